# SPDX-License-Identifier: GPL-2.0
"""Reads of several cached blocks (docs/tiercache.rst, "A bio that spans
blocks"): a read of blocks cached in consecutive slots goes to the cache
device as one bio per run of up to 256 blocks, not one bio per block; the
data read is the newest, whatever the blocks' states; a run that meets a
block cached elsewhere, or not cached, ends there and the rest is served
on its own; a cache device that fails such a read sends it to the origin
when every block is clean, and fails it when one is dirty."""

import errno

import pytest

import tclib
from tclib import MiB

pytestmark = [pytest.mark.module, pytest.mark.usefixtures("tc_module")]

B = 4096
RUN = 256               # TC_RUN_MAX in tiercache.h
# Nothing else reads the cache device while a test counts its reads: no
# background writeback (it reads dirty blocks), and no timed commit (a
# commit reads the metadata blocks it rewrites; a promotion or a new dirty
# block marks one).  Commits come from flushes only.
QUIET = {"high_watermark": 100, "low_watermark": 0, "commit_ms": 600000}


def _reads(path):
    return tclib.block_stat(path)["reads"]


def _read_counted(tc, cache, off, length):
    """O_DIRECT read through tiercache; (data, reads the cache device got,
    read_hits, read_misses)."""
    tclib.settle(cache, quiet_s=0.3)
    st0, r0 = tc.status(), _reads(cache)
    got = tclib.read_direct(tc.path, off, length)
    st, r = tc.status(), _reads(cache)
    return (got, r - r0, st["read_hits"] - st0["read_hits"],
            st["read_misses"] - st0["read_misses"])


def test_run_of_cached_blocks_is_one_cache_read_per_run(stack):
    """1 MiB written with one O_DIRECT write (tiercache takes it block by
    block: consecutive home slots), then read back with one 1 MiB read:
    one read reaches the cache device (the module before runs sent 256,
    the one with runs of at most 64 blocks 4), the
    data is byte for byte what was written, no block was a miss, and each
    run counts one read hit.
    The same once the blocks are clean (after a flush), and for a read that
    starts and ends inside a block."""
    s = stack.setup(origin_mib=64, cache_mib=16, mode="writeback", keys=QUIET,
                    seed=870)
    tc, m, cache = s.tc, s.model, s.cache
    first = 1024
    with tclib.Workload(tc.path, m, seed=871) as wl:
        wl.write_direct(first * B, MiB)
    assert tc.status()["dirty"] == 256, tc.status()["raw"]
    for state in ("dirty", "clean"):
        got, reads, hits, misses = _read_counted(tc, cache, first * B, MiB)
        tclib.compare(m.data[first * B:first * B + MiB], got, first * B,
                      f"1 MiB read of {state} cached blocks")
        assert misses == 0, f"{state}: {misses} read misses of cached blocks"
        # one bio, one count (test_10's rule: the device's reads agree)
        assert hits == reads, f"{state}: {hits} read hits for {reads} cache reads"
        assert reads <= 256 // RUN + 2, \
            (f"{state}: a 1 MiB read of 256 blocks cached in consecutive slots "
             f"took {reads} reads of the cache device ({hits} read hits): "
             f"runs of {RUN} blocks make it {256 // RUN}")
        if state == "dirty":
            tc.flush()
    # from the middle of block 1030 to the middle of block 1040: 11 blocks
    off, length = (first + 6) * B + 1024, 10 * B
    got, reads, hits, misses = _read_counted(tc, cache, off, length)
    tclib.compare(m.data[off:off + length], got, off, "unaligned read of a run")
    assert (reads, misses) == (1, 0), \
        f"an unaligned read of 11 cached blocks: {reads} cache reads, {misses} misses"
    m.verify_device(tc.path)


def test_run_ends_at_a_block_that_is_not_in_the_next_slot(stack):
    """Blocks 2048-2063 cached but 2056 not: a 64 KiB read takes two runs
    from the cache device (2048-2055, 2057-2063) and 2056 from the origin.
    Then 2056 is written: its home slot is free, so one read of the cache
    device serves all 16 blocks."""
    s = stack.setup(origin_mib=64, cache_mib=16, mode="writeback", keys=QUIET,
                    seed=872)
    tc, m, cache = s.tc, s.model, s.cache
    with tclib.Workload(tc.path, m, seed=873) as wl:
        for b in range(2048, 2064):
            if b != 2056:
                wl.write_direct(b * B, B)
        o0 = _reads(s.origin.path)
        got, reads, hits, misses = _read_counted(tc, cache, 2048 * B, 16 * B)
        tclib.compare(m.data[2048 * B:2064 * B], got, 2048 * B, "read across a hole")
        assert reads == 2 and misses == 1, \
            (f"16 blocks, block 2056 not cached: {reads} cache reads, {hits} hits, "
             f"{misses} misses (expected 2 runs and 1 miss)")
        assert _reads(s.origin.path) - o0 == 1
        wl.write_direct(2056 * B, B)
    got, reads, hits, misses = _read_counted(tc, cache, 2048 * B, 16 * B)
    tclib.compare(m.data[2048 * B:2064 * B], got, 2048 * B, "read of the filled run")
    assert (reads, misses) == (1, 0), f"16 consecutive cached blocks: {reads} cache reads"
    m.verify_device(tc.path)


def test_failed_run_read_origin_if_clean_error_if_dirty(stack):
    """The cache device fails every IO (dm-flakey down).  A run read of
    clean blocks is served from the origin, byte for byte, and latches
    nothing; a run read with a dirty block in it fails with EIO (the cache
    holds that block's only copy: the origin's older data must not be
    served) and latches the failed state."""
    ram = stack.ram(64 * MiB)
    m = tclib.seeded_origin(ram, seed=874)
    cram = stack.ram(16 * MiB)
    healthy = stack.flakey_table(cram)
    broken = stack.flakey_table(cram, up=0, down=3600)
    cdev = stack.dm("tc-cache87", healthy)
    tc = stack.tiercache(ram, cdev.path, 8, "writeback", keys=QUIET)
    with tclib.Workload(tc.path, m, seed=875) as wl:
        wl.write_direct(1024 * B, 128 * B)
        tc.flush()
        wl.write_direct(1100 * B, B)        # dirty again, in its slot
    assert tc.status()["dirty"] == 1, tc.status()["raw"]
    got, reads, _, misses = _read_counted(tc, cdev.path, 1024 * B, 128 * B)
    tclib.compare(m.data[1024 * B:1152 * B], got, 1024 * B, "healthy run read")
    assert reads <= 2 and misses == 0, (reads, misses)
    cdev.suspend()
    cdev.reload(broken)
    cur = tclib.KmsgCursor("clean run, cache device down")
    got = tclib.read_direct(tc.path, 1024 * B, 64 * B)
    tclib.compare(m.data[1024 * B:1088 * B], got, 1024 * B,
                  "a clean run the cache device failed")
    assert any("cache device error on block 1024" in ln for ln in cur.lines()), \
        "the clean run was not taken back from the failing cache device"
    st = tc.status()
    assert st["cache_failed"] == 0 and st["dirty"] == 1, st["raw"]
    with pytest.raises(OSError) as ei:
        tclib.read_direct(tc.path, 1088 * B, 64 * B)
    assert ei.value.errno == errno.EIO, ei.value
    st = tc.status()
    assert st["cache_failed"] == -errno.EIO, f"failed state not latched: {st['raw']}"
    assert st["dirty"] == 1, st["raw"]
    cdev.suspend()
    cdev.reload(healthy)
    # healed: the dirty block is read from the cache again (its only copy)
    got = tclib.read_direct(tc.path, 1088 * B, 64 * B)
    tclib.compare(m.data[1088 * B:1152 * B], got, 1088 * B, "healed, dirty block inside")
    m.verify_device(tc.path)
