# SPDX-License-Identifier: GPL-2.0
"""A flush in the failed state commits while a slot may be dirty on disk:
the regression test of commit 70ed258 (docs/tiercache.rst, "Failure
handling").

The bug: in the failed state (status field 23 nonzero) a flush
(REQ_PREFLUSH) went to the origin alone when nothing was dirty in memory
and no dropped entry waited for a commit (tc_map_flush(): tc_nr_dirty()
and tc_meta_stale() zero).  But a block written back since the last commit
is clean in memory and still recorded dirty on the cache device.  If its
last rewrite reached only the cache device's volatile write cache, a power
cut after that flush loads the dirty entry with the slot's older data, and
writeback writes it over the newer data on the origin: a write acknowledged
by fsync is lost.  The fix counts the slots that may be dirty on disk
(tc_meta nr_disk_dirty) and commits unless there are none.

Writeback kicks a commit as soon as its blocks are clean
(tc_wb_batch_done()), and every commit flushes the cache device first, so
the window is a flush that arrives while that commit waits for the cache
device.  The test holds it there: the cache device's table delays flushes
(dm-delay's third class) until the test lets them go.

Devices: the origin is a RAM disk; the cache device is a dm table (`cl`)
over dm-log-writes (`lw`: a RAM disk, its log on another one).

  1  block B = v1, fsync: a commit, B dirty on disk with v1 (mark "v1")
  2  B = v2: a rewrite in its slot, in the device's volatile cache only
  3  cl's table becomes: superblock and entry area, and B's slot, through
     dm-delay (reads and writes at once, flushes held for up to HOLD_MS);
     the rest of the data area `error`
  4  a write to block C takes a fresh slot in the error area: it goes
     around the cache and field 23 latches -EIO
  5  `flush`: writeback writes v2 to the origin, B is clean in memory
     (dirty 0); the commit it kicks waits in cl with its flush (mark
     "held": the cache device still records B dirty with v1)
  6  fsync of the tiercache device: it must succeed.  Fixed, it waits for
     a commit, so the held flushes are let go once it has not returned in
     HOLD_WAIT s; mark "fsynced" once it has returned; flushes go on
  7  power cut at "fsynced": the log replayed up to that mark onto a
     zeroed device (what the cache device holds after the cut), with the
     origin (a RAM disk: it keeps everything), under a new tiercache
     without `format`: B must read v2, and after a full flush the origin
     must hold v2.  Before the fix the fsync returned at once (in about
     10 ms, with no commit), the load found B dirty with v1, read v1 and
     wrote it over the origin.

dm-log-writes logs a plain write only when a later flush reaches it, so
the log up to a mark is what the device held durably at that mark.  The
images at the marks "v1" and "held" must record B dirty with v1 in its
slot: otherwise v2 was durable before the fsync and the test proves
nothing.  About 10 s in the VM (HOLD_WAIT of it with the fix).
"""

import errno
import time

import pytest

import logwrites
import tcdisk
import tclib
from faults import Bg, committed_dirty, fsync_path, rnd, superblock, swap, wait_until
from tclib import MiB

pytestmark = [pytest.mark.module, pytest.mark.usefixtures("tc_module")]

B = 4096
BS = B // 512               # sectors per block
BLOCK = 2048                # the test block (8 MiB in: clear of udev's probe)
OTHER = 2560                # its write latches the failed state
ORIGIN_SIZE = 32 * MiB
CACHE_SIZE = 16 * MiB
LOG_SIZE = 32 * MiB
# no background writeback, no timer commit: commits on flush, FUA, writeback
KEYS = {"high_watermark": 100, "low_watermark": 0, "commit_ms": 600000}
HOLD_MS = 30000             # flushes held in cl (bounded: teardown gets by)
HOLD_WAIT = 5               # s an fsync may take before the flushes go


def note(msg):
    """The test's log and the kernel log (timestamps beside the module's)."""
    tclib.log(msg)
    tclib.kmsg(f"t98: {msg}")


def fsync_errno(path):
    """0, or the errno of an fsync of the device (a REQ_PREFLUSH)."""
    try:
        fsync_path(path)
        return 0
    except OSError as e:
        return e.errno


def held_flushes(dev):
    """Flush bios dm-delay holds in `dev` (the status of a delay segment:
    read, write and flush bios held)."""
    n = 0
    for ln in dev.status_line().splitlines():
        w = ln.split()
        if len(w) == 6 and w[2] == "delay":
            n += int(w[5])
    return n


def hold_table(lw, size, data_start, slot_sector):
    """cl over `lw`: the superblock, entry area and the slot at
    `slot_sector` through dm-delay holding flushes, the rest `error`."""
    def delay(start, n):
        return (f"{start} {n} delay {lw} {start} 0 {lw} {start} 0 "
                f"{lw} {start} {HOLD_MS}")
    rows = [delay(0, data_start)]
    if slot_sector > data_start:
        rows.append(f"{data_start} {slot_sector - data_start} error")
    rows.append(delay(slot_sector, BS))
    if slot_sector + BS < size:
        rows.append(f"{slot_sector + BS} {size - slot_sector - BS} error")
    return "\n".join(rows)


def image_entry(img, block):
    """(state, slot, slot data) of `block`'s entry in a cache device image;
    (None, None, None) if no entry names it."""
    sb = tcdisk.decode_sb(img[:tcdisk.SB_BYTES])
    assert sb.ok, f"the replayed image's superblock is {sb.state}"
    base = tcdisk.META_START * 512
    area = bytes(img[base:base + sb.entries_bytes])
    for s, e in tcdisk.entries(area, sb):
        if e.block == block:
            off = (sb.data_start + s * sb.block_sectors) * 512
            return e.state, s, bytes(img[off:off + B])
    return None, None, None


def test_flush_after_writeback_in_failed_state_commits(stack):
    tclib.run(["modprobe", "dm-log-writes"])
    tclib.run(["modprobe", "dm-delay"])
    origin = stack.ram(ORIGIN_SIZE)
    cache_raw = stack.ram(CACHE_SIZE)
    logdev = stack.ram(LOG_SIZE)
    replay = stack.ram(CACHE_SIZE)
    csize = tclib.size_sectors(cache_raw)
    v0, v1, v2 = rnd("98-v0"), rnd("98-v1"), rnd("98-v2")
    names = {v0: "v0 (the origin's data before the test)",
             v1: "v1 (the older write)", v2: "v2 (the last write, fsynced)"}

    def what(data):
        return names.get(data, "other data")

    tclib.write_direct(origin, BLOCK * B, v0)
    lw = stack.dm("tc-lw98-log", f"0 {csize} log-writes {cache_raw} {logdev}")
    plain = f"0 {csize} linear {lw.path} 0"
    cl = stack.dm("tc-lw98-cl", plain)
    tc = stack.tiercache(origin, cl.path, BS, "writeback", keys=KEYS)

    # 1, 2: B dirty on disk with v1; v2 in the device's volatile cache
    tclib.write_direct(tc.path, BLOCK * B, v1)
    assert fsync_errno(tc.path) == 0, "the first fsync failed"
    lw.message("mark", "v1")
    tclib.write_direct(tc.path, BLOCK * B, v2)
    st = tc.status()
    assert st["dirty"] == 1 and st["cache_failed"] == 0, st["raw"]
    sb = superblock(cache_raw)
    slot = committed_dirty(cache_raw).get(BLOCK)
    assert slot is not None, "the fsync committed no dirty entry for block B"
    slot_sector = sb["data_start"] + slot * BS
    note(f"block {BLOCK} dirty in slot {slot} (sector {slot_sector}; data from "
         f"sector {sb['data_start']}), v2 written")

    # 3: flushes held, the data area fails outside B's slot
    swap(cl, hold_table(lw.path, csize, sb["data_start"], slot_sector))
    released = False

    def release():
        nonlocal released
        if not released:
            swap(cl, plain)         # dm-delay's presuspend lets them go
            released = True

    fsync_bg = None
    try:
        # 4: the failed state
        tclib.write_direct(tc.path, OTHER * B, rnd("98-other"))
        st = tc.status()
        assert st["cache_failed"] == -errno.EIO, \
            f"a write to a failing slot did not latch the failed state: {st['raw']}"
        assert st["dirty"] == 1, st["raw"]
        note("failed state latched")

        # 5: writeback; the commit it kicks waits with its flush
        st = tc.flush()
        assert st["wb_blocks"] >= 1, st["raw"]
        got = tclib.read_direct(origin, BLOCK * B, B)
        assert what(got) == what(v2), f"writeback left {what(got)} on the origin"
        wait_until(lambda: held_flushes(cl), 30,
                   "the commit after writeback to flush the cache device")
        lw.message("mark", "held")
        note("written back; the commit after it waits with its flush")

        # 6: the fsync
        commits = tc.status()["meta_commits"]
        fsync_bg = Bg(fsync_errno, tc.path)
        deadline = time.monotonic() + HOLD_WAIT
        while fsync_bg.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        waited = fsync_bg.alive()
        if waited:
            tclib.log(f"the fsync waits (a commit): the flushes go after "
                      f"{fsync_bg.seconds():.1f}s")
            release()
        r = fsync_bg.join(60, "the fsync of the failed device").result()
        st = tc.status()
        fsync_s = fsync_bg.seconds()
        committed = st["meta_commits"] - commits
        note(f"fsync: {r} in {fsync_s:.2f}s, {committed} commits meanwhile, "
             f"{'after' if waited else 'before'} the held flushes went: "
             f"{st['raw']}")
        assert r == 0, f"the fsync failed ({errno.errorcode.get(r, r)}) though the " \
                       f"cache device takes commits"
        lw.message("mark", "fsynced")
    finally:
        release()
        if fsync_bg is not None:
            fsync_bg.join(60, "the fsync of the failed device")
    tc.remove()
    cl.remove()
    lw.remove()                     # logs what was not flushed, then its end

    # 7: the power cut
    tclib.flushbufs(logdev)
    with logwrites.LogWrites.open(logdev) as log:
        tclib.log(f"log: {len(log)} entries: {log.summary()}; marks {log.marks()}")
        img = bytearray(CACHE_SIZE)
        at = {}
        done = -1
        for mark in ("v1", "held", "fsynced"):
            idx = log.mark_index(mark)
            log.replay(img, idx, start=done + 1)
            done = idx
            at[mark] = image_entry(img, BLOCK)
            tclib.log(f"at mark {mark!r} (entry {idx}): block {BLOCK}'s entry "
                      f"{at[mark][0]} in slot {at[mark][1]}, slot data "
                      f"{what(at[mark][2])}")
    for mark in ("v1", "held"):
        state, s, data = at[mark]
        assert (state, s, what(data)) == (tcdisk.DIRTY, slot, what(v1)), \
            (f"at mark {mark!r} the cache device should record block {BLOCK} dirty "
             f"in slot {slot} holding v1 (v2 not flushed yet); it records "
             f"{state} in slot {s} holding {what(data)}: the test proves nothing")
    state, s, data = at["fsynced"]

    tclib.fill_device(replay, img)
    cur = tclib.KmsgCursor("lw98-load")
    tc2 = stack.tiercache(origin, replay, BS, "writeback", keys=KEYS, fmt=False)
    loaded = [ln.split("tiercache: ", 1)[-1] for ln in cur.lines()
              if "loaded" in ln and "dirty blocks" in ln]
    note(f"loaded after the power cut: {loaded}")
    dirty = tc2.status()["dirty"]
    got = tclib.read_direct(tc2.path, BLOCK * B, B)
    tc2.flush()
    on_origin = tclib.read_direct(origin, BLOCK * B, B)
    note(f"block {BLOCK} reads {what(got)}, the origin holds {what(on_origin)} "
         f"after writeback")
    # names, not 4 KiB of bytes: pytest would diff those for half a minute
    assert (what(got), what(on_origin)) == (what(v2), what(v2)), (
        f"block {BLOCK} lost its fsynced data: the fsync in the failed state "
        f"returned 0 in {fsync_s:.2f}s with {committed} metadata commits "
        f"meanwhile, though writeback had cleaned the block in memory only; at "
        f"a power cut right after it the cache device records the block "
        f"{state} in slot {s} holding {what(data)} (the rewrite v2 was only in "
        f"its volatile cache); loaded again ({dirty} dirty), the block reads "
        f"{what(got)} and writeback leaves {what(on_origin)} on the origin "
        f"(commit 70ed258: a flush commits while a slot may be dirty on disk)")
    assert dirty == 0, f"{dirty} dirty blocks loaded after a flush that committed"
