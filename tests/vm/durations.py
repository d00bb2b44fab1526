#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Where the in-VM suite's time goes, from a run's kernel log.

    tests/vm/durations.py [RESULTS_DIR] [--top N]

The kernel_log_guard fixture (conftest.py) writes `tiercache-test: START
<id>-...` and `END <id>` into the kernel log around each test, and
results/<stamp>/dmesg-live.txt keeps it even when pytest is killed at its
time limit (no junit.xml then).  Prints the time per test file (a test's
own time plus the gap before it starts: its module-scoped fixtures run
there), the slowest tests, and the total.  CI allows `make
test` 90 minutes: keep an eye on the total.
"""

import argparse
import collections
import re
import sys
from pathlib import Path

LINE = re.compile(r"\[\s*([\d.]+)\] tiercache-test: (START|END) (\S+)")


def events(lines):
    """(seconds, START|END, test id) for each marker line."""
    for ln in lines:
        m = LINE.match(ln)
        if m:
            name = m.group(3)
            if m.group(2) == "START":
                name = re.sub(r"-\d+-\d+-\d+$", "", name)
            yield float(m.group(1)), m.group(2), name


def durations(lines):
    """{test id: seconds from the previous test's END (its own START for the
    first) to its END}, in run order: the gap before a test's START is its
    module-scoped fixtures' set-up (and the previous test's teardown)."""
    out = {}
    prev_end = None
    start = None
    for t, kind, name in events(lines):
        if kind == "START":
            start = (t if prev_end is None else prev_end, name)
        elif start is not None and name == start[1]:
            out[name] = t - start[0]
            prev_end = t
            start = None
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="?", default="results/latest")
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args(argv)
    path = Path(a.results) / "dmesg-live.txt"
    if not path.exists():
        sys.exit(f"{path}: no such file (a results directory of tests/run.sh?)")
    d = durations(path.read_text(errors="replace").splitlines())
    if not d:
        sys.exit(f"{path}: no START/END markers")
    files = collections.Counter()
    count = collections.Counter()
    for name, s in d.items():
        f = name.split("::")[0]
        files[f] += s
        count[f] += 1
    print(f"{'seconds':>8} {'tests':>5}  file")
    for f, s in files.most_common():
        print(f"{s:8.0f} {count[f]:5d}  {f}")
    print(f"{sum(d.values()):8.0f} {len(d):5d}  total")
    print(f"\nslowest {a.top}:")
    for name, s in sorted(d.items(), key=lambda kv: -kv[1])[:a.top]:
        print(f"{s:8.0f}  {name}")


if __name__ == "__main__":
    main()
