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

As a filter (tests/run.sh, tests/crash/qemu_kill.sh): kernlog.py < log > log
As a module (conftest.py): drop_emulator_noise(lines)
"""

import sys

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


def main():
    data = sys.stdin.buffer.read().decode("utf-8", "replace").splitlines(keepends=True)
    sys.stdout.write("".join(drop_emulator_noise(data)))


if __name__ == "__main__":
    main()
