#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Host test of tests/debug/ledger.py, the debug lane's record of the tests
that passed with a clean report: only passed tests are recorded, an entry
stops counting when its test file changes, the source key ignores build
products and follows the sources.  Run by `make -C tests/host check`."""

import os
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "debug"))

import ledger  # noqa: E402

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.vm.test_zz_fake" name="test_a" time="1"/>
<testcase classname="tests.vm.test_zz_fake" name="test_b[x-1]" time="1"><failure message="no"/></testcase>
<testcase classname="tests.vm.test_zz_fake" name="test_c" time="1"><skipped message="s"/></testcase>
<testcase classname="tests.vm.test_zz_fake" name="test_d[y]" time="1"/>
</testsuite></testsuites>
"""


class Ledger(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)
        # a fake repository: the test file the ids name lives under it
        self.old_repo = ledger.REPO
        ledger.REPO = self.dir
        (self.dir / "tests/vm").mkdir(parents=True)
        self.tfile = self.dir / "tests/vm/test_zz_fake.py"
        self.tfile.write_text("def test_a(): pass\n")
        (self.dir / "junit.xml").write_text(JUNIT)
        self.led = self.dir / "ledger/k.txt"

    def tearDown(self):
        ledger.REPO = self.old_repo
        self.tmp.cleanup()

    def record(self):
        return ledger.main(["ledger", "record", str(self.led), str(self.dir / "junit.xml"), "s1"])

    def test_only_passed_tests_are_recorded(self):
        self.assertEqual(self.record(), 0)
        self.assertEqual(sorted(ledger.valid_entries(self.led)),
                         ["tests/vm/test_zz_fake.py::test_a",
                          "tests/vm/test_zz_fake.py::test_d[y]"])

    def test_recording_twice_adds_nothing(self):
        self.record()
        self.record()
        self.assertEqual(len(self.led.read_text().splitlines()), 2)

    def test_changed_test_file_voids_its_entries(self):
        self.record()
        self.tfile.write_text("def test_a(): assert 0\n")
        self.assertEqual(ledger.valid_entries(self.led), {})
        self.record()       # recorded again against the new file
        self.assertEqual(len(ledger.valid_entries(self.led)), 2)

    def test_source_key_ignores_build_products_not_sources(self):
        src = self.dir / "mod"
        src.mkdir()
        (src / "a.c").write_text("int a;\n")
        (src / "Makefile").write_text("obj-m := a.o\n")
        k = ledger.source_key(src)
        for name in ("a.o", "a.ko", ".a.o.cmd", "a.mod", "a.mod.c", "modules.order"):
            (src / name).write_text("x")
        self.assertEqual(ledger.source_key(src), k)
        (src / "a.c").write_text("int a = 1;\n")
        self.assertNotEqual(ledger.source_key(src), k)


if __name__ == "__main__":
    unittest.main()
