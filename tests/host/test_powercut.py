#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Host test of tests/vm/powercut.py, the block-level power-cut oracle of
test_99: synthetic dm-log-writes logs of an upper device, and states of a
lower one that are legal, illegal, legal only under the permissive rule
(a write logged after a FUA one, without it), or legal through a discard.
Run by `make -C tests/host check`."""

import os
import struct
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "vm"))

import logwrites  # noqa: E402
import powercut  # noqa: E402

SS = 512
DEV = 64 * SS


def blk(ch):
    return bytes([ch]) * SS


def make_log(entries):
    """entries: ("w", sector, data) | ("fua", sector, data) | ("flush",) |
    ("discard", sector, n) | ("mark", text)."""
    out = [b""]
    for e in entries:
        kind = e[0]
        if kind == "mark":
            text = e[1].encode()
            hdr = struct.pack("<QQQQ", 0, 0, logwrites.MARK, len(text)) + text
            out.append(hdr.ljust(SS, b"\0"))
        elif kind == "flush":
            out.append(struct.pack("<QQQQ", 0, 0, logwrites.FLUSH, 0).ljust(SS, b"\0"))
        elif kind == "discard":
            out.append(struct.pack("<QQQQ", e[1], e[2], logwrites.DISCARD, 0)
                       .ljust(SS, b"\0"))
        else:
            flags = logwrites.FUA if kind == "fua" else 0
            out.append(struct.pack("<QQQQ", e[1], len(e[2]) // SS, flags, 0)
                       .ljust(SS, b"\0") + e[2])
    sup = struct.pack("<QQQI", logwrites.MAGIC, logwrites.VERSION, len(entries), SS)
    out[0] = sup.ljust(SS, b"\0")
    return b"".join(out)


def image(**sectors):
    img = bytearray(DEV)
    for name, ch in sectors.items():
        s = int(name[1:])
        img[s * SS:(s + 1) * SS] = blk(ch)
    return img


def checker(entries, fua_ends=False, base=None, slack=0):
    base = bytes(DEV) if base is None else base
    with logwrites.LogWrites.open(make_log([("mark", "start")] + entries)) as log:
        return powercut.History(log, 0, base, fua_ends=fua_ends,
                                slack=slack).checker(base)


def judge(chk, img):
    chk.update(img, range(DEV // SS))
    return chk.legal()


# A at sector 0 twice (1 then 2), B at 8, C at 16; intervals 0 | 1 | 2
TWO = [("w", 0, blk(1)), ("w", 8, blk(0xb)), ("flush",),
       ("w", 0, blk(2)), ("w", 16, blk(0xc)), ("flush",)]


class Intervals(unittest.TestCase):
    def test_nothing_written_is_interval_0(self):
        self.assertEqual(judge(checker(TWO), image()), 0)

    def test_subset_of_the_first_interval(self):
        self.assertEqual(judge(checker(TWO), image(s0=1)), 0)

    def test_newer_version_without_the_older_interval_is_illegal(self):
        chk = checker(TWO)
        self.assertIsNone(judge(chk, image(s0=2)))
        why = chk.explain()
        self.assertIn("behind: sector 8", why)
        self.assertIn("ahead: sector 0", why)

    def test_whole_first_interval_and_part_of_the_second(self):
        self.assertEqual(judge(checker(TWO), image(s0=2, s8=0xb)), 1)
        self.assertEqual(judge(checker(TWO), image(s0=1, s8=0xb, s16=0xc)), 1)

    def test_everything_is_the_last_interval(self):
        self.assertEqual(judge(checker(TWO), image(s0=2, s8=0xb, s16=0xc)), 2)

    def test_slack_lets_a_version_stand_one_interval_early(self):
        # A's second version in flight when the first flush came
        self.assertEqual(judge(checker(TWO, slack=1), image(s0=2)), 0)
        self.assertEqual(judge(checker(TWO, slack=1), image(s0=2, s16=0xc)), 0)
        # but not two intervals early
        log = TWO + [("w", 24, blk(0xd)), ("flush",)]
        self.assertIsNone(judge(checker(log, slack=1), image(s24=0xd)))

    def test_content_nobody_wrote_is_illegal(self):
        chk = checker(TWO)
        self.assertIsNone(judge(chk, image(s0=7, s8=0xb)))
        self.assertIn("content no write put there", chk.explain())
        self.assertIsNone(judge(checker(TWO), image(s40=1)))

    def test_update_follows_changes(self):
        chk = checker(TWO)
        img = image(s0=2)
        self.assertIsNone(judge(chk, img))
        img[8 * SS:9 * SS] = blk(0xb)
        chk.update(img, [8])
        self.assertEqual(chk.legal(), 1)

    def test_base_that_is_not_zero(self):
        base = bytes(image(s8=5))
        chk = checker(TWO, base=base)
        self.assertEqual(judge(chk, image(s8=5)), 0)
        self.assertIsNone(judge(chk, image()))


class FuaAndDiscard(unittest.TestCase):
    LOG = [("fua", 0, blk(1)), ("w", 8, blk(2)), ("flush",)]

    def test_write_after_fua_without_it(self):
        self.assertEqual(judge(checker(self.LOG), image(s8=2)), 0)
        self.assertIsNone(judge(checker(self.LOG, fua_ends=True), image(s8=2)))
        self.assertEqual(judge(checker(self.LOG, fua_ends=True), image(s0=1)), 1)
        self.assertEqual(judge(checker(self.LOG, fua_ends=True), image(s0=1, s8=2)), 2)

    def test_discard_allows_anything_after_it(self):
        log = [("w", 0, blk(1)), ("flush",), ("discard", 0, 1), ("flush",)]
        self.assertEqual(judge(checker(log), image(s0=9)), 2)
        self.assertIsNone(judge(checker(log), image(s0=9, s1=1)))


if __name__ == "__main__":
    unittest.main()
