# SPDX-License-Identifier: GPL-2.0
"""The cache device dies: the failed state (docs/tiercache.rst, "Failure
handling"; issue 12, second half).

  1  the cache device is swapped for `error` in the middle of a full flush,
     while a writer keeps writing: nothing hangs; the state is latched
     (status field 23); every write goes around the cache and succeeds
     (a partial write to a lost dirty block fails); a dirty block reads as
     its new data (written back in time) or fails, never as the origin's
     older data; clean blocks read from the origin; flushes fail (the
     dirty blocks held, the dropped entries: no commit can record them);
     suspend and resume work; after the way out (the table replaced by a
     linear mapping of the origin) flushes succeed and the origin holds
     every write acknowledged after the failure and every block written
     back before it, byte for byte
  2  a metadata commit fails (the entry area of the cache device fails,
     its superblock and data area do not): the flushes waiting on it fail,
     and so do later ones while dirty blocks are held, until the entry
     area heals; a partial write to a dirty block (its slot still reads)
     merges it and writes the whole block around the cache; the superblock gets the failed mark; a table without
     `format` is then refused, and one with `format` builds a clean cache
     over the origin's data
  3  a cache holding no dirty block dies: the device keeps working in
     full (writes, flushes, FUA writes, reads from the origin) with the
     failed state latched

Devices: RAM disks, dm-linear in front of the cache RAM disk so that its
table can be swapped for `error`, dm-delay in front of the origin so that
writeback is still running when the cache dies.  Every I/O of the test
runs with a deadline (a worker thread or a child process): a hang fails
the test, it never blocks the suite.
"""

import errno
import os
import struct
import threading
import time

import pytest

import tclib
from faults import Bg, fsync_path, rnd, swap, wait_until
from tclib import MiB

pytestmark = [pytest.mark.module, pytest.mark.usefixtures("tc_module")]

B = 4096
S = B // 512          # sectors per 4 KiB block
SB_FLAGS_OFF = 28     # struct tc_disk_sb: magic 8, version 4, csum 4, seq 8, bs 4
SB_FAILED = 1


# ---------------------------------------------------------------- helpers

def io_block(path, off, data=None, length=B):
    """One O_DIRECT read (data None) or write at byte `off`: the data read
    (or b"" for a write), or the errno it failed with."""
    n = len(data) if data is not None else length
    buf = tclib.aligned_buf(n)
    fd = os.open(path, (os.O_RDONLY if data is None else os.O_WRONLY) | os.O_DIRECT)
    try:
        if data is None:
            got = os.preadv(fd, [memoryview(buf)[:n]], off)
            assert got == n, f"short read at {off}: {got}"
            return bytes(buf[:n])
        buf[:n] = data
        got = os.pwrite(fd, memoryview(buf)[:n], off)
        assert got == n, f"short write at {off}: {got}"
        return b""
    except OSError as e:
        return e.errno
    finally:
        os.close(fd)
        buf.close()


def with_deadline(fn, *args, timeout=60, what="I/O"):
    """fn(*args) in a thread; AssertionError if it is still running after
    `timeout` s (stuck in the kernel)."""
    return Bg(fn, *args).join(timeout, what).result()


def read_blocks(path, blocks, timeout=120):
    """{block: data or errno} of O_DIRECT reads, with one deadline."""
    return with_deadline(lambda: {b: io_block(path, b * B) for b in blocks},
                         timeout=timeout, what=f"reads of {len(blocks)} blocks")


def fsync_errno(path, timeout=60):
    """0, or the errno of an fsync of the device (a REQ_PREFLUSH)."""
    def body():
        try:
            fsync_path(path)
            return 0
        except OSError as e:
            return e.errno
    return with_deadline(body, timeout=timeout, what=f"fsync of {path}")


def failed_field(st):
    """Status field 23 (cache_failed), None if the module prints no such
    field."""
    return st["cache_failed"]


def write_blocks(path, m, writes, seed):
    """O_DIRECT writes [(byte offset, length)] of seeded data, each with a
    deadline; the model follows.  No fsync: the test asserts flushes."""
    for k, (off, n) in enumerate(writes):
        data = rnd(f"{seed}-{k}", n)
        r = with_deadline(io_block, path, off, data, what=f"a write at {off}")
        assert r == b"", f"the write of {n} bytes at {off} failed: errno {r}"
        m.data[off:off + n] = data


def sb_flags(cache_backing):
    sb = tclib.read_direct(cache_backing, 0, B)
    assert sb[:8] == b"TIERCACH", f"no superblock on {cache_backing}"
    return struct.unpack_from("<I", sb, SB_FLAGS_OFF)[0]


class Writer:
    """Whole-block O_DIRECT writes, one after the other, to blocks of
    [first, first + n), each with new data, until stopped; records each
    write's data, result and whether it was issued after `failed_at`."""

    def __init__(self, path, first, n, seed):
        self.path, self.first, self.n, self.seed = path, first, n, seed
        self.stop = threading.Event()
        self.failed_at = None          # set by the test once field 23 says so
        self.done = []                 # (block, data, result, after_failure)
        self.bg = Bg(self._run)

    def _run(self):
        i = 0
        while not self.stop.is_set():
            b = self.first + (i * 7919) % self.n
            data = rnd(f"{self.seed}-{i}")
            after = self.failed_at is not None
            self.done.append((b, data, io_block(self.path, b * B, data), after))
            i += 1

    def finish(self, timeout=60):
        self.stop.set()
        self.bg.join(timeout, "the background writer")
        return self.done


# ---------------------------------------------------------------- 1

def test_cache_dies_mid_writeback_under_load(stack):
    """See the module docstring, case 1."""
    origin_ram = stack.ram(64 * MiB)
    m = tclib.seeded_origin(origin_ram, seed=9701)
    seed_copy = bytes(m.data)
    origin = stack.slow(backing=origin_ram, write_ms=400)
    cache_ram = stack.ram(16 * MiB)
    csize = tclib.size_sectors(cache_ram)
    cl = stack.linear(cache_ram)
    tc = stack.tiercache(origin.path, cl.path, 8, "writeback",
                         keys={"flush_depth": 2, "max_flush_kb": 64,
                               "high_watermark": 95, "low_watermark": 90})

    # 600 dirty blocks spread over the first 16 MiB, 64 clean cached ones
    dirty = sorted(set(int.from_bytes(rnd(f"{9702}-{k}", 4), "little") % 4096
                       for k in range(600)))
    new = {b: rnd(f"{9703}-{b}") for b in dirty}
    for b in dirty:
        assert io_block(tc.path, b * B, new[b]) == b""
    clean = list(range(6000, 6064))
    for b in clean:
        got = io_block(tc.path, b * B)
        assert got == seed_copy[b * B:(b + 1) * B], f"block {b} read wrong"
    st = tc.status()
    assert st["dirty"] == len(dirty), st["raw"]
    assert st["used"] >= len(dirty) + len(clean), st["raw"]
    assert failed_field(st) == 0, f"cache_failed field: {st['raw']}"

    # writeback under way, a writer on [8192, 8448) (uncached so far)
    ev = tc.event_nr()
    tc.message("flush")
    w = Writer(tc.path, 8192, 256, seed=9704)
    wait_until(lambda: tc.status()["wb_blocks"] >= 20, 120,
               "writeback to clean some blocks")
    tclib.kmsg("tiercache-test: the cache device dies")
    swap(cl, f"0 {csize} error")
    st = wait_until(lambda: (lambda s: s if failed_field(s) else None)(tc.status()),
                    60, "status field 23 to latch the failure")
    w.failed_at = time.monotonic()
    tclib.log(f"failed: {st['raw']}")
    assert failed_field(st) == -errno.EIO, st["raw"]
    time.sleep(2)
    writes = w.finish()
    tc.wait_event(ev, timeout=120)
    st = wait_until(lambda: (lambda s: s if s["flush_state"] != "flushing" else None)(
        tc.status()), 120, "the full flush to end")
    assert st["error"] != 0, f"the flush ended without error: {st['raw']}"

    # every write of the writer went to the origin or around the cache
    bad = [(b, r) for b, _, r, _ in writes if r != b""]
    assert not bad, f"{len(bad)} of {len(writes)} writes failed: {bad[:5]}"
    after = sum(1 for *_, a in writes if a)
    assert after > 0, "no write was issued after the failure: the test proved nothing"
    tclib.log(f"writer: {len(writes)} writes, {after} after the failure")

    # the dirty blocks at risk, and the rewrites that dropped some of them
    # (no commit can record that), make flushes fail
    assert fsync_errno(tc.path) == errno.EIO, "the first flush after the failure succeeded"

    # the writer's blocks: the last data written, or an error if that
    # write went to the cache before it died
    last, versions = {}, {}
    for b, data, _, a in writes:
        last[b] = (data, a)
        versions.setdefault(b, []).append(data)
    got = read_blocks(tc.path, sorted(last))
    wrong = [b for b in last if got[b] != last[b][0] and (last[b][1] or got[b] != errno.EIO)]
    assert not wrong, f"writer blocks read back wrong: {wrong[:8]}"
    lost_w = [b for b in last if got[b] == errno.EIO]
    for b in last:
        if b not in lost_w:
            m.data[b * B:(b + 1) * B] = last[b][0]

    # dirty blocks: the new data (written back in time) or an error
    st = tc.status()
    lost_n = st["dirty"]
    assert lost_n > 20, f"the cache died with little dirty: {st['raw']}"
    got = read_blocks(tc.path, dirty)
    stale = [b for b in dirty if got[b] == seed_copy[b * B:(b + 1) * B]]
    assert not stale, f"{len(stale)} dirty blocks read as the origin's older data: {stale[:8]}"
    wrong = [b for b in dirty if got[b] not in (new[b], errno.EIO)]
    assert not wrong, f"dirty blocks read neither new data nor EIO: " \
                      f"{[(b, got[b] if isinstance(got[b], int) else 'data') for b in wrong[:8]]}"
    lost = [b for b in dirty if got[b] == errno.EIO]
    assert len(lost) < len(dirty), \
        f"no dirty block was written back: the cache did not die mid-writeback"
    assert len(lost) + len(lost_w) == lost_n, \
        f"{len(lost)} + {len(lost_w)} reads failed, status says {lost_n} dirty"
    for b in dirty:
        if b not in lost:
            m.data[b * B:(b + 1) * B] = new[b]

    # clean cached blocks and the writer's blocks come from the origin
    got = read_blocks(tc.path, clean)
    assert all(got[b] == seed_copy[b * B:(b + 1) * B] for b in clean), \
        "a clean cached block did not read as the origin's data"

    # writes to lost dirty blocks: whole ones go around, partial ones fail
    redo = lost[:16]
    for b in redo:
        data = rnd(f"{9705}-{b}")
        assert with_deadline(io_block, tc.path, b * B, data) == b"", \
            f"a whole-block write to lost dirty block {b} failed"
        m.data[b * B:(b + 1) * B] = data
    assert tc.status()["dirty"] == lost_n - len(redo), tc.status()["raw"]
    part = lost[16]
    assert with_deadline(io_block, tc.path, part * B, b"\x5a" * 512) == errno.EIO, \
        "a partial write to a lost dirty block did not fail"
    assert with_deadline(io_block, tc.path, 9000 * B + 512, b"\xa5" * 512) == b"", \
        "a partial write to an uncached block failed"
    m.data[9000 * B + 512:9000 * B + 1024] = b"\xa5" * 512
    got = read_blocks(tc.path, redo)
    assert all(got[b] == m.data[b * B:(b + 1) * B] for b in redo), \
        "a block written after the failure reads back wrong"

    # suspend and resume work; then the way out: the origin alone
    with_deadline(tc.suspend, timeout=60, what="suspend")
    with_deadline(tc.resume, timeout=60, what="resume")
    osize = tclib.size_sectors(origin.path)
    with_deadline(tc.reload, f"0 {osize} linear {origin.path} 0", timeout=60,
                  what="the reload to a linear mapping")
    # a block still lost holds an older version (or the new one, if its
    # writeback request wrote it but could not mark it clean): expected
    img = with_deadline(tclib.read_direct, tc.path, 0, len(m.data), timeout=120,
                        what="the read of the origin")
    older = {b: [seed_copy[b * B:(b + 1) * B], new[b]] for b in lost[16:]}
    for b in lost_w:
        older[b] = [seed_copy[b * B:(b + 1) * B]] + versions[b]
    mism = []
    for b in range(len(m.data) // B):
        blk = img[b * B:(b + 1) * B]
        ok = blk in older[b] if b in older else blk == m.data[b * B:(b + 1) * B]
        if not ok:
            mism.append(b)
    assert not mism, f"{len(mism)} origin blocks hold neither the data acknowledged " \
                     f"nor (lost) an older version: {mism[:10]}"
    assert fsync_errno(tc.path) == 0, "a flush after the way out failed"
    tclib.log(f"way out: {len(lost) - len(redo) + len(lost_w)} blocks lost, "
              f"{len(m.data) // B - len(older)} verified byte for byte")
    log = [ln for ln in tclib.dmesg_lines() if "the cache device failed" in ln]
    assert log, "no kernel log line says the cache device failed"


# ---------------------------------------------------------------- 2

def test_failed_commit_marks_superblock_and_load_refuses(stack):
    """See the module docstring, case 2."""
    origin_ram = stack.ram(32 * MiB)
    m = tclib.seeded_origin(origin_ram, seed=9711)
    seed = bytes(m.data)
    cache_ram = stack.ram(16 * MiB)
    csize = tclib.size_sectors(cache_ram)
    data_start = tclib.tc_data_start(csize)
    cl = stack.linear(cache_ram)
    # no timed commit: the first commit to fail is the flush's below (on a
    # slow guest the timer's commit failed first, and the writes after it
    # went around the failed cache: 69 or 72 dirty instead of 78)
    tc = stack.tiercache(origin_ram, cl.path, 8, "writeback",
                         keys={"high_watermark": 95, "low_watermark": 90,
                               "commit_ms": 600000})
    with tclib.Workload(tc.path, m, seed=9712) as wl:
        for b in range(0, 128, 2):
            wl.write_direct(b * B, B)
    assert fsync_errno(tc.path) == 0
    assert sb_flags(cache_ram) == 0

    # the entry area fails; the superblock and the slots do not
    swap(cl, "\n".join([f"0 8 linear {cache_ram} 0",
                        f"8 {data_start - 8} error",
                        f"{data_start} {csize - data_start} linear {cache_ram} {data_start}"]))
    write_blocks(tc.path, m, [(b * B, B) for b in range(1, 33, 2)], 9713)
    assert fsync_errno(tc.path) == errno.EIO, "a flush whose commit failed succeeded"
    st = tc.status()
    assert st["meta_error"] == -errno.EIO, st["raw"]
    assert failed_field(tc.status()) == -errno.EIO, tc.status()["raw"]
    assert sb_flags(cache_ram) & SB_FAILED, "the superblock carries no failed mark"
    # writes around the cache (one drops dirty block 50): while dirty
    # blocks are held, a flush needs a commit, which fails
    write_blocks(tc.path, m, [(b * B, B) for b in list(range(200, 208)) + [50]] +
                 [(60 * B + 1024, 512)], 9714)  # the last: part of dirty block 60
    assert tc.status()["dirty"] == 64 + 16 - 2, tc.status()["raw"]
    got = with_deadline(io_block, origin_ram, 60 * B)
    tclib.compare(bytes(m.data[60 * B:61 * B]), got, 60 * B,
                  "the origin's block 60 after a partial write merged it")
    assert fsync_errno(tc.path) == errno.EIO, \
        "a flush succeeded though no commit could record the dirty blocks"
    swap(cl, f"0 {csize} linear {cache_ram} 0")
    assert fsync_errno(tc.path) == 0, "a flush failed after the entry area healed"
    assert sb_flags(cache_ram) & SB_FAILED, "a later commit dropped the failed mark"

    # everything reads back (the data area still works), then the device goes
    m.verify_device(tc.path, what="the device after the failed commit")
    # what the origin holds: the seed, and the blocks written after the failure
    expect = bytearray(seed)
    for b in list(range(200, 208)) + [50, 60]:
        expect[b * B:(b + 1) * B] = m.data[b * B:(b + 1) * B]
    name = tc.name
    with_deadline(tc.remove, timeout=120, what="the removal of the failed device")

    # whole again, the device is not loaded as it is
    cur = tclib.KmsgCursor()
    table = tclib.TierCache.make_table(origin_ram, cl.path, 8, "writeback", fmt=False)
    p = tclib.run(["dmsetup", "create", name, "--table", table], check=False, timeout=60)
    assert p.returncode != 0, "a table without format loaded a cache marked failed"
    assert any("marked failed" in ln for ln in cur.lines()), cur.lines()[-5:]
    assert name not in tclib.dm_names(), "a refused table left a device behind"
    # format starts a clean cache over the origin, which holds what it held
    tc2 = stack.tiercache(origin_ram, cl.path, 8, "writeback", name=name)
    st = tc2.status()
    assert st["dirty"] == 0 and failed_field(st) == 0, st["raw"]
    assert sb_flags(cache_ram) == 0, "format kept the failed mark"
    got = with_deadline(tclib.read_direct, tc2.path, 0, len(expect), what="read")
    tclib.compare(bytes(expect), got, 0, "the device formatted after the failure")


# ---------------------------------------------------------------- 3

def test_clean_cache_dies_device_keeps_working(stack):
    """See the module docstring, case 3."""
    origin_ram = stack.ram(32 * MiB)
    m = tclib.seeded_origin(origin_ram, seed=9721)
    cache_ram = stack.ram(8 * MiB)
    csize = tclib.size_sectors(cache_ram)
    cl = stack.linear(cache_ram)
    tc = stack.tiercache(origin_ram, cl.path, 8, "writeback")
    with tclib.Workload(tc.path, m, seed=9722) as wl:
        for b in range(0, 64):
            wl.write_direct(b * B, B)
    tc.flush()
    for b in range(100, 132):                 # clean copies by promotion
        assert io_block(tc.path, b * B) == m.data[b * B:(b + 1) * B]
    assert fsync_errno(tc.path) == 0        # the clean marks committed
    st = tc.status()
    assert st["dirty"] == 0 and st["used"] >= 96, st["raw"]

    swap(cl, f"0 {csize} error")
    # a write to a clean copy fails in the cache, goes to the origin, latches
    data = rnd(9723)
    assert with_deadline(io_block, tc.path, 10 * B, data) == b"", \
        "a write to a clean copy in the dead cache failed"
    m.data[10 * B:11 * B] = data
    st = tc.status()
    assert failed_field(st) == -errno.EIO, st["raw"]
    used = st["used"]
    with tclib.Workload(tc.path, m, seed=9724) as wl:
        for _ in range(200):
            wl.step(read_frac=0.4, unaligned_frac=0.3, seq_frac=0.3)
    fd = os.open(tc.path, os.O_WRONLY | os.O_DIRECT | os.O_DSYNC)
    buf = tclib.aligned_buf(B)
    try:
        buf[:B] = rnd(9725)
        assert os.pwrite(fd, memoryview(buf)[:B], 20 * B) == B
        m.data[20 * B:21 * B] = rnd(9725)
    finally:
        os.close(fd)
        buf.close()
    assert fsync_errno(tc.path) == 0, "a flush failed though the dead cache held nothing dirty"
    st = tc.status()
    assert st["dirty"] == 0 and st["used"] <= used, f"the dead cache took blocks: {st['raw']}"
    with_deadline(tc.suspend, timeout=60, what="suspend")
    with_deadline(tc.resume, timeout=60, what="resume")
    m.verify_device(tc.path, what="the device over a dead clean cache")
    m.verify_device(origin_ram, what="the origin under a dead clean cache")
