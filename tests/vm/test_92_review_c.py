# SPDX-License-Identifier: GPL-2.0
"""Regression tests for defects found in review (issue 14, third round).

  1   a FUA write acknowledged without a metadata commit while the cache
      device's committed metadata still says its block is dirty in a slot
      (the clean mark's commit failed): after a crash the stale entry must
      not bring the old data back over the acknowledged write
  2   a reload onto another cache device, while the old cache device fails
      writes but holds nothing dirty, resumes (it is not left suspended)
  3   a read-only table writes nothing: neither a discard nor a write past
      the last whole block (sent through a device stacked on it: the block
      layer refuses them from user space itself) reaches the origin

Faults are made with dm tables swapped under the devices (suspend, load,
resume of a dm-linear device): `flakey ... error_writes` over the
metadata area, `error` over one slot, `error` over the whole old cache.
A crash keeps the cache device as it was at one moment: from then on it
drops every write (`flakey ... drop_writes`), so the commits of `dmsetup
remove` are lost, and the cache is loaded again without `format`.  FUA
writes are asynchronous O_DIRECT writes on an O_DSYNC descriptor (AIO):
the block layer sends them as REQ_FUA and, unlike a synchronous
O_DSYNC write, does not follow them with a cache flush (which would
commit the metadata).

Every wait has a deadline; I/O that could meet a suspended device runs
in a child process with a timeout.  The test that can leave a device
suspended for good on a broken module (item 2) runs last, repairs it by
loading a table it can resume, and if even that fails leaks its devices
(names kept in tclib.KEEP, backed by null_blk devices of its own) so that
the tests after it still run.
"""

import errno
import functools
import os
import random
import subprocess

import pytest

import faults
import tclib
from faults import (clean_err, committed_dirty, dm_info, find_in_device, fsync_path,
                    named_nullb, rnd, superblock, swap, wait_until)
from tclib import MiB

pytestmark = [pytest.mark.module, pytest.mark.usefixtures("tc_module")]

B = 4096
S = B // 512          # sectors per 4 KiB block
SCRATCH = "tcr92"     # prefix of this file's scratch files

dd_read = functools.partial(faults.dd_read, prefix=SCRATCH, timeout=60)
dd_write = functools.partial(faults.dd_write, prefix=SCRATCH, timeout=60)


# ---------------------------------------------------------------- helpers

# An asynchronous (AIO) O_DIRECT write on an O_DSYNC descriptor: the block
# layer sends it as one REQ_FUA bio and completes it when that bio does (a
# synchronous O_DSYNC write to a block device is followed by a flush).
AIO_DSYNC_PY = r"""
import ctypes, mmap, os, struct, sys
path, off, data = sys.argv[1], int(sys.argv[2]), bytes.fromhex(sys.argv[3])
libc = ctypes.CDLL(None, use_errno=True)
sc = libc.syscall
sc.restype = ctypes.c_long
L = ctypes.c_long
fd = os.open(path, os.O_WRONLY | os.O_DIRECT | os.O_DSYNC)
buf = mmap.mmap(-1, 4096)
buf[:len(data)] = data
addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
ctx = ctypes.c_ulong(0)
if sc(L(206), L(1), ctypes.byref(ctx)) < 0:                 # io_setup
    sys.exit(f"io_setup: errno {ctypes.get_errno()}")
cb = ctypes.create_string_buffer(struct.pack("<QIIHhIQQqQII", 0, 0, 0, 1, 0, fd, addr,
                                             len(data), off, 0, 0, 0), 64)
cbs = (ctypes.c_void_p * 1)(ctypes.addressof(cb))
if sc(L(209), ctx, L(1), cbs) != 1:                          # io_submit
    sys.exit(f"io_submit: errno {ctypes.get_errno()}")
ev = ctypes.create_string_buffer(32)
if sc(L(208), ctx, L(1), L(1), ev, None) != 1:               # io_getevents
    sys.exit(f"io_getevents: errno {ctypes.get_errno()}")
print(struct.unpack_from("<q", ev.raw, 16)[0])
"""


def aio_dsync_write(path, off, data, timeout=30):
    """The FUA write; returns 0 or the errno it failed with."""
    p = tclib.run(["python3", "-c", AIO_DSYNC_PY, path, off, data.hex()],
                  timeout=timeout, check=False)
    assert p.returncode == 0, f"AIO helper failed: {p.stdout} {p.stderr}"
    res = int(p.stdout.split()[-1])
    assert res == len(data) or res < 0, f"short FUA write: {res}"
    return 0 if res == len(data) else -res


IO_PY = r"""
import fcntl, mmap, os, struct, sys
op, path, off, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
fd = os.open(path, os.O_WRONLY | (os.O_DIRECT if op == "write" else 0))
try:
    if op == "write":
        buf = mmap.mmap(-1, max(n, 4096))
        buf[:n] = bytes(n)
        assert os.pwrite(fd, memoryview(buf)[:n], off) == n
    else:
        fcntl.ioctl(fd, {"discard": 0x1277, "zeroout": 0x127F}[op], struct.pack("QQ", off, n))
except OSError as e:
    print(e.errno)
else:
    print(0)
"""


def write_op(op, path, off, length, timeout=30):
    """An O_DIRECT write of zeros, BLKDISCARD or BLKZEROOUT in a child
    process; 0 or the errno it failed with."""
    p = tclib.run(["python3", "-c", IO_PY, op, path, off, length], timeout=timeout)
    return int(p.stdout.split()[-1])


def metadata_failing(cram, data_start):
    """The cache device with every write to its metadata area failing."""
    n = tclib.size_sectors(cram)
    return (f"0 {data_start} flakey {cram} 0 0 3600 1 error_writes\n"
            f"{data_start} {n - data_start} linear {cram} {data_start}")


def slot_failing(cram, sector):
    """The cache device with one slot's data sectors failing."""
    n = tclib.size_sectors(cram)
    return (f"0 {sector} linear {cram} 0\n{sector} {S} error\n"
            f"{sector + S} {n - sector - S} linear {cram} {sector + S}")


# ---------------------------------------------------------------- item 1

@pytest.mark.parametrize("variant", ["cleaner_fua_hit", "writeback_partial_miss"])
def test_fua_write_after_stale_dirty_slot_drop_is_durable(stack, variant):
    """Block X is written (V1) and committed dirty in slot S.  The cache
    device's metadata area then fails writes: a flush writes V1 to the
    origin and marks X clean in memory, but the commit of the clean mark
    fails (meta_error).  The metadata area heals; S's data sectors fail.

    cleaner_fua_hit: with `cleaner on` (writes go to both devices) a FUA
    write of V2 over X fails in the cache, the slot is dropped and the
    write acknowledged from the origin.

    writeback_partial_miss: a plain write of V2 over X fails in the cache
    and goes to the origin (the slot is dropped); then a FUA write of 512
    bytes of X (a partial-block miss: to the origin) is acknowledged.

    Crash right after the acknowledgement (the cache device drops every
    write from then on), load the cache without `format`: X must read
    what the origin holds (V2, with the FUA bytes), not V1 from the stale
    dirty entry of S; or the FUA write must have failed.  The failed
    commit latched the failed state and marked the superblock: then the
    load must be refused, and the origin alone must hold that data."""
    origin = stack.ram(32 * MiB)
    m = tclib.seeded_origin(origin, seed=9201)
    cram = stack.ram(8 * MiB)
    healthy = f"0 {tclib.size_sectors(cram)} linear {cram} 0"
    cdev = stack.dm(f"tcc1-cache-{variant[:2]}", healthy)
    keys = {"commit_ms": 600000}
    tc = stack.tiercache(origin, cdev.path, 8, "writeback", keys)
    assert tclib.sysfs_queue(tc.path, "write_cache") == "write back" and \
        tclib.sysfs_queue(tc.path, "fua") == "1", \
        "the tiercache device does not take FUA: the block layer would strip it"
    X = 3000
    v1, v2 = rnd(9202), rnd(9203)
    tclib.write_direct(tc.path, X * B, v1)
    fsync_path(tc.path)
    slot_off = find_in_device(cdev.path, v1)
    sb = superblock(cdev.path)
    assert slot_off >= sb["data_start"] * 512, (slot_off, sb)
    slot = (slot_off // 512 - sb["data_start"]) // S
    assert committed_dirty(cdev.path).get(X) == slot, \
        f"precondition: block {X} is not committed dirty in slot {slot}: {tc.status_line()}"

    # the clean mark cannot be committed
    swap(cdev, metadata_failing(cram, sb["data_start"]))
    ev = tc.event_nr()
    tc.message("flush")
    tc.wait_event(ev, timeout=30)
    st = wait_until(lambda: (lambda s: s if s["dirty"] == 0 and s["meta_error"] != 0 and
                             s["flush_state"] == "idle" else None)(tc.status()),
                    20, "the flush to end with a failed metadata commit", step=0.05)
    print("clean mark not committed:", st["raw"])
    tclib.compare(v1, tclib.read_direct(origin, X * B, B), X * B, "origin after the flush")
    if variant == "cleaner_fua_hit":
        tc.message("cleaner", "on")

    # the metadata area heals, slot S fails writes
    swap(cdev, slot_failing(cram, slot_off // 512))
    assert committed_dirty(cdev.path).get(X) == slot, \
        "precondition: the committed metadata no longer names the stale dirty entry"
    st0 = tc.status()
    if variant == "cleaner_fua_hit":
        fua_off, fua_data = X * B, v2
        want = v2
    else:
        tclib.write_direct(tc.path, X * B, v2)     # to clean X: fails in the cache
        tclib.compare(v2, tclib.read_direct(origin, X * B, B), X * B,
                      "origin after the write that failed in the cache")
        fua_off, fua_data = X * B + 1024, rnd(9204, 512)
        want = v2[:1024] + fua_data + v2[1536:]
    err = aio_dsync_write(tc.path, fua_off, fua_data)
    st1 = tc.status()
    print(f"FUA write: errno {err}; {st0['raw']} -> {st1['raw']}")
    tclib.kmsg(f"test_92 item 1 {variant}: FUA write errno {err}; {st1['raw']}")
    if err == 0:
        tclib.compare(want, tclib.read_direct(origin, X * B, B), X * B,
                      "origin after the acknowledged FUA write")

    # crash: from now on the cache device keeps nothing written to it
    swap(cdev, stack.flakey_table(cram, up=0, down=3600, features=["drop_writes"]))
    tc.remove()
    swap(cdev, healthy)
    on_disk = committed_dirty(cdev.path)
    if superblock(cdev.path)["failed"]:
        table = tclib.TierCache.make_table(origin, cdev.path, 8, "writeback", keys,
                                           fmt=False)
        p = tclib.run(["dmsetup", "create", f"tcc1-re-{variant[:2]}", "--table", table],
                      check=False, timeout=60)
        assert p.returncode != 0, "a cache whose superblock is marked failed was loaded"
        got = tclib.read_direct(origin, X * B, B)
        if err:
            assert got in (v1, v2, want), "the origin holds none of the versions written"
        else:
            tclib.compare(want, got, X * B, "origin after the crash (cache refused)")
        return
    tc2 = stack.tiercache(origin, cdev.path, 8, "writeback", keys, fmt=False)
    st2 = tc2.status()
    got = tclib.read_direct(tc2.path, X * B, B)
    if err:
        assert err == errno.EIO, f"the FUA write failed with {errno.errorcode.get(err, err)}"
        assert got in (v1, v2, want), \
            "after a failed FUA write the block holds none of the versions written"
        return
    if got == v1:
        dropper = ("the FUA write itself, its cache half failing" if variant == "cleaner_fua_hit"
                   else "the earlier write that failed in the cache")
        pytest.fail(
            f"after a crash right after the acknowledged O_DIRECT|O_DSYNC (FUA) write "
            f"({variant}), block {X} reads V1, the data of the stale dirty entry of slot "
            f"{slot}: its clean mark never reached the disk (meta_error {st['meta_error']}), "
            f"the slot was dropped (by {dropper}) and the FUA write acknowledged without a "
            f"metadata commit, "
            f"so the load found block {X} still committed dirty in slot {slot} "
            f"(committed dirty entries {on_disk}) and serves the old copy over the "
            f"acknowledged data; status after the load: {st2['raw']}", pytrace=False)
    tclib.compare(want, got, X * B, "block after the crash")
    m.data[X * B:(X + 1) * B] = want
    m.verify_device(tc2.path, start=(X - 8) * B, end=(X + 8) * B)


# ---------------------------------------------------------------- item 3

def _readonly_device(stack, tag, discard, tail=0):
    """Origin (null_blk, seeded), cache, a writable tiercache with one
    committed dirty block, then the same table reloaded read-only, and a
    writable dm-linear over it.

    The block layer refuses writes and discards to a read-only device
    from user space itself (write(2) and the BLKDISCARD / BLKZEROOUT
    ioctls get EPERM before any bio is made), but not bios that a device
    stacked on it (a dm-linear, an LVM volume) remaps to it: those reach
    the read-only table with only a "Trying to write to read-only
    block-device" warning in the kernel log."""
    nb = stack.nullb(32, discard=discard)
    m = tclib.seeded_origin(nb, seed=9300 + len(tag))
    cache = stack.ram(8 * MiB)
    length = tclib.size_sectors(nb) - tail
    tc = stack.tiercache(nb, cache, 8, "writeback", name=f"tcc3-{tag}", length=length)
    D = 3000
    dirty = rnd(9310 + len(tag))
    tclib.write_direct(tc.path, D * B, dirty)
    fsync_path(tc.path)
    assert tc.status()["dirty"] == 1, tc.status_line()
    line = tc.table_line()
    tclib.run(["dmsetup", "load", "--readonly", tc.name, "--table", line], timeout=60)
    tclib.run(["dmsetup", "resume", tc.name], timeout=60)
    tclib.run(["dmsetup", "mknodes", tc.name], quiet=True)
    tclib.run(["udevadm", "settle", "--timeout=30"], check=False, quiet=True, timeout=40)
    tclib.settle(tc.path, quiet_s=0.3)
    assert tclib.run(["blockdev", "--getro", tc.path], quiet=True).stdout.strip() == "1"
    up = stack.linear(tc.path, name=f"tcc3-{tag}-up")
    tclib.run(["udevadm", "settle", "--timeout=30"], check=False, quiet=True, timeout=40)
    tclib.settle(up.path, quiet_s=0.3)
    assert tclib.run(["blockdev", "--getro", up.path], quiet=True).stdout.strip() == "0"
    return nb, m, cache, tc, up, D, dirty


def _io(nb, cache):
    o, c = tclib.block_stat(nb), tclib.block_stat(cache)
    return {"origin writes": o["write_sectors"], "origin discards": o["discard_sectors"],
            "cache writes": c["write_sectors"], "cache discards": c["discard_sectors"]}


def _refused(what, err, st0, st1, io0, io1, before, after, base, extra=""):
    """The problems of a request a read-only table should have refused."""
    problems = []
    if err == 0:
        problems.append(f"{what} succeeded")
    elif err not in (errno.EIO, errno.EPERM, errno.EROFS):
        problems.append(f"{what} failed with {errno.errorcode.get(err, err)}, "
                        f"not EIO/EPERM/EROFS")
    if st1["dirty"] != st0["dirty"]:
        problems.append(f"the dirty count went {st0['dirty']} -> {st1['dirty']}")
    if after != before:
        first = next(i for i in range(len(before)) if before[i] != after[i])
        last = max(i for i in range(len(before)) if before[i] != after[i])
        problems.append(f"the origin's bytes changed at device offsets {base + first}.."
                        f"{base + last} (now {tclib.hexdump16(after[first:])}, were "
                        f"{tclib.hexdump16(before[first:])})")
    moved = {k: io1[k] - io0[k] for k in io0 if io1[k] != io0[k]}
    if moved:
        problems.append(f"sectors written/discarded below: {moved}")
    if problems:
        pytest.fail(f"{what}, sent to a read-only tiercache table{extra}: "
                    + "; ".join(problems) + f"; status {st0['raw']} -> {st1['raw']}",
                    pytrace=False)


def test_readonly_table_refuses_discard(stack):
    """A read-only table over a dirty block D (origin null_blk with
    discard): a discard of D (BLKDISCARD through a dm-linear stacked on
    the read-only device) must fail, keep the dirty copy, and leave the
    origin's bytes as they were."""
    nb, m, cache, tc, up, D, dirty = _readonly_device(stack, "disc", discard=True)
    lo, hi = (D - 8) * B, (D + 8) * B
    before = tclib.read_direct(nb, lo, hi - lo)
    st0, io0 = tc.status(), _io(nb, cache)
    err = write_op("discard", up.path, D * B, B)
    st1, io1 = tc.status(), _io(nb, cache)
    after = tclib.read_direct(nb, lo, hi - lo)
    print(f"discard errno {err}; {st0['raw']} -> {st1['raw']}; io {io0} -> {io1}")
    _refused(f"a discard of dirty block {D}", err, st0, st1, io0, io1, before, after, lo)
    tclib.compare(dirty, tclib.read_direct(tc.path, D * B, B), D * B,
                  "the dirty block through the read-only table")


def test_readonly_table_refuses_tail_write(stack):
    """Target length = whole blocks + 4 sectors, table read-only: an
    O_DIRECT write of the last 2 KiB (the tail past the last whole block,
    which is never cached), through a dm-linear stacked on the read-only
    device, must fail and leave the origin's bytes as they were."""
    nb, m, cache, tc, up, D, dirty = _readonly_device(stack, "tail", discard=False, tail=4)
    n = tclib.size_sectors(tc.path)
    assert n % 8 == 4, f"the target is {n} sectors: no 4-sector tail"
    off = (n - 4) * 512
    before = tclib.read_direct(nb, off - B, B + 2048)
    assert before[B:] != bytes(2048), "the origin's tail is already zero"
    st0, io0 = tc.status(), _io(nb, cache)
    err = write_op("write", up.path, off, 2048)
    st1, io1 = tc.status(), _io(nb, cache)
    after = tclib.read_direct(nb, off - B, B + 2048)
    print(f"tail write errno {err}; {st0['raw']} -> {st1['raw']}; io {io0} -> {io1}")
    _refused("an O_DIRECT write of zeros over the last 2 KiB (the tail)", err, st0, st1,
             io0, io1, before, after, off - B,
             extra=f" ({n} sectors, tail from sector {n - 4})")
    tclib.compare(dirty, tclib.read_direct(tc.path, D * B, B), D * B,
                  "the dirty block through the read-only table")


# ---------------------------------------------------------------- item 2 (last)

def test_replace_failing_clean_cache_resumes(stack):
    """X runs on cache A (dm-linear), commit_ms 600000; data written and
    flushed (dirty 0), then 64 whole-block read misses are promoted (A's
    metadata changed, not committed).  A table naming cache B with
    `format` is loaded (accepted: nothing dirty), A's table is swapped to
    `error`, and X is resumed: the resume must succeed within 60 s and
    leave X active on cache B, every byte written before the reload must
    read back, and new writes and reads must work."""
    tag = f"tcc2-{os.getpid()}"
    nbo = named_nullb(stack, f"{tag}o", 32, step=0.05)
    nba = named_nullb(stack, f"{tag}a", 8, step=0.05)
    nbb = named_nullb(stack, f"{tag}b", 8, step=0.05)
    m = tclib.seeded_origin(nbo, seed=9201)
    na = tclib.size_sectors(nba)
    cache_a = stack.dm(f"{tag}-a", f"0 {na} linear {nba} 0")
    keys = {"commit_ms": 600000}
    tc = stack.tiercache(nbo, cache_a.path, 8, "writeback", keys, name=f"{tag}-x")
    names = [tc.name, cache_a.name]
    left = [False]

    def stuck(what):
        tclib.KEEP.update(names)
        left[0] = True
        stack.es.pop_all()            # nothing of this can be torn down now
        pytest.fail(f"{what} (devices {names} and null_blk {tag}o/a/b left behind: "
                    f"I/O to {tc.name} would hang)", pytrace=False)

    base, n = 2048, 256
    rng = random.Random(9202)
    for i in range(32):
        b = base + rng.randrange(n - 4)
        k = rng.randint(1, 4)
        data = rng.randbytes(k * B)
        tclib.write_direct(tc.path, b * B, data)
        m.data[b * B:(b + k) * B] = data
    tc.flush(timeout=60)
    fsync_path(tc.path)      # a commit now: the flush's own may still be queued
    R = 4096
    st0 = tc.status()
    tclib.compare(bytes(m.data[R * B:(R + 64) * B]), tclib.read_direct(tc.path, R * B, 64 * B),
                  R * B, "the 64 promoting reads")
    st1 = tc.status()
    print("before the reload:", st0["raw"], "->", st1["raw"])
    assert st1["dirty"] == 0 and st1["used"] >= st0["used"] + 64, \
        f"precondition: 64 clean promotions: {st0['raw']} -> {st1['raw']}"
    assert st1["meta_commits"] == st0["meta_commits"], \
        f"precondition: the promotions were committed: {st0['raw']} -> {st1['raw']}"

    tbl_b = tclib.TierCache.make_table(nbo, nbb, 8, "writeback", keys, fmt=True)
    p = tclib.run(["dmsetup", "load", tc.name, "--table", tbl_b], check=False, timeout=60)
    assert p.returncode == 0, f"the load naming cache B was refused: {clean_err(p.stderr)}"
    swap(cache_a, f"0 {na} error")
    try:
        p = tclib.run(["dmsetup", "resume", tc.name], check=False, timeout=60)
    except subprocess.TimeoutExpired:
        stuck("`dmsetup resume` onto cache B did not return within 60 s")
    info = dm_info(tc.name) or {}
    live = tclib.run(["dmsetup", "table", tc.name], check=False, quiet=True,
                     timeout=30).stdout.strip()
    if p.returncode != 0 or info.get("State") != "ACTIVE":
        msg = (f"`dmsetup resume` of {tc.name} onto cache B (cache A, clean: dirty 0, "
               f"64 uncommitted promotions, failing every write) "
               f"{'failed: ' + clean_err(p.stderr) if p.returncode else 'succeeded'}; the "
               f"device is left {info.get('State')} (tables {info.get('Tables present')}), "
               f"live table '{live}' (cache B is {tclib.devno(nbb)}): I/O to it hangs")
        tclib.log(msg)
        # repair: a table over cache B (its state, no hold on A) resumes
        tbl_b2 = tclib.TierCache.make_table(nbo, nbb, 8, "writeback", keys, fmt=False)
        try:
            r1 = tclib.run(["dmsetup", "load", tc.name, "--table", tbl_b2], check=False,
                           timeout=60)
            r2 = tclib.run(["dmsetup", "resume", tc.name], check=False, timeout=60)
        except subprocess.TimeoutExpired:
            stuck(msg + "; the repair (a table over cache B) did not return within 60 s")
        if r1.returncode or r2.returncode or (dm_info(tc.name) or {}).get("State") != "ACTIVE":
            stuck(msg + f"; the repair failed: {clean_err(r1.stderr)} {clean_err(r2.stderr)}")
        pytest.fail(msg, pytrace=False)
    tclib.run(["dmsetup", "mknodes", tc.name], quiet=True)
    assert tclib.devno(nbb) in live.split(), f"the live table is not over cache B: {live}"
    try:
        got = dd_read(tc.path, base * B, (R + 64 - base) * B)
        tclib.compare(bytes(m.data[base * B:(R + 64) * B]), got, base * B,
                      "read back after the resume onto cache B")
        new = rnd(9203, 4 * B)
        dd_write(tc.path, 5000 * B, new)
        tclib.compare(new, dd_read(tc.path, 5000 * B, 4 * B), 5000 * B,
                      "a new write through cache B")
        m.data[5000 * B:5004 * B] = new
        st = tc.flush(timeout=60)
    except subprocess.TimeoutExpired as e:
        stuck(f"I/O after the resume onto cache B did not complete: {e}")
    print("after the resume:", st["raw"])
    tc.remove()
    m.verify_device(nbo, start=base * B, end=5004 * B, what="origin at the end")
