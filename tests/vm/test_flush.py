# SPDX-License-Identifier: GPL-2.0
"""The neighbour-merging writeback: request-count oracles on the slow disk.

Every test counts what the origin (a dm-delay or dm-flakey device) received
in /sys/block/<dev>/stat, and verifies the data byte for byte.
"""

import math
import os
import random
import threading
import time

import pytest

import tclib
from tclib import KiB, MiB

BS = 4096
pytestmark = pytest.mark.usefixtures("tc_module")


class BlockWriter:
    """O_DIRECT 4 KiB block writes of fresh seeded data, kept in a model."""

    def __init__(self, path, model, seed=3):
        self.path = path
        self.model = model
        self.rng = random.Random(seed)
        self.buf = tclib.aligned_buf(BS)

    def write(self, blocks):
        fd = os.open(self.path, os.O_WRONLY | os.O_DIRECT)
        try:
            for b in blocks:
                data = self.rng.randbytes(BS)
                self.buf[:BS] = data
                assert os.pwrite(fd, memoryview(self.buf)[:BS], b * BS) == BS
                self.model.data[b * BS:(b + 1) * BS] = data
        finally:
            os.close(fd)


def make_cache(stack, origin_mib, cache_mib, write_ms=50, keys=None,
               flakey=False):
    """A seeded slow origin (dm-delay, or dm-flakey) and a tiercache on it."""
    if flakey:
        ram = stack.ram(origin_mib * MiB)
        slow = stack.dm(stack._name("flakey"), stack.flakey_table(ram))
        slow.backing = ram
    else:
        slow = stack.slow(origin_mib * MiB, write_ms=write_ms)
    model = tclib.seeded_origin(slow.path)
    cache = stack.ram(cache_mib * MiB)
    # no background writeback unless a test asks for it
    k = {"high_watermark": 100, "low_watermark": 0}
    k.update(keys or {})
    tc = stack.tiercache(slow.path, cache, keys=k)
    return slow, tc, model


def flush_counted(tc, slow, **kw):
    before = slow.stat()
    st = tc.flush(**kw)
    d = tclib.stat_delta(slow.stat(), before)
    return st, d


def runs_of(blocks):
    """Number of maximal runs of consecutive block numbers."""
    s = sorted(set(blocks))
    return sum(1 for i, b in enumerate(s) if i == 0 or s[i - 1] != b - 1)


@pytest.mark.parametrize("max_flush_kb", [None, 512])
def test_contiguous_random_order_one_write_per_max_request(stack, max_flush_kb):
    """8192 contiguous 4 KiB blocks written in random order: the origin
    receives exactly ceil(32 MiB / max_flush_kb) writes."""
    keys = {"flush_depth": 256}
    if max_flush_kb:
        keys["max_flush_kb"] = max_flush_kb
    slow, tc, model = make_cache(stack, 32, 64, keys=keys)
    if max_flush_kb is None:
        # the documented default: the origin's max_sectors_kb, at least 1024
        origin_kb = int(tclib.sysfs_queue(slow.path, "max_sectors_kb"))
        max_flush_kb = min(max(origin_kb, 1024), 16384)
    blocks = list(range(32 * MiB // BS))
    random.Random(11).shuffle(blocks)

    before = slow.stat()
    BlockWriter(tc.path, model).write(blocks)
    assert tclib.stat_delta(slow.stat(), before)["writes"] == 0, \
        "writeback mode wrote to the origin before any flush"
    assert tc.status()["dirty"] == len(blocks)

    st, d = flush_counted(tc, slow)
    want = math.ceil(32 * 1024 / max_flush_kb)
    assert d["writes"] == want, \
        f"origin got {d['writes']} writes, want ceil(32 MiB / {max_flush_kb} KiB) = {want}"
    assert d["write_sectors"] == 32 * MiB // 512
    assert st["wb_requests"] == want and st["wb_blocks"] == len(blocks)
    assert st["avg_write_kb"] == max_flush_kb
    assert st["merge_ratio"] == pytest.approx(len(blocks) / want, abs=0.01)
    tc.remove()
    model.verify_device(slow.path, what="origin after flush")


def _holes_layout():
    """Runs of 60 KiB separated by holes of 4, 8 and 64 KiB, then a hole of
    128 KiB, then more runs.  Returns (dirty blocks, hole lists)."""
    blocks, b = [], 16
    holes = [1, 2, 16, 1, 2, 16, 32, 1, 2, 16]   # in 4 KiB blocks
    for h in holes + [0]:
        blocks += list(range(b, b + 15))           # a 60 KiB run
        b += 15 + h
    return blocks


@pytest.mark.parametrize("gap_kb", [0, 64])
def test_gap_bridging(stack, gap_kb):
    """Holes of 4, 8, 64 KiB: one write per run without bridging; with
    bridge_gap_kb 64 the runs join (the 128 KiB hole still splits)."""
    slow, tc, model = make_cache(stack, 16, 32,
                                 keys={"bridge_gap_kb": gap_kb,
                                       "max_flush_kb": 4096})
    blocks = _holes_layout()
    # one hole block is cached clean (read through the cache first), the
    # others were never cached: both kinds of filler must keep their data
    hole_block = blocks[14] + 1
    tclib.read_direct(tc.path, hole_block * BS, BS)
    order = blocks[:]
    random.Random(5).shuffle(order)
    BlockWriter(tc.path, model).write(order)

    st, d = flush_counted(tc, slow)
    nruns = runs_of(blocks)
    want = nruns if gap_kb == 0 else 2
    assert d["writes"] == want, f"origin got {d['writes']} writes, want {want}"
    assert st["wb_blocks"] == len(blocks)
    if gap_kb:
        # every hole but the 128 KiB one was written as filler
        assert st["bridged_blocks"] == (1 + 2 + 16) * 3
        assert d["write_sectors"] == (len(blocks) + st["bridged_blocks"]) * 8
    else:
        assert st["bridged_blocks"] == 0
        assert d["write_sectors"] == len(blocks) * 8
    tc.remove()
    model.verify_device(slow.path, what="origin after bridged flush")


def test_bridged_flush_reusing_buffers(stack):
    """Two requests in flight at a time, so later requests are built in the
    buffer chunks of earlier ones (the engine's pool): every hole must still
    carry the origin's data and every run its own, not a neighbour's.
    Two passes: the second rewrites the runs over chunks the first left."""
    slow, tc, model = make_cache(stack, 16, 32, write_ms=20,
                                 keys={"flush_depth": 2, "bridge_gap_kb": 64,
                                       "max_flush_kb": 512})
    # per 128-block window: runs of 32, 8 and 40 blocks around holes of 8
    # and 56 KiB, and a run that starts where a chunk does not
    window = list(range(0, 32)) + list(range(34, 42)) + list(range(56, 96))
    blocks = [w * 128 + b for w in range(32) for b in window]
    writer = BlockWriter(tc.path, model)
    for rnd in range(2):
        order = blocks[:]
        random.Random(20 + rnd).shuffle(order)
        writer.write(order)
        st, d = flush_counted(tc, slow)
        assert st["error"] == 0 and st["dirty"] == 0, st["raw"]
        assert d["writes"] == 32, f"round {rnd}: {d['writes']} writes, want 32"
        assert st["inflight_max"] <= 2, st["raw"]
        model.verify_device(slow.path, what=f"origin after round {rnd}")
    tc.remove()


def test_clean_data_never_written_back(stack):
    slow, tc, model = make_cache(stack, 16, 32)
    before = slow.stat()
    model.verify_device(tc.path, what="read through the cache")   # promotes
    model.verify_device(tc.path, what="read hits")
    st = tc.status()
    assert st["read_hits"] > 0 and st["used"] > 0
    st, d = flush_counted(tc, slow)
    assert d["writes"] == 0 and st["wb_requests"] == 0
    assert tclib.stat_delta(slow.stat(), before)["writes"] == 0

    BlockWriter(tc.path, model).write([3, 4, 5, 100])
    st, d = flush_counted(tc, slow)
    assert d["writes"] == 2 and d["write_sectors"] == 4 * 8
    st, d = flush_counted(tc, slow)      # nothing dirty any more
    assert d["writes"] == 0
    tc.remove()
    model.verify_device(slow.path)


def test_rewrite_during_flush_stays_dirty(stack):
    """A block rewritten while its flush is in flight keeps the new data,
    stays dirty, and reaches the origin with the next flush."""
    slow, tc, model = make_cache(stack, 16, 32, write_ms=1500)
    w = BlockWriter(tc.path, model)
    w.write([7])
    first = bytes(model.data[7 * BS:8 * BS])
    # the flush's origin write and origin flush take 4 s each: on a slow
    # guest (the debug kernel) spawning dmsetup alone can take seconds
    n = tclib.size_sectors(slow.path)
    backing = slow.table.split()[3]
    slow.suspend()
    slow.reload(f"0 {n} delay {backing} 0 0 {backing} 0 4000")
    ev = tc.event_nr()
    tc.message("flush")
    # the message asks for the flush before it returns
    assert tc.status()["flush_state"] == "flushing"
    t = threading.Thread(target=w.write, args=([7],))
    t.start()                                  # waits for the block lock
    tc.wait_event(ev, timeout=60)
    t.join(60)
    assert not t.is_alive()
    st = tc.status()
    assert st["dirty"] == 1, f"rewritten block not dirty: {st['raw']}"
    assert tclib.read_direct(slow.path, 7 * BS, BS) == first
    assert tclib.read_direct(tc.path, 7 * BS, BS) == bytes(model.data[7 * BS:8 * BS])
    tc.flush()
    tc.remove()
    model.verify_device(slow.path, what="origin after the second flush")


def test_origin_write_error_keeps_blocks_dirty(stack):
    slow, tc, model = make_cache(stack, 16, 32, flakey=True)
    blocks = list(range(0, 2048, 3))
    BlockWriter(tc.path, model).write(blocks)
    n = len(blocks)
    ram = slow.backing
    size = tclib.size_sectors(ram)
    slow.reload(f"0 {size} flakey {ram} 0 0 3600 1 error_writes")

    ev = tc.event_nr()
    tc.message("flush")
    tc.wait_event(ev, timeout=120)
    st = tc.status()
    assert st["error"] == -5, f"no EIO latched: {st['raw']}"
    assert st["dirty"] == n, f"blocks lost their dirty bit: {st['raw']}"
    assert st["flush_state"] == "idle"
    # the data is still served from the cache
    model.verify_device(tc.path, what="cache after failed flush")

    slow.reload(stack.flakey_table(ram))
    st = tc.flush()
    assert st["error"] == 0 and st["dirty"] == 0
    tc.remove()
    model.verify_device(slow.path, what="origin after the retried flush")


@pytest.mark.parametrize("depth", [4, 64])
def test_flush_depth_respected(stack, depth):
    slow, tc, model = make_cache(stack, 16, 32, write_ms=200,
                                 keys={"flush_depth": depth})
    blocks = list(range(0, 4096, 16))            # 256 separate runs
    BlockWriter(tc.path, model).write(blocks)
    st, d = flush_counted(tc, slow)
    assert d["writes"] == len(blocks)
    assert st["inflight_max"] <= depth, st["raw"]
    assert st["inflight_max"] >= min(depth, 4), st["raw"]
    tc.remove()
    model.verify_device(slow.path)


def test_live_set_and_table(stack):
    slow, tc, model = make_cache(stack, 16, 32)
    tc.message("set", "bridge_gap_kb", "64")
    assert "bridge_gap_kb 64" in tc.table_line()
    p = tc.message("set", "bridge_gap_kb", "999999", check=False)
    assert p.returncode != 0
    p = tc.message("set", "no_such_key", "1", check=False)
    assert p.returncode != 0
    tc.message("set", "high_watermark", "40")
    p = tc.message("set", "low_watermark", "60", check=False)
    assert p.returncode != 0, "low above high must be refused"
    assert "bridge_gap_kb 64" in tc.table_line()
    blocks = [1, 2, 4, 5]                        # one hole of 4 KiB
    BlockWriter(tc.path, model).write(blocks)
    st, d = flush_counted(tc, slow)
    assert d["writes"] == 1
    tc.message("stats", "reset")
    st = tc.status()
    assert st["wb_requests"] == 0 and st["read_hits"] == 0
    tc.remove()
    model.verify_device(slow.path)


def test_background_writeback_progresses_under_load(stack):
    """Between the watermarks writeback runs while writes keep arriving."""
    slow, tc, model = make_cache(stack, 32, 8, write_ms=20,
                                 keys={"high_watermark": 30,
                                       "low_watermark": 10})
    total = tc.status()["total"]
    load = tclib.fio(["--name=load", f"--filename={tc.path}", "--bs=4k",
                      "--direct=1", "--ioengine=libaio", "--iodepth=4",
                      "--rw=randwrite", "--time_based", "--runtime=6",
                      "--size=32M", "--randseed=2"], check=False)
    assert load.returncode == 0, load.stderr
    st = tc.status()
    assert st["wb_blocks"] > 0, f"no background writeback under load: {st['raw']}"
    # once the load stops, writeback drains to the low watermark
    deadline = time.monotonic() + 60
    while tc.status()["dirty"] > total * 10 // 100:
        assert time.monotonic() < deadline, tc.status()["raw"]
        time.sleep(0.2)
    tc.flush()
    tc.remove()


def test_cleaner_drains_and_stops_new_dirty(stack):
    slow, tc, model = make_cache(stack, 16, 32)
    w = BlockWriter(tc.path, model)
    w.write(range(0, 512))
    assert tc.status()["dirty"] == 512
    tc.message("cleaner", "on")
    deadline = time.monotonic() + 60
    while tc.status()["dirty"]:
        assert time.monotonic() < deadline, tc.status()["raw"]
        time.sleep(0.1)
    w.write(range(0, 1024, 2))                   # hits and misses
    st = tc.status()
    assert st["dirty"] == 0 and st["cleaner"] == 1
    model.verify_device(slow.path, what="origin with cleaner on")
    tc.message("cleaner", "off")
    w.write([4000])
    assert tc.status()["dirty"] == 1
    tc.flush()
    tc.remove()
    model.verify_device(slow.path)


def test_flush_on_suspend(stack):
    slow, tc, model = make_cache(stack, 16, 32,
                                 keys={"flush_on_suspend": 1})
    BlockWriter(tc.path, model).write(range(0, 1024, 5))
    assert tc.status()["dirty"] > 0
    tc.suspend()
    st = tc.status()
    assert st["dirty"] == 0, f"suspend left dirty blocks: {st['raw']}"
    model.verify_device(slow.path, what="origin while suspended")
    tc.resume()
    tc.remove()
