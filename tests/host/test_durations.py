#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Host test of tests/vm/durations.py: a test's time runs from the previous
test's END (its module fixtures set up before its START) to its own END;
the first test counts from its START; a test without an END (the run was
cut short) and other kernel lines count nothing; the per-file table adds
up.  Run by `make -C tests/host check`."""

import contextlib
import io
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "vm"))

import durations  # noqa: E402

LOG = """\
[   10.000000] tiercache-test: START tests/vm/test_a.py::test_one-279-1-100
[   12.500000] tiercache-test: END tests/vm/test_a.py::test_one
[   12.600000] device-mapper: tiercache: something else
[   20.500000] tiercache-test: START tests/vm/test_b.py::test_two[x]-279-2-200
[   21.500000] tiercache-test: END tests/vm/test_b.py::test_two[x]
[   22.000000] tiercache-test: START tests/vm/test_b.py::test_three-279-3-300
[   23.000000] tiercache-test: END tests/vm/test_b.py::test_three
[   24.000000] tiercache-test: START tests/vm/test_b.py::test_cut-279-4-400
""".splitlines()


class Durations(unittest.TestCase):
    def test_from_previous_end(self):
        d = durations.durations(LOG)
        self.assertEqual(list(d), ["tests/vm/test_a.py::test_one",
                                   "tests/vm/test_b.py::test_two[x]",
                                   "tests/vm/test_b.py::test_three"])
        self.assertAlmostEqual(d["tests/vm/test_a.py::test_one"], 2.5)
        # 8 s of module fixture before its START, 1 s of its own
        self.assertAlmostEqual(d["tests/vm/test_b.py::test_two[x]"], 9.0)
        self.assertAlmostEqual(d["tests/vm/test_b.py::test_three"], 1.5)

    def test_table(self):
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "dmesg-live.txt"), "w") as f:
                f.write("\n".join(LOG) + "\n")
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                durations.main([tmp, "--top", "1"])
        text = out.getvalue()
        self.assertRegex(text, r"\n\s+10\s+2  tests/vm/test_b.py\n")
        self.assertRegex(text, r"\n\s+2\s+1  tests/vm/test_a.py\n")  # 2.5 rounds to even
        self.assertRegex(text, r"\n\s+13\s+3  total\n")
        self.assertRegex(text, r"slowest 1:\n\s+9  tests/vm/test_b.py::test_two\[x\]\n")

    def test_no_markers(self):
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "dmesg-live.txt"), "w") as f:
                f.write("[ 1.0] nothing\n")
            with self.assertRaises(SystemExit) as e:
                durations.main([tmp])
            self.assertIn("no START/END markers", str(e.exception))


if __name__ == "__main__":
    unittest.main()
