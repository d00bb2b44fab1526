# SPDX-License-Identifier: GPL-2.0
"""Writes of several blocks (docs/tiercache.rst, "A bio that spans
blocks"): in writeback mode a write of whole blocks whose slots are
consecutive (fresh slots taken next to each other, or copies already in
consecutive slots, dirty or clean) goes to the cache device as one bio per
run of up to 256 blocks, not one bio per block; the new dirty slots are
recorded on disk as a one-block write's are; a block that cannot join (its
slot is not the next one) ends the run; a cache device that fails a run
sends it whole to the origin and drops the copies it replaced."""

import errno
import os
import random

import pytest

import faults
import tclib
from tclib import MiB

pytestmark = [pytest.mark.module, pytest.mark.usefixtures("tc_module")]

B = 4096
RUN = 256               # TC_RUN_MAX in tiercache.h
# Nothing else writes the cache device while a test counts its writes: no
# background writeback (it would clean blocks and commit), and no timed
# commit (it writes metadata blocks).  Commits come from flushes only.
QUIET = {"high_watermark": 100, "low_watermark": 0, "commit_ms": 600000}


def _writes(path):
    return tclib.block_stat(path)["writes"]


def _dirty_on_disk(cache):
    """The blocks the cache device's committed entries record dirty."""
    return set(faults.committed_dirty(cache))


def _write_counted(tc, wl, cache, off, length):
    """One O_DIRECT write through tiercache; (writes the cache device got,
    write_hits, write_misses)."""
    tclib.settle(cache, quiet_s=0.3)
    st0, w0 = tc.status(), _writes(cache)
    wl.write_direct(off, length)
    st, w = tc.status(), _writes(cache)
    return (w - w0, st["write_hits"] - st0["write_hits"],
            st["write_misses"] - st0["write_misses"])


def test_run_of_blocks_is_one_cache_write_per_run(stack):
    """1 MiB written with one O_DIRECT write, three times: to blocks not
    cached (fresh slots, taken next to each other), to their dirty copies,
    and after a flush to their clean copies.  Each time one write reaches
    the cache device (the module before runs sent 256, the one with runs
    of at most 64 blocks 4), each run counts one
    write (hits + misses = the cache device's writes), and nothing goes to
    the origin.  The dirty slots are on disk: after a remove and a load of
    the same cache all 256 blocks are dirty and read back byte for byte,
    and a flush writes them to the origin."""
    s = stack.setup(origin_mib=64, cache_mib=16, mode="writeback", keys=QUIET,
                    seed=880)
    tc, m, cache = s.tc, s.model, s.cache
    first = 1024
    with tclib.Workload(tc.path, m, seed=881) as wl:
        for state in ("uncached", "dirty", "clean"):
            o0 = _writes(s.origin.path)
            writes, hits, misses = _write_counted(tc, wl, cache, first * B, MiB)
            st = tc.status()
            assert writes <= 256 // RUN + 2, \
                (f"{state}: a 1 MiB write of 256 blocks took {writes} writes of "
                 f"the cache device ({hits} hits, {misses} misses): runs of "
                 f"{RUN} blocks make it {256 // RUN}: {st['raw']}")
            assert hits + misses == writes, \
                f"{state}: {hits} write hits + {misses} misses for {writes} cache writes"
            assert (misses if state == "uncached" else hits) == writes, st["raw"]
            assert st["dirty"] == 256 and st["write_bypass"] == 0, st["raw"]
            assert _writes(s.origin.path) == o0, f"{state}: the origin was written"
            m.verify_device(tc.path, what=f"after the write to {state} blocks")
            if state == "dirty":
                tc.flush()
                assert tc.status()["dirty"] == 0
    tc.remove()
    tc2 = stack.dm("tc-wrun-again", tclib.TierCache.make_table(
        s.origin.path, cache, 8, "writeback", QUIET, None, fmt=False),
        cls=tclib.TierCache)
    st = tc2.status()
    assert st["dirty"] == 256, f"the runs' dirty slots were not on disk: {st['raw']}"
    m.verify_device(tc2.path, what="after a load of the same cache")
    tc2.flush()
    m.verify_device(s.origin.path, what="origin after the flush")


def test_fua_run_is_one_bio_committed_before_it_completes(stack):
    """A 1 MiB O_DIRECT O_DSYNC write (REQ_FUA) of blocks not cached,
    submitted with libaio: an asynchronous write is not followed by a flush
    of the device (a synchronous O_DSYNC pwrite is: blkdev_fsync), so only
    the FUA runs' own commits can make it durable.  It is taken as at most
    6 bios (the module before: 256 one-block FUA writes), and once fio has
    seen it complete, the cache device's committed entries (read raw)
    record all 256 blocks dirty.  The data reads back byte for byte, and a
    flush puts it on the origin."""
    s = stack.setup(origin_mib=64, cache_mib=16, mode="writeback", keys=QUIET,
                    seed=886)
    tc, m, cache = s.tc, s.model, s.cache
    first = 1024
    pattern = b"tiercache-fua-run"
    data = (pattern * (MiB // len(pattern) + 1))[:MiB]
    tclib.settle(cache, quiet_s=0.3)
    st0 = tc.status()
    tclib.fio(["--name=fua", f"--filename={tc.path}", "--ioengine=libaio",
               "--direct=1", "--sync=dsync", "--rw=write", "--bs=1M",
               "--size=1M", f"--offset={first * B}", "--iodepth=1",
               f'--buffer_pattern="{pattern.decode()}"'])
    st = tc.status()
    on_disk = _dirty_on_disk(cache)
    m.data[first * B:first * B + MiB] = data
    tclib.compare(data, tclib.read_direct(tc.path, first * B, MiB), first * B,
                  "the FUA write read back")
    bios = st["write_hits"] + st["write_misses"] - st0["write_hits"] - st0["write_misses"]
    assert bios <= 256 // RUN + 2, \
        (f"a 1 MiB FUA write of 256 blocks was taken as {bios} bios: runs of "
         f"{RUN} blocks make it {256 // RUN}: {st['raw']}")
    assert st["meta_commits"] > st0["meta_commits"], \
        f"a FUA write completed without a commit: {st0['raw']} -> {st['raw']}"
    missing = set(range(first, first + 256)) - on_disk
    assert not missing, \
        (f"{len(missing)} of 256 blocks of an acknowledged FUA write are not "
         f"recorded dirty on the cache device (first: {min(missing)})")
    m.verify_device(tc.path, what="after the FUA write")
    tc.flush()
    m.verify_device(s.origin.path, what="origin after the flush")


def test_run_ends_at_a_block_whose_slot_is_not_the_next(stack):
    """Block 2056 + slots is written first: it takes block 2056's home slot.
    Then one 64 KiB write of blocks 2048-2063: 2048-2055 go in one run;
    2056 cannot take the slot after 2055's, so the run ends there, and the
    rest (2056-2063, in slots next to each other elsewhere) is a second run:
    2 writes of the cache device, not 16."""
    s = stack.setup(origin_mib=64, cache_mib=16, mode="writeback", keys=QUIET,
                    seed=882)
    tc, m, cache = s.tc, s.model, s.cache
    nslots = tc.status()["total"]
    assert 2064 + nslots < 64 * MiB // B
    with tclib.Workload(tc.path, m, seed=883) as wl:
        wl.write_direct((2056 + nslots) * B, B)
        writes, hits, misses = _write_counted(tc, wl, cache, 2048 * B, 16 * B)
    st = tc.status()
    # 2 runs; 3 if a block the udev probe promoted sits among the free
    # slots the second run starts in
    assert 2 <= writes <= 3 and (hits, misses) == (0, writes), \
        (f"16 blocks, block 2056's home slot taken: {writes} cache writes, "
         f"{hits} hits, {misses} misses (expected 2 runs): {st['raw']}")
    assert st["dirty"] == 17, st["raw"]
    m.verify_device(tc.path)
    tc.flush()
    m.verify_device(s.origin.path, what="origin after the flush")


def test_failed_run_write_goes_to_the_origin_whole(stack):
    """The cache device fails every IO (dm-flakey down) under a 512 KiB
    write of blocks 1024-1151: 1024-1087 cached clean, except 1030-1033
    dirty, 1100 dirty, the rest not cached.  The write succeeds: its first
    run (1024-1087) goes to the origin whole, the rest as a second run or,
    if mapped once the cache failed, as the failed cache's one-block
    writes.  The failed state is latched, nothing is left
    dirty (the dirty copies were replaced), and the origin itself holds the
    new data, byte for byte; so does tiercache once the cache device
    heals.  (No fsync: with the cache device down, a flush fails, as its
    commit cannot be written.)"""
    ram = stack.ram(64 * MiB)
    m = tclib.seeded_origin(ram, seed=884)
    cram = stack.ram(16 * MiB)
    healthy = stack.flakey_table(cram)
    broken = stack.flakey_table(cram, up=0, down=3600)
    cdev = stack.dm("tc-cache88", healthy)
    tc = stack.tiercache(ram, cdev.path, 8, "writeback", keys=QUIET)
    with tclib.Workload(tc.path, m, seed=885) as wl:
        wl.write_direct(1024 * B, 64 * B)
        tc.flush()
        wl.write_direct(1030 * B, 4 * B)
        wl.write_direct(1100 * B, B)
    assert tc.status()["dirty"] == 5, tc.status()["raw"]
    cdev.suspend()
    cdev.reload(broken)
    cur = tclib.KmsgCursor("write run, cache device down")
    data = random.Random(886).randbytes(128 * B)
    tclib.write_direct(tc.path, 1024 * B, data)
    m.data[1024 * B:1152 * B] = data
    log = cur.lines()
    assert any("cache device error" in ln and "1024" in ln for ln in log), \
        f"the write was not taken back from the failing cache device: {log}"
    st = tc.status()
    assert st["cache_failed"] == -errno.EIO, f"failed state not latched: {st['raw']}"
    assert st["dirty"] == 0, f"replaced dirty copies left: {st['raw']}"
    m.verify_device(ram, what="origin after the failed run", start=1024 * B,
                    end=1152 * B)
    m.verify_device(tc.path, what="through the failed cache")
    cdev.suspend()
    cdev.reload(healthy)
    m.verify_device(tc.path, what="healed")
