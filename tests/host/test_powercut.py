#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Host test of tests/vm/powercut.py, the block-level power-cut oracle of
test_99: synthetic timed writes and flushes of an upper device (their
dm-log-writes log built as the target would log them), and states of a
lower one that are legal, illegal, legal because a write was in flight
across flushes, illegal because a write came after a FUA write had
completed, legal through a discard; and the parser of ftrace's block
events.  Run by `make -C tests/host check`."""

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


def history(timed, base=None):
    """timed: [(entry, issued, done)]; a flush entry's bio is an empty one."""
    base = bytes(DEV) if base is None else base
    bios = []
    for e, q, c in timed:
        if e[0] == "flush":
            bios.append(powercut.Bio(0, 0, "FWS", q, c))
        elif e[0] == "discard":
            bios.append(powercut.Bio(e[1], e[2], "DS", q, c))
        else:
            bios.append(powercut.Bio(e[1], len(e[2]) // SS,
                                     "WFS" if e[0] == "fua" else "WS", q, c))
    # the log as dm-log-writes writes it: a flush takes the plain writes
    # completed when it is mapped and logs them, then itself, when it
    # completes; a FUA write is logged when it completes
    logged, taken = [], set()
    for k, (e, q, c) in enumerate(timed):
        if e[0] == "flush":
            group = sorted((c2, j) for j, (e2, q2, c2) in enumerate(timed)
                           if e2[0] in ("w", "discard") and c2 <= q and j not in taken)
            taken.update(j for _, j in group)
            logged += [(c, k, n, timed[j][0]) for n, (_, j) in enumerate(group)]
            logged.append((c, k, len(group), e))
        elif e[0] == "fua":
            logged.append((c, k, 0, e))
    rest = sorted((c, j) for j, (e, q, c) in enumerate(timed)
                  if e[0] in ("w", "discard") and j not in taken)
    logged += [(powercut.INF, j, 0, timed[j][0]) for _, j in rest]
    log = [("mark", "start")] + [e for *_, e in sorted(logged, key=lambda t: t[:3])]
    with logwrites.LogWrites.open(make_log(log)) as lw:
        h = powercut.History(lw, 0, base, bios)
    assert not h.unmatched, h.unmatched
    return h


def judge(h, img):
    chk = h.checker(bytes(DEV) if h.base is None else h.base)
    chk.update(img, range(DEV // SS))
    return chk.legal(), chk


A1, B, A2, C = ("w", 0, blk(1)), ("w", 8, blk(0xb)), ("w", 0, blk(2)), ("w", 16, blk(0xc))
F1, F2 = ("flush",), ("flush",)
# A1 and B, flush, A2 and C, flush: one at a time
SERIAL = [(A1, 1, 2), (B, 3, 4), (F1, 5, 6), (A2, 7, 8), (C, 9, 10), (F2, 11, 12)]


class Serial(unittest.TestCase):
    def test_nothing_written(self):
        self.assertIsNotNone(judge(history(SERIAL), image())[0])

    def test_part_of_the_first_flush(self):
        self.assertIsNotNone(judge(history(SERIAL), image(s0=1))[0])

    def test_newer_version_without_an_older_flushed_write_is_illegal(self):
        legal, chk = judge(history(SERIAL), image(s0=2))
        self.assertIsNone(legal)
        why = chk.explain()
        self.assertIn("newest: sector 0", why)
        self.assertIn("oldest: sector 8", why)

    def test_first_flush_and_part_of_the_second(self):
        self.assertEqual(judge(history(SERIAL), image(s0=2, s8=0xb))[0], 7)
        self.assertEqual(judge(history(SERIAL), image(s0=1, s8=0xb, s16=0xc))[0], 9)

    def test_everything(self):
        self.assertEqual(judge(history(SERIAL), image(s0=2, s8=0xb, s16=0xc))[0], 9)

    def test_content_nobody_wrote(self):
        legal, chk = judge(history(SERIAL), image(s0=7, s8=0xb))
        self.assertIsNone(legal)
        self.assertIn("content no write put there", chk.explain())
        self.assertIsNone(judge(history(SERIAL), image(s40=1))[0])

    def test_update_follows_changes(self):
        h = history(SERIAL)
        chk = h.checker(bytes(DEV))
        img = image(s0=2)
        chk.update(img, range(DEV // SS))
        self.assertIsNone(chk.legal())
        img[8 * SS:9 * SS] = blk(0xb)
        chk.update(img, [8])
        self.assertIsNotNone(chk.legal())

    def test_base_that_is_not_zero(self):
        base = bytes(image(s8=5))
        h = history(SERIAL, base=base)
        chk = h.checker(base)
        chk.update(image(s8=5), range(DEV // SS))
        self.assertIsNotNone(chk.legal())
        chk.update(image(), range(DEV // SS))
        self.assertIsNone(chk.legal())


class InFlight(unittest.TestCase):
    def test_write_in_flight_across_two_flushes(self):
        # A2 issued before F1, completed after F2: a cut before F1
        # completed may hold A2 without B (no flush had made B durable)
        timed = [(A1, 1, 2), (B, 3, 4), (A2, 4.5, 20), (F1, 5, 6), (C, 7, 8),
                 (F2, 11, 12)]
        self.assertIsNotNone(judge(history(timed), image(s0=2))[0])
        # issued after F1 completed: not without B
        timed = [(A1, 1, 2), (B, 3, 4), (F1, 5, 6), (A2, 6.5, 20), (C, 7, 8),
                 (F2, 11, 12)]
        self.assertIsNone(judge(history(timed), image(s0=2))[0])

    def test_flush_issued_before_a_write_completed_does_not_cover_it(self):
        timed = [(A1, 1, 6.5), (F1, 5, 6), (B, 7, 8), (F2, 9, 10)]
        # F1 was issued before A1 completed: nothing makes A1 durable, so
        # a state with B and without A1 is legal
        self.assertIsNotNone(judge(history(timed), image(s8=0xb))[0])


class Races(unittest.TestCase):
    def test_flushes_that_complete_out_of_order(self):
        # F1 takes A1, F2 takes A2 and completes first: A2 is logged first
        timed = [(A1, 1, 2), (F1, 3, 10), (A2, 4, 5), (F2, 6, 7), (("fua", 8, blk(3)), 8, 9)]
        h = history(timed)
        self.assertEqual([v[0] for v in h.versions[0]], [-powercut.INF, 1, 4])
        self.assertIsNotNone(judge(h, image(s0=2, s8=3))[0])

    def test_flush_issued_in_the_microsecond_a_write_completed(self):
        # the flush may have come first: it does not make A2 durable
        timed = [(A1, 1, 2), (A2, 3, 5), (F1, 5, 6), (("fua", 8, blk(3)), 7, 8)]
        self.assertIsNotNone(judge(history(timed), image(s0=1, s8=3))[0])

    def test_write_that_completes_in_the_microsecond_it_was_issued(self):
        timed = [(A1, 1, 1), (F1, 2, 3), (B, 4, 5), (F2, 6, 7)]
        self.assertIsNotNone(judge(history(timed), image(s0=1, s8=0xb))[0])

    def test_overlapping_writes_in_flight_together(self):
        # W (2 sectors) issued first, X (1 sector) inside it; W may land last
        W, X = ("w", 0, blk(2) + blk(2)), ("w", 0, blk(1))
        timed = [(W, 1, 4), (X, 2, 3), (F1, 5, 6), (("fua", 8, blk(3)), 7, 8)]
        self.assertIsNotNone(judge(history(timed), image(s0=2, s1=2, s8=3))[0])
        self.assertIsNotNone(judge(history(timed), image(s0=1, s1=2, s8=3))[0])
        # but not a version that no write of the pair left
        self.assertIsNone(judge(history(timed), image(s1=2, s8=3))[0])


class FuaAndDiscard(unittest.TestCase):
    def test_write_after_a_completed_fua_without_it(self):
        W, X = ("fua", 0, blk(1)), ("w", 8, blk(2))
        self.assertIsNone(judge(history([(W, 1, 2), (X, 3, 4), (F1, 5, 6)]),
                                image(s8=2))[0])
        # issued before the FUA write completed: legal
        self.assertIsNotNone(judge(history([(W, 1, 2), (X, 1.5, 4), (F1, 5, 6)]),
                                   image(s8=2))[0])

    def test_plain_write_logged_after_a_later_fua_one(self):
        # P completes before F, both to sector 0; the log has F first
        P, F = ("w", 0, blk(1)), ("fua", 0, blk(2))
        h = history([(P, 1, 2), (F, 3, 4), (F1, 5, 6)])
        self.assertIsNotNone(judge(h, image(s0=2))[0])
        vs = h.versions[0]
        self.assertEqual([v[0] for v in vs], [-powercut.INF, 1, 3])

    def test_discard_allows_anything_after_it(self):
        D = ("discard", 0, 1)
        timed = [(A1, 1, 2), (F1, 3, 4), (D, 5, 6), (F2, 7, 8)]
        self.assertIsNotNone(judge(history(timed), image(s0=9))[0])
        self.assertIsNone(judge(history(timed), image(s0=9, s1=1))[0])


class Trace(unittest.TestCase):
    TEXT = """# tracer: nop
#
# entries-in-buffer/entries-written: 5/5   #P:2
     kworker/0:1-12    [000] .....   100.000100: block_bio_queue: 254,4 WS 17640 + 8 [kworker/0:1]
     kworker/0:1-12    [000] .....   100.000200: block_bio_queue: 254,4 FWS 0 + 0 [jbd2/dm-6-8]
          <idle>-0     [001] ..s1.   100.000300: block_bio_complete: 254,4 FWS 0 + 0 [0]
          <idle>-0     [001] ..s1.   100.000400: block_bio_complete: 254,4 WS 17640 + 8 [0]
     kworker/0:1-12    [000] .....   100.000500: block_bio_queue: 254,5 WS 8 + 8 [x]
"""

    TEXT2 = """# entries-in-buffer/entries-written: 6/6   #P:2
 a-1 [000] .....   1.000000: block_bio_queue: 254,4 FWFS 88 + 8 [jbd2]
 a-1 [000] .....   2.000000: block_bio_complete: 254,4 WFS 88 + 8 [0]
 a-1 [000] .....   3.000000: block_bio_queue: 254,4 FWS 0 + 0 [a]
 a-1 [000] .....   3.500000: block_bio_queue: 254,4 FWS 0 + 0 [b]
 a-1 [000] .....   4.000000: block_bio_complete: 254,4 FWS 0 + 0 [0]
 a-1 [000] .....   5.000000: block_bio_complete: 254,4 FWS 0 + 0 [0]
"""

    def test_reads_are_not_writes(self):
        timed = [(A1, 1, 2), (F1, 3, 4)]
        h = history(timed)
        read = powercut.Bio(0, 1, "RA", 0.5, 0.6)
        with logwrites.LogWrites.open(make_log([("mark", "s"), A1, F1])) as lw:
            h2 = powercut.History(lw, 0, bytes(DEV), [read] + [
                powercut.Bio(0, 1, "WS", 1, 2), powercut.Bio(0, 0, "FWS", 3, 4)])
        self.assertEqual(h.versions[0], h2.versions[0])

    def test_fua(self):
        fua = [powercut.Bio(0, 8, r, 0) for r in ("WFS", "FWFS", "FWS", "WS", "DS")]
        self.assertEqual([b.is_fua for b in fua], [True, True, False, False, False])

    def test_flush_with_data_and_overlapping_flushes(self):
        w, f1, f2 = powercut.parse_trace(self.TEXT2, 254, 4)
        self.assertTrue(w.is_flush)
        self.assertEqual((w.issued, w.done), (1.0, 2.0))
        # which of the two flushes completed at 4 is unknown: both at 5
        self.assertEqual((f1.issued, f1.done, f2.issued, f2.done), (3.0, 5.0, 3.5, 5.0))

    def test_parse(self):
        bios = powercut.parse_trace(self.TEXT, 254, 4)
        self.assertEqual(len(bios), 2)
        w, f = bios
        self.assertEqual((w.sector, w.nr, w.issued, w.done), (17640, 8, 100.0001, 100.0004))
        self.assertTrue(f.is_flush)
        self.assertFalse(w.is_flush)
        self.assertEqual(f.done, 100.0003)


if __name__ == "__main__":
    unittest.main()
