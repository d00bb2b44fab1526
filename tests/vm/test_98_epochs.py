# SPDX-License-Identifier: GPL-2.0
"""Epochs and the `ordered` writeback policy (issue 12, first half;
docs/tiercache.rst, "Epochs and the ordered policy").

An epoch is the set of writes between two flushes.  Under `ordered 1`
each flush after a write opens a new epoch; a block whose dirty version
is of an older epoch is copied to a new slot when it is rewritten; and
writeback sends the epochs to the origin one at a time, oldest first,
with an origin flush between them.

dm-log-writes sits between tiercache and the origin and records the
origin's writes in the order they became durable.  Replaying its log
entry by entry onto a zeroed image gives every state the origin passed
through; each must be *legal*: the blocks after some number k of whole
epochs, plus any of the writes of epoch k + 1 (what a power cut of the
cached device at a flush could have left).

  1  ordered: three epochs, rewrites of a block in each (whole-block and
     partial copies on write), reads see the newest; the flush passes the
     origin only through legal states and ends with the newest data;
     every epoch retires (status fields 24, 25)
  2  the default policy on the same writes: no epoch is opened, and the
     same replay finds an illegal state (the oracle has teeth)
  3  ordered, versions survive a reload: the epochs and both versions of a
     block are loaded from the metadata (format version 3), and the flush
     after the reload still goes epoch by epoch
  4  ordered, more flushes than live epochs may span: the flush that would
     open one too many waits for writeback to retire the oldest (nothing
     hangs, the span stays within 254), and the data verifies; loaded
     again with the span full, writes wait for a new epoch, and a partial
     write to an uncached block reaches the origin after every loaded one
  5  ordered: a write issued after a FUA write completed reaches the
     origin after it (the FUA write ends its epoch)
  6  a cache of format version 2 loaded by a read-only table, then by a
     writable ordered one: the first commit of versions with epoch bits
     is torn at every write of the cache device's log, and every state
     still loads (its superblock says version 3 before such an entry is
     written)
  7  ordered, a partial write to an uncached block (it goes around the
     cache) under a steady stream of writes and fsyncs: it waits for the
     epochs before it only, not for writeback to catch up with the stream
  8  `set ordered 1` on a cache with dirty blocks written under the
     default policy (which keeps no per-slot epoch tags: they are
     allocated at the switch, every dirty block in the one epoch): the
     blocks rewritten after the next flush are copied on write, and the
     flush passes the origin only through legal states; loaded again by a
     default-policy table (the load meets three epochs and allocates the
     tags), writeback still drains them in order
"""

import os
import threading
import time

import pytest

import logwrites
import tcdisk
import tclib
from tclib import MiB

pytestmark = [pytest.mark.module, pytest.mark.usefixtures("tc_module")]

B = 4096
ORIGIN_MIB = 32
# far apart: no request merges or bridges two of them
A, BB, C = 0, 2000, 4000
KEYS = {"high_watermark": 100, "low_watermark": 0, "commit_ms": 600000}
SPAN = 254


def pat(tag):
    return (tag.encode() * (B // len(tag) + 1))[:B]


def epochs(tc):
    """Status fields 24 (epoch_oldest) and 25 (epoch_current)."""
    f = tc.status_line().split()[3:]
    assert len(f) >= 25, f"no epoch fields in the status: {f}"
    return int(f[23]), int(f[24])


def dirty(tc):
    return tc.status()["dirty"]


def put(path, block, data, off=0):
    tclib.write_direct(path, block * B + off, data)


def get(path, block):
    return tclib.read_direct(path, block * B, B)


def fsync_dev(path):
    fd = os.open(path, os.O_RDWR)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def origin_stack(stack):
    """Origin = log-writes over a RAM disk; returns (logged dev, log dev)."""
    tclib.run(["modprobe", "dm-log-writes"])
    raw = stack.ram(ORIGIN_MIB * MiB)
    logdev = stack.ram(64 * MiB)
    n = tclib.size_sectors(raw)
    lw = stack.dm(stack._name("lw"), f"0 {n} log-writes {raw} {logdev}")
    return lw, logdev


def workload(tc):
    """Three epochs; returns the history: a list of {block: data} per epoch."""
    hist = []
    e = {A: pat("a1"), BB: pat("b1")}
    for blk, d in e.items():
        put(tc.path, blk, d)
    fsync_dev(tc.path)
    hist.append(e)
    e = {A: pat("a2"), C: pat("c1")}
    for blk, d in e.items():
        put(tc.path, blk, d)
    fsync_dev(tc.path)
    hist.append(e)
    x = b"X" * 512
    bx = bytearray(pat("b1"))
    bx[1024:1536] = x
    put(tc.path, BB, x, off=1024)          # partial: copied from epoch 0
    put(tc.path, A, pat("a3"))             # whole: copied from epoch 1
    fsync_dev(tc.path)
    hist.append({BB: bytes(bx), A: pat("a3")})
    return hist


def legal_states(hist, blocks):
    """For each k, (base after k epochs, {block: allowed values})."""
    zero = bytes(B)
    base = {b: zero for b in blocks}
    out = []
    for e in hist:
        allowed = {b: {base[b]} | ({e[b]} if b in e else set()) for b in blocks}
        out.append(allowed)
        base = dict(base)
        base.update(e)
    out.append({b: {base[b]} for b in blocks})
    return out, base


def replay_check(logdev, mark, hist):
    """Replay the origin's log from `mark` on: count the states, and return
    the first illegal one (None if all are legal)."""
    blocks = sorted({b for e in hist for b in e})
    allowed, final = legal_states(hist, blocks)
    img = bytearray(ORIGIN_MIB * MiB)
    tclib.flushbufs(logdev)
    with logwrites.LogWrites.open(logdev) as log:
        start = log.mark_index(mark)
        log.replay(img, end=start)
        states = 0
        for e in list(log.entries)[start + 1:]:
            log.replay(img, start=e.index, end=e.index)
            if not (e.is_write or e.flags & logwrites.DISCARD):
                continue
            states += 1
            state = {b: bytes(img[b * B:(b + 1) * B]) for b in blocks}
            if not any(all(state[b] in ok[b] for b in blocks) for ok in allowed):
                return states, {b: state[b][:4] for b in blocks}, final
    state = {b: bytes(img[b * B:(b + 1) * B]) for b in blocks}
    assert state == final, "the origin does not end with the newest data"
    return states, None, final


def make(stack, ordered, lw, name=None, fmt=True, cache=None):
    cache = cache or stack.ram(8 * MiB)
    keys = dict(KEYS, ordered=1) if ordered else dict(KEYS)
    return stack.tiercache(lw.path, cache, keys=keys, name=name, fmt=fmt), cache


def test_ordered_epochs_reach_origin_in_order(stack):
    lw, logdev = origin_stack(stack)
    tc, _ = make(stack, True, lw)
    assert epochs(tc) == (0, 0)
    hist = workload(tc)
    # versions: A in epochs 0, 1, 2; B in 0 and 2; C in 1
    assert dirty(tc) == 6, tc.status_line()
    assert epochs(tc) == (0, 3), tc.status_line()
    assert get(tc.path, A) == hist[2][A]
    assert get(tc.path, BB) == hist[2][BB]
    assert get(tc.path, C) == hist[1][C]
    lw.message("mark", "wb")
    tc.flush()
    lw.message("mark", "end")       # the log's entry count is written
    old, cur = epochs(tc)
    assert old == cur == 3, tc.status_line()
    states, bad, _ = replay_check(logdev, "wb", hist)
    assert bad is None, f"illegal origin state after {states} writes: {bad}"
    assert states >= 6, f"only {states} origin writes replayed"
    for blk, d in ((A, hist[2][A]), (BB, hist[2][BB]), (C, hist[1][C])):
        assert get(tc.path, blk) == d


def test_default_policy_mixes_epochs(stack):
    lw, logdev = origin_stack(stack)
    tc, _ = make(stack, False, lw)
    hist = workload(tc)
    # one epoch: each block written in place
    assert dirty(tc) == 3, tc.status_line()
    assert epochs(tc) == (0, 0)
    lw.message("mark", "wb")
    tc.flush()
    lw.message("mark", "end")
    states, bad, _ = replay_check(logdev, "wb", hist)
    assert bad is not None, \
        f"the default policy passed {states} origin states, all legal: " \
        "this oracle cannot tell the policies apart"
    tclib.log(f"default policy: illegal origin state after {states} writes: {bad}")


def test_ordered_versions_survive_reload(stack):
    lw, logdev = origin_stack(stack)
    tc, cache = make(stack, True, lw)
    name = tc.name
    put(tc.path, A, pat("v1"))
    fsync_dev(tc.path)
    put(tc.path, A, pat("v2"))
    put(tc.path, C, pat("w2"))
    fsync_dev(tc.path)
    assert dirty(tc) == 3 and epochs(tc) == (0, 2), tc.status_line()
    tc.remove()
    tc, _ = make(stack, True, lw, name=name + "b", fmt=False, cache=cache)
    assert dirty(tc) == 3, tc.status_line()
    old, cur = epochs(tc)
    assert old == 0 and cur >= 1, tc.status_line()
    assert get(tc.path, A) == pat("v2")
    lw.message("mark", "wb")
    tc.flush()
    lw.message("mark", "end")
    hist = [{A: pat("v1")}, {A: pat("v2"), C: pat("w2")}]
    states, bad, _ = replay_check(logdev, "wb", hist)
    assert bad is None, f"illegal origin state after {states} writes: {bad}"
    assert get(tc.path, A) == pat("v2")


def test_ordered_flush_waits_for_a_free_epoch(stack):
    """Then (the span full) the cache is loaded again: writes after the
    load go to a new epoch once writeback makes room for it, and a
    partial write to an uncached block reaches the origin only after
    every loaded epoch (case 4)."""
    lw, logdev = origin_stack(stack)
    tc, cache = make(stack, True, lw)
    n = SPAN + 20
    widest = 0
    for i in range(n):
        put(tc.path, A + (i % 3), pat(f"r{i}-"))
        fsync_dev(tc.path)
        old, cur = epochs(tc)
        widest = max(widest, cur - old)
    assert widest <= SPAN, f"{widest} live epochs"
    old, cur = epochs(tc)
    assert cur >= SPAN, f"only {cur} epochs opened: {tc.status_line()}"
    assert old > 0, "no epoch retired: the flushes never had to wait"
    want = {}
    for j in range(3):
        last = max(i for i in range(n) if i % 3 == j)
        want[A + j] = pat(f"r{last}-")
    want[A] = pat("last")
    put(tc.path, A, want[A])                # the open epoch: the span full
    for blk, d in want.items():
        assert get(tc.path, blk) == d
    name = tc.name
    tc.remove()
    tc, _ = make(stack, True, lw, name=name + "b", fmt=False, cache=cache)
    old, cur = epochs(tc)
    tclib.kmsg(f"loaded epochs {old}..{cur}")
    assert cur - old >= SPAN - 1, f"the span is not full after the load: {old}..{cur}"
    lw.message("mark", "reload")
    p = bytearray(B)
    p[1024:1536] = b"P" * 512
    put(tc.path, BB, b"P" * 512, off=1024)  # uncached: around the cache
    put(tc.path, C, pat("after"))
    fsync_dev(tc.path)
    assert get(tc.path, BB) == bytes(p) and get(tc.path, C) == pat("after")
    tc.flush()
    lw.message("mark", "end")
    for blk, d in {**want, BB: bytes(p), C: pat("after")}.items():
        assert get(lw.path, blk) == d
    # the partial write is on the origin only after every loaded version
    img = bytearray(ORIGIN_MIB * MiB)
    tclib.flushbufs(logdev)
    with logwrites.LogWrites.open(logdev) as log:
        start = log.mark_index("reload")
        log.replay(img, end=start)
        for e in list(log.entries)[start + 1:]:
            log.replay(img, start=e.index, end=e.index)
            if bytes(img[BB * B:(BB + 1) * B]) == bytes(p):
                early = [blk for blk, d in want.items()
                         if bytes(img[blk * B:(blk + 1) * B]) != d]
                assert not early, f"the partial write reached the origin before " \
                                  f"the loaded versions of blocks {early}"
                break
        else:
            pytest.fail("the partial write never reached the origin")


def fua_write(path, block, byte):
    """One 4 KiB write of `byte` as a pure REQ_FUA: asynchronous O_DIRECT
    with O_DSYNC (fio, libaio); a synchronous O_DSYNC write would be
    followed by a flush, which ends the epoch anyway."""
    tclib.fio(["--name=fua", f"--filename={path}", "--ioengine=libaio",
               "--direct=1", "--sync=dsync", "--rw=write", "--bs=4k",
               "--size=4k", f"--offset={block * B}", "--iodepth=1",
               f"--buffer_pattern={byte:#04x}"])


def test_ordered_fua_write_ends_its_epoch(stack):
    """A write issued after a FUA write completed must not reach the origin
    before it: block 0 (Y) written after a FUA write of block C (X), no
    flush anywhere; writeback in block order would send Y first."""
    lw, logdev = origin_stack(stack)
    tc, _ = make(stack, True, lw)
    x = bytes([0x58]) * B
    fua_write(tc.path, C, 0x58)
    assert get(tc.path, C) == x, "the FUA write did not land"
    put(tc.path, A, pat("y1"))
    assert dirty(tc) == 2, tc.status_line()
    lw.message("mark", "wb")
    tc.flush()
    lw.message("mark", "end")
    hist = [{C: x}, {A: pat("y1")}]
    states, bad, _ = replay_check(logdev, "wb", hist)
    assert bad is None, f"the origin took a write issued after a FUA write " \
                        f"before it (after {states} writes): {bad}"
    assert get(lw.path, A) == pat("y1") and get(lw.path, C) == x


def cache_stack(stack, mib=4):
    """Cache device = log-writes over a RAM disk: (logged dev, log dev)."""
    tclib.run(["modprobe", "dm-log-writes"])
    raw = stack.ram(mib * MiB)
    logdev = stack.ram(64 * MiB)
    n = tclib.size_sectors(raw)
    return stack.dm(stack._name("clw"), f"0 {n} log-writes {raw} {logdev}"), logdev


def downgrade_to_v2(path):
    """Rewrite a cache with no dirty version of an epoch above 0 as the
    version 2 code wrote it (its layout: no summary, the data lower);
    durable (logged) at return."""
    img = tclib.read_direct(path, 0, tclib.size_bytes(path))
    tclib.write_direct(path, 0, tcdisk.downgrade(img, tcdisk.VERSION_V2))
    fsync_dev(path)
    assert tcdisk.decode_sb(tclib.read_direct(path, 0, B)).version == 2


def corrupt_entries(img):
    """The entries a load refuses in cache image @img (or the superblock's
    state if it does not decode)."""
    sb = tcdisk.decode_sb(img[:B])
    if not sb.ok:
        return f"superblock {sb.state}"
    area = img[tcdisk.META_START * 512:tcdisk.META_START * 512 + sb.entries_bytes]
    return [(s, e.state) for s, e in tcdisk.entries(area, sb) if e.state in tcdisk.CORRUPT]


def test_v2_cache_read_only_then_writable_upgrades_first(stack):
    """Reported in review (issue 12): a version 2 cache loaded read-only
    keeps its version 2 superblock until the first commit of a writable
    table, and that commit wrote entries with epoch bits before the
    superblock that makes them legal: torn there, the cache is refused as
    corrupt.  Every power-cut state of the cache device must load, and the
    last one holds the block committed before the downgrade."""
    origin = stack.ram(ORIGIN_MIB * MiB)
    clw, logdev = cache_stack(stack)
    tc = stack.tiercache(origin, clw.path, keys=dict(KEYS))
    put(tc.path, A, pat("a0"))
    fsync_dev(tc.path)
    line = tc.table_line()
    tc.remove()
    downgrade_to_v2(clw.path)
    clw.message("mark", "v2")
    parts = line.split()
    if "ordered" in parts[7:]:
        parts[parts.index("ordered", 7) + 1] = "1"
    else:
        parts[6] = str(int(parts[6]) + 2)       # the feature count
        parts += ["ordered", "1"]
    ordered = " ".join(parts)
    name = stack._name("v2")
    tclib.run(["dmsetup", "create", "--readonly", name, "--table", ordered])
    tc2 = tclib.TierCache(name, ordered)
    stack._defer(tc2.remove)
    tclib.run(["dmsetup", "mknodes", name], quiet=True)
    assert get(tc2.path, A) == pat("a0")
    tc2.reload(ordered)                         # writable now
    put(tc2.path, BB, pat("b1"))
    fsync_dev(tc2.path)                         # epoch 1 opens
    put(tc2.path, C, pat("c1"))
    fsync_dev(tc2.path)                         # commits c1 in epoch >= 1
    assert epochs(tc2)[1] >= 1, tc2.status_line()
    tc2.remove()
    clw.message("mark", "end")
    tclib.flushbufs(logdev)
    img = bytearray(tclib.size_bytes(clw.path))
    bad, states, last_torn = [], 0, None
    with logwrites.LogWrites.open(logdev) as log:
        start = log.mark_index("v2")
        log.replay(img, end=start)
        for e in list(log.entries)[start + 1:]:
            if e.is_write and e.sector == 0:
                # torn here: every write before this superblock, none after
                states += 1
                found = corrupt_entries(img)
                if found:
                    bad.append((e.index, found[:4]))
                last_torn = bytes(img)
            log.replay(img, start=e.index, end=e.index)
    assert states >= 2, f"only {states} superblock writes after the downgrade"
    assert not bad, f"power-cut states of the cache that no load accepts " \
                    f"(log entry, entries refused): {bad}"
    # the module agrees: the last torn state loads and holds a0
    raw = stack.ram(4 * MiB)
    tclib.write_direct(raw, 0, last_torn)
    t3 = line.split()
    t3[4] = raw
    t3 = " ".join(t3)
    name3 = stack._name("torn")
    cur = tclib.KmsgCursor("torn")
    p = tclib.run(["dmsetup", "create", "--readonly", name3, "--table", t3], check=False)
    log3 = "\n".join(cur.lines())
    assert p.returncode == 0, f"the torn state is refused: {log3[-600:]}"
    tc3 = tclib.TierCache(name3, t3)
    stack._defer(tc3.remove)
    tclib.run(["dmsetup", "mknodes", name3], quiet=True)
    assert get(tc3.path, A) == pat("a0")


def test_ordered_partial_write_not_starved_by_fsyncs(stack):
    """Reported in review (issue 12): a write that goes around the cache
    waited until no epoch older than the open one was left.  Under a writer
    that keeps writing and fsyncing faster than writeback retires epochs,
    that never happens: the write waited as long as the writer ran.  It
    must complete while the writer still runs, and read back."""
    # each epoch's writeback: a write and a flush of 200 ms each, slower
    # than the writer's write + fsync
    origin = stack.slow(ORIGIN_MIB * MiB, write_ms=200)
    tc = stack.tiercache(origin.path, stack.ram(8 * MiB),
                         keys=dict(KEYS, ordered=1))
    stop, fsyncs, errors, pw = threading.Event(), [0], [], None

    def writer():
        fd = os.open(tc.path, os.O_RDWR | os.O_DIRECT)
        buf = tclib.aligned_buf(B)
        try:
            i = 0
            while not stop.is_set():
                buf[:B] = pat(f"s{i}-")
                os.pwrite(fd, memoryview(buf)[:B], (4000 + i % 64) * B)
                os.fsync(fd)
                fsyncs[0] += 1
                i += 1
        except OSError as e:
            errors.append(e)
        finally:
            os.close(fd)
            buf.close()

    th = threading.Thread(target=writer)
    th.start()
    try:
        deadline = time.monotonic() + 60
        while fsyncs[0] < 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fsyncs[0] >= 8, "the writer made no progress"
        before = fsyncs[0]
        t0 = time.monotonic()
        done = []
        # uncached, so around the cache
        pw = threading.Thread(target=lambda: done.append(
            put(tc.path, 100, b"P" * 512, off=1024)))
        pw.start()
        pw.join(60)
        took = time.monotonic() - t0
        finished = bool(done)       # before the writer stops
        during = fsyncs[0] - before
        old, cur = epochs(tc)
    finally:
        stop.set()
        th.join(120)
    if pw:
        pw.join(120)
    assert not errors, errors
    tclib.kmsg(f"partial write: {'done' if finished else 'still waiting'} after {took:.1f} s, "
               f"{during} fsyncs meanwhile, epochs {old}..{cur}")
    assert finished, f"a partial write around the cache still waited after {took:.0f} s " \
                 f"while {during} fsyncs went on (epochs {old}..{cur})"
    want = bytearray(B)
    want[1024:1536] = b"P" * 512
    assert get(tc.path, 100) == bytes(want)
    origin.reload(origin.table.rsplit(" ", 1)[0] + " 0")   # drain fast
    tc.flush()
    assert get(origin.path, 100) == bytes(want)


def test_ordered_switched_on_over_dirty_blocks(stack):
    lw, logdev = origin_stack(stack)
    tc, cache = make(stack, False, lw)
    name = tc.name
    put(tc.path, A, pat("a1"))
    put(tc.path, BB, pat("b1"))
    fsync_dev(tc.path)              # the default policy: no new epoch
    assert dirty(tc) == 2 and epochs(tc) == (0, 0), tc.status_line()
    tc.message("set", "ordered", "1")
    fsync_dev(tc.path)              # opens epoch 1: A and B are epoch 0's
    assert epochs(tc) == (0, 1), tc.status_line()
    put(tc.path, A, pat("a2"))      # copied on write
    put(tc.path, C, pat("c1"))
    fsync_dev(tc.path)
    x = b"X" * 512
    bx = bytearray(pat("b1"))
    bx[1024:1536] = x
    put(tc.path, BB, x, off=1024)   # partial: copied from epoch 0
    put(tc.path, A, pat("a3"))
    fsync_dev(tc.path)
    hist = [{A: pat("a1"), BB: pat("b1")}, {A: pat("a2"), C: pat("c1")},
            {BB: bytes(bx), A: pat("a3")}]
    assert dirty(tc) == 6, tc.status_line()
    assert epochs(tc) == (0, 3), tc.status_line()
    for blk, d in ((A, hist[2][A]), (BB, hist[2][BB]), (C, hist[1][C])):
        assert get(tc.path, blk) == d
    # a default-policy table loads the three epochs and drains them in order
    tc.remove()
    tc, _ = make(stack, False, lw, name=name + "b", fmt=False, cache=cache)
    assert dirty(tc) == 6, tc.status_line()
    assert epochs(tc) == (0, 2), tc.status_line()
    lw.message("mark", "wb")
    tc.flush()
    lw.message("mark", "end")
    states, bad, _ = replay_check(logdev, "wb", hist)
    assert bad is None, f"illegal origin state after {states} writes: {bad}"
    assert states >= 6, f"only {states} origin writes replayed"
    for blk, d in ((A, hist[2][A]), (BB, hist[2][BB]), (C, hist[1][C])):
        assert get(tc.path, blk) == d
