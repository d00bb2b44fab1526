# SPDX-License-Identifier: GPL-2.0
"""Persistent metadata: format, load, refusals, corruption, crash.

The on-disk format is dm-tiercache/tc_disk.h: a superblock in sector 0,
32-byte entries from sector 8, slot data from data_start (decoded by
tcdisk.py).
"""

import os
import random

import pytest

import tcdisk
import tclib
from tclib import MiB, KiB

pytestmark = [pytest.mark.module, pytest.mark.usefixtures("tc_module")]

B = 4096


def table(origin, cache, fmt, keys=(), block=8, length=None):
    return tclib.TierCache.make_table(origin, cache, block, "writeback", keys,
                                      length, fmt=fmt)


def try_create(name, tbl, uuid=None):
    """dmsetup create; on success remove again.  Returns (rc, new log lines)."""
    cur = tclib.KmsgCursor()
    cmd = ["dmsetup", "create", name] + (["-u", uuid] if uuid else []) + ["--table", tbl]
    p = tclib.run(cmd, check=False)
    if p.returncode == 0:
        tclib.run(["dmsetup", "remove", "--retry", name])
    return p.returncode, "\n".join(cur.lines())


def write_blocks(path, blocks, model, tag):
    """One seeded 4 KiB write per block, in the given order; updates model."""
    for b in blocks:
        data = random.Random(f"{tag}-{b}").randbytes(B)
        tclib.write_direct(path, b * B, data)
        model.data[b * B:(b + 1) * B] = data


def dirty_entries(cache):
    """(slot, block) of the dirty entries on the cache device (of its
    superblock's generation, committed or not)."""
    sb = tcdisk.decode_sb(tclib.read_direct(cache, 0, B))
    raw = tclib.read_direct(cache, tcdisk.META_START * 512, sb.entries_bytes)
    return [(s, e.block) for s, e in tcdisk.entries(raw, sb) if e.dirty]


def poke(path, offset, data):
    """Write @data at byte @offset, through the sectors that hold it."""
    a = offset // 512 * 512
    end = -(-(offset + len(data)) // 512) * 512
    b = bytearray(tclib.read_direct(path, a, end - a))
    b[offset - a:offset - a + len(data)] = data
    tclib.write_direct(path, a, bytes(b))


def flip(path, offset):
    b = bytearray(tclib.read_direct(path, offset // 512 * 512, 512))
    b[offset % 512] ^= 0x20
    tclib.write_direct(path, offset // 512 * 512, bytes(b))


def test_blank_cache_needs_format_and_is_not_touched(stack):
    origin = stack.slow(16 * MiB)
    cache = stack.ram(4 * MiB)
    before = tclib.read_direct(cache, 0, 256 * KiB)
    rc, log = try_create("tc-p-blank", table(origin.path, cache, fmt=False))
    assert rc != 0, "a blank cache device was accepted without 'format'"
    assert "format" in log and "superblock" in log, log
    assert tclib.read_direct(cache, 0, 256 * KiB) == before, "a refusal wrote to the cache"
    rc, log = try_create("tc-p-blank", table(origin.path, cache, fmt=True))
    assert rc == 0, log
    assert tclib.read_direct(cache, 0, 512)[:8] == b"TIERCACH"


def test_dirty_blocks_survive_remove_and_module_reload(stack):
    origin = stack.slow(32 * MiB)
    m = tclib.seeded_origin(origin.path, seed=801)
    cache = stack.ram(8 * MiB)
    tc = stack.tiercache(origin.path, cache, 8, "writeback")
    blocks = random.Random(802).sample(range(32 * MiB // B), 500)
    write_blocks(tc.path, blocks, m, "a")
    st = tc.status()
    assert st["dirty"] == 500, st["raw"]
    w0 = tclib.block_stat(origin.path)["writes"]
    tc.remove()
    assert tclib.block_stat(origin.path)["writes"] == w0, \
        "removing the table wrote dirty blocks to the origin"
    assert len(dirty_entries(cache)) == 500
    tclib.unload_module()
    tclib.ensure_module()

    tc2 = stack.dm("tc-p-again", table(origin.path, cache, fmt=False), cls=tclib.TierCache)
    st = tc2.status()
    # clean entries are not loaded (reads since may have promoted some)
    assert st["dirty"] == 500 and st["used"] >= 500, st["raw"]
    m.verify_device(tc2.path, what="after reload: through the cache")
    tc2.flush()
    tc2.remove()
    m.verify_device(origin.path, what="origin after the flush")
    assert dirty_entries(cache) == [], "the flush was not recorded on disk"


def test_commit_of_many_adjacent_metadata_blocks(stack):
    """A cache of 36,000 slots filled dirty in order (one 144 MiB sequential
    write): one commit covers more than 256 adjacent 4 KiB metadata blocks
    (32,768 slots).  Before the fix the commit asked for 257 bio vectors
    ('kernel BUG at block/bio.c:57!', found by the memory benchmark of a
    262,016-slot cache).  The data survives remove and load."""
    n = 36000
    origin = stack.ram(256 * MiB)
    cache = stack.ram(160 * MiB)
    tc = stack.tiercache(origin, cache, 8, "writeback",
                         [("high_watermark", 100), ("low_watermark", 99)])
    data = random.Random(805).randbytes(MiB)
    fd = os.open(tc.path, os.O_WRONLY | os.O_DIRECT)
    buf = tclib.aligned_buf(MiB)
    try:
        buf[:MiB] = data
        for off in range(0, n * B, MiB):
            assert os.pwrite(fd, memoryview(buf)[:MiB], off) == MiB
        os.fsync(fd)
    finally:
        os.close(fd)
        buf.close()
    st = tc.status()
    # written back or not, every slot's entry changed and was committed
    assert st["used"] >= 32768 + 128 and st["meta_commits"] >= 1, st["raw"]
    tc.remove()
    tc2 = stack.dm("tc-p-many", table(origin, cache, fmt=False), cls=tclib.TierCache)
    for off in (0, 79 * MiB, 140 * MiB):
        got = tclib.read_direct(tc2.path, off, MiB)
        tclib.compare(data, got, off, "a block of the big commit, after load")


def test_format_refused_while_dirty_then_load_and_reformat(stack):
    origin = stack.slow(16 * MiB)
    m = tclib.seeded_origin(origin.path, seed=811)
    cache = stack.ram(4 * MiB)
    tc = stack.tiercache(origin.path, cache, 8, "writeback")
    write_blocks(tc.path, random.Random(812).sample(range(4096), 100), m, "f")
    tc.remove()
    sb = tclib.read_direct(cache, 0, B)
    rc, log = try_create("tc-p-fmt", table(origin.path, cache, fmt=True))
    assert rc != 0 and "dirty" in log, log
    assert tclib.read_direct(cache, 0, B) == sb, "a refused format wrote the superblock"
    tc2 = stack.dm("tc-p-load", table(origin.path, cache, fmt=False), cls=tclib.TierCache)
    assert tc2.status()["dirty"] == 100
    m.verify_device(tc2.path)
    tc2.flush()
    tc2.remove()
    rc, log = try_create("tc-p-fmt", table(origin.path, cache, fmt=True))
    assert rc == 0, f"format of a clean cache refused: {log}"
    m.verify_device(origin.path)


def test_other_geometry_or_device_refused(stack):
    origin = stack.slow(16 * MiB)
    m = tclib.seeded_origin(origin.path, seed=821)
    cache = stack.ram(4 * MiB)
    n = tclib.size_sectors(origin.path)
    tclib.run(["dmsetup", "create", "tc-p-geo", "-u", "TC-UUID-A", "--table",
               table(origin.path, cache, fmt=True)])
    tclib.run(["dmsetup", "mknodes", "tc-p-geo"], quiet=True)
    write_blocks("/dev/mapper/tc-p-geo", range(10, 30), m, "g")
    tclib.run(["dmsetup", "remove", "--retry", "tc-p-geo"])
    sb = tclib.read_direct(cache, 0, B)
    for what, tbl, uuid, want in [
            ("block size", table(origin.path, cache, False, block=16), None, "lock size"),
            ("length", table(origin.path, cache, False, length=n - 8), None, "origin"),
            ("uuid", table(origin.path, cache, False), "TC-UUID-B", "uuid")]:
        rc, log = try_create("tc-p-geo", tbl, uuid)
        assert rc != 0, f"{what}: another {what} was accepted"
        assert want in log, f"{what}: refusal does not say why: {log}"
        assert tclib.read_direct(cache, 0, B) == sb, f"{what}: refusal wrote the superblock"
    rc, log = try_create("tc-p-geo", table(origin.path, cache, False), "TC-UUID-A")
    assert rc == 0, log


def test_corrupt_superblock_or_entry_refused(stack):
    origin = stack.slow(16 * MiB)
    m = tclib.seeded_origin(origin.path, seed=831)
    cache = stack.ram(4 * MiB)
    tc = stack.tiercache(origin.path, cache, 8, "writeback")
    write_blocks(tc.path, random.Random(832).sample(range(4096), 50), m, "c")
    tc.remove()
    good = tclib.read_direct(cache, 0, 64 * KiB)
    tbl = table(origin.path, cache, fmt=False)

    flip(cache, 40)                                     # nr_slots
    rc, log = try_create("tc-p-bad", tbl)
    assert rc != 0 and "checksum" in log, log
    tclib.write_direct(cache, 0, good)

    slot, _blk = dirty_entries(cache)[7]
    flip(cache, tcdisk.entry_offset(slot) + 1)          # the entry's block
    rc, log = try_create("tc-p-bad", tbl)
    assert rc != 0, "a corrupt entry was loaded"
    assert f"slot {slot}: checksum mismatch" in log, log
    tclib.write_direct(cache, 0, good)

    tc2 = stack.dm("tc-p-good", tbl, cls=tclib.TierCache)
    assert tc2.status()["dirty"] == 50
    m.verify_device(tc2.path)


def test_superblock_counters_that_would_wrap_refused(stack):
    """A superblock whose commit sequence or epoch is 2^63 or more (with a
    valid checksum) is refused at load, and nothing is written: a load
    counts on from both.  From a commit sequence of 2^64 - 1 the next one
    wraps to 0, every entry then reads as not yet committed and its dirty
    data is dropped at the next load; with an epoch near 2^64 the dirty
    entries are refused as not live, or no epoch can open and a flush waits
    for ever.  The cache loads as before once the superblock is restored."""
    origin = stack.slow(16 * MiB)
    m = tclib.seeded_origin(origin.path, seed=851)
    cache = stack.ram(4 * MiB)
    tc = stack.tiercache(origin.path, cache, 8, "writeback")
    write_blocks(tc.path, range(100, 120), m, "w")
    tc.remove()
    good = tclib.read_direct(cache, 0, B)
    sb = tcdisk.decode_sb(good)
    assert sb.ok and sb.commit_seq < 1000 and sb.epoch < 1000, sb
    tbl = table(origin.path, cache, fmt=False)
    for field, value in [("commit_seq", 2**64 - 1), ("commit_seq", 2**63),
                         ("epoch", 2**64 - 1), ("epoch", 2**63)]:
        f = sb._replace(**{field: value})
        raw = tcdisk.encode_sb(f.nr_slots, f.block_sectors, f.commit_seq, f.origin_sectors,
                               f.gen, f.uuid.encode(), version=f.version, flags=f.flags,
                               epoch=f.epoch)
        bad = raw + good[len(raw):]
        assert tcdisk.decode_sb(bad).state == tcdisk.SB_BAD_FIELDS
        tclib.write_direct(cache, 0, bad)
        rc, log = try_create("tc-p-wrap", tbl)
        assert rc != 0, f"{field} {value}: the cache was loaded"
        assert "superblock fields out of range" in log, f"{field} {value}: {log}"
        assert tclib.read_direct(cache, 0, B) == bad, f"{field}: the refusal wrote"
    tclib.write_direct(cache, 0, good)
    tc2 = stack.dm("tc-p-wrap", tbl, cls=tclib.TierCache)
    assert tc2.status()["dirty"] == 20
    m.verify_device(tc2.path)


def _crash(stack):
    """A workload, then a power cut of the cache device: 300 blocks written
    and flushed, one FUA write, then 200 writes (100 rewrites, 100 new
    blocks) without a flush.  Returns what each block may hold."""
    origin = stack.slow(32 * MiB)
    m = tclib.seeded_origin(origin.path, seed=841)
    original = bytes(m.data)
    cache_ram = stack.ram(8 * MiB)
    cache = stack.linear(cache_ram)
    keys = {"commit_ms": 600000, "high_watermark": 100, "low_watermark": 0}
    tc = stack.tiercache(origin.path, cache.path, 8, "writeback", keys=keys)
    rng = random.Random(842)
    pool = rng.sample(range(32 * MiB // B), 501)
    a, f, new = pool[:300], pool[300], pool[301:]
    write_blocks(tc.path, a, m, "a")
    fd = os.open(tc.path, os.O_RDWR)
    os.fsync(fd)                                        # REQ_PREFLUSH: a commit
    os.close(fd)
    after_a = bytes(m.data)
    fdata = random.Random(843).randbytes(B)            # one FUA write
    buf = tclib.aligned_buf(B)
    buf[:B] = fdata
    fd = os.open(tc.path, os.O_WRONLY | os.O_DIRECT | os.O_DSYNC)
    assert os.pwrite(fd, memoryview(buf)[:B], f * B) == B
    os.close(fd)
    b = a[:100] + new                                   # rewrites and new blocks, no flush
    write_blocks(tc.path, b, m, "b")
    assert tc.status()["dirty"] == 300 + 1 + 200

    # power cut: from here the cache device drops every write
    cache.reload(stack.flakey_table(cache_ram, up=0, down=3600, features=["drop_writes"]))
    tc.remove()
    cache.reload(f"0 {tclib.size_sectors(cache_ram)} linear {cache_ram} 0")

    def check(path, what):
        for blk in a[100:]:
            tclib.compare(after_a[blk * B:(blk + 1) * B], tclib.read_direct(path, blk * B, B),
                          blk * B, f"{what}: block flushed before the crash")
        for blk in a[:100]:                             # either version
            got = tclib.read_direct(path, blk * B, B)
            assert got in (after_a[blk * B:(blk + 1) * B], bytes(m.data[blk * B:(blk + 1) * B])), \
                f"{what}: rewritten block {blk} holds neither version"
        tclib.compare(fdata, tclib.read_direct(path, f * B, B), f * B, f"{what}: FUA block")
        for blk in new:
            tclib.compare(original[blk * B:(blk + 1) * B], tclib.read_direct(path, blk * B, B),
                          blk * B, f"{what}: unflushed new block must read the old data")

    return origin, cache, check


def test_crash_keeps_exactly_the_last_commit(stack):
    """Writes acknowledged before a flush (or with FUA) survive a power cut
    of the cache device; later writes are not reported dirty."""
    origin, cache, check = _crash(stack)
    tc2 = stack.dm("tc-p-crash", table(origin.path, cache.path, fmt=False),
                   cls=tclib.TierCache)
    st = tc2.status()
    assert st["dirty"] == 301, f"after the crash: {st['raw']} (want the 301 committed blocks)"
    check(tc2.path, "through the cache")
    tc2.flush()
    tc2.remove()
    check(origin.path, "origin after the flush")


TOOL = tclib.REPO / "userspace/target/release/tiercache"


def test_offline_writeback_after_a_crash(stack):
    """Without the module: tiercache writeback copies the committed dirty
    blocks to the origin and records them clean."""
    origin, cache, check = _crash(stack)
    p = tclib.run([str(TOOL), "check", cache.path], check=False)
    assert p.returncode == 0, f"check after the crash: rc {p.returncode}\n{p.stdout}{p.stderr}"
    p = tclib.run([str(TOOL), "writeback", "--cache", cache.path, "--origin", origin.path],
                  check=False)
    assert p.returncode == 0, f"writeback: rc {p.returncode}\n{p.stdout}{p.stderr}"
    check(origin.path, "origin after the offline writeback")
    assert dirty_entries(cache.path) == [], "writeback left entries dirty"
    tc2 = stack.dm("tc-p-offline", table(origin.path, cache.path, fmt=False),
                   cls=tclib.TierCache)
    assert tc2.status()["dirty"] == 0
    check(tc2.path, "through the cache after the offline writeback")


def test_offline_writeback_cut_short_leaves_no_older_version_dirty(stack):
    """tiercache writeback marks entries clean epoch by epoch, oldest first,
    each epoch synced before the next: a run cut short (here the cache
    device fails the write of one metadata block) never leaves a block's
    newer version clean and an older one dirty, which the module would
    load as the block's newest and serve.  Block 5 has versions in epochs
    e, e+1 and e+3, block 6 in e and e+1, their newest in the first
    metadata block; writes to the third fail."""
    origin = stack.slow(16 * MiB)
    m = tclib.seeded_origin(origin.path, seed=861)
    ram = stack.ram(4 * MiB)
    tc = stack.tiercache(origin.path, ram, 8, "writeback")
    tc.remove()
    sb = tcdisk.decode_sb(tclib.read_direct(ram, 0, B))
    assert sb.ok and sb.sum_blocks and sb.nr_slots > 3 * tcdisk.ENTRIES_PER_MBLOCK, sb
    e = sb.epoch
    versions = [(0, 5, e + 3), (200, 5, e), (300, 5, e + 1), (3, 6, e + 1), (130, 6, e)]
    data = {}
    for slot, block, epoch in versions:
        data[slot] = random.Random(f"v-{slot}").randbytes(B)
        poke(ram, tcdisk.entry_offset(slot),
             tcdisk.encode_entry(slot, block, True, sb.commit_seq, sb.gen, epoch))
        tclib.write_direct(ram, (sb.data_start + slot * sb.block_sectors) * 512, data[slot])
    mbs = {slot // tcdisk.ENTRIES_PER_MBLOCK for slot, _, _ in versions}
    tclib.write_direct(ram, sb.sum_start * 512, tcdisk.encode_sum(0, sb.gen, mbs))
    newest = {5: data[0], 6: data[3]}

    # the third metadata block (slots 256-383) refuses writes
    n = tclib.size_sectors(ram)
    a = tcdisk.META_START + 2 * tcdisk.MBLOCK // 512
    w = tcdisk.MBLOCK // 512
    cache = stack.dm(stack._name("cut"), f"0 {a} linear {ram} 0\n"
                     f"{a} {w} flakey {ram} {a} 0 3600 1 error_writes\n"
                     f"{a + w} {n - a - w} linear {ram} {a + w}")
    p = tclib.run([str(TOOL), "writeback", "--cache", cache.path, "--origin", origin.path],
                  check=False)
    assert p.returncode != 0, f"writeback did not fail\n{p.stdout}{p.stderr}"
    cache.remove()

    raw = tclib.read_direct(ram, tcdisk.META_START * 512, sb.entries_bytes)
    left = {}
    for slot, ent in tcdisk.entries(raw, sb):
        if ent.dirty:
            left.setdefault(ent.block, []).append(
                [ep for s, _, ep in versions if s == slot][0])
    for block in (5, 6):
        was = sorted(ep for _, b, ep in versions if b == block)
        now = sorted(left.get(block, []))
        assert now == was[len(was) - len(now):], \
            f"block {block}: dirty in epochs {now} of {was}: an older version dirty, a newer clean"
    for block, want in newest.items():
        tclib.compare(want, tclib.read_direct(origin.path, block * B, B), block * B,
                      f"origin block {block} after the writeback")
    # what the module loads serves the newest version of each block
    tc2 = stack.dm("tc-p-cut", table(origin.path, ram, fmt=False), cls=tclib.TierCache)
    for block, want in newest.items():
        tclib.compare(want, tclib.read_direct(tc2.path, block * B, B), block * B,
                      f"block {block} through the cache after the cut writeback")
        m.data[block * B:(block + 1) * B] = want
    tc2.flush()
    m.verify_device(origin.path)
