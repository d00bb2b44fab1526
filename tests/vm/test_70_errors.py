# SPDX-License-Identifier: GPL-2.0
"""Failure handling (docs/tiercache.rst): an origin write error during
writeback keeps the blocks dirty, latches the error, ends the full flush
with a dm event; the next flush retries.  Origin read errors fail only the
reads that asked for the failed data."""

import errno
import os

import pytest

import tclib
from tclib import MiB

pytestmark = [pytest.mark.module, pytest.mark.usefixtures("tc_module")]

B = 4096


def test_origin_write_error_keeps_blocks_dirty(stack):
    ram = stack.ram(32 * MiB)
    m = tclib.seeded_origin(ram, seed=161)
    healthy = stack.flakey_table(ram)
    broken = stack.flakey_table(ram, up=0, down=3600, features=["error_writes"])
    flk = stack.dm("tc-origin", healthy)
    cache = stack.ram(16 * MiB)
    tc = stack.tiercache(flk.path, cache, 8, "writeback", keys={"bridge_gap_kb": 8})
    with tclib.Workload(tc.path, m, seed=162) as wl:
        for b in list(range(0, 200, 2)) + list(range(1000, 1100)):
            wl.write_direct(b * B, B)
    assert tc.status()["dirty"] == 200
    flk.suspend()
    flk.reload(broken)
    ev = tc.event_nr()
    tc.message("flush")
    tc.wait_event(ev, timeout=120)
    st = tc.wait_idle(want_clean=False)
    print(st["raw"])
    assert st["error"] == -errno.EIO, f"origin write error not latched: {st['raw']}"
    assert st["dirty"] == 200, f"failed writeback changed the dirty count: {st['raw']}"
    assert st["flush_state"] == "idle", st["raw"]
    m.verify_device(tc.path, what="read back while the origin fails writes")
    flk.suspend()
    flk.reload(healthy)
    st = tc.flush()
    assert st["error"] == 0, f"error not cleared by a successful flush: {st['raw']}"
    tc.remove()
    m.verify_device(flk.path, what="origin after the retried flush")


def test_origin_read_error(stack):
    """The origin's second MiB fails every IO: reads there fail, others work."""
    ram = stack.ram(8 * MiB)
    m = tclib.seeded_origin(ram, seed=171)
    S = MiB // 512
    origin = stack.dm("tc-origin",
                      f"0 {S} linear {ram} 0\n{S} {S} error\n{2 * S} {6 * S} linear {ram} {2 * S}")
    cache = stack.ram(4 * MiB)
    tc = stack.tiercache(origin.path, cache, 8, "writeback", keys={"bridge_gap_kb": 64})
    with pytest.raises(OSError) as ei:
        tclib.read_direct(tc.path, MiB + 8 * B, B)
    assert ei.value.errno == errno.EIO
    with pytest.raises(OSError):
        tclib.read_direct(tc.path, MiB - B, 2 * B)       # straddles into the bad MiB
    m.verify_device(tc.path, end=MiB)
    m.verify_device(tc.path, start=2 * MiB)
    # dirty blocks in the good ranges (bridged holes read from the good origin)
    # flush fine while a part of the origin fails
    with tclib.Workload(tc.path, m, seed=172) as wl:
        for b in range(2 * 256 + 10, 2 * 256 + 20, 2):
            wl.write_direct(b * B, B)
        for b in (250, 252):
            wl.write_direct(b * B, B)
    st = tc.status()
    assert st["dirty"] == 7 and st["error"] == 0, st["raw"]
    st = tc.flush()
    m.verify_device(tc.path, end=MiB)
    m.verify_device(tc.path, start=2 * MiB)
    tc.remove()
    m.verify_device(origin.path, end=MiB)
    m.verify_device(origin.path, start=2 * MiB)


def _fsync(path):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.fsync(fd)                    # an empty REQ_PREFLUSH: a metadata commit
    finally:
        os.close(fd)


def test_cache_write_error(stack):
    """The cache device fails writes (dm-flakey error_writes).  A block
    written for the first time goes around the cache: the write succeeds
    on the origin, nothing is dirty and no slot is kept (the same through
    the FUA path).  A discard of dirty blocks must commit before it ends:
    that commit fails, so the discard fails with EIO; status field 22
    latches the error, field 21 stops counting.  The first failed write
    latched the failed state (field 23): the next flush fails, reporting
    the dirty blocks at risk.
    Healed, the state stays failed: writes go around the cache (a rewrite
    of a dirty block drops it), commits work again, and a flush puts
    exactly the acknowledged data on the origin.  The origin can discard
    (null_blk): over one that cannot, a discard keeps the dirty copies and
    commits nothing."""
    ram = stack.nullb(32, discard=True)
    m = tclib.seeded_origin(ram, seed=181)
    cram = stack.ram(16 * MiB)
    healthy = stack.flakey_table(cram)
    broken = stack.flakey_table(cram, up=0, down=3600, features=["error_writes"])
    cdev = stack.dm("tc-cache", healthy)
    tc = stack.tiercache(ram, cdev.path, 8, "writeback")
    with tclib.Workload(tc.path, m, seed=182) as wl:
        for b in range(100, 140):
            wl.write_direct(b * B, B)
    _fsync(tc.path)
    st = tc.status()
    assert st["dirty"] == 40 and st["meta_error"] == 0, st["raw"]
    commits = st["meta_commits"]
    assert commits >= 1, f"an fsync after 40 new dirty blocks committed nothing: {st['raw']}"

    cdev.suspend()
    cdev.reload(broken)
    used = tc.status()["used"]               # reads may have promoted blocks
    bypass = tc.status()["write_bypass"]
    with tclib.Workload(tc.path, m, seed=184) as wl:
        for b in (500, 501, 777):            # never cached: fresh slots
            wl.write_direct(b * B, B)
    # the same through the FUA path (the slot write, then a commit)
    fd = os.open(tc.path, os.O_WRONLY | os.O_DIRECT | os.O_DSYNC)
    buf = tclib.aligned_buf(B)
    try:
        data = bytes([88]) * B
        buf[:B] = data
        assert os.pwrite(fd, memoryview(buf)[:B], 888 * B) == B
        m.data[888 * B:889 * B] = data
    finally:
        os.close(fd)
        buf.close()
    st = tc.status()
    assert st["dirty"] == 40, f"a failed write to a fresh slot left it dirty: {st['raw']}"
    assert st["used"] == used, f"a failed write to a fresh slot kept its slot: {st['raw']}"
    assert st["write_bypass"] == bypass + 4, st["raw"]
    assert st["cache_failed"] == -errno.EIO, \
        f"failed state not latched: {st['raw']}"
    m.verify_device(tc.path, what="after writes around the failed cache")
    m.verify_device(ram, what="origin after writes around the failed cache",
                    start=500 * B, end=502 * B)
    # Dropping dirty blocks 101-103 changes their entries: the discard
    # commits before it ends, and that commit fails.
    with pytest.raises(OSError) as ei:
        tclib.discard(tc.path, 101 * B, 3 * B)
    assert ei.value.errno == errno.EIO
    assert tc.status()["dirty"] == 37
    with pytest.raises(OSError) as ei:
        _fsync(tc.path)
    assert ei.value.errno == errno.EIO
    st = tc.status()
    assert st["meta_error"] == -errno.EIO, f"failed commit not latched: {st['raw']}"
    assert st["meta_commits"] == commits, st["raw"]

    cdev.suspend()
    cdev.reload(healthy)
    used = tc.status()["used"]
    with tclib.Workload(tc.path, m, seed=183) as wl:
        for b in (500, 501, 777, 100, 2000, 101, 102, 103):
            wl.write_direct(b * B, B)
    _fsync(tc.path)
    st = tc.status()
    # still failed: nothing new cached, dirty block 100 dropped and written around
    assert st["dirty"] == 36 and st["used"] < used, st["raw"]
    assert st["meta_commits"] > commits, st["raw"]
    assert st["meta_error"] == -errno.EIO, f"the latch went away: {st['raw']}"
    m.verify_device(tc.path, what="healed cache")
    st = tc.flush()
    assert st["dirty"] == 0 and st["error"] == 0, st["raw"]
    tc.remove()
    m.verify_device(ram, what="origin after the flush")
