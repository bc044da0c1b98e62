/* html.c: stash-replay's report as one self-contained HTML page - inline SVG, no script,
 * no network: per trace, the table; per configuration, live and reserved bytes over the
 * trace, the modelled driver time so far (simulated), and the memory layout when reserved
 * first reached its peak (each segment a bar, each block a stretch of it: live, waiting for
 * another stream, cached, lent, unmapped), with each pool's account of it in words
 * (replay_peak_text). */
#include "html.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#define W 960           /* plot width, px */
#define H 260           /* plot height */
#define PAD 48          /* left margin for the axis labels */
#define MAXPTS 1200     /* points per curve at most (the max of each bucket: peaks survive) */

static const char* const k_style =
    "body{font:14px system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}"
    "h1{font-size:20px}h2{font-size:17px;margin-top:32px}h3{font-size:15px;margin:20px 0 6px}"
    "table{border-collapse:collapse;margin:8px 0}td,th{padding:3px 8px;text-align:right;white-space:nowrap;"
    "border-bottom:1px solid #ddd}td:first-child,th:first-child{text-align:left}"
    ".best{font-weight:bold;background:#eef7ee}.note{color:#666;font-size:12px}"
    ".legend span{display:inline-block;margin-right:16px}"
    ".sw{display:inline-block;width:12px;height:12px;vertical-align:middle;margin-right:4px}";

/* Block colours by stash_block_state_t: allocated, pending free, free, unmapped, lent, alias. */
static const char* const k_state_color[] = {"#2b8a3e", "#f08c00", "#ced4da", "#ffffff",
                                            "#7048e8", "#e9ecef"};
static const char* const k_state_name[] = {"live", "freed, another stream may still use it",
                                           "cached (free)", "unmapped", "lent to a stitched range",
                                           "stitched alias"};

static void esc(FILE* f, const char* s) {
  for (; *s; s++) {
    switch (*s) {
      case '<': fputs("&lt;", f); break;
      case '>': fputs("&gt;", f); break;
      case '&': fputs("&amp;", f); break;
      case '"': fputs("&quot;", f); break;
      default: fputc(*s, f);
    }
  }
}

static double gib(uint64_t b) { return (double)b / (1024.0 * 1024.0 * 1024.0); }

/* A polyline of v[0..n) scaled to the plot (max of each bucket of events). */
static void curve(FILE* f, const uint64_t* v, size_t n, uint64_t ymax, const char* color) {
  if (!n || !ymax) return;
  size_t pts = n < MAXPTS ? n : MAXPTS;
  fprintf(f, "<polyline fill='none' stroke='%s' stroke-width='1.6' points='", color);
  for (size_t p = 0; p < pts; p++) {
    size_t a = p * n / pts, b = (p + 1) * n / pts;
    uint64_t m = 0;
    for (size_t i = a; i < b; i++)
      if (v[i] > m) m = v[i];
    double x = PAD + (double)(W - PAD - 8) * (double)p / (double)(pts > 1 ? pts - 1 : 1);
    double y = 10 + (double)(H - 30) * (1.0 - (double)m / (double)ymax);
    fprintf(f, "%.1f,%.1f ", x, y);
  }
  fputs("'/>\n", f);
}

static void plot(FILE* f, const replay_result_t* r, uint64_t events, uint64_t ymax) {
  fprintf(f, "<svg class='plot' width='%d' height='%d' viewBox='0 0 %d %d' "
          "xmlns='http://www.w3.org/2000/svg'>\n", W, H, W, H);
  fprintf(f, "<rect x='%d' y='10' width='%d' height='%d' fill='#fcfcfd' stroke='#bbb'/>\n", PAD,
          W - PAD - 8, H - 30);
  for (int k = 0; k <= 4; k++) {
    double y = 10 + (H - 30) * (1.0 - k / 4.0);
    fprintf(f, "<line x1='%d' x2='%d' y1='%.1f' y2='%.1f' stroke='#eee'/>"
            "<text x='%d' y='%.1f' font-size='11' text-anchor='end' fill='#666'>%.1f GiB</text>\n",
            PAD, W - 8, y, y, PAD - 4, y + 4, gib(ymax) * k / 4.0);
  }
  fprintf(f, "<text x='%d' y='%d' font-size='11' fill='#666'>event 1</text>"
          "<text x='%d' y='%d' font-size='11' text-anchor='end' fill='#666'>event %" PRIu64
          "</text>\n", PAD, H - 4, W - 8, H - 4, events);
  curve(f, r->series_reserved, events, ymax, "#d62728");
  curve(f, r->series_live, events, ymax, "#1f77b4");
  fputs("</svg>\n", f);
}

#define DH 90 /* the driver-time strip's height */

/* The simulated device's modelled driver time so far over the trace (the value at the end of
 * each bucket of events), on a scale shared by the trace's configurations (dmax us), with
 * the trace's halfway mark: a steady state's calls would come after it. */
static void driver_strip(FILE* f, const replay_result_t* r, uint64_t events, double dmax) {
  if (!r->series_driver_us || !events || dmax <= 0) return;
  fprintf(f, "<svg class='driver' width='%d' height='%d' viewBox='0 0 %d %d' "
          "xmlns='http://www.w3.org/2000/svg'>\n", W, DH, W, DH);
  fprintf(f, "<rect x='%d' y='6' width='%d' height='%d' fill='#fcfcfd' stroke='#bbb'/>\n", PAD,
          W - PAD - 8, DH - 20);
  double ytop = 6 + (DH - 20) * 0.1; /* dmax, a little under the frame */
  fprintf(f, "<line x1='%d' x2='%d' y1='%.1f' y2='%.1f' stroke='#eee'/>"
          "<text x='%d' y='%.1f' font-size='11' text-anchor='end' fill='#666'>%.1f ms</text>"
          "<text x='%d' y='%d' font-size='11' text-anchor='end' fill='#666'>0</text>\n",
          PAD, W - 8, ytop, ytop, PAD - 4, ytop + 4, dmax / 1000.0, PAD - 4, DH - 14);
  double xmid = PAD + (double)(W - PAD - 8) / 2.0;
  fprintf(f, "<line x1='%.1f' x2='%.1f' y1='6' y2='%d' stroke='#999' stroke-dasharray='4 3'/>"
          "<text x='%.1f' y='%d' font-size='11' fill='#666'> second half</text>\n", xmid, xmid,
          DH - 14, xmid, DH - 2);
  size_t pts = events < MAXPTS ? events : MAXPTS;
  fprintf(f, "<polyline fill='none' stroke='#e8590c' stroke-width='1.6' points='");
  for (size_t p = 0; p < pts; p++) {
    size_t b = (p + 1) * events / pts;
    double x = PAD + (double)(W - PAD - 8) * (double)p / (double)(pts > 1 ? pts - 1 : 1);
    double y = 6 + (double)(DH - 20) * (1.0 - 0.9 * r->series_driver_us[b - 1] / dmax);
    fprintf(f, "%.1f,%.1f ", x, y);
  }
  fputs("'/>\n</svg>\n", f);
  fprintf(f, "<p class='note driver'>Modelled driver time so far: %.2f ms at the end, "
          "%" PRIu64 " provider calls in the second half.</p>\n", r->modeled_driver_us / 1000.0,
          r->device_allocs_second_half + r->device_frees_second_half);
}

/* The layout: a bar per segment (stitched ranges too), width by size on one scale. */
static void layout(FILE* f, const replay_result_t* r) {
  if (!r->nlayout) return;
  uint64_t biggest = 0;
  for (size_t i = 0; i < r->nlayout; i++)
    if (r->layout[i].size > biggest) biggest = r->layout[i].size;
  if (!biggest) return;
  size_t rows = r->nlayout;
  int rh = rows > 60 ? 6 : 12;
  fprintf(f, "<svg class='layout' width='%d' height='%zu' xmlns='http://www.w3.org/2000/svg'>\n",
          W, rows * (size_t)(rh + 2) + 4);
  for (size_t i = 0; i < rows; i++) {
    const replay_segment_t* s = &r->layout[i];
    double y = 2 + (double)i * (rh + 2);
    double scale = (double)(W - PAD - 8) / (double)biggest;
    fprintf(f, "<rect x='%d' y='%.1f' width='%.2f' height='%d' fill='#fff' stroke='#999' "
            "stroke-width='0.5'><title>%s segment at 0x%" PRIx64 ", %.1f MiB</title></rect>\n",
            PAD, y, (double)s->size * scale, rh, s->stitched ? "stitched" : s->small ? "small" : "large",
            s->address, (double)s->size / 1048576.0);
    for (size_t k = 0; k < s->nblocks; k++) {
      const replay_block_t* b = &s->blocks[k];
      int st = b->state >= 0 && b->state < 6 ? b->state : 2;
      double x = PAD + (double)(b->address - s->address) * scale;
      double w = (double)b->size * scale;
      if (w < 0.05) continue;
      fprintf(f, "<rect x='%.2f' y='%.1f' width='%.2f' height='%d' fill='%s'/>\n", x, y,
              w < 0.3 ? 0.3 : w, rh, k_state_color[st]);
    }
  }
  fputs("</svg>\n", f);
}

static void table(FILE* f, const char* const* confs, const replay_result_t* rs, const bool* ok,
                  int n, int best) {
  fputs("<table><tr><th>configuration</th><th>peak live</th><th>peak reserved</th>"
        "<th>utilization</th><th>wasted</th><th>device allocs</th><th>device frees</th>"
        "<th>OOMs</th><th>ns/event</th><th>driver ms</th><th>late calls</th></tr>\n", f);
  for (int c = 0; c < n; c++) {
    if (!ok[c]) continue;
    const replay_result_t* r = &rs[c];
    double util = r->peak_reserved_bytes ? 100.0 * (double)r->peak_live_bytes /
                                               (double)r->peak_reserved_bytes : 0.0;
    uint64_t wasted = r->peak_reserved_bytes > r->peak_live_bytes
                          ? r->peak_reserved_bytes - r->peak_live_bytes : 0;
    fprintf(f, "<tr%s><td>%s", c == best ? " class='best'" : "", c == best ? "&#9733; " : "");
    esc(f, confs[c]);
    fprintf(f, "</td><td>%.2f GiB</td><td>%.2f GiB</td><td>%.1f%%</td><td>%.2f GiB</td>"
            "<td>%" PRIu64 "</td><td>%" PRIu64 "</td><td>%" PRIu64 "</td><td>%.0f</td>",
            gib(r->peak_live_bytes), gib(r->peak_reserved_bytes), util, gib(wasted),
            r->device_allocs, r->device_frees, r->ooms, r->ns_per_event);
    /* the driver time, modelled (simulated) or measured (a GPU), and the steady state's calls */
    fprintf(f, "<td>%.2f</td><td>%" PRIu64 "</td></tr>\n",
            (r->series_driver_us ? r->modeled_driver_us : r->measured_driver_us) / 1000.0,
            r->device_allocs_second_half + r->device_frees_second_half);
  }
  fputs("</table>\n", f);
}

void html_begin(FILE* f) {
  fprintf(f, "<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>stash-replay</title>"
          "<style>%s</style></head><body>\n<h1>stash-replay: what each allocator setting "
          "reserves</h1>\n<p class='note'>Peak live: the most bytes the program ever had "
          "allocated at once - no allocator can reserve less. Wasted = peak reserved - peak "
          "live.</p>\n", k_style);
}

void html_trace(FILE* f, const trace_t* t, const char* const* confs, const replay_result_t* rs,
                const bool* ok, int n, int best) {
  fputs("<h2>", f);
  esc(f, t->name);
  uint64_t lag = 0; /* (every setting's replay had the same) */
  for (int c = 0; c < n && !lag; c++)
    if (ok[c]) lag = rs[c].lag;
  fprintf(f, "</h2>\n<p>%zu events, %zu stream%s, peak live %.2f GiB", t->nevents,
          t->nstreams, t->nstreams == 1 ? "" : "s", gib(t->peak_live));
  if (lag) fprintf(f, "; replayed on a GPU %llu events behind the host", (unsigned long long)lag);
  fputs(".</p>\n", f);
  table(f, confs, rs, ok, n, best);
  uint64_t ymax = 1;
  for (int c = 0; c < n; c++)
    if (ok[c] && rs[c].peak_reserved_bytes > ymax) ymax = rs[c].peak_reserved_bytes;
  double dmax = 0;
  for (int c = 0; c < n; c++)
    if (ok[c] && rs[c].modeled_driver_us > dmax) dmax = rs[c].modeled_driver_us;
  fputs("<p class='legend'><span><span class='sw' style='background:#1f77b4'></span>live "
        "(bytes the program holds)</span><span><span class='sw' style='background:#d62728'>"
        "</span>reserved (bytes the allocator holds)</span></p>\n", f);
  for (int c = 0; c < n; c++) {
    if (!ok[c]) continue;
    fputs("<h3>", f);
    esc(f, confs[c]);
    fprintf(f, "</h3>\n");
    if (rs[c].series_live) plot(f, &rs[c], t->nevents, ymax);
    driver_strip(f, &rs[c], t->nevents, dmax);
    if (rs[c].nlayout) {
      fprintf(f, "<p class='note'>Memory at the peak (after event %" PRIu64 ", %.2f GiB "
              "reserved): one bar per segment, to scale.</p>\n", rs[c].layout_event,
              gib(rs[c].peak_reserved_bytes));
      layout(f, &rs[c]);
      char text[512];
      for (int small = 1; small >= 0; small--)
        if (replay_peak_text(&rs[c], small, text, sizeof text))
          fprintf(f, "<p class='note account'>%s</p>\n", text);
    }
  }
  fputs("<p class='legend'>", f);
  for (int k = 0; k < 6; k++) {
    if (k == 3) continue;
    fprintf(f, "<span><span class='sw' style='background:%s;border:1px solid #999'></span>%s"
            "</span>", k_state_color[k], k_state_name[k]);
  }
  fputs("</p>\n", f);
}

void html_end(FILE* f) { fputs("</body></html>\n", f); }
