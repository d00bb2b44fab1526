# SPDX-License-Identifier: GPL-2.0
"""Cache-full behaviour (writes go around, data intact) and discard."""

import random
import time

import pytest

import tcdisk
import tclib
from faults import Bg, swap
from tclib import KiB, MiB

pytestmark = [pytest.mark.module, pytest.mark.usefixtures("tc_module")]

B = 4096


def cache_bytes_for(slots):
    """The smallest cache device (whole blocks) that formats to @slots."""
    nb = slots
    while tcdisk.layout(nb * B // 512)[0] < slots:
        nb += 1
    return nb * B


def test_cache_full_writes_go_around(stack):
    """64 slots, 1024 distinct blocks written: writes go around the cache."""
    origin = stack.slow(32 * MiB, write_ms=20)
    cache = stack.ram(cache_bytes_for(64))
    m = tclib.seeded_origin(origin.path, seed=121)
    tc = stack.tiercache(origin.path, cache, 8, "writeback")
    assert tc.status()["total"] == 64
    blocks = random.Random(122).sample(range(32 * MiB // B), 1024)
    with tclib.Workload(tc.path, m, seed=123) as wl:
        for b in blocks:
            wl.write_direct(b * B, B)
        st = tc.status()
        print(st["raw"])
        assert st["write_bypass"] > 0, f"1024 distinct blocks into 64 slots, no bypass: {st['raw']}"
        assert st["write_bypass"] <= 1024 and st["used"] <= 64 and st["dirty"] <= 64, st["raw"]
        m.verify_device(tc.path)
        # rewrites and reads on a full cache
        for b in blocks[:200]:
            wl.write_direct(b * B, B)
        wl.run(80)
    m.verify_device(tc.path)
    tc.flush()
    tc.remove()
    m.verify_device(origin.path, what="origin after a cache-full workload")


def test_discard_drops_cached_copies_and_reaches_origin(stack):
    nb = stack.nullb(64, discard=True)
    cache = stack.ram(16 * MiB)
    m = tclib.seeded_origin(nb, seed=131)
    tc = stack.tiercache(nb, cache, 8, "writeback")
    with tclib.Workload(tc.path, m, seed=132) as wl:
        for off in range(0, 4 * MiB, 64 * KiB):          # clean cached copies
            wl.read_check(off, 64 * KiB, direct=True)
        for off in range(8 * MiB, 9 * MiB, B):           # dirty blocks
            wl.write_direct(off, B)
    deadline = time.monotonic() + 20
    while tc.status()["used"] < 1024 + 256 and time.monotonic() < deadline:
        time.sleep(0.1)
    st0 = tc.status()
    assert st0["used"] >= 1024 + 256 and st0["dirty"] == 256, st0["raw"]
    n0 = tclib.block_stat(nb)
    tclib.discard(tc.path, 0, 4 * MiB)                 # clean cached range
    tclib.discard(tc.path, 8 * MiB, 512 * KiB)         # half of the dirty range
    # a slot that is dirty in the on-disk metadata is reused only after a
    # commit has recorded it free (the discard starts one at once)
    deadline = time.monotonic() + 10
    while tc.status()["used"] > st0["used"] - 1024 - 128 and time.monotonic() < deadline:
        time.sleep(0.1)
    st = tc.status()
    d = tclib.stat_delta_when(nb, n0, lambda d: d["discard_sectors"] >=
                              (4 * MiB + 512 * KiB) // 512)
    print(st0["raw"], "->", st["raw"], d)
    assert st["used"] <= st0["used"] - 1024 - 128, \
        f"discard did not drop cached copies: used {st0['used']} -> {st['used']}"
    assert st["dirty"] == 128, f"discarded dirty blocks still dirty: {st['raw']}"
    assert d["discards"] >= 1 and d["discard_sectors"] >= (4 * MiB + 512 * KiB) // 512, \
        f"the origin (discard capable) did not get the discard: {d}"
    # the origin zeroes discarded ranges, and nothing stale is served
    m.data[0:4 * MiB] = bytes(4 * MiB)
    m.data[8 * MiB:8 * MiB + 512 * KiB] = bytes(512 * KiB)
    m.verify_device(tc.path, what="read back after discard")
    tc.flush()
    tc.remove()
    m.verify_device(nb, what="origin after discard + flush")


def test_dropped_dirty_slots_wait_for_a_commit_then_come_back(stack):
    """Dirty blocks discarded before any commit recorded them leave slots
    that the disk still records dirty: they are parked, not given out,
    until the discard's commit records them empty, and then freed.  The
    cache device's writes are delayed so that the commit takes seconds
    and the writeback engine's merge frees the slots inside it (on a RAM
    disk the commit usually ends first and nothing is ever parked)."""
    delay_ms = 4000
    nb = stack.nullb(64, discard=True)
    cache = stack.slow(16 * MiB)
    backing = cache.table.split()[3]
    n = tclib.size_sectors(cache.path)
    m = tclib.seeded_origin(nb, seed=133)
    tc = stack.tiercache(nb, cache.path, 8, "writeback",
                         keys={"commit_ms": 600000, "high_watermark": 100,
                               "low_watermark": 99})
    with tclib.Workload(tc.path, m, seed=134) as wl:
        for off in range(0, 64 * B, B):
            wl.write_direct(off, B)
    st0 = tc.status()
    used0 = st0["used"]     # with clean copies the device's probes read
    assert st0["dirty"] == 64 and used0 >= 64, st0["raw"]
    swap(cache, f"0 {n} delay {backing} 0 0 {backing} 0 {delay_ms}")
    try:
        bg = Bg(tclib.discard, tc.path, 0, 64 * B)
        # the discard's commit: a flush, the entries, the superblock
        seen = []
        while bg.alive():
            seen.append((time.monotonic(), tc.status()["used"]))
            time.sleep(0.2)
        bg.join(120, "discard")
        if bg.error:
            raise bg.error
    finally:
        swap(cache, f"0 {n} delay {backing} 0 0 {backing} 0 0")
    st = tc.status()
    print("used while the discard committed:", [u for _, u in seen],
          "after:", st["raw"])
    assert bg.t1 - bg.t0 >= 2 * delay_ms / 1000, \
        f"the discard took {bg.t1 - bg.t0:.1f}s: its commit did not wait for the delayed device"
    # no slot was given out while the disk could still say it is dirty: the
    # samples up to the commit's superblock write (the last delayed write)
    early = [u for t, u in seen if t < bg.t1 - delay_ms / 1000 + 0.5]
    assert len(early) >= 2 and min(early) == used0, \
        f"slots freed before the commit: used {early}"
    # and once the commit recorded them empty, every one is free again
    deadline = time.monotonic() + 10
    while tc.status()["used"] > used0 - 64 and time.monotonic() < deadline:
        time.sleep(0.2)
    st = tc.status()
    assert st["used"] == used0 - 64 and st["dirty"] == 0, \
        f"slots parked for a commit were never freed: {st['raw']}"
    m.data[0:64 * B] = bytes(64 * B)
    m.verify_device(tc.path, what="read back after discard")


def test_partial_block_discard_keeps_rest_of_block(stack):
    """A discard of part of a 32 KiB block must not lose the rest of it."""
    nb = stack.nullb(32, discard=True)
    cache = stack.ram(16 * MiB)
    m = tclib.seeded_origin(nb, seed=141)
    tc = stack.tiercache(nb, cache, 64, "writeback")
    BB = 32 * KiB
    with tclib.Workload(tc.path, m, seed=142, block_bytes=BB) as wl:
        for i in range(16):
            wl.write_direct(i * BB, BB)                   # 16 dirty blocks
    assert tc.status()["dirty"] == 16
    for i in range(16):
        try:
            tclib.discard(tc.path, i * BB + 8 * KiB, 4 * KiB)
        except OSError as e:
            print("partial-block discard refused:", e)
    # the discarded 4 KiB pieces are undefined (old data or zeroes); all else must match
    for i in range(16):
        lo = i * BB + 8 * KiB
        got = tclib.read_direct(tc.path, lo, 4 * KiB)
        assert got in (bytes(m.data[lo:lo + 4 * KiB]), bytes(4 * KiB)), \
            f"discarded range at {lo} holds neither the old data nor zeroes"
        m.data[lo:lo + 4 * KiB] = got
    m.verify_device(tc.path, end=16 * BB, what="rest of partially discarded blocks")
    tc.flush()
    tc.remove()
    for i in range(16):
        lo = i * BB + 8 * KiB
        m.data[lo:lo + 4 * KiB] = tclib.read_direct(nb, lo, 4 * KiB)
    m.verify_device(nb, what="origin after partial discards")


def test_discard_on_origin_without_discard(stack):
    """brd (6.1) has no discard: discard through the cache must not corrupt
    anything outside the range, and leave the cache consistent."""
    s = stack.setup(origin_mib=32, cache_mib=16, seed=151)
    tc, m = s.tc, s.model
    with tclib.Workload(tc.path, m, seed=152) as wl:
        for off in range(0, 2 * MiB, B):
            wl.write_direct(off, B)
    try:
        tclib.discard(tc.path, 512 * KiB, 512 * KiB)
    except OSError as e:
        print("discard refused:", e)
    lo, hi = 512 * KiB, 1 * MiB
    got = tclib.read_direct(tc.path, lo, hi - lo)
    m.data[lo:hi] = got            # contents of a discarded range are undefined
    m.verify_device(tc.path)
    tc.flush()
    # whatever the cache returned for the range, the origin holds after a flush
    tc.remove()
    m.verify_device(s.origin.path)


def test_discard_over_origin_without_discard_never_goes_back_in_time(stack):
    """The origin cannot discard (here a null_blk without discard; brd on
    6.1, or a dm table swapped to `error` while a fault lasts).  Block X
    holds version 1 on the origin
    (written, flushed) and version 2 dirty in the cache; a discard of X
    completes.  A read of X may then return version 2 (the discard was a
    no-op) or zeroes, never version 1: the cache must not drop the newest
    copy when the origin keeps an older one.  Found by the stress test
    (seed 1: 'read write#13101; acceptable: write#13627, discard(zeroes)')."""
    origin = stack.nullb(32, discard=False)     # brd can discard on newer kernels
    tclib.seeded_origin(origin, seed=153)
    tc = stack.tiercache(origin, stack.ram(16 * MiB), 8, "writeback")
    assert tclib.sysfs_queue(origin, "discard_max_bytes") == "0", \
        "the origin can discard: this test needs one that cannot"
    X = 300
    v1 = random.Random(154).randbytes(B)
    v2 = random.Random(155).randbytes(B)
    tclib.write_direct(tc.path, X * B, v1)
    tc.flush()
    tclib.write_direct(tc.path, X * B, v2)
    assert tc.status()["dirty"] == 1
    tclib.discard(tc.path, X * B, B)
    got = tclib.read_direct(tc.path, X * B, B)
    if got == v1:
        pytest.fail(f"block {X} reads version 1 after the discard: the discard dropped "
                    f"the newer dirty copy and the origin, which cannot discard, "
                    f"kept the older one: {tc.status()['raw']}", pytrace=False)
    assert got in (v2, bytes(B)), f"block {X} reads neither version 2 nor zeroes"
    tc.flush()
    assert tclib.read_direct(origin, X * B, B) in (v2, bytes(B))


def test_failed_origin_discard_never_goes_back_in_time(stack):
    """The origin can discard but fails the discard (dm-flakey with
    error_writes, as in a fault window of the stress test).  Block X holds
    version 1 on the origin and version 2 dirty in the cache; the discard
    of X fails.  A read of X must then return version 2 (or zeroes), never
    version 1: the dirty copy is dropped only once the origin has
    discarded.  Found by the soak hour of 2026-11-28 (seed 2137552990:
    'read write#102292; acceptable: write#102464, discard(zeroes)', an
    origin error_writes window open)."""
    nb = stack.nullb(32, discard=True)
    n = tclib.size_sectors(nb)
    origin = stack.dm(stack._name("fl"), stack.flakey_table(nb))
    tclib.seeded_origin(origin.path, seed=156)
    tc = stack.tiercache(origin.path, stack.ram(16 * MiB), 8, "writeback")
    assert tclib.sysfs_queue(origin.path, "discard_max_bytes") != "0", \
        "the origin cannot discard: this test needs one that can"
    X = 300
    v1 = random.Random(157).randbytes(B)
    v2 = random.Random(158).randbytes(B)
    tclib.write_direct(tc.path, X * B, v1)
    tc.flush()
    tclib.write_direct(tc.path, X * B, v2)
    assert tc.status()["dirty"] == 1
    origin.suspend()
    origin.reload(f"0 {n} flakey {nb} 0 0 3600 1 error_writes")
    try:
        tclib.discard(tc.path, X * B, B)
        failed = None
    except OSError as e:
        failed = e
    tclib.log(f"the discard: {failed!r}")
    got = tclib.read_direct(tc.path, X * B, B)
    if got == v1:
        pytest.fail(f"block {X} reads version 1 after a discard the origin failed: the "
                    f"newer dirty copy was dropped: {tc.status()['raw']}", pytrace=False)
    assert got in (v2, bytes(B)), f"block {X} reads neither version 2 nor zeroes"
    origin.suspend()
    origin.reload(stack.flakey_table(nb))
    tc.flush()
    assert tclib.read_direct(origin.path, X * B, B) in (v2, bytes(B))
    # a discard that succeeds drops the dirty copy and reaches the origin
    tclib.write_direct(tc.path, X * B, v1)
    assert tc.status()["dirty"] == 1
    tclib.discard(tc.path, X * B, B)
    st = tc.status()
    assert st["dirty"] == 0, f"the discarded dirty block stayed dirty: {st['raw']}"
    assert tclib.read_direct(tc.path, X * B, B) == bytes(B)


def test_discard_finer_than_a_thin_block_keeps_the_dirty_copy(stack):
    """A thin origin (64 KiB blocks) completes a discard of part of one of
    its blocks without discarding anything.  Block X (4 KiB) holds
    version 1 on the origin and version 2 dirty in the cache; a discard of
    X alone must not drop version 2 (reads would return version 1).  A
    discard of a whole thin block drops the dirty copies in it.  Found by
    a review of the fix above (2026-11-28)."""
    tclib.run(["modprobe", "dm-thin-pool"])
    meta, data = stack.ram(16 * MiB), stack.ram(64 * MiB)
    pool = stack.dm(stack._name("pool"),
                    f"0 {tclib.size_sectors(data)} thin-pool {meta} {data} 128 0 "
                    f"1 skip_block_zeroing")
    pool.message("create_thin", 0)
    thin = stack.dm(stack._name("thin"), f"0 {32 * MiB // 512} thin {pool.path} 0")
    assert tclib.sysfs_queue(thin.path, "discard_granularity") == str(64 * KiB)
    tc = stack.tiercache(thin.path, stack.ram(16 * MiB), 8, "writeback")
    X, Y = 300, 1024                       # Y: the first block of a thin block
    v1 = random.Random(159).randbytes(B)
    v2 = random.Random(160).randbytes(B)
    tclib.write_direct(tc.path, X * B, v1)
    tc.flush()
    tclib.write_direct(tc.path, X * B, v2)
    tclib.write_direct(tc.path, Y * B, v2)
    assert tc.status()["dirty"] == 2
    tclib.discard(tc.path, X * B, B)
    got = tclib.read_direct(tc.path, X * B, B)
    if got == v1:
        pytest.fail(f"block {X} reads version 1 after a discard of part of a thin block: "
                    f"the newer dirty copy was dropped: {tc.status()['raw']}", pytrace=False)
    assert got in (v2, bytes(B)), f"block {X} reads neither version 2 nor zeroes"
    tclib.discard(tc.path, Y * B, 64 * KiB)
    st = tc.status()
    assert st["dirty"] == 1, f"a discard of a whole thin block kept its dirty copy: {st['raw']}"
    assert tclib.read_direct(tc.path, Y * B, B) == bytes(B)
    tc.flush()
    assert tclib.read_direct(thin.path, X * B, B) in (v2, bytes(B))
