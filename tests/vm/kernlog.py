#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""The guest's kernel log, less one warning that the emulator causes.

Under QEMU's software emulation (TCG) a debug exception (#DB) with the
single-step bit set now and then reaches the guest kernel where no one
single-steps it.  Linux 6.12's exc_debug_kernel() then warns once per boot
("WARNING: ... at arch/x86/kernel/traps.c:... exc_debug_kernel", with a
comment naming QEMU as a known source), wherever the CPU happened to be:
seen in `sleep` reading a file over 9p.  That warning is dropped here,
but only when no frame of its trace is in dm_tiercache: its WARNING line
and its "Call Trace:" line, nothing else of the block, so any other bad
line printed in between still counts.

It is also the one place that says which kernel lines are bad: a line
that matches a pattern of dmesg-bad.txt (the debug lane adds its own
list) and none of dmesg-ok.txt, once the warning above is gone.

  kernlog.py bad [--patterns FILE] LOG...
        the bad kernel lines of the logs (lines with a [seconds] stamp;
        console.log also holds pytest's output): tests/run.sh,
        tests/crash/qemu_kill.sh, tests/debug/run.sh
  kernlog.py < log > log
        the log less the emulator's warning
As a module (conftest.py, stress.py): bad_lines(lines), drop_emulator_noise(lines)
"""

import argparse
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
STAMP = re.compile(r"^\[ *[0-9]+\.[0-9]+\] ")

CUT = "------------[ cut here ]------------"
END = "---[ end trace"
NOISE = "exc_debug_kernel"
OURS = "[dm_tiercache]"


def drop_emulator_noise(lines):
    out, block = [], None
    for ln in lines:
        if block is None:
            if CUT in ln:
                block = [ln]
            else:
                out.append(ln)
            continue
        block.append(ln)
        if END in ln:
            out.extend(_judge(block))
            block = None
    if block is not None:       # a block the log ends in: keep it whole
        out.extend(block)
    return out


def _judge(block):
    warn = next((ln for ln in block if "WARNING:" in ln), "")
    if NOISE not in warn or any(OURS in ln for ln in block):
        return block
    i = block.index(warn)
    j = next((k for k in range(i + 1, len(block)) if "Call Trace" in block[k]), None)
    return [ln for k, ln in enumerate(block) if k not in (i, j)]


def patterns(path):
    """One regex of a pattern file's lines (extended regexes, one per
    line; grep -E -f's syntax where the two agree)."""
    pats = [ln for ln in Path(path).read_text().splitlines() if ln.strip()]
    return re.compile("|".join(f"(?:{p})" for p in pats))


OK = re.compile("|".join(re.escape(ln) for ln in
                         (HERE / "dmesg-ok.txt").read_text().splitlines() if ln.strip()))
BAD = patterns(HERE / "dmesg-bad.txt")


def bad_lines(lines, bad=BAD):
    """The lines of a kernel log that fail a run."""
    return [ln for ln in drop_emulator_noise(lines)
            if bad.search(ln) and not OK.search(ln)]


def read_log(path):
    """A saved log's kernel lines (those with a [seconds] stamp)."""
    text = Path(path).read_bytes().decode("utf-8", "replace")
    return [ln for ln in text.splitlines() if STAMP.match(ln)]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        data = sys.stdin.buffer.read().decode("utf-8", "replace").splitlines(keepends=True)
        sys.stdout.write("".join(drop_emulator_noise(data)))
        return 0
    p = argparse.ArgumentParser(prog="kernlog.py")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bad", help="print the bad kernel lines of the logs")
    b.add_argument("--patterns", default=str(HERE / "dmesg-bad.txt"))
    b.add_argument("logs", nargs="+")
    a = p.parse_args(argv)
    rx = patterns(a.patterns)
    for log in a.logs:
        if Path(log).is_file():
            for ln in bad_lines(read_log(log), rx):
                print(ln)
    return 0


if __name__ == "__main__":
    sys.exit(main())
