# SPDX-License-Identifier: GPL-2.0
"""Regression tests for defects found in review (issue 14, items 2, 3, 5,
6, 8, 9, 10, 11, 12).

Races are made deterministic by holding one bio in a window: dm-delay
under the origin or the cache device (read and write delays separately),
and dm tables swapped to `error` over chosen sectors (suspend, load,
resume of a dm-linear device).  Every wait has a deadline: a hang fails
the test, it never blocks the suite.  The test that can leave a device
stuck for good on a broken module (item 8) runs last and leaks its
devices on purpose (their names go to tclib.KEEP) instead of hanging in
teardown.
"""

import errno
import os
import random
import subprocess
import threading
import time

import pytest

import tclib
from faults import (Bg, find_in_device, fio_start_s, linear_with_error, named_nullb, rnd,
                    start_fio, stop_fio, swap, wait_until)
from tclib import MiB

pytestmark = [pytest.mark.module, pytest.mark.usefixtures("tc_module")]

B = 4096
S = B // 512          # sectors per 4 KiB block


# ---------------------------------------------------------------- helpers

def delayed(stack, size, read_ms=0, write_ms=0):
    """dm-delay over a RAM disk, created without delay; call the returned
    function (once the tiercache over it exists and udev has probed it)
    to switch the delays on."""
    dev = stack.slow(size, 0, 0)
    backing = dev.table.split()[3]
    n = tclib.size_sectors(dev.path)

    def disarm():
        # no delay for teardown (udev probes the device after each resume:
        # with a read delay its blkid would keep the device open for long)
        swap(dev, f"0 {n} delay {backing} 0 0 {backing} 0 0")
        tclib.run(["udevadm", "settle", "--timeout=30"], check=False, quiet=True)

    def arm():
        swap(dev, f"0 {n} delay {backing} 0 {read_ms} {backing} 0 {write_ms}")
        stack._defer(disarm)
    return dev, arm


# ---------------------------------------------------------------- item 2

def test_cleaner_write_during_writeback_write(stack):
    """A write to a dirty block with the cleaner on goes to the origin and
    the cache (writethrough).  When the block's writeback write is still
    in flight, that older copy and the new write are both on their way to
    the origin: the block may be marked clean only if the new data surely
    lands last, i.e. the write waited for the writeback, or else it stays
    dirty (or goes to the cache only) and is written back again.

    What this can and cannot show: dm-delay keeps the order of writes, so
    the origin ends with the new data on every module (checked below); the
    reordering itself, which a real disk may do, cannot be produced here.
    The test checks the protocol.  The origin (dm-delay over a null_blk with
    a write cache) delays writes and flushes by D (TC_RACE_D, 2 s; the
    debug lane's slower kernel needs more), so the writeback of the old
    copy ends 2 D after its write was issued.  The writeback write of the
    old copy is issued after the `cleaner on` message (t0) and seen issued
    in wb_requests; the new write
    is issued before t0 + D, so before the old copy can have landed.  It is
    sent at once if it takes about D, waits if it takes 1.3 D or more, and
    goes to the cache only if it takes much less.  The block was written
    back twice (wb_blocks +2) unless the new write waited."""
    D = float(os.environ.get("TC_RACE_D", "2.0"))
    # a null_blk with a write cache: the origin takes REQ_PREFLUSH (a RAM
    # disk has no write cache, so the block layer completes an empty flush
    # at once and the old copy's writeback ends D after its write, before
    # the new write completes and lets go of the block)
    nb = stack.nullb(32, discard=False, cache_size=16)
    tclib.seeded_origin(nb, seed=201)
    origin = stack.slow(backing=nb, write_ms=int(D * 1000))
    assert tclib.sysfs_queue(origin.path, "write_cache") == "write back", \
        "the origin does not take flushes: the test cannot hold the writeback's flush"
    tc = stack.tiercache(origin.path, stack.ram(8 * MiB), 8, "writeback")
    X = 3000
    a, c = rnd(202), rnd(203)
    tclib.write_direct(tc.path, X * B, a)
    st0 = tc.status()
    assert st0["dirty"] == 1, st0["raw"]
    t0 = time.monotonic()
    tc.message("cleaner", "on")
    try:
        # the writeback write of `a` is issued (wb_requests counts it at
        # submission) and now held by the origin's write delay
        wait_until(lambda: tc.status()["wb_requests"] > st0["wb_requests"], 10,
                   "the writeback write to be issued")
        w = Bg(tclib.write_direct, tc.path, X * B, c)
        w.join(30, "the cleaner-mode write").result()
        st_c = tc.status()
        st = wait_until(lambda: (lambda st: st["dirty"] == 0 and
                                 st["flush_state"] == "idle" and st)(tc.status()),
                        40, "the cleaner to write the block back", step=0.1)
    finally:
        tc.message("cleaner", "off")
    lag = w.t0 - t0
    waited = w.seconds() >= 1.3 * D
    wb = st["wb_blocks"] - st0["wb_blocks"]
    note = (f"write issued {lag:.2f}s after the cleaner message, took "
            f"{w.seconds():.2f}s; wb_blocks +{wb}; at its return: {st_c['raw']}; "
            f"at the end: {st['raw']}")
    print(note)
    tclib.kmsg(f"item 2: {note}")
    assert st["error"] == 0, st["raw"]
    tclib.compare(c, tclib.read_direct(tc.path, X * B, B), X * B, "device after the race")
    tc.remove()
    tclib.compare(c, tclib.read_direct(origin.path, X * B, B), X * B,
                  "origin after the race")
    assert lag < 0.75 * D, \
        f"the write was issued {lag:.2f}s after the cleaner message: no race (slow VM?)"
    assert waited or wb >= 2, (
        f"the cleaner write of block {X}, issued {lag:.2f}s after the cleaner "
        f"message, i.e. while the writeback write of the block's older copy was "
        f"held by the origin ({D:.0f} s), took {w.seconds():.2f}s: it was sent to "
        f"the origin alongside the older copy, and the block was then marked clean "
        f"after one writeback write (wb_blocks +{wb}; dirty {st_c['dirty']} when "
        f"the write returned): on an origin that reorders writes the older copy "
        f"lands last and the clean cached copy differs from the origin: {st['raw']}")


# ---------------------------------------------------------------- item 3

def test_promotion_not_from_reader_buffer(stack):
    """An O_DIRECT read miss of a whole block is promoted; the reader
    scribbles over its own buffer while the promotion's cache write is
    held (cache write delay 500 ms).  A later read (a cache hit) must
    return the origin's data, not the scribble."""
    origin = stack.ram(32 * MiB)
    m = tclib.seeded_origin(origin, seed=301)
    cdev, arm = delayed(stack, 8 * MiB, write_ms=500)
    tc = stack.tiercache(origin, cdev.path, 8, "writeback")
    arm()
    X = 4000
    want = bytes(m.data[X * B:(X + 1) * B])
    scribble = bytes([0xA5]) * B
    buf = tclib.aligned_buf(B)

    def read():
        fd = os.open(tc.path, os.O_RDONLY | os.O_DIRECT)
        try:
            return os.preadv(fd, [memoryview(buf)[:B]], X * B)
        finally:
            os.close(fd)

    st0 = tc.status()
    r = Bg(read)
    n = 0
    deadline = time.monotonic() + 20
    while r.alive() and time.monotonic() < deadline:
        buf[:B] = scribble
        n += 1
        time.sleep(0.005)
    assert r.join(5, "the promoting read").result() == B
    buf.close()
    st1 = tc.status()
    print(st0["raw"], st1["raw"], f"{n} scribbles during {r.seconds():.2f}s")
    assert st1["read_misses"] > st0["read_misses"], st1["raw"]
    got = tclib.read_direct(tc.path, X * B, B)
    st2 = tc.status()
    print(st2["raw"])
    if got == scribble:
        pytest.fail(f"block {X} reads back as the first reader's scribble "
                    f"(0xa5...) instead of the origin's data: the promotion was "
                    f"written to the cache from the reader's pages, which the "
                    f"reader changed meanwhile ({n} scribbles, read "
                    f"{r.seconds():.2f}s); hits {st1['read_hits']} -> "
                    f"{st2['read_hits']}", pytrace=False)
    tclib.compare(want, got, X * B, "read after a promotion")
    m.verify_device(tc.path, start=(X - 8) * B, end=(X + 8) * B)


# ---------------------------------------------------------------- item 5

def test_writethrough_origin_write_error(stack):
    """Writethrough, block cached clean; the origin fails the block's
    sectors; a write of it fails with EIO.  The device must then read what
    the origin holds (or fail while the origin fails), never the failed
    write's data, which nobody has on the origin."""
    ram = stack.ram(32 * MiB)
    m = tclib.seeded_origin(ram, seed=501)
    X = 3000
    healthy = f"0 {tclib.size_sectors(ram)} linear {ram} 0"
    broken = linear_with_error(ram, X * S, S)
    org = stack.dm("tcb-origin5", healthy)
    tc = stack.tiercache(org.path, stack.ram(8 * MiB), 8, "writethrough")
    old, new = bytes(m.data[X * B:(X + 1) * B]), rnd(502)
    tclib.compare(old, tclib.read_direct(tc.path, X * B, B), X * B, "first read")
    st0 = tc.status()
    tclib.compare(old, tclib.read_direct(tc.path, X * B, B), X * B, "second read")
    st1 = tc.status()
    assert st1["read_hits"] == st0["read_hits"] + 1, \
        f"block {X} not cached after a whole-block read: {st0['raw']} -> {st1['raw']}"
    swap(org, broken)
    try:
        with pytest.raises(OSError) as ei:
            tclib.write_direct(tc.path, X * B, new)
        assert ei.value.errno == errno.EIO, ei.value
        try:
            got = tclib.read_direct(tc.path, X * B, B)
        except OSError as e:
            got = e
        st = tc.status()
        print(st["raw"], "read while the origin fails:",
              got if isinstance(got, OSError) else tclib.hexdump16(got))
        if got == new:
            pytest.fail(f"after a writethrough write failed with EIO at the origin, "
                        f"block {X} reads back as the failed write's data (a cached "
                        f"copy that is not on the origin): {st['raw']}", pytrace=False)
    finally:
        swap(org, healthy)
    got = tclib.read_direct(tc.path, X * B, B)
    if got == new:
        pytest.fail(f"origin healed: block {X} still reads as the failed write's "
                    f"data from the cache: {tc.status()['raw']}", pytrace=False)
    tclib.compare(old, got, X * B, "read after the failed writethrough write")
    m.verify_device(tc.path, start=(X - 8) * B, end=(X + 8) * B)


def test_cache_read_error_served_from_origin(stack):
    """A clean cached block whose slot cannot be read (cache region swapped
    to error): the read is served from the origin."""
    ram = stack.ram(32 * MiB)
    m = tclib.seeded_origin(ram, seed=503)
    cram = stack.ram(8 * MiB)
    healthy = f"0 {tclib.size_sectors(cram)} linear {cram} 0"
    cdev = stack.dm("tcb-cache5", healthy)
    tc = stack.tiercache(ram, cdev.path, 8, "writeback")
    X = 3000
    want = bytes(m.data[X * B:(X + 1) * B])
    tclib.compare(want, tclib.read_direct(tc.path, X * B, B), X * B, "promoting read")
    slot_off = find_in_device(cdev.path, want)
    st0 = tc.status()
    assert st0["dirty"] == 0, st0["raw"]
    swap(cdev, linear_with_error(cram, slot_off // 512, S))
    try:
        try:
            got = tclib.read_direct(tc.path, X * B, B)
        except OSError as e:
            st = tc.status()
            pytest.fail(f"read of clean cached block {X} (slot at cache byte "
                        f"{slot_off}, unreadable) failed with {e!r} instead of being "
                        f"served from the origin: {st0['raw']} -> {st['raw']}",
                        pytrace=False)
        tclib.compare(want, got, X * B, "read of a clean block with an unreadable slot")
        print(tc.status()["raw"])
    finally:
        swap(cdev, healthy)
    m.verify_device(tc.path, start=(X - 8) * B, end=(X + 8) * B)


# ---------------------------------------------------------------- item 6

def test_discard_races_promotion(stack):
    """A read miss of block H is being promoted (its cache write held by a
    1 s cache write delay) when H is discarded through the device.  After
    both, the device must read what the origin holds (zeros: null_blk
    frees discarded sectors), not the pre-discard data the promotion
    cached."""
    nb = stack.nullb(32, discard=True)
    m = tclib.seeded_origin(nb, seed=601)
    cdev, arm = delayed(stack, 8 * MiB, write_ms=1000)
    tc = stack.tiercache(nb, cdev.path, 8, "writeback")
    arm()
    H = 3000
    pre = bytes(m.data[H * B:(H + 1) * B])
    r0 = tclib.block_stat(nb)["reads"]
    r = Bg(tclib.read_direct, tc.path, H * B, B)
    wait_until(lambda: tclib.block_stat(nb)["reads"] > r0, 10,
               "the promotion's origin read")
    time.sleep(0.2)          # the promotion's cache write is now held
    d = Bg(tclib.discard, tc.path, H * B, B)
    d.join(20, "the discard").result()
    tclib.compare(pre, r.join(20, "the promoting read").result(), H * B,
                  "the read that raced the discard (issued first)")
    on_origin = tclib.read_direct(nb, H * B, B)
    assert on_origin == bytes(B), \
        f"null_blk did not zero the discarded block: {tclib.hexdump16(on_origin)}"
    got = tclib.read_direct(tc.path, H * B, B)
    st = tc.status()
    print(st["raw"], f"discard took {d.seconds():.2f}s, read {r.seconds():.2f}s")
    if got == pre:
        pytest.fail(f"block {H} was discarded (the origin reads zeros) but the device "
                    f"reads its pre-discard data: the promotion that raced the discard "
                    f"cached it (discard took {d.seconds():.2f}s, read "
                    f"{r.seconds():.2f}s): {st['raw']}", pytrace=False)
    tclib.compare(on_origin, got, H * B, "read after the discard")


def test_discard_races_bridge_filler(stack):
    """Dirty blocks H-1 and H+1 around an uncached hole H, bridged.  The
    flush has read H's filler from the origin and waits for the dirty
    slots (cache read delay 1 s) when H is discarded through the device.
    The origin must not get the pre-discard data of H back."""
    nb = stack.nullb(32, discard=True)
    m = tclib.seeded_origin(nb, seed=602)
    cdev, arm = delayed(stack, 8 * MiB, read_ms=1000)
    tc = stack.tiercache(nb, cdev.path, 8, "writeback", keys={"bridge_gap_kb": 64})
    arm()
    H = 3001
    pre = bytes(m.data[H * B:(H + 1) * B])
    with tclib.Workload(tc.path, m, seed=603) as wl:
        for b in (H - 1, H + 1):
            wl.write_direct(b * B, B)
    st0 = tc.status()
    assert st0["dirty"] == 2, st0["raw"]
    r0 = tclib.block_stat(nb)["reads"]
    ev = tc.event_nr()
    tc.message("flush")
    wait_until(lambda: tclib.block_stat(nb)["reads"] > r0, 10,
               "the flush's origin read of the hole")
    d = Bg(tclib.discard, tc.path, H * B, B)
    d.join(20, "the discard").result()
    tc.wait_event(ev, timeout=30)
    st = tc.wait_idle(timeout=30, want_clean=False)
    print(st["raw"], f"discard took {d.seconds():.2f}s")
    assert st["dirty"] == 0 and st["error"] == 0, st["raw"]
    assert st["bridged_blocks"] - st0["bridged_blocks"] == 1, \
        f"the hole was not bridged: {st0['raw']} -> {st['raw']}"
    on_origin = tclib.read_direct(nb, H * B, B)
    if on_origin == pre:
        pytest.fail(f"block {H} was discarded while a flush bridged it, and the origin "
                    f"holds its pre-discard data again: the bridge filler read before "
                    f"the discard was written after it (discard took "
                    f"{d.seconds():.2f}s): {st['raw']}", pytrace=False)
    assert on_origin == bytes(B), tclib.hexdump16(on_origin)
    tclib.compare(on_origin, tclib.read_direct(tc.path, H * B, B), H * B,
                  "device read of the discarded block")
    m.data[H * B:(H + 1) * B] = bytes(B)
    m.verify_device(nb, start=(H - 1) * B, end=(H + 2) * B, what="origin after the flush")


# ---------------------------------------------------------------- item 9

def test_background_writeback_resumes_after_error(stack):
    """high_watermark 30, low 10.  The origin fails writes while dirty
    blocks pass the high watermark: background writeback fails and pauses.
    Once the origin is healed, background writeback must resume on its
    own and bring dirty down to the low watermark, without a flush
    message."""
    ram = stack.ram(32 * MiB)
    m = tclib.seeded_origin(ram, seed=901)
    healthy = stack.flakey_table(ram)
    broken = stack.flakey_table(ram, up=0, down=3600, features=["error_writes"])
    flk = stack.dm("tcb-origin9", healthy)
    tc = stack.tiercache(flk.path, stack.ram(4 * MiB), 8, "writeback",
                         keys={"high_watermark": 30, "low_watermark": 10})
    total = tc.status()["total"]
    n = total * 40 // 100
    swap(flk, broken)
    healed = False
    try:
        with tclib.Workload(tc.path, m, seed=902) as wl:
            base = 2048
            for b in range(base, base + n, 64):
                wl.write_direct(b * B, min(64, base + n - b) * B)
        st = wait_until(lambda: (lambda st: st["error"] != 0 and
                                 st["flush_state"] == "idle" and st)(tc.status()),
                        20, "background writeback to fail on the broken origin")
        print("origin failing:", st["raw"])
        assert st["error"] == -errno.EIO and st["dirty"] >= n, st["raw"]
        swap(flk, healthy)
        healed = True
        low = total * 10 // 100
        t0 = time.monotonic()
        try:
            st = wait_until(lambda: (lambda st: st["dirty"] <= low and st)(tc.status()),
                            30, "dirty to reach the low watermark", step=0.2)
        except AssertionError:
            st = tc.status()
            pytest.fail(f"origin healed 30 s ago, {n} of {total} blocks were dirty, "
                        f"high_watermark 30: background writeback never resumed, "
                        f"dirty {st['dirty']} (low watermark {low}), state "
                        f"{st['flush_state']}: {st['raw']}", pytrace=False)
        print(f"resumed: dirty {st['dirty']} after {time.monotonic() - t0:.1f}s: {st['raw']}")
    finally:
        if not healed:
            swap(flk, healthy)
    m.verify_device(tc.path, start=base * B, end=(base + n) * B)
    tc.flush()
    tc.remove()
    m.verify_device(flk.path, start=base * B, end=(base + n) * B, what="origin")


# ---------------------------------------------------------------- item 10

def test_unreadable_bridged_hole_writes_the_runs(stack):
    """Dirty runs H-3..H-1 and H+1..H+3 around a hole H whose origin
    sectors fail (dm-linear with an `error` segment), bridge_gap_kb 64: the
    flush must give up the bridge, not the runs: dirty 0 afterwards and
    the runs on the origin."""
    ram = stack.ram(32 * MiB)
    m = tclib.seeded_origin(ram, seed=1001)
    H = 3000
    org = stack.dm("tcb-origin10", linear_with_error(ram, H * S, S))
    tc = stack.tiercache(org.path, stack.ram(8 * MiB), 8, "writeback",
                         keys={"bridge_gap_kb": 64})
    runs = [H - 3, H - 2, H - 1, H + 1, H + 2, H + 3]
    with tclib.Workload(tc.path, m, seed=1002) as wl:
        for b in runs:
            wl.write_direct(b * B, B)
    assert tc.status()["dirty"] == 6, tc.status()["raw"]
    ev = tc.event_nr()
    tc.message("flush")
    tc.wait_event(ev, timeout=30)
    st = tc.wait_idle(timeout=30, want_clean=False)
    print(st["raw"])
    ok = [b for b in runs
          if tclib.read_direct(ram, b * B, B) == bytes(m.data[b * B:(b + 1) * B])]
    assert st["dirty"] == 0, (
        f"one unreadable origin block inside a bridged hole kept the dirty runs "
        f"around it from being written: dirty {st['dirty']}, error {st['error']}, "
        f"{len(ok)} of 6 run blocks on the origin: {st['raw']}")
    assert len(ok) == 6, f"runs on the origin: {ok} of {runs}"
    m.verify_device(tc.path, start=(H - 3) * B, end=H * B)
    m.verify_device(tc.path, start=(H + 1) * B, end=(H + 4) * B)


# ---------------------------------------------------------------- item 11

def test_full_flush_ends_under_rewrites(stack):
    """256 dirty blocks; a full flush while 16 threads keep rewriting random
    blocks among them (O_DIRECT, each thread its own blocks; every cache
    request takes 100 ms, so a rewrite holds its block that long).  The
    flush must end (dm event, flushes +1) within 30 s while the writers go
    on, every block dirty when it began is on the origin in that version or
    a newer one, and it must not chase the rewrites: it writes each block
    about once (at most 1.25 x 256 blocks), not pass after pass over
    blocks dirtied after it began.

    The review said such a flush never ends; here the old module's flush
    did end (after 0.4-24 s), because a pass that happens to meet no block
    being rewritten ends it; what it does is chase the rewrites (687 blocks
    in 425 requests for 256 dirty, against 256 in 30)."""
    nw = 16
    ram = stack.ram(32 * MiB)
    m = tclib.seeded_origin(ram, seed=1101)
    # the cache: null_blk completing every request 100 ms after it came
    # (a timer per request: unlike dm-delay, which releases its held bios
    # in batches, the rewriters do not fall into step, so some block is
    # always being rewritten)
    cdev = stack.nullb(16, discard=False, irqmode=2, completion_nsec=100_000_000)
    tc = stack.tiercache(ram, cdev, 8, "writeback")
    base, N = 2048, 256
    first = rnd(1102, N * B)
    tclib.write_direct(tc.path, base * B, first)
    versions = {base + i: [first[i * B:(i + 1) * B]] for i in range(N)}
    st0 = tc.status()
    assert st0["dirty"] == N, st0["raw"]
    stop = threading.Event()
    counts = [0] * nw
    lock = threading.Lock()

    def writer(k):
        rng = random.Random(1110 + k)
        buf = tclib.aligned_buf(B)
        fd = os.open(tc.path, os.O_WRONLY | os.O_DIRECT)
        try:
            while not stop.is_set():
                b = base + rng.randrange(N // nw) * nw + k
                data = rng.randbytes(B)
                buf[:B] = data
                with lock:
                    versions[b].append(data)
                assert os.pwrite(fd, memoryview(buf)[:B], b * B) == B
                counts[k] += 1
        finally:
            os.close(fd)
            buf.close()

    ws = [Bg(writer, k) for k in range(nw)]
    try:
        wait_until(lambda: sum(counts) >= 8, 10, "the writers to get going")
        ev = tc.event_nr()
        n0 = sum(counts)
        wb0 = tc.status()["wb_blocks"]
        t0 = time.monotonic()
        tc.message("flush")
        ended = None
        samples = []
        while time.monotonic() - t0 < 30:
            st = tc.status()
            samples.append((round(time.monotonic() - t0, 1), st["dirty"], st["wb_blocks"],
                            st["wb_requests"], st["flush_state"], sum(counts)))
            if tc.event_nr() > ev and st["flushes"] >= st0["flushes"] + 1 and \
                    st["flush_state"] != "flushing":
                ended = time.monotonic() - t0
                break
            time.sleep(0.2)
        during = sum(counts) - n0
        alive = all(w.alive() for w in ws)
    finally:
        stop.set()
        for w in ws:
            w.join(20, "a rewriting thread")
    for w in ws:
        w.result()
    print(st["raw"], f"flush ended after {ended}s, {during} rewrites during it")
    print("t, dirty, wb_blocks, wb_requests, state, rewrites:", samples)
    tclib.kmsg(f"item 11 ({nw} writers): flush ended after {ended}s, {during} rewrites; "
               f"samples {samples[:12]} ... {samples[-3:]}")
    assert ended is not None, (
        f"a full flush did not end within 30 s while {nw} threads rewrote its "
        f"blocks ({during} rewrites meanwhile): {st['raw']}")
    assert alive and during >= 4, f"the writers stalled during the flush ({during} writes)"
    chased = st["wb_blocks"] - wb0
    assert chased <= N * 5 // 4, (
        f"the flush wrote {chased} blocks for {N} dirty when it began ({during} "
        f"rewrites meanwhile): it chased blocks dirtied after it began: {st['raw']}")
    bad = []
    for b, vs in sorted(versions.items()):
        got = tclib.read_direct(ram, b * B, B)
        if got not in vs:
            bad.append(b)
    assert not bad, (f"{len(bad)} of {N} blocks dirty when the flush began are not on "
                     f"the origin in any version written (first {bad[:8]})")
    for b, vs in versions.items():
        m.data[b * B:(b + 1) * B] = vs[-1]
    m.verify_device(tc.path, start=base * B, end=(base + N) * B)


# ---------------------------------------------------------------- item 12

def test_full_flush_writes_block_rewritten_while_busy(stack):
    """A full flush owes the origin every block dirty when it began.  Blocks
    W and X are dirty (X in version 0); the flush begins and writes W first
    (one request at a time, the cache device's reads take 1 s); meanwhile X
    is rewritten (version 1, held 3 s in the cache device's write delay),
    so the flush finds X locked.  When the flush ends, the origin must hold
    version 0 or 1 of X, not the data from before X was written.

    Found by CI (test_full_flush_ends_under_rewrites, 2 of 256 blocks): the
    rewrite gave X a sequence younger than the flush, and the flush took
    that for "dirtied after I began" and left X for later.  Here the race
    is held open on purpose."""
    ram = stack.ram(32 * MiB)
    m = tclib.seeded_origin(ram, seed=1201)
    cdev, arm = delayed(stack, 8 * MiB, read_ms=1000, write_ms=3000)
    tc = stack.tiercache(ram, cdev.path, 8, "writeback", keys={"flush_depth": 1})
    W, X = 100, 1000
    v0, v1, w0 = rnd(1202), rnd(1203), rnd(1204)
    before = bytes(m.data[X * B:(X + 1) * B])
    tclib.write_direct(tc.path, X * B, v0)
    tclib.write_direct(tc.path, W * B, w0)
    assert tc.status()["dirty"] == 2
    arm()
    st0 = tc.status()
    tc.message("flush")
    time.sleep(0.3)          # the flush is reading W from the cache (1 s)
    w = Bg(tclib.write_direct, tc.path, X * B, v1)
    st = wait_until(lambda: (lambda s: s if s["flushes"] > st0["flushes"] and
                             s["flush_state"] == "idle" else None)(tc.status()),
                    30, "the full flush to end")
    w.join(20, "the rewrite of X").result()
    got = tclib.read_direct(ram, X * B, B)
    print(st["raw"], f"rewrite took {w.seconds():.2f}s")
    assert w.seconds() > 2, "the rewrite of X was not held by the cache's delay"
    assert tclib.read_direct(ram, W * B, B) == w0
    if got == before:
        pytest.fail(f"the full flush ended ({st['raw']}) with block {X}, dirty "
                    f"when it began, never written: the origin holds its data "
                    f"from before the test", pytrace=False)
    assert got in (v0, v1), f"block {X} on the origin is neither version"
    tc.flush()
    tclib.compare(v1, tclib.read_direct(ram, X * B, B), X * B, "after a second flush")


def test_writer_not_starved_by_readers(stack):
    """48 O_DIRECT reads in flight on one cached block all the time (fio,
    6 jobs, iodepth 8; cache read delay 50 ms so each read holds the block
    a while); a writer writes that block 50 times: each write completes
    within 1 s, and the block then reads as the last write."""
    ram = stack.ram(32 * MiB)
    m = tclib.seeded_origin(ram, seed=1201)
    cdev, arm = delayed(stack, 8 * MiB, read_ms=50)
    tc = stack.tiercache(ram, cdev.path, 8, "writeback")
    arm()
    X = 3000
    tclib.write_direct(tc.path, X * B, rnd(1202))
    cmd = ["fio", "--eta=never", "--name=hot", f"--filename={tc.path}",
           "--ioengine=libaio", "--direct=1", "--rw=read", "--bs=4k",
           f"--offset={X * B}", "--size=4k", "--iodepth=8", "--numjobs=6",
           "--time_based", "--runtime=120"]
    fio = start_fio(cmd)
    lat, cur = [], [None]
    w = None
    try:
        h0 = tc.status()["read_hits"]
        wait_until(lambda: tc.status()["read_hits"] >= h0 + 100, fio_start_s(30),
                   "fio's reads to flow")

        def writes():
            buf = tclib.aligned_buf(B)
            fd = os.open(tc.path, os.O_WRONLY | os.O_DIRECT)
            try:
                for i in range(50):
                    buf[:B] = rnd(1300 + i)
                    cur[0] = time.monotonic()
                    assert os.pwrite(fd, memoryview(buf)[:B], X * B) == B
                    lat.append(time.monotonic() - cur[0])
                    cur[0] = None
            finally:
                os.close(fd)
                buf.close()

        w = Bg(writes)
        starved = None
        deadline = time.monotonic() + 90
        while w.alive() and time.monotonic() < deadline:
            t = cur[0]
            if t is not None and time.monotonic() - t > 10:
                starved = len(lat)
                break
            time.sleep(0.1)
        hits_during = tc.status()["read_hits"] - h0
    finally:
        stop_fio(fio)
    assert w is not None
    w.join(30, "the writer (readers stopped)").result()
    print(f"write latencies: max {max(lat):.3f}s, mean {sum(lat) / len(lat):.3f}s, "
          f"read hits meanwhile {hits_during}")
    assert starved is None, (
        f"write {starved + 1} of 50 to a block under 48 concurrent O_DIRECT reads "
        f"had not completed after 10 s (it completed only once the readers "
        f"stopped, after {lat[starved]:.1f}s); latencies so far "
        f"{[round(x, 2) for x in lat[:starved]]}")
    slow = [(i, round(x, 2)) for i, x in enumerate(lat) if x > 1.0]
    assert not slow, f"writes slower than 1 s under readers (write, seconds): {slow}"
    last = rnd(1300 + 49)
    tclib.compare(last, tclib.read_direct(tc.path, X * B, B), X * B,
                  "block after 50 writes")
    m.data[X * B:(X + 1) * B] = last


# ---------------------------------------------------------------- item 8 (last)

def test_writeback_read_failure_of_last_request(stack):
    """Two writeback requests: the first is written to the origin, the
    last one's slot read fails (1 s later: the slot is mapped to dm-delay
    over `error`).  The flush must end with the error in the status, the
    first block clean and on the origin, and suspend and remove must work.

    On a module that hangs here nothing can unstick the device: the test
    then leaks its devices (names kept out of the per-test cleanup) so that
    the tests after it still run."""
    tag = f"tcb8-{os.getpid()}"
    nbo = named_nullb(stack, f"{tag}o", 32, step=0.02)
    nbc = named_nullb(stack, f"{tag}c", 8, step=0.02)
    n = tclib.size_sectors(nbc)
    healthy = f"0 {n} linear {nbc} 0"
    cdev = stack.dm(f"{tag}-cache", healthy)
    tc = stack.tiercache(nbo, cdev.path, 8, "writeback", name=f"{tag}-tc")
    X1, X2 = 2000, 6000
    a1, a2 = rnd(801), rnd(802)
    tclib.write_direct(tc.path, X1 * B, a1)
    tclib.write_direct(tc.path, X2 * B, a2)
    assert tc.status()["dirty"] == 2, tc.status()["raw"]
    slot = find_in_device(cdev.path, a2) // 512
    err = stack.dm(f"{tag}-err", f"0 {S} error")
    slow_err = stack.dm(f"{tag}-slowerr", f"0 {S} delay {err.path} 0 1000 {err.path} 0 0")
    rows = [f"0 {slot} linear {nbc} 0", f"{slot} {S} linear {slow_err.path} 0",
            f"{slot + S} {n - slot - S} linear {nbc} {slot + S}"]
    swap(cdev, "\n".join(rows))

    def stuck(what):
        names = [f"{tag}-tc", f"{tag}-cache", f"{tag}-err", f"{tag}-slowerr"]
        tclib.KEEP.update(names)
        left[0] = True
        stack.es.pop_all()            # nothing of this can be torn down now
        pytest.fail(f"{what}; status: {tc.status_line()} (devices {names} "
                    f"left behind: suspend or remove would hang)", pytrace=False)

    left = [False]
    try:
        ev = tc.event_nr()
        tc.message("flush")
        try:
            tc.wait_event(ev, timeout=20)
        except AssertionError:
            stuck("a flush whose first request was written and whose last request "
                  "failed at its slot read did not end within 20 s (the written "
                  "request never gets its origin flush)")
        st = tc.wait_idle(timeout=10, want_clean=False)
        print(st["raw"])
        assert st["error"] == -errno.EIO, st["raw"]
        assert st["dirty"] == 1, f"the written block should be clean, the failed one dirty: {st['raw']}"
        tclib.compare(a1, tclib.read_direct(nbo, X1 * B, B), X1 * B, "origin: first request")
        try:
            tclib.run(["dmsetup", "suspend", tc.name], timeout=30)
        except subprocess.TimeoutExpired:
            stuck("dmsetup suspend did not return within 30 s after the failed flush")
        tc.resume()
    finally:
        if not left[0]:
            swap(cdev, healthy)
    st = tc.flush(timeout=30)
    assert st["dirty"] == 0, st["raw"]
    try:
        tclib.run(["dmsetup", "remove", tc.name], timeout=30)
        tc.removed = True
    except subprocess.TimeoutExpired:
        stuck("dmsetup remove did not return within 30 s")
    tclib.compare(a2, tclib.read_direct(nbo, X2 * B, B), X2 * B, "origin: retried block")
