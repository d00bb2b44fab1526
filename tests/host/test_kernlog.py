#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Host test of tests/vm/kernlog.py: the emulator's #DB warning (a real
one, from a 6.12 guest under TCG: data/db-warning-6.12.txt) is dropped,
and nothing else is: the same warning with a dm_tiercache frame, another
warning, a bad line printed inside the block, a block the log ends in.
Run by `make -C tests/host check`."""

import os
import re
import subprocess
import sys
import tempfile
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


KERNLOG = os.path.join(HERE, "..", "vm", "kernlog.py")
VM = os.path.join(HERE, "..", "vm")

# the grep pipeline that tests/run.sh, qemu_kill.sh and debug/run.sh each
# carried before `kernlog.py bad`
OLD_PIPE = ("grep -a -E '^\\[ *[0-9]+\\.[0-9]+\\] ' \"$1\" | python3 \"$2\" | "
            "grep -a -E -f \"$3\" | grep -a -v -F -f \"$4\" || true")


class BadCommand(unittest.TestCase):
    """`kernlog.py bad LOG...` finds what the grep pipeline it replaced
    found, on a log with every kind of line the lanes see."""

    def log(self):
        return ["[    1.000000] Linux version 6.1.0",
                "WARNING: this line of pytest's output has no stamp",
                "tests/vm/test_x.py::test_y BUG: in a test's name PASSED",
                "[    2.000000] dm_tiercache: loading out-of-tree module taints kernel",
                "[    2.100000] tiercache-test: WARNING: a test's own kmsg note",
                "[    3.000000] general protection fault, probably for non-canonical",
                "[    3.100000] Oops: 0000 [#1] PREEMPT SMP",
                "[    4.000000] INFO: task fio:123 blocked for more than 120 seconds.",
                "[    5.000000] possible circular locking dependency detected",
                "[    5.100000] kmemleak: 3 new suspected memory leaks",
                "[ 1234.567890] list_del corruption. prev->next should be"] + \
            block() + ["[ 9999.000000] the end"]

    def run_both(self, patterns):
        with tempfile.TemporaryDirectory() as d:
            log = os.path.join(d, "console.log")
            with open(log, "w") as f:
                f.write("\n".join(self.log()) + "\n")
            new = subprocess.run([sys.executable, KERNLOG, "bad", "--patterns", patterns,
                                  log, os.path.join(d, "absent.txt")],
                                 capture_output=True, text=True, check=True).stdout
            old = subprocess.run(["bash", "-c", OLD_PIPE, "-", log, KERNLOG, patterns,
                                  os.path.join(VM, "dmesg-ok.txt")],
                                 capture_output=True, text=True, check=True).stdout
        return new.splitlines(), old.splitlines()

    def test_same_as_the_pipeline_it_replaced(self):
        new, old = self.run_both(os.path.join(VM, "dmesg-bad.txt"))
        self.assertEqual(new, old)
        self.assertEqual(len(new), 4, new)     # gp fault, Oops, hung task, list_del

    def test_same_with_the_debug_lanes_patterns(self):
        new, old = self.run_both(os.path.join(HERE, "..", "debug", "dmesg-debug.txt"))
        self.assertEqual(new, old)
        self.assertEqual(len(new), 3, new)     # lockdep, kmemleak, list_del

    def test_module_matches_command(self):
        lines = self.log()
        stamped = [ln for ln in lines if kernlog.STAMP.match(ln)]
        self.assertEqual(len(kernlog.bad_lines(stamped)), 4)


if __name__ == "__main__":
    unittest.main()
