# SPDX-License-Identifier: GPL-2.0
"""The metadata summary (format version 4, issue 11): a load reads only
the metadata blocks that may hold dirty entries.

dm-tiercache/tc_disk.h ("The summary") and tc_msum.c: one bit per 4 KiB
metadata block, set (and written with FUA) before a commit first writes a
dirty entry into its block, cleared once the block's last complete write
left no dirty entry in it.  The load says how many metadata blocks it read
("read K of N metadata blocks").  The crash side of the rule is tested
by test_81_logwrites.py, which decodes the summary of every replayed state
and fails on a dirty entry in an unmarked block.

* a load after dirty writes reads only their blocks, and after a flush
  (every block clean) none; the data verifies each time; the tool's check
  agrees and counts the marked blocks;
* a torn summary block reads as all set: the load reads every block of
  its range, loses nothing, and the first commit writes it whole again;
* a cache made by the version 3 code (no summary, data lower on the
  device) keeps its layout: it loads with every block read, stays
  version 3 through commits, and a format makes it version 4.
"""

import os
import random
import re
import subprocess
from pathlib import Path

import pytest

import logwrites
import tcdisk
import tclib
from tclib import MiB

pytestmark = [pytest.mark.module, pytest.mark.usefixtures("tc_module")]

B = 4096
REPO = Path(__file__).resolve().parents[2]
TOOL = Path(os.environ.get("TIERCACHE_TOOL", REPO / "userspace/target/release/tiercache"))
READ_RE = re.compile(r"loaded (\d+) dirty blocks \(commit \d+\), ignored \d+ uncommitted "
                     r"entries; read (\d+) of (\d+) metadata blocks")
KEYS = {"high_watermark": 100, "low_watermark": 0}


def table(origin, cache, fmt):
    return tclib.TierCache.make_table(origin, cache, 8, "writeback", KEYS, fmt=fmt)


def load(stack, name, origin, cache):
    """Create the device over an existing cache: (device, dirty loaded,
    metadata blocks read, metadata blocks in all)."""
    cur = tclib.KmsgCursor()
    tc = stack.dm(stack._name(name), table(origin, cache, fmt=False), cls=tclib.TierCache)
    found = [READ_RE.search(ln) for ln in cur.lines()]
    found = [m for m in found if m]
    assert len(found) == 1, f"no load message: {cur.lines()}"
    return (tc,) + tuple(int(x) for x in found[0].groups())


def check(cache):
    """The tool's check of the cache device: (exit status, stdout)."""
    if not TOOL.exists():
        pytest.fail(f"{TOOL} does not exist: build it with 'make -C userspace'",
                    pytrace=False)
    p = subprocess.run([str(TOOL), "check", cache], capture_output=True, text=True,
                       timeout=120)
    tclib.log(f"tiercache check {cache}: {p.returncode}\n{p.stdout}{p.stderr}")
    return p.returncode, p.stdout


def superblock(cache):
    return tcdisk.decode_sb(tclib.read_direct(cache, 0, B))


def dirty_mblocks(cache):
    """The metadata blocks holding committed dirty entries on the device."""
    sb = superblock(cache)
    area = tclib.read_direct(cache, tcdisk.META_START * 512, sb.entries_bytes)
    return {s // tcdisk.ENTRIES_PER_MBLOCK for s, e in tcdisk.entries(area, sb)
            if e.state == tcdisk.DIRTY}


def write(path, m, blocks, tag):
    for b in blocks:
        data = random.Random(f"{tag}-{b}").randbytes(B)
        tclib.write_direct(path, b * B, data)
        m.data[b * B:(b + 1) * B] = data


def dirty_cache(stack, cache_mib=64, nblocks=40):
    """A formatted cache with @nblocks dirty blocks, removed: (origin,
    cache, model)."""
    origin = stack.ram(64 * MiB)
    m = tclib.seeded_origin(origin, seed=8201)
    cache = stack.ram(cache_mib * MiB)
    tc = stack.tiercache(origin, cache, 8, "writeback", KEYS)
    write(tc.path, m, range(100, 100 + 2 * nblocks, 2), "a")
    tclib.run(["sync"])
    assert tc.status()["dirty"] == nblocks, tc.status_line()
    tc.remove()
    return origin, cache, m


def test_load_reads_only_the_marked_blocks(stack):
    origin, cache, m = dirty_cache(stack)
    sb = superblock(cache)
    assert sb.ok and sb.version == 4 and sb.sum_blocks == 1, sb
    rc, out = check(cache)
    assert rc == 0, out
    # slots are taken in a row: 40 dirty ones fill a few metadata blocks
    want = dirty_mblocks(cache)
    assert 1 <= len(want) <= 4, want
    tc, ndirty, nread, nall = load(stack, "sum", origin, cache)
    assert ndirty == 40 and nall == tcdisk.meta_blocks(sb.nr_slots) and nall > 100, \
        (ndirty, nread, nall)
    assert nread == len(want), \
        f"the load read {nread} of {nall} metadata blocks, {len(want)} hold dirty entries"
    m.verify_device(tc.path, what="after the load")
    # every block clean: the next load reads nothing
    tc.flush()
    tc.remove()
    tc, ndirty, nread, nall = load(stack, "sum2", origin, cache)
    assert (ndirty, nread) == (0, 0), f"a clean cache's load read {nread} of {nall} blocks"
    m.verify_device(tc.path, what="after the flush and a load")
    write(tc.path, m, [7, 9], "b")
    tclib.run(["sync"])
    tc.remove()
    rc, out = check(cache)
    assert rc == 0 and re.search(r"summary: +[12] of \d+ metadata blocks marked", out), out
    want = dirty_mblocks(cache)
    tc, ndirty, nread, _ = load(stack, "sum3", origin, cache)
    assert (ndirty, nread) == (2, len(want)) and len(want) <= 2, (ndirty, nread, want)
    m.verify_device(tc.path, what="after the third load")


def test_torn_summary_block_reads_all_and_is_rewritten(stack):
    origin, cache, m = dirty_cache(stack, nblocks=8)
    sb = superblock(cache)
    off = sb.sum_start * 512
    raw = bytearray(tclib.read_direct(cache, off, B))
    assert tcdisk.decode_sum(raw, 0, sb.gen)[0] == tcdisk.SUM_OK
    raw[2048] ^= 0x10                                   # a torn sector
    tclib.write_direct(cache, off, bytes(raw))
    assert tcdisk.decode_sum(raw, 0, sb.gen)[0] == tcdisk.SUM_BAD
    rc, out = check(cache)
    assert rc == 0 and "torn, damaged" in out, out
    cur = tclib.KmsgCursor()
    tc, ndirty, nread, nall = load(stack, "torn", origin, cache)
    assert ndirty == 8 and nread == nall, (ndirty, nread, nall)
    assert any("summary block 0" in ln for ln in cur.lines()), cur.lines()
    m.verify_device(tc.path, what="after a load with a torn summary")
    tc.remove()
    # the load's commits wrote the summary block whole again
    want = dirty_mblocks(cache)
    state, bits = tcdisk.decode_sum(tclib.read_direct(cache, off, B), 0, sb.gen)
    assert state == tcdisk.SUM_OK and bits == want, (state, sorted(bits)[:8], want)
    tc, ndirty, nread, _ = load(stack, "torn2", origin, cache)
    assert (ndirty, nread) == (8, len(want)), (ndirty, nread, want)
    m.verify_device(tc.path, what="after the next load")


def test_version_3_cache_keeps_its_layout_until_a_format(stack):
    origin, cache, m = dirty_cache(stack, cache_mib=16, nblocks=12)
    img = tclib.read_direct(cache, 0, tclib.size_bytes(cache))
    tclib.write_direct(cache, 0, tcdisk.downgrade(img, tcdisk.VERSION_V3))
    sb = superblock(cache)
    assert sb.ok and sb.version == 3 and sb.sum_blocks == 0, sb
    assert sb.nr_slots == tclib.tc_slots(tclib.size_sectors(cache)) + 1, sb
    tc, ndirty, nread, nall = load(stack, "v3", origin, cache)
    assert ndirty == 12 and nread == nall == tcdisk.meta_blocks(sb.nr_slots), \
        (ndirty, nread, nall)
    assert tc.status()["total"] == sb.nr_slots, tc.status_line()
    m.verify_device(tc.path, what="a version 3 cache, loaded")
    write(tc.path, m, [3], "c")
    tclib.run(["sync"])
    # a reload keeps the state (the same slot count in its layout)
    tc.reload(tc.table_line())
    tc.flush()
    tc.remove()
    sb = superblock(cache)
    assert sb.ok and sb.version == 3 and sb.sum_blocks == 0, sb
    m.verify_device(origin, what="the origin after the flush of a version 3 cache")
    # format (no dirty block left) makes version 4, in its own layout
    tc = stack.dm(stack._name("v4"), table(origin, cache, fmt=True), cls=tclib.TierCache)
    assert tc.status()["total"] == tclib.tc_slots(tclib.size_sectors(cache)), tc.status_line()
    tc.remove()
    sb = superblock(cache)
    assert sb.ok and sb.version == 4 and sb.sum_blocks == 1, sb


def test_summary_rule_holds_at_every_power_cut(stack):
    """dm-log-writes under the cache device records every write of a
    workload that dirties blocks, flushes them clean (writeback: their
    marks are cleared), dirties others, with flushes between.  Replayed
    write by write, every state of the cache device (every prefix of the
    log: dm-log-writes logs a FUA write when it completes, other writes
    at the next flush, as a power cut may keep them) keeps the rule: no
    dirty entry of ours, committed or not, in a metadata block the
    summary leaves unmarked.  The marks must have been both set and
    cleared on the way, or the test proves nothing; and the last state
    loads with every dirty block.

    A module that clears a mark in the commit that writes its block
    clean fails here (the cleared summary is durable before the clean
    entries, which wait for the superblock's flush).  One that writes the
    summary after the entries cannot be told apart by dm-log-writes
    (unflushed writes are logged at the next flush, so the log never
    holds the entries before the summary), though a drive's volatile
    cache may persist them in that order: the REQ_FUA write of the
    summary, waited for before the entries are submitted, is what
    excludes it (tc_msum.c)."""
    tclib.run(["modprobe", "dm-log-writes"])
    raw = stack.ram(16 * MiB)
    logdev = stack.ram(128 * MiB)
    n = tclib.size_sectors(raw)
    clw = stack.dm(stack._name("clw"), f"0 {n} log-writes {raw} {logdev}")
    origin = stack.ram(64 * MiB)
    m = tclib.seeded_origin(origin, seed=8202)
    keys = dict(KEYS, commit_ms=200)
    tc = stack.dm(stack._name("rule"),
                  tclib.TierCache.make_table(origin, clw.path, 8, "writeback", keys),
                  cls=tclib.TierCache)
    rng = random.Random(8203)
    nb = 64 * MiB // B
    for r in range(4):
        write(tc.path, m, rng.sample(range(nb), 400), f"r{r}")
        tclib.run(["sync"])
        tc.flush()
        write(tc.path, m, rng.sample(range(nb), 40), f"s{r}")
        tclib.run(["sync"])
    ndirty = tc.status()["dirty"]
    tc.remove()
    clw.message("mark", "end")
    tclib.flushbufs(logdev)

    sb = superblock(clw.path)
    meta_end = sb.data_start * 512
    img = bytearray(tclib.size_bytes(clw.path))
    states, marked, bad = 0, [], []
    with logwrites.LogWrites.open(logdev) as log:
        for e in log.entries:
            if not e.is_write:
                continue
            log.replay(img, start=e.index, end=e.index)
            if e.offset >= meta_end or img[:8] != tcdisk.MAGIC:
                continue                        # the data area: nothing changes
            states += 1
            cur = tcdisk.decode_sb(img[:512])
            if not cur.ok:
                continue
            found = tcdisk.unmarked_dirty(img, cur)
            if found:
                bad.append((e.index, found[:4]))
            marked.append(len(tcdisk.marked_blocks(img, cur)))
    tclib.kmsg(f"test_82: {states} states, marks from {min(marked)} to {max(marked)}; "
               f"{len(bad)} break the rule")
    assert not bad, f"states with a dirty entry in an unmarked block (log entry, " \
                    f"[(slot, metadata block)]): {bad[:5]}"
    assert states > 50 and max(marked) >= 10, (states, max(marked))
    drops = sum(1 for a, b in zip(marked, marked[1:]) if b < a)
    assert drops >= 3, f"the marks were cleared only {drops} times: {marked}"
    tc, nd, nread, nall = load(stack, "rule2", origin, clw.path)
    assert nd == ndirty and nread < nall, (nd, ndirty, nread, nall)
    m.verify_device(tc.path, what="after the replayed workload's load")
