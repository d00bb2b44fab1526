#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Model-checked stress test of the tiercache target (the project's fsx).

Runs as root inside the test VM (tests/vm/test_95_stress.py, `make soak`),
or by hand there:

    python3 tests/vm/stress.py --seed 7 --seconds 120 --threads 4

Stack: origin = dm-delay over a discard-capable, memory-backed null_blk
(reads of discarded sectors give zeroes); cache = dm-linear over a RAM
disk, small (eviction, write-around); tiercache on top.  The origin's and
the cache's dm tables are swapped to `error` or `flakey` tables and back
(fault windows).

IO threads (O_DIRECT, page-aligned mmap buffers, one op at a time each):
reads, block-aligned writes, partial (sector-aligned) writes, FUA writes
(O_DSYNC), discards (BLKDISCARD), fsync and fdatasync (PREFLUSH).  Every
sector written carries (magic, sector, write id) 32 times, so a read
decodes which write it sees.

The model keeps, per 512-byte sector, the candidate contents: the writes
that may be visible.  A write that completed before another *successful*
write of the sector began is superseded for every read that begins after
that second write completed; writes in flight (overlapping the read) are
accepted; a failed write (EIO in a fault window) makes the sector
"unknown" (any content) until a successful write supersedes it; a discard
adds "zeroes" to the candidates (the previous content stays acceptable).
Rules:
  stale      a read returns a content that is not a candidate
  stable     (pin, on by default) once a read has seen one of several
             candidates (or an unknown content) with no write or discard
             to that sector overlapping it, later reads see the same until
             the next write: a device's content does not change by itself
             (--no-pin: off; --lax-discard: off after partial-block discards)
  eio        an IO error outside a fault window (+ grace)
  hang       an IO or control step exceeds --deadline
  control    a control command refused that must not be (only a
             passthrough reload while dirty, or anything inside a fault
             window, may be refused; invalid `set` values must be refused)
  flush      a `flush` message raises no dm event within --deadline
  final      after the final flush (dirty 0, error 0) the device and the
             origin (read directly) equal the model; swapping the table to
             linear releases the cache device
Kernel log: warnings and worse fail the run (checked at the end).

Deterministic given --seed: each IO thread's op sequence and the control
schedule (the actions and the sleeps between them) come from seeded RNGs.
The interleaving is not.  A failure prints the seed and the command line
that replays it.
"""

import argparse
import collections
import errno
import fcntl
import itertools
import mmap
import os
import random
import struct
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kernlog  # noqa: E402
import tclib  # noqa: E402

SECTOR = 512
MAGIC = 0x54435354          # "TSCT"
HDR = struct.Struct("<IIQ")  # magic, sector, write id
ZERO = bytes(SECTOR)
BLKDISCARD = 0x1277
KiB, MiB = 1024, 1024 * 1024


def sector_data(wid, s0, n):
    return b"".join([HDR.pack(MAGIC, s & 0xffffffff, wid) * 32 for s in range(s0, s0 + n)])


class Failure(Exception):
    def __init__(self, rule, detail):
        self.rule, self.detail = rule, detail
        super().__init__(f"{rule}: {detail}")


# ---------------------------------------------------------------- model

class Cand:
    """One possible content of the sectors it is listed in.

    kind: 'w' write (wid), 'd' discard (zeroes), 'o' observation (pin),
    'i' initial content (wid 0).  ok: None in flight, True done, False
    failed (a write: any content).  raw: observed bytes of a pin that
    decodes to nothing known.
    """
    __slots__ = ("kind", "wid", "start", "end", "ok", "raw", "desc")

    def __init__(self, kind, wid, start, end=None, ok=None, raw=None, desc=""):
        self.kind, self.wid, self.start, self.end = kind, wid, start, end
        self.ok, self.raw, self.desc = ok, raw, desc

    def supersedes(self):
        return self.ok is True and self.kind in "wio"

    def matches(self, obs):
        """obs: ('w', wid) | ('z',) | ('g', bytes)"""
        if self.ok is False:
            return True                 # failed write or discard: unknown content
        if self.kind == "d":
            return obs[0] == "z"
        if self.kind == "o":
            if self.raw is not None:
                return obs[0] == "g" and obs[1] == self.raw
            if self.wid == -1:
                return obs[0] == "z"
            return obs[0] == "w" and obs[1] == self.wid
        return obs[0] == "w" and obs[1] == self.wid

    def __repr__(self):
        st = {None: "inflight", True: "ok", False: "FAILED"}[self.ok]
        what = {"w": f"write#{self.wid}", "d": "discard(zeroes)", "i": "initial",
                "o": f"seen({'garbage' if self.raw is not None else self.wid})"}[self.kind]
        return f"{what}[{self.start}..{self.end} {st}{' ' + self.desc if self.desc else ''}]"


INIT = Cand("i", 0, -2, -1, True)


def decode(mv, s):
    """What a sector read back holds: ('w', wid), ('z',) or ('g', bytes)."""
    magic, sec, wid = HDR.unpack_from(mv, 0)
    if magic == MAGIC and sec == (s & 0xffffffff) and mv == HDR.pack(magic, sec, wid) * 32:
        return ("w", wid)
    if mv == ZERO:
        return ("z",)
    return ("g", bytes(mv))


def obs_str(obs):
    if obs[0] == "w":
        return f"write#{obs[1]}" if obs[1] else "initial"
    if obs[0] == "z":
        return "zeroes"
    return "garbage " + obs[1][:16].hex()


class Model:
    def __init__(self, nsect, pin=True):
        self.n = nsect
        self.c = [None] * nsect         # None: [INIT]
        self.lock = threading.Lock()
        self.clock = itertools.count()
        self.wids = itertools.count(1)
        self.read_starts = {}           # thread -> logical start of its read in flight
        self.pin = pin
        self.lax_discard = False
        self.pins = 0
        self.unknown_sectors = 0

    def _list(self, s):
        lst = self.c[s]
        if lst is None:
            lst = self.c[s] = [INIT]
        return lst

    def _min_rs(self, now):
        return min(self.read_starts.values(), default=now)

    @staticmethod
    def _gc(lst, min_rs):
        if len(lst) < 2:
            return lst
        keep = []
        for c in lst:
            if c.end is not None and any(d.supersedes() and d.start > c.end and d.end < min_rs
                                         for d in lst):
                continue
            keep.append(c)
        return keep

    def begin_write(self, kind, s0, n, desc=""):
        with self.lock:
            now = next(self.clock)
            wid = next(self.wids) if kind == "w" else -1
            c = Cand(kind, wid, now, desc=desc)
            min_rs = self._min_rs(now)
            for s in range(s0, s0 + n):
                lst = self._gc(self._list(s), min_rs)
                lst.append(c)
                self.c[s] = lst
            return c

    def end_write(self, c, ok):
        with self.lock:
            c.end = next(self.clock)
            c.ok = ok

    def begin_read(self, tid):
        with self.lock:
            rs = next(self.clock)
            self.read_starts[tid] = rs
            return rs

    def abort_read(self, tid):
        with self.lock:
            self.read_starts.pop(tid, None)

    def check_read(self, tid, rs, mv, s0, n, what):
        """Check n sectors read at s0 (started at logical time rs)."""
        with self.lock:
            re_ = next(self.clock)
            self.read_starts.pop(tid, None)
            for i in range(n):
                s = s0 + i
                lst = self._list(s)
                obs = decode(mv[i * SECTOR:(i + 1) * SECTOR], s)
                live = [c for c in lst
                        if not (c.end is not None and
                                any(d.supersedes() and d.start > c.end and d.end < rs
                                    for d in lst))]
                if not any(c.matches(obs) for c in live):
                    # against a pin: the content changed with no write
                    rule = "stable" if any(c.kind == "o" for c in live) else "stale"
                    raise Failure(rule, f"{what}: sector {s} (4k-block {s // 8}) read "
                                  f"{obs_str(obs)}; acceptable: {live}")
                if not self.pin:
                    continue
                if len(live) == 1 and live[0].kind in "wio" and live[0].ok is not False:
                    continue            # unambiguous already
                if any(c.end is None or c.end >= rs for c in lst):
                    continue            # a write/discard overlapped this read
                if self.lax_discard and any(c.kind == "d" and c.desc.endswith("partial")
                                            for c in live):
                    continue
                why = "of " + ", ".join(map(repr, live))
                if obs[0] == "w":
                    p = Cand("o", obs[1], rs, re_, True, desc=why)
                elif obs[0] == "z":
                    p = Cand("o", -1, rs, re_, True, desc=why)
                else:
                    p = Cand("o", None, rs, re_, True, raw=obs[1], desc=why)
                lst.append(p)
                self.c[s] = self._gc(lst, self._min_rs(re_))
                self.pins += 1

    def count_unknown(self):
        with self.lock:
            return sum(1 for lst in self.c if lst is not None and
                       any(c.kind == "w" and c.ok is False for c in lst))


# ---------------------------------------------------------------- IO threads

OPS = ["read", "write", "partial", "fua", "discard", "fsync", "fdatasync"]
OP_WEIGHTS = [36, 22, 16, 9, 6, 6, 5]


class Worker(threading.Thread):
    def __init__(self, st, idx):
        super().__init__(name=f"io{idx}", daemon=True)
        self.st = st
        self.idx = idx
        self.rng = random.Random(f"{st.args.seed}-io-{idx}")
        self.cur = None                 # (description, wall start)
        self.counts = collections.Counter()
        self.nops = 0

    def pick(self):
        st, r = self.st, self.rng
        op = r.choices(OPS, OP_WEIGHTS)[0]
        bs = st.block_sectors
        nsect = st.nsect
        if r.random() < 0.75:           # hot region: about twice the cache
            lo, hi = st.hot
        else:
            lo, hi = 0, nsect
        if op in ("write", "fua") and (op == "write" or r.random() < 0.6):
            nb = max(1, int(2 ** r.uniform(0, 4)))          # 1..16 blocks
            nb = min(nb, max(1, st.max_io // (bs * SECTOR)))
            n = nb * bs
            s0 = r.randrange(lo // bs, (hi - n) // bs + 1) * bs
        elif op in ("fsync", "fdatasync"):
            return op, 0, 0
        elif op == "discard" and r.random() < 0.5:          # whole blocks
            nb = max(1, int(2 ** r.uniform(0, 3)))
            n = nb * bs
            s0 = r.randrange(lo // bs, (hi - n) // bs + 1) * bs
        else:
            n = max(1, int(2 ** r.uniform(0, 7)))           # 1..128 sectors
            if op in ("partial", "fua") and n % bs == 0:
                n += 1
            n = min(n, st.max_io // SECTOR)
            s0 = r.randrange(lo, hi - n + 1)
        return op, s0, n

    def run(self):
        st = self.st
        fd = os.open(st.tc_path, os.O_RDWR | os.O_DIRECT)
        fdf = os.open(st.tc_path, os.O_RDWR | os.O_DIRECT | os.O_DSYNC)
        buf = mmap.mmap(-1, st.max_io)
        mv = memoryview(buf)
        try:
            while not st.stop.is_set():
                op, s0, n = self.pick()
                self.nops += 1
                desc = f"{self.name} op {self.nops}: {op} sectors {s0}+{n}"
                self.cur = (desc, time.monotonic())
                self.do(op, s0, n, fd, fdf, buf, mv, desc)
                self.cur = None
        except Failure as f:
            st.fail(f.rule, f"{f.detail} [fault windows: {st.last_window()}]")
        except Exception:
            st.fail("crash", f"{self.name}: {traceback.format_exc()}")
        finally:
            self.cur = None
            mv.release()
            buf.close()
            os.close(fd)
            os.close(fdf)

    def _err(self, op, e, t0, desc):
        """An IO error: allowed only around a fault window."""
        self.counts[f"{op}_err"] += 1
        if not self.st.in_fault(t0, time.monotonic()):
            raise Failure("eio", f"{desc}: {e} outside a fault window "
                          f"(last window {self.st.last_window()})")

    def do(self, op, s0, n, fd, fdf, buf, mv, desc):
        st, m = self.st, self.st.model
        t0 = time.monotonic()
        off, ln = s0 * SECTOR, n * SECTOR
        self.counts[op] += 1
        if op == "read":
            rs = m.begin_read(self.idx)
            try:
                got = os.preadv(fd, [mv[:ln]], off)
            except OSError as e:
                m.abort_read(self.idx)
                self._err(op, e, t0, desc)
                return
            if got != ln:
                m.abort_read(self.idx)
                raise Failure("eio", f"{desc}: short read {got}")
            m.check_read(self.idx, rs, mv[:ln], s0, n, desc)
        elif op in ("write", "partial", "fua"):
            c = m.begin_write("w", s0, n, desc=f"{self.name}#{self.nops}")
            buf[:ln] = sector_data(c.wid, s0, n)
            ok = False
            try:
                got = os.pwritev(fdf if op == "fua" else fd, [mv[:ln]], off)
                ok = got == ln
                if not ok:
                    self._err(op, f"short write {got}", t0, desc)
            except OSError as e:
                self._err(op, e, t0, desc)
            finally:
                m.end_write(c, ok)
        elif op == "discard":
            bs = st.block_sectors
            c = m.begin_write("d", s0, n, desc=f"{self.name}#{self.nops} {s0}+{n} " + (
                "whole blocks" if s0 % bs == 0 and n % bs == 0 else "partial"))
            ok = False
            try:
                fcntl.ioctl(fd, BLKDISCARD, struct.pack("QQ", off, ln))
                ok = True
            except OSError as e:
                if e.errno in (errno.EOPNOTSUPP, errno.EINVAL):
                    self.counts["discard_refused"] += 1
                    ok = True           # zeroes or the old content, as a discard
                else:
                    self._err(op, e, t0, desc)
            finally:
                m.end_write(c, ok)
        elif op in ("fsync", "fdatasync"):
            try:
                (os.fsync if op == "fsync" else os.fdatasync)(fd)
            except OSError as e:
                self._err(op, e, t0, desc)


# ---------------------------------------------------------------- control

KEYS = ["flush_depth", "max_flush_kb", "bridge_gap_kb", "high_watermark",
        "low_watermark", "flush_on_suspend", "ordered"]
ACTIONS = ["flush", "cleaner", "set", "set_bad", "reload_mode", "reload_same",
           "suspend", "fault", "stats"]
ACTION_WEIGHTS = [12, 7, 22, 4, 7, 4, 6, 6, 2]


class Control(threading.Thread):
    def __init__(self, st):
        super().__init__(name="control", daemon=True)
        self.st = st
        self.rng = random.Random(f"{st.args.seed}-control")
        self.cur = None
        self.counts = collections.Counter()
        self.steps = 0
        self.history = collections.deque(maxlen=40)
        self.fault = None               # (what, kind, steps left)
        self.flush_pending = None       # (event_nr, wall start, step)

    # --- commands
    def cmd(self, args, check=True, timeout=None):
        timeout = timeout or self.st.args.deadline
        t0 = time.monotonic()
        try:
            p = tclib.run(args, check=False, timeout=timeout, quiet=True)
        except subprocess.TimeoutExpired:
            raise Failure("hang", f"control step {self.steps}: `{' '.join(map(str, args))}` "
                          f"did not return within {timeout}s")
        dt = time.monotonic() - t0
        self.history.append(f"{time.monotonic() - self.st.t0:8.2f}s step {self.steps}: "
                            f"{' '.join(map(str, args))} -> rc {p.returncode} ({dt:.2f}s)"
                            + (f" {p.stderr.strip()[:200]}" if p.returncode else ""))
        if check and p.returncode != 0:
            raise Failure("control", f"step {self.steps}: `{' '.join(map(str, args))}` "
                          f"failed (rc {p.returncode}): {p.stderr.strip()}"
                          + (f" [fault window: {self.fault}]" if self.fault else ""))
        return p

    def tc(self, *words, check=True):
        return self.cmd(["dmsetup"] + list(words), check=check)

    def message(self, *words, check=True):
        return self.tc("message", self.st.tc_name, "0", *map(str, words), check=check)

    def status(self):
        line = self.tc("status", self.st.tc_name).stdout.strip()
        d = tclib.parse_status(line)
        if not (d["dirty"] <= d["used"] <= d["total"]):
            raise Failure("status", f"dirty <= used <= total broken: {line}")
        return d

    def event_nr(self):
        return int(self.tc("info", "-c", "--noheadings", "-o", "events",
                           self.st.tc_name).stdout.strip())

    def suspended(self, name):
        out = self.tc("info", name).stdout
        return "SUSPENDED" in out

    # --- actions
    def table(self, mode, keys):
        st = self.st
        feat = [mode] + [str(x) for kv in keys for x in kv]
        return (f"0 {st.nsect} tiercache {st.origin_path} {st.cache_path} "
                f"{st.block_sectors} {len(feat)} " + " ".join(feat))

    def random_keys(self):
        r, st = self.rng, self.st
        keys = []
        bkb = st.block_sectors // 2
        mf = None
        if r.random() < 0.5:
            keys.append(("flush_depth", r.choice([1, 2, 4, 16, 128, 4096])))
        if r.random() < 0.5:
            mf = r.choice([bkb, 64, 256, 1024, 16384])
            mf = max(bkb, mf // bkb * bkb)
            keys.append(("max_flush_kb", mf))
        if r.random() < 0.5:
            keys.append(("bridge_gap_kb", r.choice([0, bkb, 64, 1024])
                         if mf is None else r.choice([0, mf // 2, mf])))
            if mf is None and keys[-1][1] > 1024:
                keys[-1] = ("bridge_gap_kb", 1024)
        if r.random() < 0.5:
            hi = r.choice([1, 5, 20, 50, 90, 100])
            lo = r.randint(0, hi)
            # valid whichever order the constructor checks them in (the
            # defaults are 50 and 10)
            if hi < 10:
                keys += [("low_watermark", lo), ("high_watermark", hi)]
            else:
                keys += [("high_watermark", hi), ("low_watermark", lo)]
        if r.random() < 0.3:
            keys.append(("flush_on_suspend", r.randint(0, 1)))
        if r.random() < 0.3:
            keys.append(("commit_ms", r.choice([1, 50, 1000, 600000])))
        return keys

    def do_set(self):
        r = self.rng
        bkb = self.st.block_sectors // 2
        key = r.choice(KEYS)
        seq = []
        if key == "flush_depth":
            seq = [(key, r.choice([1, 2, 3, 8, 64, 128, 1000, 4096]))]
        elif key in ("max_flush_kb", "bridge_gap_kb"):
            # valid whatever the current values: no hole, then the limit,
            # then a hole that fits
            mf = r.choice([bkb, 2 * bkb, 100, 512, 1024, 4096, 16384])
            mf = max(bkb, mf // bkb * bkb)
            seq = [("bridge_gap_kb", 0), ("max_flush_kb", mf),
                   ("bridge_gap_kb", r.choice([0, bkb, mf // 3, mf]))]
        elif key in ("high_watermark", "low_watermark"):
            hi = r.randint(1, 100)
            seq = [("low_watermark", 0), ("high_watermark", hi),
                   ("low_watermark", r.randint(0, hi))]
        else:
            seq = [(key, r.randint(0, 1))]
        for k, v in seq:
            self.message("set", k, v)
        self.counts["set"] += 1
        self.counts[f"set_{key}"] += 1

    def do_set_bad(self):
        bkb = self.st.block_sectors // 2
        k, v = self.rng.choice([("flush_depth", 0), ("flush_depth", 4097),
                                ("max_flush_kb", 16385), ("max_flush_kb", max(1, bkb // 2)),
                                ("bridge_gap_kb", 16385), ("high_watermark", 0),
                                ("high_watermark", 101), ("low_watermark", 101),
                                ("flush_on_suspend", 2), ("no_such_key", 1),
                                ("flush_depth", "x")])
        if k == "max_flush_kb" and v == 0:
            v = 16385
        p = self.message("set", k, v, check=False)
        self.counts["set_bad"] += 1
        if p.returncode == 0:
            raise Failure("control", f"step {self.steps}: invalid `set {k} {v}` accepted")

    def do_reload(self, same):
        st = self.st
        if same:
            t = self.tc("table", st.tc_name).stdout.strip()
            w = t.split()
            mode = w[7] if len(w) > 7 and w[7] in tclib.MODES else "writeback"
            self.counts["reload_same"] += 1
        else:
            mode = self.rng.choice(["writeback", "writeback", "writethrough", "passthrough"])
            t = self.table(mode, self.random_keys())
            self.counts[f"reload_{mode}"] += 1
        p = self.tc("reload", st.tc_name, "--table", t, check=False)
        if p.returncode != 0:
            if mode == "passthrough" and not same:
                self.counts["passthrough_refused_at_load"] += 1
                return
            if self.fault:
                self.counts["reload_refused_in_fault"] += 1
                return
            raise Failure("control", f"step {self.steps}: reload refused: {t}: "
                          f"{p.stderr.strip()}")
        p = self.tc("resume", st.tc_name, check=False)
        if p.returncode != 0:
            if self.suspended(st.tc_name):
                err = p.stderr.strip()
                # recover so that the run can end, then fail
                self.tc("reload", st.tc_name, "--table", self.table("writeback", []),
                        check=False)
                self.tc("resume", st.tc_name, check=False)
                raise Failure("control", f"step {self.steps}: resume after reload to {mode} "
                              f"failed and left the device suspended ({err}): {t}")
            self.counts[f"{mode}_refused_at_resume"] += 1
            return
        self.counts["reloads"] += 1

    def fault_tables(self, what):
        st = self.st
        if what == "origin":
            dev, n = st.nullb, st.nsect
        else:
            dev, n = st.ram, st.cache_sectors
        return {
            "error": f"0 {n} error",
            "error_writes": f"0 {n} flakey {dev} 0 0 3600 1 error_writes",
            "flaky": f"0 {n} flakey {dev} 0 1 1",
        }

    def swap(self, what, table):
        name = self.st.origin_name if what == "origin" else self.st.cache_name
        self.tc("suspend", name)
        self.tc("load", name, "--table", table)
        self.tc("resume", name)

    def open_fault(self):
        r = self.rng
        what = r.choice(["origin", "origin", "cache"])
        kind = r.choice(["error", "error_writes", "flaky"])
        steps = r.randint(2, 8)
        with self.st.wlock:
            self.st.windows.append([time.monotonic(), None, what, kind])
        self.fault = (what, kind, steps)
        self.swap(what, self.fault_tables(what)[kind])
        self.counts["faults"] += 1
        self.counts[f"fault_{what}_{kind}"] += 1

    def close_fault(self):
        what = self.fault[0]
        self.swap(what, self.st.healthy[what])
        if what == "cache":
            self.recover_failed_cache()
        with self.st.wlock:
            self.st.windows[-1][1] = time.monotonic()
        self.fault = None

    def recover_failed_cache(self):
        """A cache device that failed during the window latched the failed
        state (status field 23), which lasts (docs/tiercache.rst, "Failure
        handling"): recover as an administrator would, the window still
        open (writes to dirty blocks may fail until then).  Flush until
        nothing is dirty (the healed device reads again), then build a new
        cache state: a linear table of the origin, then the tiercache
        table again, with `format` if the superblock was marked failed."""
        st = self.st
        d = self.status()
        if not d["cache_failed"]:
            return
        self.counts["failed_recoveries"] += 1
        deadline = time.monotonic() + self.st.args.deadline
        while True:
            self.message("flush")
            d = self.status()
            while d["flush_state"] != "idle" or (d["dirty"] and not d["error"]):
                if time.monotonic() > deadline:
                    raise Failure("hang", f"step {self.steps}: the failed cache does not "
                                  f"flush after its device healed: {d['raw']}")
                time.sleep(0.2)
                d = self.status()
            if not d["dirty"]:
                break
            time.sleep(0.5)
        t = self.tc("table", st.tc_name).stdout.strip()
        self.tc("suspend", st.tc_name)
        self.tc("load", st.tc_name, "--table", f"0 {st.nsect} linear {st.origin_path} 0")
        self.tc("resume", st.tc_name)
        self.tc("suspend", st.tc_name)
        if self.tc("load", st.tc_name, "--table", t, check=False).returncode:
            w = t.split()
            w[6:7] = [str(int(w[6]) + 1), "format"]
            self.tc("load", st.tc_name, "--table", " ".join(w))
            self.counts["failed_formats"] += 1
        self.tc("resume", st.tc_name)

    def step(self):
        r = self.rng
        self.steps += 1
        act = r.choices(ACTIONS, ACTION_WEIGHTS)[0]
        pause = r.uniform(0.05, 1.0)
        self.cur = (f"control step {self.steps}: {act}", time.monotonic())
        if act == "fault" and self.fault:
            act = "flush"
        if act == "flush":
            ev = self.event_nr()
            self.message("flush")
            if self.flush_pending is None:
                self.flush_pending = (ev, time.monotonic(), self.steps)
            self.counts["flush"] += 1
        elif act == "cleaner":
            self.message("cleaner", r.choice(["on", "off"]))
            self.counts["cleaner"] += 1
        elif act == "set":
            self.do_set()
        elif act == "set_bad":
            self.do_set_bad()
        elif act == "reload_mode":
            self.do_reload(False)
        elif act == "reload_same":
            self.do_reload(True)
        elif act == "suspend":
            self.tc("suspend", self.st.tc_name)
            time.sleep(r.uniform(0, 0.5))
            self.tc("resume", self.st.tc_name)
            self.counts["suspend"] += 1
        elif act == "fault":
            self.open_fault()
        elif act == "stats":
            self.message("stats", "reset")
            self.counts["stats_reset"] += 1
        if self.fault and act != "fault":
            what, kind, left = self.fault
            if left <= 1:
                self.close_fault()
            else:
                self.fault = (what, kind, left - 1)
        d = self.status()
        self.st.last_status = d["raw"]
        self.check_flush()
        self.cur = None
        time.sleep(pause)

    def check_flush(self):
        if self.flush_pending is None:
            return
        ev, t, step = self.flush_pending
        if self.event_nr() > ev:
            self.flush_pending = None
            self.counts["flush_events"] += 1
        elif time.monotonic() - t > self.st.args.deadline:
            raise Failure("flush", f"the flush sent at control step {step} raised no dm "
                          f"event in {self.st.args.deadline}s; status {self.st.last_status}")

    def run(self):
        try:
            while not self.st.stop.is_set():
                self.step()
        except Failure as f:
            self.st.fail(f.rule, f.detail)
        except Exception:
            self.st.fail("crash", f"control: {traceback.format_exc()}")
        finally:
            self.cur = None


# ---------------------------------------------------------------- the run

class Stress:
    def __init__(self, args):
        self.args = args
        self.stop = threading.Event()
        self.failures = []
        self.flock = threading.Lock()
        self.wlock = threading.Lock()
        self.windows = []               # [open wall, close wall|None, what, kind]
        self.last_status = ""
        r = random.Random(f"{args.seed}-setup")
        self.block_sectors = args.block or r.choice([8, 8, 16, 32])
        self.read_ms = r.choice([0, 1, 2])
        self.write_ms = r.choice([2, 3, 5])
        self.max_io = 128 * KiB
        self.t0 = time.monotonic()

    def log(self, msg):
        print(f"[stress {time.monotonic() - self.t0:8.2f}s] {msg}", flush=True)

    def fail(self, rule, detail):
        with self.flock:
            self.failures.append((rule, detail))
        self.stop.set()

    def in_fault(self, t0, t1):
        g = self.args.grace
        with self.wlock:
            return any(o <= t1 and (c is None or t0 <= c + g) for o, c, _, _ in self.windows)

    def last_window(self):
        with self.wlock:
            if not self.windows:
                return "none"
            n = len(self.windows)
            o, c, what, kind = self.windows[-1]
            now = time.monotonic()
            return (f"{n} so far, the last: {what} {kind} opened {now - o:.2f}s ago, "
                    + ("still open" if c is None else f"closed {now - c:.2f}s ago"))

    def setup(self, stack):
        a = self.args
        self.ram = stack.ram(tclib.Stack.RD_SIZE_KIB * KiB)     # /dev/ram0, whole
        self.cache_sectors = a.cache_kib * 2
        self.nullb = stack.nullb(a.origin_mib, discard=True)
        self.nsect = a.origin_mib * MiB // SECTOR
        # the initial content: write id 0 in every sector
        fd = os.open(self.nullb, os.O_WRONLY | os.O_DIRECT)
        buf = mmap.mmap(-1, MiB)
        try:
            per = MiB // SECTOR
            for s0 in range(0, self.nsect, per):
                buf[:] = sector_data(0, s0, per)
                os.pwrite(fd, buf, s0 * SECTOR)
            os.fsync(fd)
        finally:
            buf.close()
            os.close(fd)
        self.healthy = {
            "origin": f"0 {self.nsect} delay {self.nullb} 0 {self.read_ms} "
                      f"{self.nullb} 0 {self.write_ms}",
            "cache": f"0 {self.cache_sectors} linear {self.ram} 0",
        }
        self.origin_name, self.cache_name, self.tc_name = "st-origin", "st-cache", "st-tc"
        self.origin_path = stack.dm(self.origin_name, self.healthy["origin"]).path
        self.cache_path = stack.dm(self.cache_name, self.healthy["cache"]).path
        tc = stack.tiercache(self.origin_path, self.cache_path, self.block_sectors,
                             "writeback", name=self.tc_name,
                             keys={"bridge_gap_kb": 64, "high_watermark": 30,
                                   "low_watermark": 10})
        self.tc = tc
        self.tc_path = tc.path
        st = tc.status()
        self.slots = st["total"]
        # the hot region: about twice the cache, at a seeded place
        r = random.Random(f"{a.seed}-hot")
        hot = min(self.nsect, 2 * self.slots * self.block_sectors)
        lo = r.randrange(0, self.nsect - hot + 1) // self.block_sectors * self.block_sectors
        self.hot = (lo, lo + hot)
        self.model = Model(self.nsect, pin=not a.no_pin)
        self.model.lax_discard = a.lax_discard
        self.log(f"seed {a.seed}: block {self.block_sectors} sectors, cache {a.cache_kib} KiB "
                 f"= {self.slots} slots, origin {a.origin_mib} MiB (delay r {self.read_ms} ms "
                 f"w {self.write_ms} ms), hot sectors [{self.hot[0]}, {self.hot[1]}), "
                 f"{a.threads} threads, {a.seconds} s")

    def watchdog(self, threads, ctl, until):
        """Wait until `until` (monotonic) or a failure; fail on any step
        older than the deadline.  Progress lines every --progress s."""
        nextp = time.monotonic() + self.args.progress
        while not self.stop.is_set() and time.monotonic() < until:
            time.sleep(0.25)
            self.check_deadlines(threads)
            self.check_deadlines([ctl], 3)
            if time.monotonic() >= nextp:
                nextp += self.args.progress
                self.log("progress: " + self.summary(threads, ctl, short=True))

    def check_deadlines(self, actors, factor=1):
        """IO ops: --deadline.  Control steps (several commands, each with
        its own --deadline timeout): 3 x --deadline."""
        now = time.monotonic()
        for t in actors:
            cur = t.cur
            if cur and now - cur[1] > factor * self.args.deadline:
                self.hang(f"{cur[0]} running for {now - cur[1]:.0f}s")

    def hang(self, what):
        self.log(f"HANG: {what}")
        for name in (self.tc_name, self.origin_name, self.cache_name):
            try:
                self.log(f"{name}: " + tclib.run(["dmsetup", "status", name], timeout=10,
                                                 quiet=True, check=False).stdout.strip())
                self.log(f"{name}: " + " ".join(tclib.run(["dmsetup", "info", name], timeout=10,
                                                          quiet=True, check=False).stdout.split()))
            except Exception as e:
                self.log(f"{name}: {e}")
        # blocked tasks, then every CPU's stack (a worker that spins is not blocked)
        for key in ("w", "l"):
            tclib.sysrq(key)
        self.report_fail("hang", what)
        sys.stdout.flush()
        os._exit(2)                     # threads stuck in the kernel cannot be joined

    def summary(self, threads, ctl, short=False):
        ops = collections.Counter()
        for t in threads:
            ops.update(t.counts)
        kinds = " ".join(f"{k}={ops[k]}" for k in OPS)
        errs = " ".join(f"{k}={v}" for k, v in sorted(ops.items()) if k not in OPS)
        c = ctl.counts
        ctl_s = " ".join(f"{k}={v}" for k, v in sorted(c.items()))
        s = (f"ops {sum(ops[k] for k in OPS)} ({kinds}) errors/refusals ({errs or 'none'}) "
             f"control steps {ctl.steps}: {ctl_s}")
        if not short:
            s += f"; pins {self.model.pins}"
        return s

    def report_fail(self, rule, detail):
        a = self.args
        print(f"STRESS FAIL seed={a.seed} rule={rule}: {detail}", flush=True)
        print(f"replay: python3 tests/vm/stress.py --seed {a.seed} --seconds {a.seconds} "
              f"--threads {a.threads}" + (f" --block {a.block}" if a.block else ""), flush=True)

    def final(self, ctl):
        """Stop, heal, flush, and compare device and origin with the model."""
        a = self.args
        m = self.model

        def step(name, args, timeout=None, check=True):
            try:
                p = tclib.run(args, timeout=timeout or a.deadline, quiet=True, check=False)
            except subprocess.TimeoutExpired:
                raise Failure("hang", f"final step '{name}' did not end within "
                              f"{timeout or a.deadline}s")
            if check and p.returncode != 0:
                raise Failure("final", f"final step '{name}': {p.stderr.strip()}")
            return p

        if ctl.fault:
            ctl.close_fault()
        for name in (self.origin_name, self.cache_name, self.tc_name):
            if "SUSPENDED" in step("info", ["dmsetup", "info", name]).stdout:
                step("resume", ["dmsetup", "resume", name])
        step("cleaner off", ["dmsetup", "message", self.tc_name, "0", "cleaner", "off"])
        self.log("final: reading the whole device through the cache")
        self.verify(self.tc_path, "final read through tiercache")
        # the final flush: retried once (an error latched by a fault window
        # may end the first one)
        for attempt in (1, 2):
            ev = ctl.event_nr()
            step("flush", ["dmsetup", "message", self.tc_name, "0", "flush"])
            step("wait for the flush event", ["dmsetup", "wait", self.tc_name, str(ev)])
            deadline = time.monotonic() + a.deadline
            while True:
                d = ctl.status()
                if d["flush_state"] == "idle" and (d["dirty"] == 0 or d["error"]):
                    break
                if time.monotonic() > deadline:
                    raise Failure("hang", f"final flush: not idle and clean after "
                                  f"{a.deadline}s: {d['raw']}")
                time.sleep(0.2)
            if d["dirty"] == 0 and d["error"] == 0:
                break
        if d["dirty"] or d["error"]:
            raise Failure("final", f"final flush (twice) left dirty {d['dirty']} error "
                          f"{d['error']}: {d['raw']}")
        self.log(f"final: flushed: {d['raw']}")
        self.verify(self.tc_path, "read through tiercache after the final flush")
        self.verify(self.nullb, "origin read directly after the final flush")
        # swap the table to linear: the cache device must be released
        step("suspend", ["dmsetup", "suspend", self.tc_name])
        step("load linear", ["dmsetup", "load", self.tc_name, "--table",
                             f"0 {self.nsect} linear {self.origin_path} 0"])
        step("resume linear", ["dmsetup", "resume", self.tc_name])
        self.verify(self.tc_path, "origin through the table swapped to linear")
        opn = step("cache open count", ["dmsetup", "info", "-c", "--noheadings", "-o", "open",
                                        self.cache_name]).stdout.strip()
        if opn != "0":
            raise Failure("final", f"the cache device {self.cache_name} is still open "
                          f"({opn}) after the tiercache table was swapped to linear")
        self.log(f"final: device, origin and linear swap match the model "
                 f"({m.count_unknown()} sectors had failed writes; pins {m.pins})")

    def verify(self, path, what):
        m = self.model
        chunk = MiB
        buf = mmap.mmap(-1, chunk)
        mv = memoryview(buf)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            per = chunk // SECTOR
            for s0 in range(0, self.nsect, per):
                rs = m.begin_read("final")
                got = os.preadv(fd, [mv], s0 * SECTOR)
                if got != chunk:
                    raise Failure("final", f"{what}: short read {got} at sector {s0}")
                m.check_read("final", rs, mv, s0, per, what)
        except OSError as e:
            raise Failure("final", f"{what}: {e}")
        finally:
            mv.release()
            buf.close()
            os.close(fd)

    def run(self):
        a = self.args
        stack = tclib.Stack(prefix="st")
        cursor = tclib.KmsgCursor(f"stress seed {a.seed}")
        threads, ctl = [], None
        try:
            self.setup(stack)
            ctl = Control(self)
            threads = [Worker(self, i) for i in range(a.threads)]
            for t in threads:
                t.start()
            ctl.start()
            self.watchdog(threads, ctl, time.monotonic() + a.seconds)
            self.stop.set()
            # let every actor end its step (each has the deadline)
            end = time.monotonic() + a.deadline
            for t in threads + [ctl]:
                while t.is_alive():
                    t.join(0.25)
                    self.check_deadlines([t], 1 if t is not ctl else 3)
                    if time.monotonic() > end:
                        self.hang(f"{t.name} does not stop")
            if ctl.flush_pending and not self.failures:
                try:
                    ctl.check_flush()
                except Failure as f:
                    self.fail(f.rule, f.detail)
            self.log("run: " + self.summary(threads, ctl))
            if not self.failures:
                wd = threading.Thread(target=self._final_guard, args=(ctl,), daemon=True)
                wd.start()
                t_end = time.monotonic() + 10 * a.deadline
                while wd.is_alive():
                    wd.join(0.25)
                    if time.monotonic() > t_end:
                        self.hang("the final checks (flush, verify, linear swap) "
                                  f"did not end in {10 * a.deadline:.0f}s")
        except Failure as f:
            self.fail(f.rule, f.detail)
        except Exception:
            self.fail("crash", traceback.format_exc())
        finally:
            self.stop.set()
            if self.failures and ctl is not None:
                self.log("last control steps:\n    " + "\n    ".join(ctl.history))
                self.log(f"last status: {self.last_status}")
            errors = []
            try:
                # heal before teardown (a failed run may have left a fault on)
                for name, key in ((getattr(self, "origin_name", None), "origin"),
                                  (getattr(self, "cache_name", None), "cache")):
                    if name and name in tclib.dm_names():
                        tclib.run(["dmsetup", "load", name, "--table", self.healthy[key]],
                                  check=False, quiet=True, timeout=60)
                        tclib.run(["dmsetup", "resume", name], check=False, quiet=True,
                                  timeout=60)
                if getattr(self, "tc_name", None) in tclib.dm_names():
                    tclib.run(["dmsetup", "resume", self.tc_name], check=False, quiet=True,
                              timeout=60)
                errors = stack.close()
            except Exception as e:
                errors.append(repr(e))
            if errors:
                self.log(f"teardown problems: {errors}")
        bad = kernlog.bad_lines(cursor.lines())
        if bad:
            self.fail("kernel log", "\n".join(bad[:40]))
        if self.failures:
            for rule, detail in self.failures[:5]:
                self.report_fail(rule, detail)
            print(f"VERDICT: FAIL (seed {a.seed})", flush=True)
            return 1
        print(f"VERDICT: PASS (seed {a.seed}, {time.monotonic() - self.t0:.0f}s)", flush=True)
        return 0

    def _final_guard(self, ctl):
        try:
            self.final(ctl)
        except Failure as f:
            self.fail(f.rule, f.detail)
        except Exception:
            self.fail("crash", traceback.format_exc())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=None, help="default: random (printed)")
    p.add_argument("--seconds", type=float, default=120, help="IO phase length")
    p.add_argument("--threads", type=int, default=4, help="IO threads")
    p.add_argument("--deadline", type=float, default=120,
                   help="longest any IO or control step may take (s)")
    p.add_argument("--grace", type=float, default=1.0,
                   help="IO errors still accepted this long after a fault window closed (s)")
    p.add_argument("--origin-mib", type=int, default=32)
    p.add_argument("--cache-kib", type=int, default=2048)
    p.add_argument("--block", type=int, default=0, help="block sectors (default: by seed)")
    p.add_argument("--no-pin", action="store_true",
                   help="do not enforce the 'stable' rule (ambiguous contents pinned by a read)")
    p.add_argument("--lax-discard", action="store_true",
                   help="no 'stable' rule for sectors whose ambiguity comes from a partial-block "
                        "discard (old data first, zeroes after an eviction)")
    p.add_argument("--progress", type=float, default=60, help="progress line interval (s)")
    a = p.parse_args(argv)
    if a.seed is None:
        a.seed = random.SystemRandom().randrange(1, 1 << 31)
    if os.geteuid() != 0:
        sys.exit("stress.py runs as root inside the test VM")
    if not tclib.module_loaded():
        p_ = tclib.run(["insmod", str(tclib.KO)], check=False)
        if p_.returncode != 0:
            sys.exit(f"insmod {tclib.KO}: {p_.stderr.strip()}")
    return Stress(a).run()


if __name__ == "__main__":
    sys.exit(main())
