# SPDX-License-Identifier: GPL-2.0
"""The cache dies under the `ordered` policy: the origin alone stays a state
a power cut of the cached device could have left (issue 12: "the slow disk
stays mountable when the cache dies").

In the failed state writes go around the cache.  Under `ordered` a write
that reaches the origin while the cache still holds dirty versions would
land after flushes whose earlier writes are not there: block A written and
fsynced (epoch 0), then block C written: C on the origin without A is no
state of the cached device.  So under `ordered` a write around a failed
cache waits until writeback has put every dirty version on the origin, and
fails (EIO) if writeback cannot (a dead cache): the file system gets the
error, never a mixed origin.

dm-log-writes between tiercache and the origin records what the origin
took, in order; the replay checks every state (as test_98_epochs.py).

  1  the cache device dies whole (an `error` table): the write of C fails
     with EIO within its deadline, and the origin never holds C without A
  2  only writes to the cache device fail (dm-flakey error_writes; reads
     work): the write of C, which latches the failed state, waits for A's
     writeback and then succeeds; every origin state is legal and the
     origin ends with A and C
  3  the default policy, same steps as 2: C goes around at once (the
     availability the default policy promises), and the origin holds C
     without A for a while (the oracle has teeth)
  4  A in epoch 0, C in epoch 1, then the cache device's metadata area
     fails: the pass over epoch 1 waits for a commit that records epoch 0
     written back (the floor rule), and that commit fails.  Writeback must
     go on (a failed commit latches the failed state; the rule no longer
     applies) and the flush end, with A before C on the origin
"""

import errno

import pytest

import logwrites
import tcdisk
import tclib
from faults import Bg, fsync_path, linear_with_error, swap
from test_97_cache_failure import io_block as io_at
from tclib import MiB

pytestmark = [pytest.mark.module, pytest.mark.usefixtures("tc_module")]

B = 4096
A, C = 100, 3000
KEYS = {"high_watermark": 100, "low_watermark": 0, "commit_ms": 600000}


def pat(tag):
    return (tag.encode() * (B // len(tag) + 1))[:B]


def io_block(path, block, data=None):
    """One O_DIRECT read (data None) or write of block `block`
    (test_97's io_block, by block): the data read, b"" for a write, or
    the errno it failed with."""
    return io_at(path, block * B, data)


def build(stack, ordered, cache_features=None):
    """Origin: log-writes over a RAM disk.  Cache: dm-linear over a RAM disk
    (its table swapped later).  Returns (tc, log-writes dev, log, cache dm,
    cache RAM disk)."""
    tclib.run(["modprobe", "dm-log-writes"])
    tclib.run(["modprobe", "dm-flakey"])
    raw = stack.ram(32 * MiB)
    logdev = stack.ram(64 * MiB)
    n = tclib.size_sectors(raw)
    lw = stack.dm(stack._name("lw"), f"0 {n} log-writes {raw} {logdev}")
    cache_ram = stack.ram(8 * MiB)
    cl = stack.linear(cache_ram)
    keys = dict(KEYS, ordered=1) if ordered else dict(KEYS)
    tc = stack.tiercache(lw.path, cl.path, keys=keys)
    return tc, lw, logdev, cl, cache_ram


def epoch0(tc):
    """A written and fsynced: dirty in the cache, epoch 0 closed."""
    assert io_block(tc.path, A, pat("A1")) == b""
    fsync_path(tc.path)
    st = tc.status()
    assert st["dirty"] == 1, st["raw"]


def origin_states(logdev, mark):
    """The (A, C) contents of every origin state from `mark` on."""
    tclib.flushbufs(logdev)
    img = bytearray(32 * MiB)
    out = []
    with logwrites.LogWrites.open(logdev) as log:
        start = log.mark_index(mark)
        log.replay(img, end=start)
        for e in list(log.entries)[start + 1:]:
            log.replay(img, start=e.index, end=e.index)
            if e.is_write:
                out.append((bytes(img[A * B:(A + 1) * B]),
                            bytes(img[C * B:(C + 1) * B])))
    return out


def illegal(states):
    """States with C's new data but not A's: no power cut leaves them."""
    return [i for i, (a, c) in enumerate(states)
            if c == pat("C2") and a != pat("A1")]


def write_c(tc):
    """C written as the write that finds (or makes) the cache failed."""
    return Bg(io_block, tc.path, C, pat("C2")).join(60, "the write of C").result()


def test_dead_cache_fails_writes_that_would_pass_older_epochs(stack):
    tc, lw, logdev, cl, _ = build(stack, ordered=True)
    epoch0(tc)
    lw.message("mark", "kill")
    swap(cl, f"0 {tclib.size_sectors(cl.path)} error")
    r = write_c(tc)
    st = tc.status()
    assert st["cache_failed"], f"the failed state is not latched: {st['raw']}"
    # the log records a plain write at the next flush: the origin's
    fsync_path(lw.path)
    lw.message("mark", "end")
    states = origin_states(logdev, "kill")
    bad = illegal(states)
    assert not bad, f"the origin took C before A (states {bad} of {len(states)}): " \
                    f"the write of C returned {r!r}"
    assert r == errno.EIO, f"the write of C returned {r!r}, not EIO"
    assert io_block(lw.path, C) != pat("C2")


def test_failed_cache_drains_older_epochs_before_writes_go_around(stack):
    tc, lw, logdev, cl, cache_ram = build(stack, ordered=True)
    epoch0(tc)
    lw.message("mark", "kill")
    n = tclib.size_sectors(cache_ram)
    swap(cl, f"0 {n} flakey {cache_ram} 0 0 3600 1 error_writes")
    r = write_c(tc)
    st = tc.status()
    assert st["cache_failed"], f"the failed state is not latched: {st['raw']}"
    assert r == b"", f"the write of C failed: errno {r}"
    # the log records a plain write at the next flush: the origin's
    fsync_path(lw.path)
    lw.message("mark", "end")
    states = origin_states(logdev, "kill")
    bad = illegal(states)
    assert not bad, f"the origin took C before A (states {bad} of {len(states)})"
    assert states and states[-1] == (pat("A1"), pat("C2")), \
        "the origin does not end with A and C"
    assert st["dirty"] == 0, st["raw"]
    assert io_block(tc.path, A) == pat("A1") and io_block(tc.path, C) == pat("C2")


def test_default_policy_writes_around_at_once(stack):
    tc, lw, logdev, cl, cache_ram = build(stack, ordered=False)
    epoch0(tc)
    lw.message("mark", "kill")
    n = tclib.size_sectors(cache_ram)
    swap(cl, f"0 {n} flakey {cache_ram} 0 0 3600 1 error_writes")
    assert write_c(tc) == b""
    st = tc.status()
    assert st["cache_failed"] and st["dirty"] == 1, st["raw"]
    st = tc.flush(expect_clean=False)
    assert st["dirty"] == 0, st["raw"]
    lw.message("mark", "end")
    states = origin_states(logdev, "kill")
    assert illegal(states), "the default policy kept the order: this test " \
                            "cannot tell the policies apart"
    assert states[-1] == (pat("A1"), pat("C2"))


def test_failed_commit_does_not_stop_ordered_writeback(stack):
    tc, lw, logdev, cl, cache_ram = build(stack, ordered=True)
    epoch0(tc)
    assert io_block(tc.path, C, pat("C2")) == b""
    fsync_path(tc.path)
    st = tc.status()
    assert st["dirty"] == 2 and st["epoch_current"] >= 2, st["raw"]
    sb = tcdisk.decode_sb(tclib.read_direct(cache_ram, 0, B))
    assert sb.ok and sb.epoch == 0, sb
    swap(cl, linear_with_error(cache_ram, 0, sb.data_start))
    lw.message("mark", "wb")
    st = tc.flush(timeout=120, expect_clean=False)
    assert st["meta_error"], f"no commit failed: the test did not test: {st['raw']}"
    assert st["dirty"] == 0, f"writeback stopped: {st['raw']}"
    fsync_path(lw.path)
    lw.message("mark", "end")
    states = origin_states(logdev, "wb")
    bad = illegal(states)
    assert not bad, f"the origin took C before A (states {bad} of {len(states)})"
    assert states and states[-1] == (pat("A1"), pat("C2")), \
        "the origin does not end with A and C"
