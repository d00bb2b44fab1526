# SPDX-License-Identifier: GPL-2.0
"""Crash oracle in the style of xfstests' dm-log-writes tests.

dm-log-writes sits under the cache device and records every write to it,
in the order the writes became durable (logwrites.py).  An ext4 workload
with fsyncs, and raw writes next to the file system, run on the tiercache
device; a mark is put into the log after mkfs, after each fsync, after
each batch of raw writes and after the umount.  Then the log is replayed
onto a zeroed scratch copy of the cache device up to chosen entries, and
each replayed image, with the origin (which the workload never writes:
see below), is a state the cache could be left in by a power cut:

* every mark, and at most MAX_PLAIN flush/FUA entries (a run logs about
  100, some 50 distinct states; a point costs 2-3 s under TCG emulation):
  first the states just before each of the cache's superblock writes (a
  commit's entries on disk, its superblock not), up to two thirds of the
  points, then others spread evenly over the log (choose_points).  At each point the table without
  ``format`` must load if the image holds a superblock (and be refused
  if not: only before the format's superblock write); the status
  ``dirty`` field and the load's kernel message (dirty blocks, commit,
  uncommitted entries) must match what the image holds, decoded by
  tcdisk.py as tc_disk.c does (an entry counts when it is of the
  superblock's format generation and its own slot, its checksum is good,
  it is dirty and its seq is not newer than the superblock's commit_seq;
  an entry of another generation reads as empty); the image
  must hold no corrupt entry and no block dirty twice; and blocks must
  read as the image says: every committed dirty block from its slot,
  every block of a clean or uncommitted entry and SAMPLE others from the
  origin;
* at a mark also: the device's last RAW_SIZE bytes, outside the file
  system, hold exactly what was written there before the mark (raw
  O_DIRECT writes, each batch followed by an fsync of the device or made
  of FUA writes, then a mark: this catches a flush that completes before
  the metadata of the writes it covers is durable, which ext4's flush +
  FUA commit pairs would hide); the file system mounts (-o ro; ext4
  still replays its journal, on the scratch copy), every file fsync'ed
  before the mark has the content it had at its last fsync, no file
  created after the mark exists, nothing reports an ext4 error, and
  ``fsck.ext4 -fn`` finds nothing after the mount; at the marks after
  the umount the whole tree is exactly the final one (unsynced files
  included).

The origin stays in its initial state because nothing is written back:
high_watermark 100 / low_watermark 0 and a cache larger than everything
the workload writes, commit_ms 600000 (so commits happen only on flush /
FUA / suspend, all of which the log records), and all writes are whole
4 KiB blocks (ext4 with 4 KiB blocks, mkfs without discard); the test
checks that the origin saw no write or discard at all.
"""

import collections
import contextlib
import hashlib
import os
import random
import re
import time
from pathlib import Path

import pytest

import logwrites
import tcdisk
import tclib
from faults import fsync_path
from tclib import MiB, KiB

pytestmark = [pytest.mark.module, pytest.mark.usefixtures("tc_module")]

B = 4096
BLOCK_SECTORS = 8
ORIGIN_SIZE = 64 * MiB
CACHE_SIZE = 32 * MiB
LOG_SIZE = 128 * MiB    # a run logs about 18 MiB
KEYS = {"high_watermark": 100, "low_watermark": 0, "commit_ms": 600000}
# flush/FUA replay points checked besides the marks (12 keeps make test in
# CI's time; TC_LOGWRITES_MAX_PLAIN, passed with TC_GUEST_ENV, raises it)
MAX_PLAIN = int(os.environ.get("TC_LOGWRITES_MAX_PLAIN", "12"))
RAW_SIZE = 4 * MiB      # the end of the device: raw writes, no file system
RAW_START = ORIGIN_SIZE - RAW_SIZE
SAMPLE = 512            # blocks not named by any entry, read back per point
END_MARK = "dm-log-writes-end"

# ---------------------------------------------------------------- tc_disk.h

class Image:
    """What a cache device image holds, decoded as the module's load does
    (tcdisk.py: tc_sb_decode, tc_de_decode)."""

    def __init__(self, img, origin_sectors):
        self.blank = img[:8] != tcdisk.MAGIC
        self.problems = []          # corruption the load would refuse
        self.dirty = {}             # origin block -> slot, committed dirty
        self.named = set()          # blocks of clean or uncommitted entries
        self.uncommitted = 0
        self.clean = 0
        self.foreign = 0            # entries of another generation: empty
        self.unread = 0             # metadata blocks the summary leaves out
        self.commit_seq = None
        if self.blank:
            return
        sb = tcdisk.decode_sb(img[:512])
        self.commit_seq, self.block_sectors = sb.commit_seq, sb.block_sectors
        self.nr_slots, self.meta_start, self.data_start = (sb.nr_slots, sb.meta_start,
                                                           sb.data_start)
        if sb.state == tcdisk.SB_BAD_CSUM:
            self.problems.append("superblock checksum mismatch")
            return
        if not sb.ok or sb.origin_sectors != origin_sectors:
            self.problems.append(f"superblock {sb.state}: version {sb.version} flags "
                                 f"{sb.flags} origin_sectors {sb.origin_sectors}")
            return
        nr_blocks = origin_sectors // self.block_sectors
        base = self.meta_start * 512
        area = bytes(img[base:base + sb.entries_bytes])
        # a load reads only the metadata blocks the summary marks (v4):
        # every dirty entry of ours, committed or not, must be in one
        marked = tcdisk.marked_blocks(img, sb)
        self.unread = tcdisk.meta_blocks(sb.nr_slots) - len(marked)
        for s, e in tcdisk.entries(area, sb, nr_blocks):
            mb = s // tcdisk.ENTRIES_PER_MBLOCK
            if mb not in marked:
                if tcdisk.dirty_flagged(area[s * 32:(s + 1) * 32], s, sb.gen):
                    self.problems.append(f"slot {s}: a dirty entry in metadata block "
                                         f"{mb}, which the summary does not mark")
                elif e.state == tcdisk.UNCOMMITTED:
                    self.named.add(e.block)     # not read: the load ignores it
                    continue
            if e.state == tcdisk.FOREIGN:
                self.foreign += 1
            elif e.state in tcdisk.CORRUPT:
                self.problems.append(f"slot {s}: {e.state}"
                                     + (f" (block {e.block})" if e.block is not None else ""))
            elif e.state == tcdisk.UNCOMMITTED:
                self.uncommitted += 1
                self.named.add(e.block)
            elif e.state == tcdisk.CLEAN:
                self.clean += 1
                self.named.add(e.block)
            elif e.state != tcdisk.DIRTY:
                continue
            elif e.block in self.dirty:
                self.problems.append(f"block {e.block} dirty in slots "
                                     f"{self.dirty[e.block]} and {s}")
            else:
                self.dirty[e.block] = s

    def slot_data(self, img, slot):
        off = (self.data_start + slot * self.block_sectors) * 512
        return img[off:off + self.block_sectors * 512]

    def __str__(self):
        if self.blank:
            return "blank (no superblock)"
        return (f"commit_seq {self.commit_seq}, {len(self.dirty)} committed dirty, "
                f"{self.clean} clean, {self.uncommitted} uncommitted, "
                f"{self.foreign} foreign entries, {self.unread} metadata blocks unread"
                + (f", problems: {self.problems[:5]}" if self.problems else ""))


def note(msg):
    """Progress and timings: the test's log and the kernel log (which the
    harness keeps also for a test that passes)."""
    tclib.log(msg)
    tclib.kmsg(f"lw: {msg}")


# ---------------------------------------------------------------- workload

def sha(data):
    return hashlib.sha256(data).hexdigest()


class Fs:
    """The workload on a mounted file system, and raw O_DIRECT writes to
    the device's last RAW_SIZE bytes, which the file system leaves alone.
    Its expectations, for each mark: the fsync'ed files (path -> sha256 at
    their last fsync), how many files and directories had been created,
    and the content of the raw area (every raw write is followed by a
    flush, or is FUA, and a mark)."""

    def __init__(self, mnt, lw, dev, raw_initial):
        self.mnt = Path(mnt)
        self.lw = lw
        self.dev = dev
        self.raw = bytearray(raw_initial)
        self.raw_fresh = list(range(RAW_SIZE // B))    # blocks never written
        self.rng = random.Random(8101)
        self.rng.shuffle(self.raw_fresh)
        self.synced = {}            # rel path -> sha256 at its last fsync
        self.final = {}             # rel path -> sha256 now
        self.created = []           # rel paths in creation order (dirs too)
        self.dirs = []
        self.marks = {}             # mark -> (synced, number created, raw)

    def _write(self, rel, data, offset=None, fsync=True):
        p = self.mnt / rel
        new = not p.exists()
        if new:
            self.created.append(rel)
        with open(p, "r+b" if not new else "wb") as f:
            if offset is not None:
                f.seek(offset)
            f.write(data)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        content = p.read_bytes()
        self.final[rel] = sha(content)
        if fsync:
            if new:                 # its directory entry too
                fsync_path(p.parent)
            self.synced[rel] = self.final[rel]

    def create(self, rel, size, fsync=True):
        self._write(rel, self.rng.randbytes(size), fsync=fsync)

    def overwrite(self, rel, offset, size):
        self._write(rel, self.rng.randbytes(size), offset=offset)

    def append(self, rel, size):
        self._write(rel, self.rng.randbytes(size),
                    offset=(self.mnt / rel).stat().st_size)

    def truncate(self, rel, size):
        p = self.mnt / rel
        with open(p, "r+b") as f:
            f.truncate(size)
            os.fsync(f.fileno())
        self.final[rel] = self.synced[rel] = sha(p.read_bytes())

    def unlink_unsynced(self, rel):
        (self.mnt / rel).unlink()
        del self.final[rel]

    def mkdir(self, rel):
        (self.mnt / rel).mkdir()
        self.created.append(rel)
        self.dirs.append(rel)
        fsync_path(self.mnt / rel)
        fsync_path((self.mnt / rel).parent)

    def mark(self, name):
        self.lw.message("mark", name)
        self.marks[name] = (dict(self.synced), len(self.created), bytes(self.raw))

    def raw_write(self, blocks, fua):
        """4 KiB O_DIRECT writes to raw-area blocks, then (unless each is
        FUA: O_DSYNC) one fsync of the device: an empty flush."""
        buf = tclib.aligned_buf(B)
        fd = os.open(self.dev, os.O_WRONLY | os.O_DIRECT | (os.O_DSYNC if fua else 0))
        try:
            for b in blocks:
                data = self.rng.randbytes(B)
                buf[:B] = data
                assert os.pwrite(fd, memoryview(buf)[:B], RAW_START + b * B) == B
                self.raw[b * B:(b + 1) * B] = data
            if not fua:
                os.fsync(fd)
        finally:
            os.close(fd)
            buf.close()

    def raw_new(self, n):
        out, self.raw_fresh = self.raw_fresh[:n], self.raw_fresh[n:]
        return out

    def run(self):
        self.create("a", 64 * KiB)
        self.mark("fsync-1")
        self.create("u0", 128 * KiB, fsync=False)
        self.create("b", 1 * MiB)
        self.mark("fsync-2")
        self.raw_write(self.raw_new(64), fua=False)
        self.mark("raw-flush")
        self.create("c", 300 * KiB + 123)
        self.mark("fsync-3")
        self.overwrite("a", 20 * KiB, 16 * KiB)
        self.mark("fsync-4")
        self.append("b", 200 * KiB + 7)
        self.mark("fsync-5")
        self.raw_write(self.raw_new(4), fua=True)
        self.mark("raw-fua")
        self.create("u1", 1 * MiB, fsync=False)
        self.unlink_unsynced("u0")
        self.create("d", 2 * MiB)
        self.mark("fsync-6")
        self.mkdir("sub")
        self.create("sub/e", 50 * KiB)
        self.mark("fsync-7")
        self.truncate("c", 100 * KiB)
        self.mark("fsync-8")
        old = [b for b in range(RAW_SIZE // B) if b not in self.raw_fresh]
        self.raw_write(self.rng.sample(old, 16) + self.raw_new(16), fua=False)
        self.mark("raw-rewrite")
        self.create("sub/u2", 40 * KiB, fsync=False)
        self.overwrite("d", 1 * MiB, 256 * KiB)
        self.mark("fsync-9")


def tree(mnt):
    """rel path -> sha256 of every regular file, plus directories (None)."""
    out = {}
    for d, dirs, files in os.walk(mnt):
        rel = os.path.relpath(d, mnt)
        if rel == "lost+found":
            dirs[:] = []
            continue
        for n in dirs:
            if n != "lost+found" or rel != ".":
                out[os.path.normpath(os.path.join(rel, n))] = None
        for n in files:
            out[os.path.normpath(os.path.join(rel, n))] = \
                sha(Path(d, n).read_bytes())
    return out


@contextlib.contextmanager
def mounted(dev, mnt, opts=None):
    cmd = ["mount", "-t", "ext4"] + (["-o", opts] if opts else []) + [dev, str(mnt)]
    tclib.run(cmd)
    try:
        yield Path(mnt)
    finally:
        tclib.run(["umount", str(mnt)], check=False)


def mkfs(dev):
    # 4 KiB blocks: every write is a whole cache block (a partial-block
    # write miss would go around the cache to the origin); no discard (it
    # would reach the origin); no lazy init (ext4lazyinit would write
    # later); the last RAW_SIZE bytes of the device stay outside
    tclib.run(["mkfs.ext4", "-q", "-F", "-b", "4096",
               "-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0", dev,
               str(RAW_START // B)], timeout=300)


# ---------------------------------------------------------------- points

def spread(items, k):
    """k of the items, evenly spaced, first and last included."""
    n = len(items)
    if k <= 0:
        return []
    if n <= k:
        return list(items)
    if k == 1:
        return [items[-1]]
    return sorted({items[round(j * (n - 1) / (k - 1))] for j in range(k)})


def choose_points(log, cap):
    """The replay points: every mark, plus at most `cap` (0: all) flush/FUA
    entries.  A flush/FUA entry with no write since an earlier flush/FUA
    entry or mark gives the same image: it is skipped.  First
    come the states just before each superblock write (a commit's entries
    written, its superblock not: the entries must be ignored), at most two
    thirds of `cap` of them, then the others spread evenly over the log."""
    writes, state = 0, []
    for e in log.entries:
        if e.flags & logwrites.DISCARD or e.is_write:
            writes += 1
        state.append(writes)
    marks = [i for i, _ in log.marks()]
    seen = {state[i] for i in marks}
    durable = []
    for i in log.durable_points():
        if state[i] not in seen:
            seen.add(state[i])
            durable.append(i)
    if cap and len(durable) > cap:
        pre = set()
        for e in log.entries:
            if e.is_write and e.sector == 0:        # a tiercache superblock
                before = [i for i in durable if i < e.index]
                if before:
                    pre.add(before[-1])
        must = spread(sorted(pre), cap - cap // 3)
        rest = [i for i in durable if i not in must]
        durable = must + spread(rest, cap - len(must))
    return sorted(set(marks) | set(durable))


def flag_and_mark(e):
    return logwrites.flag_str(e.flags) + (f" {e.mark!r}" if e.mark else "")


LOADED_RE = re.compile(r"loaded (\d+) dirty blocks \(commit (\d+)\), ignored (\d+) "
                       r"uncommitted entries")


class Checker:
    def __init__(self, stack, origin, origin_data, replay, workload):
        self.stack = stack
        self.origin = origin
        self.origin_data = origin_data
        self.replay = replay
        self.fs = workload
        self.osect = len(origin_data) // 512
        self.table = tclib.TierCache.make_table(origin, replay, BLOCK_SECTORS,
                                                "writeback", KEYS, fmt=False)
        self.mnt = Path(tclib.WORKDIR) / f"tc-lw-mnt-{os.getpid()}"
        self.mnt.mkdir(exist_ok=True)
        self.loaded_once = False
        self.stats = collections.Counter()

    def where(self, log, idx):
        e = log.entries[idx]
        return f"replay to entry {idx} {e!r} ({len(log)} entries)"

    def check(self, log, idx, img):
        t0 = time.monotonic()
        e = log.entries[idx]
        what = self.where(log, idx)
        laps, last = [], [t0]

        def lap(name):              # where the time goes, for the note
            now = time.monotonic()
            laps.append(f"{name} {now - last[0]:.1f}")
            last[0] = now

        tclib.fill_device(self.replay, img)
        lap("fill")
        im = Image(img, self.osect)
        lap("parse")
        tclib.log(f"{what}: image {im}")
        assert not im.problems, f"{what}: the replayed image is corrupt: {im}"
        cur = tclib.KmsgCursor("lw-load")
        try:
            tc = self.stack.dm("tc-lw-replay", self.table, cls=tclib.TierCache)
        except tclib.CmdError as err:
            lines = "\n".join(cur.lines())
            if im.blank:
                assert not self.loaded_once, \
                    f"{what}: the superblock vanished after an earlier point loaded"
                assert "superblock" in lines, lines
                self.stats["blank"] += 1
                return
            raise AssertionError(f"{what}: a valid image ({im}) was refused: "
                                 f"{err.err.strip()}\nkernel log:\n{lines}")
        try:
            assert not im.blank, f"{what}: a blank cache device was loaded"
            self.loaded_once = True
            lines = cur.lines()
            st = tc.status()
            loaded = [LOADED_RE.search(ln) for ln in lines]
            loaded = [m for m in loaded if m]
            assert loaded, f"{what}: no 'loaded' message:\n" + "\n".join(lines)
            nd, seq, stale = map(int, loaded[-1].groups())
            assert (nd, seq, stale) == (len(im.dirty), im.commit_seq, im.uncommitted), \
                (f"{what}: the module loaded {nd} dirty blocks (commit {seq}, "
                 f"{stale} uncommitted); the image holds {im}")
            assert st["dirty"] == len(im.dirty), \
                f"{what}: status dirty {st['dirty']}, image {im}: {st['raw']}"
            assert st["used"] >= st["dirty"], st["raw"]
            lap("load")
            nb = self.verify_blocks(tc, img, im, what, idx)
            lap("verify")
            tclib.log(f"{what}: {nb} blocks read back")
            mark = e.mark if e.flags & logwrites.MARK else None
            if mark:
                self.check_raw(tc, mark, what)
                self.check_fs(tc, mark, what)
                lap("fs")
            tc.remove()
            lap("remove")
        finally:
            tclib.run(["umount", str(self.mnt)], check=False, quiet=True)
            tc.remove()
        self.stats["mark" if e.flags & logwrites.MARK else "durable"] += 1
        note(f"entry {idx} {flag_and_mark(e)}: {im}: ok in {time.monotonic() - t0:.1f}s ({', '.join(laps)})")

    def verify_blocks(self, tc, img, im, what, idx):
        """Blocks read as the last commit says: a committed dirty block from
        its slot, any other from the (unchanged) origin.  Checked: every
        committed dirty block, every block named by a clean or uncommitted
        entry, and SAMPLE other blocks (reading all 16384 costs seconds of
        promotions under TCG)."""
        nblocks = len(self.origin_data) // B
        want = set(im.dirty) | im.named
        want |= set(random.Random(idx).sample(range(nblocks), SAMPLE))
        blocks = sorted(want)
        buf = tclib.aligned_buf(MiB)
        fd = os.open(tc.path, os.O_RDONLY | os.O_DIRECT)
        try:
            i = 0
            while i < len(blocks):
                j = i + 1           # a run of consecutive blocks, <= 1 MiB
                while j < len(blocks) and blocks[j] == blocks[j - 1] + 1 and \
                        j - i < MiB // B:
                    j += 1
                first, n = blocks[i], j - i
                assert os.preadv(fd, [memoryview(buf)[:n * B]], first * B) == n * B
                for k in range(n):
                    b = first + k
                    exp = im.slot_data(img, im.dirty[b]) if b in im.dirty else \
                        self.origin_data[b * B:(b + 1) * B]
                    got = buf[k * B:(k + 1) * B]
                    if got != exp:
                        tclib.compare(bytes(exp), bytes(got), b * B,
                                      f"{what}: {'dirty' if b in im.dirty else 'clean'} "
                                      f"block {b} read through the loaded cache")
                i = j
        finally:
            os.close(fd)
            buf.close()
        return len(blocks)

    def check_raw(self, tc, mark, what):
        raw = bytes(self.fs.raw) if mark == END_MARK else self.fs.marks[mark][2]
        tclib.compare(raw, tclib.read_direct(tc.path, RAW_START, RAW_SIZE), RAW_START,
                      f"{what}: the raw area (every write to it was flushed or FUA "
                      f"before the mark)")

    def check_fs(self, tc, mark, what):
        synced, ncreated, _ = self.fs.marks.get(mark, (None, None, None))
        final = mark in ("umount", END_MARK)
        cur = tclib.KmsgCursor("lw-mount")
        opts = "ro"
        p = tclib.run(["mount", "-t", "ext4", "-o", "ro", tc.path, str(self.mnt)],
                      check=False)
        if p.returncode != 0:
            tclib.log(f"{what}: mount -o ro failed ({p.stderr.strip()}): mounting "
                      f"read-write (the replay device is a scratch copy)")
            opts = "rw"
            tclib.run(["mount", "-t", "ext4", tc.path, str(self.mnt)])
        try:
            got = tree(self.mnt)
        finally:
            tclib.run(["umount", str(self.mnt)])
        tclib.log(f"{what}: mounted {opts}: {len(got)} files and directories")
        if final:
            want = dict(self.fs.final)
            want.update({d: None for d in self.fs.dirs})
            assert got == want, f"{what}: after the umount the tree is {got}, want {want}"
        elif mark == "mkfs":
            assert got == {}, f"{what}: a new file system holds {got}"
        else:
            assert synced is not None, f"{what}: unknown mark {mark!r}"
            for rel, h in synced.items():
                assert rel in got, f"{what}: {rel} was fsync'ed before the mark, is missing"
                assert got[rel] == h, f"{what}: {rel} does not hold its fsync'ed content"
            for rel in self.fs.created[ncreated:]:
                assert rel not in got, f"{what}: {rel} was created after the mark, exists"
        errors = [ln for ln in cur.lines() if "EXT4-fs error" in ln or "JBD2" in ln
                  and "error" in ln.lower()]
        assert not errors, f"{what}: kernel log:\n" + "\n".join(errors)
        p = tclib.run(["fsck.ext4", "-fn", tc.path], check=False, timeout=300)
        assert p.returncode == 0, \
            f"{what}: fsck.ext4 -fn exit {p.returncode}:\n{p.stdout}\n{p.stderr}"


def test_replay_flush_fua_and_mark_points(stack):
    t0 = time.monotonic()
    tclib.run(["modprobe", "dm-log-writes"])
    origin = stack.ram(ORIGIN_SIZE)
    model = tclib.seeded_origin(origin, seed=8100)
    origin_data = bytes(model.data)
    cache_raw = stack.ram(CACHE_SIZE)
    logdev = stack.ram(LOG_SIZE)
    replay = stack.ram(CACHE_SIZE)
    o0 = tclib.block_stat(origin)
    note(f"devices ready in {time.monotonic() - t0:.0f}s")

    n = tclib.size_sectors(cache_raw)
    lw = stack.dm("tc-lw-log", f"0 {n} log-writes {cache_raw} {logdev}")
    tc = stack.tiercache(origin, lw.path, BLOCK_SECTORS, "writeback", keys=KEYS)
    mnt = Path(tclib.WORKDIR) / f"tc-lw-mnt-{os.getpid()}"
    mnt.mkdir(exist_ok=True)

    fs = Fs(mnt, lw, tc.path, origin_data[RAW_START:])
    mkfs(tc.path)
    fs.mark("mkfs")
    note(f"mkfs done at {time.monotonic() - t0:.0f}s")
    with mounted(tc.path, mnt):
        fs.run()
    fsync_path(tc.path)                 # one more flush: everything durable
    fs.mark("umount")
    st = tc.status()
    tclib.log(f"after the workload: {st['raw']}")
    assert st["write_bypass"] == 0 and st["wb_blocks"] == 0, \
        f"the workload reached the origin: {st['raw']}"
    tc.remove()
    lw_status = lw.status_line()
    lw.remove()
    assert "logging_disabled" not in lw_status, f"log device full: {lw_status}"
    t_work = time.monotonic() - t0

    tclib.flushbufs(logdev)
    with logwrites.LogWrites.open(logdev) as log:
        note(f"log: {len(log)} entries, {log.end // KiB} KiB: {log.summary()}; "
             f"workload {t_work:.0f}s")
        names = [m for _, m in log.marks()]
        assert names == list(fs.marks) + [END_MARK], names
        points = choose_points(log, MAX_PLAIN)
        note(f"checking {len(points) - len(names)} of {len(log.durable_points())} "
             f"flush/FUA entries and {len(names)} marks: {points}")
        chk = Checker(stack, origin, origin_data, replay, fs)
        img = bytearray(CACHE_SIZE)
        done = -1
        for idx in points:
            log.replay(img, idx, start=done + 1)
            done = idx
            chk.check(log, idx, img)

    o1 = tclib.block_stat(origin)
    assert (o1["writes"], o1["discards"]) == (o0["writes"], o0["discards"]), \
        "the origin was written: replay points are not self-contained"
    model.verify_device(origin, what="origin after all replays")
    note(f"checked {dict(chk.stats)}; workload {t_work:.0f}s, "
         f"total {time.monotonic() - t0:.0f}s")
    assert chk.stats["mark"] == len(names)
    assert chk.stats["durable"] + chk.stats["blank"] == len(points) - len(names)
    mnt.rmdir()
