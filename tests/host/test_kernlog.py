#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Host test of tests/vm/kernlog.py: the emulator's #DB warning (a real
one, from a 6.12 guest under TCG: data/db-warning-6.12.txt) is dropped,
and nothing else is: the same warning with a dm_tiercache frame, another
warning, a bad line printed inside the block, a block the log ends in.
Run by `make -C tests/host check`."""

import os
import re
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "vm"))

import kernlog  # noqa: E402

with open(os.path.join(HERE, "..", "vm", "dmesg-bad.txt")) as _f:
    BAD = re.compile("|".join(p for p in _f.read().splitlines() if p))


def block():
    with open(os.path.join(HERE, "data", "db-warning-6.12.txt")) as f:
        return f.read().splitlines()


def bad(lines):
    return [ln for ln in kernlog.drop_emulator_noise(lines) if BAD.search(ln)]


class KernLog(unittest.TestCase):
    def test_the_real_block_has_bad_lines(self):
        self.assertEqual(len([ln for ln in block() if BAD.search(ln)]), 2)

    def test_emulator_db_warning_dropped(self):
        lines = ["[ 1.0] before"] + block() + ["[ 2.0] after"]
        out = kernlog.drop_emulator_noise(lines)
        self.assertEqual(bad(lines), [])
        self.assertEqual(len(out), len(lines) - 2)
        self.assertEqual((out[0], out[-1]), ("[ 1.0] before", "[ 2.0] after"))

    def test_kept_with_a_tiercache_frame(self):
        b = block()
        i = next(i for i, ln in enumerate(b) if "netfs_extract_user_iter+0x7a" in ln)
        b[i] = "[  398.132033]  tc_map+0x7a/0x2e0 [dm_tiercache]"
        self.assertEqual(len(bad(b)), 2)

    def test_other_warning_kept(self):
        b = [ln.replace("exc_debug_kernel", "tc_end_io") if "WARNING:" in ln else ln
             for ln in block()]
        self.assertEqual(len(bad(b)), 2)

    def test_bad_line_inside_the_block_kept(self):
        b = block()
        b.insert(10, "[  398.125000] BUG: unable to handle page fault for address: 0")
        self.assertEqual(bad(b), ["[  398.125000] BUG: unable to handle page fault for address: 0"])

    def test_second_call_trace_inside_the_block_kept(self):
        b = block()
        b.insert(-2, "[  398.133950] Call Trace:")
        self.assertEqual(bad(b), ["[  398.133950] Call Trace:"])

    def test_unfinished_block_kept(self):
        b = block()[:-1]
        self.assertEqual(len(bad(b)), 2)


if __name__ == "__main__":
    unittest.main()
