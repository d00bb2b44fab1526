# SPDX-License-Identifier: GPL-2.0
"""Regression tests for defects found in review (review D).

  1  a full flush ends while several writers rewrite the SAME dirty block
     with overlapping writes (the lock is handed from one parked writer to
     the next, so writeback's try-lock never finds the block free, and the
     block is owed to the flush)
  2  a clean cached block whose slot cannot be read, sitting in a bridged
     hole, does not keep the dirty runs around it from being written back
  3  a full flush asked for while the device is suspended ends (EROFS,
     with a dm event) when a read-only table is resumed; `cleaner on` is
     refused by a read-only table
  4  a FUA write that goes around the cache after its clean slot is
     dropped (the slot still waits in the dirty order, the disk still
     records it dirty) is acknowledged only after a commit: a crash does
     not bring the old dirty copy back over it

Races are made deterministic by slow devices: the cache is a null_blk
completing every request 20 ms after it came (a timer per request), so
eight writes of one block overlap all the time; a cache slot is made
unreadable by swapping the cache device's dm-linear table for one with an
`error` segment over it.  Every wait has a deadline: a flush that never
ends fails the test, it never blocks the suite.
"""

import errno
import time

import pytest

import tclib
from faults import (BgCmd, committed_dirty, dirty_tiercache, fio_start_s, find_in_device,
                    fsync_path, linear_with_error, load_table, rnd, start_fio, stop_fio,
                    swap, wait_until)
from tclib import MiB

pytestmark = [pytest.mark.module, pytest.mark.usefixtures("tc_module")]

B = 4096
S = B // 512          # sectors per 4 KiB block


# ---------------------------------------------------------------- helpers

def inflight_writes(path):
    """Writes in flight on a block device (/sys/.../inflight)."""
    with open(f"/sys/dev/block/{tclib.devno(path)}/inflight") as f:
        return int(f.read().split()[1])


def flush_ended(tc, st0, ev):
    """The status if the full flush sent after st0 / event ev has ended."""
    st = tc.status()
    if st["flushes"] > st0["flushes"] and st["flush_state"] != "flushing" and \
            tc.event_nr() > ev:
        return st
    return None


# ---------------------------------------------------------------- 1

def test_full_flush_ends_under_same_block_writers(stack):
    """256 dirty blocks; fio rewrites one of them (X) with 8 overlapping
    O_DIRECT writes all the time (every cache request takes 20 ms, so one
    write holds X and the others are parked on it, and the lock goes from
    one to the next); a full flush sent a second later must end (dm event,
    flushes +1, state not flushing) within 20 s while fio still writes,
    with the other 255 blocks on the origin byte for byte as they were when
    it began, and X on the origin in the version it had then (every write
    of fio writes the same pattern).

    The old module's flush stays "flushing" as long as the writers run:
    writeback only try-locks X, which is never free, and X is owed (the
    first rewrite after the flush began flagged it), so every pass comes
    back for it."""
    ram = stack.ram(32 * MiB)
    m = tclib.seeded_origin(ram, seed=9301)
    cdev = stack.nullb(16, discard=False, irqmode=2, completion_nsec=20_000_000)
    tc = stack.tiercache(ram, cdev, 8, "writeback")
    base, N = 2048, 256
    X = base + 100
    first = rnd(9302, N * B)
    tclib.write_direct(tc.path, base * B, first)
    m.data[base * B:(base + N) * B] = first
    st0 = tc.status()
    assert st0["dirty"] == N, st0["raw"]
    cmd = ["fio", "--eta=never", "--name=same-block", f"--filename={tc.path}",
           "--ioengine=libaio", "--direct=1", "--rw=write", "--bs=4k",
           f"--offset={X * B}", "--size=4k", "--iodepth=8",
           "--buffer_pattern=0x5a6b7c8d", "--scramble_buffers=0",
           "--time_based", "--runtime=60"]
    fio = start_fio(cmd)
    ended = after_stop = xdata = None
    overlap = 0
    try:
        wh0 = st0["write_hits"]
        wait_until(lambda: tc.status()["write_hits"] >= wh0 + 16, fio_start_s(45),
                   "fio's rewrites of block X to flow", step=0.05)
        overlap = wait_until(lambda: inflight_writes(tc.path) >= 2 and
                             inflight_writes(tc.path), 10,
                             "two writes of block X in flight at once", step=0.01)
        time.sleep(1)
        # the version of X when the flush begins: every fio write is the same
        xdata = tclib.read_direct(tc.path, X * B, B)
        assert xdata != first[100 * B:101 * B], "fio did not rewrite block X"
        assert fio.poll() is None, "fio ended early"
        st1 = tc.status()
        ev = tc.event_nr()
        t0 = time.monotonic()
        tc.message("flush")
        samples = []
        while time.monotonic() - t0 < 20:
            overlap = max(overlap, inflight_writes(tc.path))
            st = flush_ended(tc, st1, ev)
            if st:
                ended = time.monotonic() - t0
                break
            st = tc.status()
            samples.append((round(time.monotonic() - t0, 1), st["dirty"],
                            st["wb_blocks"], st["flush_state"], st["write_hits"]))
            time.sleep(0.2)
        running = fio.poll() is None
        wh_end = tc.status()["write_hits"]
        time.sleep(0.5)
        wh_after = tc.status()["write_hits"]
    finally:
        out = stop_fio(fio)
    stopped = time.monotonic()
    if ended is None:
        # how long the flush goes on once the writers are gone (diagnosis)
        try:
            wait_until(lambda: flush_ended(tc, st1, ev), 15,
                       "the flush to end after fio stopped", step=0.1)
            after_stop = f"it ended {time.monotonic() - stopped:.1f}s after fio stopped"
        except AssertionError:
            after_stop = "it had not ended 15 s after fio stopped either"
    print(f"flush ended after {ended and round(ended, 2)} s; fio: {out[-600:]}")
    print("t, dirty, wb_blocks, state, write_hits:", samples)
    tclib.kmsg(f"review d 1: flush ended after {ended}s ({after_stop}); "
               f"samples {samples[:5]} ... {samples[-3:]}")
    if ended is None:
        pytest.fail(f"a full flush did not end within 20 s while fio rewrote block {X} "
                    f"with up to {overlap} overlapping writes ({wh_end - st1['write_hits']} "
                    f"writes meanwhile; fio running: {running}): state "
                    f"{samples[-1][3]!r}, dirty {samples[-1][1]} (of {N} when it began); "
                    f"{after_stop}: {tc.status()['raw']}", pytrace=False)
    assert running and wh_after > wh_end, \
        (f"the flush ended after {ended:.1f}s, but fio was not writing any more "
         f"(running {running}, write_hits {wh_end} -> {wh_after} in 0.5 s): no race")
    assert overlap >= 2, f"at most {overlap} writes of block X were in flight at once"
    st = tc.status()
    assert st["error"] == 0, st["raw"]
    bad = [b for b in range(base, base + N) if b != X and
           tclib.read_direct(ram, b * B, B) != first[(b - base) * B:(b - base + 1) * B]]
    assert not bad, (f"the flush ended ({ended:.1f}s) but {len(bad)} of {N - 1} blocks "
                     f"dirty when it began are not on the origin (first {bad[:8]})")
    tclib.compare(xdata, tclib.read_direct(ram, X * B, B), X * B,
                  f"origin: block X ({X}) after the flush (version when it began)")
    m.data[X * B:(X + 1) * B] = xdata
    tc.flush(timeout=30)
    m.verify_device(ram, start=base * B, end=(base + N) * B, what="origin after fio")
    m.verify_device(tc.path, start=base * B, end=(base + N) * B)


# ---------------------------------------------------------------- 2

def test_unreadable_clean_cached_hole_does_not_block_writeback(stack):
    """bridge_gap_kb 64.  Block H is read (O_DIRECT, so promoted: a clean
    cached copy), H-3..H-1 and H+1..H+3 are written (dirty), then H's slot
    is made unreadable (the cache device's table gets an `error` segment
    over it).  A full flush must write the six dirty blocks to the (healthy)
    origin: dirty 0 at its end, the six on the origin byte for byte, and H
    on the origin still its own data.

    The old module reads the hole from its slot, and the slot's read error
    goes to the request's status, not the hole's: the request is released
    unwritten, the flush ends with error -5 and dirty 6, and so does every
    retry."""
    ram = stack.ram(32 * MiB)
    m = tclib.seeded_origin(ram, seed=9321)
    cram = stack.ram(8 * MiB)
    healthy = f"0 {tclib.size_sectors(cram)} linear {cram} 0"
    cdev = stack.dm("tcd-cache2", healthy)
    tc = stack.tiercache(ram, cdev.path, 8, "writeback", keys={"bridge_gap_kb": 64})
    H = 3000
    hdata = bytes(m.data[H * B:(H + 1) * B])
    tclib.compare(hdata, tclib.read_direct(tc.path, H * B, B), H * B, "promoting read")
    st0 = tc.status()
    tclib.compare(hdata, tclib.read_direct(tc.path, H * B, B), H * B, "second read")
    st1 = tc.status()
    assert st1["read_hits"] == st0["read_hits"] + 1, \
        f"block {H} not cached after a whole-block read: {st0['raw']} -> {st1['raw']}"
    runs = [H - 3, H - 2, H - 1, H + 1, H + 2, H + 3]
    with tclib.Workload(tc.path, m, seed=9322) as wl:
        for b in runs:
            wl.write_direct(b * B, B)
    st1 = tc.status()
    assert st1["dirty"] == 6, st1["raw"]
    slot_off = find_in_device(cdev.path, hdata)
    swap(cdev, linear_with_error(cram, slot_off // 512, S))
    results = []
    try:
        for _ in range(2):          # a second flush shows a retry does no better
            ev = tc.event_nr()
            tc.message("flush")
            tc.wait_event(ev, timeout=30)
            st = tc.wait_idle(timeout=30, want_clean=False)
            results.append(st)
            print(st["raw"])
            if st["dirty"] == 0:
                break
    finally:
        swap(cdev, healthy)
    st = results[0]
    ok = [b for b in runs
          if tclib.read_direct(ram, b * B, B) == bytes(m.data[b * B:(b + 1) * B])]
    if st["dirty"]:
        pytest.fail(f"a clean cached block ({H}, slot at cache byte {slot_off}, unreadable) "
                    f"in a bridged hole kept the dirty runs around it from being written "
                    f"to the healthy origin: the flush ended with dirty {st['dirty']}, "
                    f"error {st['error']}; a second flush: dirty {results[-1]['dirty']}, "
                    f"error {results[-1]['error']}; {len(ok)} of 6 run blocks on the "
                    f"origin: {st1['raw']} -> {results[-1]['raw']}", pytrace=False)
    assert len(ok) == 6, f"runs on the origin: {ok} of {runs}: {st['raw']}"
    m.verify_device(ram, start=(H - 3) * B, end=(H + 4) * B, what="origin after the flush")
    tclib.compare(hdata, tclib.read_direct(tc.path, H * B, B), H * B,
                  "device read of the hole after the flush")
    m.verify_device(tc.path, start=(H - 8) * B, end=(H + 8) * B)


# ---------------------------------------------------------------- 3

def test_readonly_resume_ends_pending_flush(stack):
    """A device with dirty blocks is suspended; a `flush` message is sent
    (accepted: the engine is stopped, so the flush is only requested) and
    a read-only table is loaded and resumed.  A read-only table writes
    nothing back, so the flush must end at once: within 10 s the state is
    not "flushing", the latched error (status field `error`) is -30
    (EROFS), and a dm event was raised (`dmsetup wait` returns).

    The old module leaves the request pending for ever: "flushing", and no
    event.  (A suspend, load and resume raises no dm event by itself: the
    event counter stays put across the read-only reload of
    test_readonly_cleaner_refused, which prints it.)  Afterwards the
    writable table is loaded again and a flush cleans the device."""
    base, n = 2048, 8
    ram, m, tc, table = dirty_tiercache(stack, base, n, seed=9331, write_seed=9332)
    st0 = tc.status()
    assert st0["dirty"] == n and st0["flush_state"] == "idle", st0["raw"]
    tc.suspend(timeout=30)
    readonly = False
    try:
        p = tc.message("flush", check=False)
        assert p.returncode == 0, \
            f"a flush message to the suspended device was refused: {p.stderr.strip()}"
        st_s = tc.status()
        ev = tc.event_nr()
        print("suspended, flush requested:", st_s["raw"], "event_nr", ev)
        tclib.run(["dmsetup", "load", "--readonly", tc.name, "--table", table],
                  timeout=60)
        tc.resume()
        readonly = True
        t0 = time.monotonic()
        assert tclib.run(["blockdev", "--getro", tc.path],
                         quiet=True).stdout.strip() == "1", "the table is not read-only"
        while True:
            st = tc.status()
            if st["flush_state"] != "flushing" or time.monotonic() - t0 > 10:
                break
            time.sleep(0.1)
        if st["flush_state"] == "flushing":
            pytest.fail(f"a full flush requested while suspended is still pending "
                        f"{time.monotonic() - t0:.1f}s after a read-only table was "
                        f"resumed (its engine never runs): state "
                        f"{st['flush_state']!r}, error {st['error']}, event_nr "
                        f"{ev} -> {tc.event_nr()} (no dm event: `dmsetup wait` would "
                        f"not return): {st['raw']}", pytrace=False)
        print("read-only table resumed:", st["raw"])
        assert st["error"] == -errno.EROFS, \
            f"the flush ended on a read-only table with error {st['error']}, not " \
            f"-{errno.EROFS} (EROFS): {st['raw']}"
        tc.wait_event(ev, timeout=5)
        assert st["dirty"] == n, f"a read-only table changed dirty: {st['raw']}"
    finally:
        if readonly:
            load_table(tc, table, readonly=False)
        else:
            tc.resume()
    st = tc.flush(timeout=30)
    m.verify_device(ram, start=base * B, end=(base + n) * B, what="origin after the flush")


def test_readonly_cleaner_refused(stack):
    """`cleaner on` on a read-only table (reloaded with `dmsetup load -r`,
    dirty blocks in the cache) must be refused: nothing can be written
    back, so it could only leave the state "cleaning" for ever.  (`flush`
    is refused there with EROFS already: checked as a precondition.)"""
    base, n = 2048, 8
    ram, m, tc, table = dirty_tiercache(stack, base, n, seed=9341, write_seed=9342)
    ev0 = tc.event_nr()
    load_table(tc, table, readonly=True)
    ev1 = tc.event_nr()
    print(f"event_nr across the read-only reload: {ev0} -> {ev1}")
    accepted = False
    try:
        st0 = tc.status()
        assert st0["dirty"] == n, st0["raw"]
        p = tc.message("flush", check=False)
        assert p.returncode != 0 and "Read-only" in p.stderr, \
            f"precondition: flush on the read-only table: rc {p.returncode} {p.stderr}"
        p = tc.message("cleaner", "on", check=False)
        accepted = p.returncode == 0
        if accepted:
            time.sleep(1)
            st = tc.status()
            pytest.fail(f"`cleaner on` was accepted by a read-only table with {n} dirty "
                        f"blocks (nothing can be written back): a second later state "
                        f"{st['flush_state']!r}, cleaner {st['cleaner']}, dirty "
                        f"{st['dirty']}: {st['raw']}", pytrace=False)
        st = tc.status()
        print("cleaner on refused:", p.stderr.strip(), st["raw"])
        assert st["cleaner"] == 0 and st["flush_state"] == "idle", st["raw"]
    finally:
        if accepted:
            tc.message("cleaner", "off")
        load_table(tc, table, readonly=False)
    tc.flush(timeout=30)
    m.verify_device(ram, start=base * B, end=(base + n) * B, what="origin after the flush")


# ---------------------------------------------------------------- 4

FUA_PATTERN = "a5c3e1f7"


def fua_write_cmd(path, off):
    """fio writing one 4 KiB block of FUA_PATTERN at @off as one REQ_FUA
    write: O_DIRECT | O_DSYNC through libaio.  (A synchronous O_DSYNC write
    of a block device is followed by a cache flush, which commits the
    metadata whatever the write path did; an asynchronous one is not.)"""
    return ["fio", "--name=fua", f"--filename={path}", "--rw=write", "--bs=4096",
            "--size=4096", f"--offset={off}", "--ioengine=libaio", "--iodepth=1",
            "--direct=1", "--sync=dsync", f"--buffer_pattern=0x{FUA_PATTERN}",
            "--output-format=terse"]


def read_image(path, size):
    return b"".join(tclib.read_direct(path, off, min(MiB, size - off))
                    for off in range(0, size, MiB))


def data_start(cache_sectors, block=S):
    """First sector of the data area (tc_disk_layout())."""
    return tclib.tc_data_start(cache_sectors, block)


def test_fua_write_around_after_dropping_a_queued_slot_survives_crash(stack):
    """Block X is dirty and committed.  A full flush writes X back; its
    slot is clean in memory but still waits in the dirty order (the pass
    goes on with blocks Y, whose origin writes are held by dm-delay), and the commit
    that records X clean cannot finish (the metadata area of the cache
    device is a dm-linear of its own, suspended).  Then the cache's data
    area fails (its own dm-linear swapped for `error`) and an O_DIRECT |
    O_DSYNC (REQ_FUA) write of X arrives: it hits the clean slot, its
    cache write fails, the slot is dropped and the write goes to the
    origin.  The disk still records X dirty, so the write may be
    acknowledged only once a commit has recorded the drop: a crash right
    after the acknowledgement (both devices imaged as they are) must read
    the new data of X, never the old dirty copy.

    The module of 8918d4c counted a dropped slot as stale only when the
    slot was freed, after the dirty order let go of it: the write was
    acknowledged at once, and the crashed cache wrote the old data back."""
    osz, csz = 64 * MiB, 16 * MiB
    o_raw, c_raw = stack.ram(osz), stack.ram(csz)
    on, cn = osz // 512, csz // 512
    mid = on // 2
    ds = data_start(cn)
    orig = stack.dm("tce4-orig", f"0 {mid} linear {o_raw} 0\n"
                    f"{mid} {on - mid} delay {o_raw} {mid} 0 {o_raw} {mid} 120000 "
                    f"{o_raw} {mid} 0")
    cmeta = stack.dm("tce4-cmeta", f"0 {ds} linear {c_raw} 0")
    data_table = f"0 {cn - ds} linear {c_raw} {ds}"
    cdata = stack.dm("tce4-cdata", data_table)
    cdev = stack.dm("tce4-cache", f"0 {ds} linear {cmeta.path} 0\n"
                    f"{ds} {cn - ds} linear {cdata.path} 0")
    keys = [("high_watermark", 100), ("low_watermark", 0), ("commit_ms", 600000),
            ("flush_depth", 1), ("bridge_gap_kb", 0)]
    tc = stack.tiercache(orig.path, cdev.path, S, "writeback", keys, name="tce4")
    x, ys = 100, list(range(mid // S + 100, mid // S + 116))
    a, b = rnd("e4-a"), bytes.fromhex(FUA_PATTERN) * (B // 4)
    ydata = {y: rnd(f"e4-y{y}") for y in ys}
    tclib.write_direct(tc.path, x * B, a)
    for y, d in ydata.items():
        tclib.write_direct(tc.path, y * B, d)
    fsync_path(tc.path)
    assert x in committed_dirty(cdev.path), "precondition: X is not committed dirty"

    cmeta.suspend(timeout=30)
    meta_held, notes, w = True, [], None
    try:
        tc.message("flush")
        wait_until(lambda: tc.status()["dirty"] == len(ys), 30,
                   "the flush writing X back (dirty down to the Y blocks)")
        st = tc.status()
        assert st["flush_state"] == "flushing", f"precondition: the pass ended: {st['raw']}"
        swap(cdata, f"0 {cn - ds} error")
        w = BgCmd(fua_write_cmd(tc.path, x * B), "REQ_FUA write of X")
        # fio takes seconds to start under emulation
        rc = w.wait(20)
        if rc is None:
            notes.append("the FUA write waited for the metadata")
            cmeta.resume()
            meta_held = False
            rc = w.wait(30)
            assert rc is not None, "the FUA write did not end 30 s after the metadata resumed"
        acked = rc == 0
        st = tc.status()
        tclib.kmsg(f"test_93 e4: FUA write rc {rc}; {'; '.join(notes) or 'nothing waited'}; "
                   f"status {st['raw']}")
        assert st["flush_state"] == "flushing" and st["dirty"] == len(ys), \
            f"the Y blocks were written back before the write ended: no test ({st['raw']})"

        # the crash point: both devices as they are now
        img_c, img_o = read_image(c_raw, csz), read_image(o_raw, osz)
    finally:
        if meta_held:
            cmeta.resume()
        if w is not None:
            w.kill()
        # a suspend of dm-delay sends what it holds: the Y writes end now
        orig.suspend(timeout=30)
        orig.resume()
    swap(cdata, data_table)
    assert acked, f"the write failed (rc {rc}: {w.err[-300:]}), yet the origin is healthy"
    tc.remove()
    swap(orig, f"0 {on} linear {o_raw} 0")
    tclib.fill_device(c_raw, img_c)
    tclib.fill_device(o_raw, img_o)
    tc2 = stack.tiercache(orig.path, cdev.path, S, "writeback", name="tce4-after",
                          fmt=False)
    got = tclib.read_direct(tc2.path, x * B, B)
    what = {a: "the old dirty copy", b: "the acknowledged FUA data"}.get(got, "neither")
    assert got == b, (f"after the crash X reads as {what} (status after load: "
                      f"{tc2.status()['raw']}); notes: {notes}")
    bad = [y for y, d in ydata.items() if tclib.read_direct(tc2.path, y * B, B) != d]
    assert not bad, f"{len(bad)} fsynced Y blocks read wrong after the crash"
