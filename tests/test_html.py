#!/usr/bin/env python3
"""stash-replay --html, opened in a real browser: headless Chromium (Debian's chromium
package) renders the page and takes a screenshot; the screenshot must show the plots (not
blank: the live and the reserved curves, and the modelled driver time so far, drawn in their
colours) and the layout at the peak. The page must also stand alone: no script, no external
resource. Its table gives each setting's modelled driver time and late calls as the JSON does.

  test_html.py STASH_REPLAY DATA_DIR

Skips (exit 77) without chromium, unless STASH_REQUIRE_BROWSER=1 (CI sets it).
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

REPLAY, DATA = (os.path.abspath(a) for a in sys.argv[1:3])
LIVE, RESERVED, LAYOUT_LIVE = (0x1f, 0x77, 0xb4), (0xd6, 0x27, 0x28), (0x2b, 0x8a, 0x3e)
DRIVER = (0xe8, 0x59, 0x0c)


def png_pixels(path):
    """(width, height, rows of (r, g, b) tuples) of an 8-bit RGB or RGBA PNG."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, b""
    w = h = depth = ctype = 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    assert depth == 8 and ctype in (2, 6), "PNG colour type %d depth %d" % (ctype, depth)
    bpp = 3 if ctype == 2 else 4
    raw, stride, rows, prev = zlib.decompress(idat), w * bpp, [], bytearray(w * bpp)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[x * bpp:x * bpp + 3]) for x in range(w)])
        prev = line
    return w, h, rows


def near(p, q, tol=40):
    return all(abs(a - b) <= tol for a, b in zip(p, q))


def main():
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if not browser:
        if os.environ.get("STASH_REQUIRE_BROWSER") == "1":
            print("FAIL: chromium is not installed (apt-get install chromium)")
            return 1
        print("skipped: no chromium")
        return 77
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        page, shot = os.path.join(tmp, "r.html"), os.path.join(tmp, "shot.png")
        p = subprocess.run([REPLAY, "--json", "--html", page, "--conf", "policy:stash", "--conf",
                            "policy:pytorch", os.path.join(DATA, "traces", "resnet50_train.csv.gz")],
                           capture_output=True, text=True, timeout=300)
        if p.returncode or not os.path.exists(page):
            print("FAIL: stash-replay --html\n" + p.stdout + p.stderr)
            return 1
        html = open(page).read()
        rows = [json.loads(l) for l in p.stdout.splitlines()]
        cells = re.findall(r"<td>([\d.]+)</td><td>(\d+)</td></tr>", html)
        want = [("%.2f" % (r["modeled_driver_us"] / 1000.0),
                 str(r["device_allocs_second_half"] + r["device_frees_second_half"])) for r in rows]
        if cells != want:
            failures.append("the table's driver ms and late calls %r, the JSON's %r" % (cells, want))
        notes = re.findall(r"Modelled driver time so far: ([\d.]+) ms at the end", html)
        if notes != [w[0] for w in want]:
            failures.append("the driver strips say %r, the JSON %r" % (notes, [w[0] for w in want]))
        for bad in ("<script", "http://", "https://", "src=", "@import"):
            if bad in html.replace("http://www.w3.org/2000/svg", ""):
                failures.append("the page is not self-contained: it has %r" % bad)
        if html.count("<polyline") != 6:
            failures.append("%d curves, expected 6 (live, reserved and driver time, 2 settings)"
                            % html.count("<polyline"))
        r = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                            "--window-size=1100,1100", "--screenshot=" + shot, "file://" + page],
                           capture_output=True, text=True, timeout=120)
        if not os.path.exists(shot):
            print("FAIL: chromium took no screenshot\n" + r.stdout + r.stderr)
            return 1
        w, h, rows = png_pixels(shot)
        colours = {}
        counts = {"live": 0, "reserved": 0, "layout": 0, "driver": 0, "non-white": 0}
        for row in rows:
            for px in row:
                if px != (255, 255, 255):
                    counts["non-white"] += 1
                if near(px, LIVE):
                    counts["live"] += 1
                elif near(px, RESERVED):
                    counts["reserved"] += 1
                elif near(px, LAYOUT_LIVE, 25):
                    counts["layout"] += 1
                elif near(px, DRIVER, 30):
                    counts["driver"] += 1
        print("screenshot %dx%d: %s" % (w, h, counts))
        if counts["non-white"] < w * h // 50:
            failures.append("the screenshot is (nearly) blank")
        if counts["live"] < 500:
            failures.append("the live curve is not drawn")
        if counts["reserved"] < 500:
            failures.append("the reserved curve is not drawn")
        if counts["layout"] < 500:
            failures.append("the layout at the peak is not drawn")
        if counts["driver"] < 300:
            failures.append("the driver time curve is not drawn")
    for f in failures:
        print("FAIL: " + f)
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
