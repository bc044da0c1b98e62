#!/usr/bin/env python3
"""policy:stash's turn replay, the twenty-second session's two rules, on real traces.

Stitched blocks (src/policy_stash.c, replay_range): a block whose counterpart one turn earlier
was stitched takes that range back when it is cached and free as it was. Before (the
twenty-first session's source, f12374d) such a block had no hint; the blocks placed before it
took its range's pages by best fit, and VGG made new ranges for its large activations in its
second and third steps, and grew:

- all three of issue 4's targets now hold on seventeenth/vgg11_b48 (before: 95.0%, 1582 us
  against PyTorch's 1387) and fourteenth/opt125m_b2 (before: 94.3%, 146.8 MB over PyTorch's
  default);
- the memory target (utilization >= 98% and at or below every anchor) now holds on
  final/vgg11_b64 (before 96.8%), eleventh/vgg11_b96 (95.4%) and later/vgg16_b64 (97.9%); their
  driver time stays over PyTorch's (VGG's first two steps, docs/policy-stash.md).

Frees of blocks that live into the next turn (src/loop.c, same_free): such a free is older
or younger than its counterpart a turn earlier when the turns before had other lengths; the
period now follows a free of the same bytes. fourteenth/t5_base_b2 meets all three targets
(before: 97.95% and 3 provider calls in the second half).

  test_turn_replay_ranges_and_ages.py STASH_REPLAY DATA_DIR
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from targets_table import CONFS, async_peaks, replay, row, targets_met  # noqa: E402

MEETS_ALL = ["seventeenth/vgg11_b48", "fourteenth/opt125m_b2", "fourteenth/t5_base_b2"]
MEETS_MEMORY = ["final/vgg11_b64", "eleventh/vgg11_b96", "later/vgg16_b64"]


def main():
    exe, data = sys.argv[1], sys.argv[2]
    failures = 0
    for rel in MEETS_ALL + MEETS_MEMORY:
        d, name = os.path.split(os.path.join(data, "traces", rel))
        by = replay(exe, os.path.join(d, name + ".csv.gz"))
        line, all_met = row(name, by, async_peaks(d)[name])
        anchors = [by[c]["peak_reserved_bytes"] for c in CONFS[1:]] + [async_peaks(d)[name]]
        memory = targets_met(name, by[CONFS[0]], min(anchors),
                             by[CONFS[1]]["modeled_driver_us"])[0]
        ok = all_met if rel in MEETS_ALL else memory
        print(("ok   " if ok else "FAIL ") + line)
        failures += not ok
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
