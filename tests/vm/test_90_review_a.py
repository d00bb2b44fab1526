# SPDX-License-Identifier: GPL-2.0
"""Regression tests for defects found in review of the module (issue 14).

One test (or two) per defect; each asserts the outcome a user sees (data
read back byte for byte, request and flush counters of the devices below,
device state, errors), never a mechanism:

  1   a reload naming another cache device keeps what was written between
      `dmsetup load` and `dmsetup resume`, and releases the old cache
  2   refused `dmsetup create`s leave no device behind, and huge numbers
      that wrap around 2^32 are refused
  4   a FUA write after a discard survives a crash (no stale dirty entry of
      the discarded block comes back over it)
  7   `format` over a cache of another geometry holding committed dirty
      blocks is refused
  13  no metadata I/O reaches the cache device after suspend; an idle cache
      does not flush its cache device
  14  a passthrough reload whose resume finds dirty blocks never leaves the
      device suspended, and loses nothing
  R   a read-only table writes neither the origin nor the cache device

Every wait has a deadline: reads and writes that could meet a suspended
device run in a child process with a timeout.
"""

import fcntl
import functools
import os
import random
import struct
import time
from pathlib import Path

import pytest

import faults
import tclib
from faults import BgCmd, clean_err, committed_dirty, dm_info, fsync_path, rnd, scratch
from tclib import KiB, MiB

pytestmark = [pytest.mark.module, pytest.mark.usefixtures("tc_module")]

B = 4096            # tiercache block (8 sectors) and ext4 block
BLK = 8
FIBMAP = 1
SCRATCH = "tcr90"   # prefix of this file's scratch files

dd_read = functools.partial(faults.dd_read, prefix=SCRATCH)
dd_write = functools.partial(faults.dd_write, prefix=SCRATCH)


# ---------------------------------------------------------------- helpers

def name_of(data, named):
    """Which of the named byte strings `data` is (for failure messages)."""
    for k, v in named.items():
        if data == v:
            return k
    return "none of " + ", ".join(named) + f" (starts {tclib.hexdump16(data)})"


DISCARD_PY = ("import fcntl,os,struct,sys\n"
              "fd=os.open(sys.argv[1],os.O_WRONLY)\n"
              "fcntl.ioctl(fd,0x1277,struct.pack('QQ',int(sys.argv[2]),int(sys.argv[3])))\n")

DSYNC_PY = ("import mmap,os,sys\n"
            "d=bytes.fromhex(sys.argv[3])\n"
            "fd=os.open(sys.argv[1],os.O_WRONLY|os.O_DIRECT|os.O_DSYNC)\n"
            "m=mmap.mmap(-1,4096)\n"
            "m[:len(d)]=d\n"
            "assert os.pwrite(fd,memoryview(m)[:len(d)],int(sys.argv[2]))==len(d)\n"
            "os.close(fd)\n")


def suspend(dev, timeout=30):
    tclib.run(["dmsetup", "suspend", dev.name], timeout=timeout)


def resume(dev, timeout=30):
    tclib.run(["dmsetup", "resume", dev.name], timeout=timeout)


def create(stack, name, table, readonly=False, timeout=60):
    """dmsetup create; on success the stack removes the device at the end.
    Returns (TierCache or None, dmsetup stderr, new kernel log lines)."""
    cur = tclib.KmsgCursor("create")
    cmd = ["dmsetup", "create"] + (["--readonly"] if readonly else []) + \
        [name, "--table", table]
    p = tclib.run(cmd, check=False, timeout=timeout)
    log = "\n".join(cur.lines())
    if p.returncode != 0:
        return None, p.stderr.strip(), log
    tc = tclib.TierCache(name, table)
    stack._defer(tc.remove)
    tclib.run(["dmsetup", "mknodes", name], quiet=True)
    return tc, p.stderr.strip(), log


def settle_new(tc):
    tclib.run(["udevadm", "settle", "--timeout=30"], check=False, quiet=True, timeout=40)
    tclib.settle(tc.path, quiet_s=0.3)


def read_image(path, size, chunk=MiB):
    img = bytearray(size)
    for off in range(0, size, chunk):
        img[off:off + chunk] = tclib.read_direct(path, off, min(chunk, size - off))
    return bytes(img)


def stat_keys(st, keys=("writes", "write_sectors", "flushes")):
    return {k: st[k] for k in keys}


# ---------------------------------------------------------------- 1

def test_01_reload_other_cache_keeps_writes_between_load_and_resume(stack):
    """Writes between `dmsetup load` (a table naming cache B) and `dmsetup
    resume` are acknowledged by the live table (cache A): after the resume
    they must be read back, a later re-attach of A must not bring them
    back over newer data, and after `dmsetup remove` A must be free."""
    origin = stack.ram(32 * MiB)
    cache_a = stack.ram(8 * MiB)
    cache_b = stack.ram(8 * MiB)
    X, Y = 2048, 2100                       # blocks, far from udev's probes
    d0 = {X: rnd("1-d0x"), Y: rnd("1-d0y")}
    for b, d in d0.items():
        tclib.write_direct(origin, b * B, d)
    tc = stack.tiercache(origin, cache_a, BLK, "writeback", name="tcr1")
    d1 = rnd("1-d1")
    dd_write(tc.path, X * B, d1)
    tc.flush()
    assert dd_read(tc.path, X * B, B) == d1

    problems = []
    cur = tclib.KmsgCursor("load-b")
    tbl_b = tclib.TierCache.make_table(origin, cache_b, BLK, "writeback", fmt=True)
    p = tclib.run(["dmsetup", "load", tc.name, "--table", tbl_b], check=False, timeout=60)
    loaded = p.returncode == 0
    if not loaded:
        tclib.log(f"load naming cache B refused: {p.stderr.strip()} / {cur.lines()[-3:]}")
        assert any("tiercache" in ln for ln in cur.lines()), \
            f"the load was refused without a kernel log line saying why: {p.stderr}"

    # acknowledged (fsynced) writes between load and resume
    d2 = {X: rnd("1-d2x"), Y: rnd("1-d2y")}
    for b, d in d2.items():
        dd_write(tc.path, b * B, d)
    want = dict(d2)

    resumed_on_b = False
    if loaded:
        p = tclib.run(["dmsetup", "resume", tc.name], check=False, timeout=60)
        info = dm_info(tc.name)
        if p.returncode != 0:
            tclib.log(f"resume refused: {p.stderr.strip()}")
            if info and info.get("State") != "ACTIVE":
                pytest.fail(f"the resume was refused ({clean_err(p.stderr)}) and the device "
                            f"was left {info.get('State')} (tables: "
                            f"{info.get('Tables present')})", pytrace=False)
        else:
            resumed_on_b = True
            tclib.run(["dmsetup", "mknodes", tc.name], quiet=True)
    for b in (X, Y):
        got = dd_read(tc.path, b * B, B)
        named = {"the new data": want[b], "the origin's data from before the load": d0[b]}
        if b == X:
            named["the origin's data from before the load"] = d1
        if got != want[b]:
            problems.append(f"after the resume, block {b} (written and fsynced between load "
                            f"and resume) reads {name_of(got, named)}")

    if resumed_on_b:
        # newer data through the new table, written back to the origin
        d3 = rnd("1-d3x")
        dd_write(tc.path, X * B, d3)
        tc.flush()
        want[X] = d3
    tc.remove()

    # cache A in a new device: free (no "in use"), and nothing stale in it.
    # First with `format`: refused only for dirty blocks left in A (the
    # EBUSY reported as "still claimed"); accepted if A is clean.
    tbl_af = tclib.TierCache.make_table(origin, cache_a, BLK, "writeback", fmt=True)
    tcf, err, log = create(stack, "tcr1-fmt", tbl_af)
    fmt_note = ""
    if tcf is None:
        why = [x for x in log.splitlines() if "tiercache" in x][-1:]
        fmt_note = f" (a `format` of cache A was refused: {clean_err(err)} {why})"
        if "in use" in log:
            problems.append(f"after `dmsetup remove`, cache A is still claimed: {why}")
    else:
        tcf.remove()
    tbl_a = tclib.TierCache.make_table(origin, cache_a, BLK, "writeback", fmt=False)
    tc2, err, log = create(stack, "tcr1-again", tbl_a)
    if tc2 is None:
        problems.append(f"cache A cannot be loaded by a new device: {clean_err(err)} / "
                        f"{[x for x in log.splitlines() if 'tiercache' in x][-2:]}")
    if tc2 is not None:
        for b in (X, Y):
            got = dd_read(tc2.path, b * B, B)
            named = {"the newest data": want[b], "the stale data written between load and "
                     "resume": d2[b], "the data from before the load": d1 if b == X else d0[b]}
            if got != want[b]:
                problems.append(f"a new device over the origin and cache A reads block {b} "
                                f"as {name_of(got, named)}{fmt_note}")
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------- 2

WRAP = 2 ** 32


def bad_lines(o, c, blank, small, regular):
    """(id, table after '0 <len> tiercache ', kernel log regex, length)."""
    return [
        ("huge-length",        f"{o} {c} 8 1 format",               r"origin|smaller", 2 ** 40),
        ("bs-wraps-to-8",      f"{o} {c} {WRAP + 8} 1 format",       r"block size", None),
        ("bs-huge",            f"{o} {c} 99999999999999999999999 1 format", r"block size", None),
        ("nfeat-wraps-to-1",   f"{o} {c} 8 {WRAP + 1} format",       r"feature", None),
        ("commit_ms-wraps",    f"{o} {c} 8 3 format commit_ms {WRAP + 1000}", r"commit_ms", None),
        ("flush_depth-huge",   f"{o} {c} 8 3 format flush_depth 99999999999999999999", r"flush_depth", None),
        ("cache-dev-null",     f"{o} /dev/null 8 1 format",         r"cache", None),
        ("cache-regular-file", f"{o} {regular} 8 1 format",         r"cache", None),
        ("origin-is-cache",    f"{o} {o} 8 1 format",               r"origin|cache", None),
        ("unformatted",        f"{o} {blank} 8 0",                  r"format|superblock", None),
        ("unknown-path",       f"{o} /dev/tcr-nonexistent 8 1 format", r"cache", None),
        ("unknown-devno",      f"{o} 240:4000 8 1 format",          r"cache", None),
        ("unknown-origin",     f"/dev/tcr-nonexistent {c} 8 1 format", r"origin", None),
        ("cache-too-small",    f"{o} {small} 8 1 format",           r"small", None),
        ("bs-12",              f"{o} {c} 12 1 format",              r"block size", None),
    ]


def test_02_refused_creates_leave_nothing_behind(stack):
    """A few hundred refused `dmsetup create`s of bad lines: each is
    refused with a kernel log line naming the problem, and no device of
    that name exists afterwards.  Numbers that wrap around 2^32 (block
    size, feature count, key values) must be refused, not read modulo
    2^32.  TC_BADTABLE_ROUNDS (default 2, as in the debug kernel's lane,
    where each create takes seconds) rounds."""
    import re
    rounds = int(os.environ.get("TC_BADTABLE_ROUNDS", "2"))
    origin = stack.ram(16 * MiB)
    cache = stack.ram(4 * MiB)
    blank = stack.ram(4 * MiB)
    small = stack.ram(64 * KiB)
    regular = scratch(SCRATCH, "regular")
    Path(regular).write_bytes(b"\0" * 4 * MiB)
    stack._defer(os.unlink, regular)
    length = tclib.size_sectors(origin)
    kinds = bad_lines(origin, cache, blank, small, regular)
    name = "tcr2-bad"
    accepted, left, unclear = {}, [], []
    creates = 0
    for i in range(rounds):
        for kid, rest, pat, ln in kinds:
            if kid in accepted:
                continue        # reported once
            table = f"0 {ln or length} tiercache {rest}"
            cur = tclib.KmsgCursor("bad") if i == 0 else None
            p = tclib.run(["dmsetup", "create", name, "--table", table],
                          check=False, quiet=i > 0, timeout=60)
            creates += 1
            info = dm_info(name)
            tbl = tclib.run(["dmsetup", "table", name], check=False,
                            quiet=True).stdout.strip() if info else ""
            if p.returncode == 0:
                accepted[kid] = f"{kid}: `{table}` was accepted, live table '{tbl}'"
            elif info is not None:
                left.append(f"{kid} (round {i}): refused (rc {p.returncode}: "
                            f"{clean_err(p.stderr)[:200]}) but {name} exists: state "
                            f"{info.get('State')}, tables {info.get('Tables present')}, "
                            f"open count {info.get('Open count')}, table '{tbl}'")
            if cur is not None and p.returncode != 0:
                lines = [x for x in cur.lines() if "tiercache" in x or "device-mapper" in x]
                if not any(re.search(pat, x, re.I) for x in lines):
                    unclear.append(f"{kid}: refused, but no kernel log line matches "
                                   f"/{pat}/: {lines[-3:]} / {clean_err(p.stderr)[:200]}")
            if info is not None:
                tclib.run(["dmsetup", "remove", "--retry", name], check=False, timeout=60)
                if dm_info(name) is not None:
                    tclib.run(["dmsetup", "remove", "--force", name], check=False, timeout=60)
    tclib.run(["udevadm", "settle", "--timeout=30"], check=False, quiet=True, timeout=40)
    if dm_info(name) is not None:
        left.append(f"{name} exists after the loop")
    tclib.log(f"{creates} creates of {len(kinds)} kinds")
    problems = list(accepted.values()) + left + unclear
    assert not problems, f"{len(problems)} problem(s) in {creates} creates:\n" + \
        "\n".join(problems)


# ---------------------------------------------------------------- 4

def test_04_fua_write_after_discard_survives_crash(stack):
    """ext4 on tiercache: a file's block is dirty and committed; the block
    is discarded through the device; then an O_DIRECT|O_DSYNC partial
    write of the file (ext4/iomap sends it as a REQ_FUA write, no flush;
    a partial-block miss goes to the origin).  A crash right after the
    write's acknowledgement (the cache and origin devices imaged as they
    are, restored after teardown, the cache loaded without `format`) must
    keep the written bytes: the pre-discard dirty copy must not come back.
    The cache device is suspended from before the discard to the crash,
    so no metadata commit can sneak in; a module that waits for a commit
    gets it after 5 s (the device is resumed)."""
    osz, csz = 64 * MiB, 32 * MiB
    o_raw = stack.ram(tclib.Stack.RD_SIZE_KIB * KiB)
    c_raw = stack.ram(tclib.Stack.RD_SIZE_KIB * KiB)
    odev = stack.linear(o_raw, osz // 512)
    cdev = stack.linear(c_raw, csz // 512)
    keys = [("high_watermark", 100), ("low_watermark", 0), ("commit_ms", 600000)]
    tc = stack.tiercache(odev.path, cdev.path, BLK, "writeback", keys, name="tcr4")
    tclib.run(["mkfs.ext4", "-q", "-F", "-b", "4096",
               "-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0", tc.path], timeout=300)
    tc.flush(timeout=120)
    mnt = Path(scratch(SCRATCH, "mnt"))
    mnt.mkdir(exist_ok=True)
    tclib.run(["mount", "-t", "ext4", "-o", "noatime,nodiscard,commit=300,noinit_itable",
               tc.path, str(mnt)])
    mounted = [True]

    def umount():
        if mounted[0]:
            tclib.run(["umount", str(mnt)], timeout=120)
            mounted[0] = False
    stack._defer(umount)

    f = mnt / "f"
    a = rnd("4-a")
    fd = os.open(f, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, a, 0)
        os.fsync(fd)
        phys = struct.unpack("i", fcntl.ioctl(fd, FIBMAP, struct.pack("i", 0)))[0]
    finally:
        os.close(fd)
    assert phys > 0
    tclib.log(f"file block 0 is device block {phys}")
    assert phys in committed_dirty(cdev.path), \
        f"precondition: block {phys} is not dirty in a committed entry: {tc.status_line()}"
    b = rnd("4-b", 512)
    boff = 1024

    suspend(cdev)
    cdev_suspended = True
    notes = []
    try:
        disc = BgCmd(["python3", "-c", DISCARD_PY, tc.path, phys * B, B], "discard")
        rc = disc.wait(5)
        if rc is None:
            notes.append("the discard waited for the cache device")
            resume(cdev)
            cdev_suspended = False
            rc = disc.wait(30)
            assert rc is not None, "the discard did not end within 30 s of the cache's resume"
        assert rc == 0, f"the discard failed: {disc.err}"
        w = BgCmd(["python3", "-c", DSYNC_PY, f, boff, b.hex()], "O_DIRECT|O_DSYNC write")
        rc = w.wait(5)
        if rc is None:
            notes.append("the FUA write waited for the cache device")
            if cdev_suspended:
                resume(cdev)
                cdev_suspended = False
            rc = w.wait(30)
            assert rc is not None, "the O_DSYNC write did not end within 30 s"
        fua_ok = rc == 0
        tclib.log(f"O_DSYNC write: rc {rc} {w.err}; notes: {notes}")
        tclib.kmsg(f"test_04: O_DSYNC write rc {rc}; {'; '.join(notes) or 'nothing waited'}")
        # the crash point: both devices as they are now
        if not cdev_suspended:
            suspend(cdev)
            cdev_suspended = True
        suspend(odev)
        try:
            img_c = read_image(c_raw, csz)
            img_o = read_image(o_raw, osz)
        finally:
            resume(odev)
    finally:
        if cdev_suspended:
            resume(cdev)
    assert fua_ok, f"the O_DIRECT|O_DSYNC write failed: {w.err}"

    umount()
    tc.remove()
    tclib.fill_device(c_raw, img_c)
    tclib.fill_device(o_raw, img_o)
    tbl = tclib.TierCache.make_table(odev.path, cdev.path, BLK, "writeback", fmt=False)
    tc2, err, log = create(stack, "tcr4-after", tbl)
    assert tc2 is not None, f"the crashed cache does not load: {clean_err(err)} / {log[-600:]}"
    st = tc2.status()
    got = dd_read(tc2.path, phys * B, B)[boff:boff + 512]
    named = {"the FUA data": b, "the stale pre-discard data": a[boff:boff + 512]}
    assert got == b, (f"after the crash, the bytes of the acknowledged O_DSYNC write read "
                      f"as {name_of(got, named)} (status after load: {st['raw']}; "
                      f"dirty {st['dirty']}); notes: {notes}")
    tc2.flush()
    got = dd_read(odev.path, phys * B + boff, 512)
    assert got == b, f"after a flush the origin holds {name_of(got, named)}"


# ---------------------------------------------------------------- 7

def _write_dirty(tc, tag, n):
    """Write @n random blocks through @tc and fsync (a commit); returns
    {block: data}, asserting that all @n are dirty."""
    blocks = random.Random(tag).sample(range(1024, 4096), n)
    data = {}
    for blk in blocks:
        data[blk] = rnd(f"{tag}-{blk}")
        tclib.write_direct(tc.path, blk * B, data[blk])
    fsync_path(tc.path)
    st = tc.status()
    assert st["dirty"] == n, st["raw"]
    return data


def _cache_with_dirty(stack, origin, cache_path, n=64, tag="7"):
    tc = stack.tiercache(origin, cache_path, BLK, "writeback", name=f"tcr{tag}")
    data = _write_dirty(tc, tag, n)
    tc.remove()
    assert set(committed_dirty(cache_path)) == set(data)
    return data


def _verify_loaded(stack, origin, cache_path, data, name):
    tbl = tclib.TierCache.make_table(origin, cache_path, BLK, "writeback", fmt=False)
    tc, err, log = create(stack, name, tbl)
    if tc is None:
        return f"the original cache no longer loads: {clean_err(err)} / {log.splitlines()[-2:]}"
    st = tc.status()
    bad = [blk for blk, d in data.items() if tclib.read_direct(tc.path, blk * B, B) != d]
    if st["dirty"] != len(data) or bad:
        return (f"after the refusal the cache loads with dirty {st['dirty']} of {len(data)}, "
                f"{len(bad)} blocks read wrong")
    return None


def test_07_format_refused_on_shrunken_cache_with_dirty_data(stack):
    """A cache device with committed dirty blocks shrinks (its dm-linear
    reloaded shorter): `format` must be refused (the superblock is of
    another geometry and holds dirty data), and back at its size the
    cache still loads with every dirty block."""
    origin = stack.ram(32 * MiB)
    c_raw = stack.ram(tclib.Stack.RD_SIZE_KIB * KiB)
    full, short = 16 * MiB // 512, 12 * MiB // 512
    cdev = stack.linear(c_raw, full)
    data = _cache_with_dirty(stack, origin, cdev.path, tag="7a")
    cdev.reload(f"0 {short} linear {c_raw} 0")
    problems = []
    tbl = tclib.TierCache.make_table(origin, cdev.path, BLK, "writeback", fmt=True)
    tc, err, log = create(stack, "tcr7a-fmt", tbl)
    if tc is not None:
        problems.append(f"`format` over a 16 MiB cache's superblock with {len(data)} committed "
                        f"dirty blocks, on the device shrunk to 12 MiB, was accepted: "
                        f"{[x for x in log.splitlines() if 'tiercache' in x][-2:]}")
        tc.remove()
    else:
        tclib.log(f"format refused: {err} / {log.splitlines()[-2:]}")
    cdev.reload(f"0 {full} linear {c_raw} 0")
    p = _verify_loaded(stack, origin, cdev.path, data, "tcr7a-load")
    if p:
        problems.append(p)
    assert not problems, "\n".join(problems)


def test_07_format_refused_on_other_block_size_with_dirty_data(stack):
    """A cache formatted with 4 KiB blocks holding committed dirty blocks:
    a table with 8 KiB blocks and `format` must be refused, and the cache
    then still loads with its dirty blocks."""
    origin = stack.ram(32 * MiB)
    cache = stack.ram(16 * MiB)
    data = _cache_with_dirty(stack, origin, cache, tag="7b")
    problems = []
    tbl = tclib.TierCache.make_table(origin, cache, 16, "writeback", fmt=True)
    tc, err, log = create(stack, "tcr7b-fmt", tbl)
    if tc is not None:
        problems.append(f"`format` with 16-sector blocks over a cache of 8-sector blocks "
                        f"holding {len(data)} committed dirty blocks was accepted")
        tc.remove()
    p = _verify_loaded(stack, origin, cache, data, "tcr7b-load")
    if p:
        problems.append(p)
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------- 13

def _nullb_cache(stack, name):
    """A cache device that counts flushes: dm-linear over a null_blk with
    a volatile write cache (request based: /sys/block/nullbN/stat counts
    flush requests)."""
    nb = stack.nullb(32, discard=False, cache_size=32)
    cdev = stack.linear(nb, name=name)
    return nb, cdev


def _cache_io(nb, cdev):
    return {"nullb": stat_keys(tclib.block_stat(nb)),
            "dm": stat_keys(tclib.block_stat(cdev.path), ("writes", "write_sectors"))}


def _io_delta(after, before):
    return {k: {f: after[k][f] - before[k][f] for f in after[k]} for k in after}


def test_13_no_cache_io_while_suspended(stack):
    """Metadata changes pending (commit_ms 4000), then `dmsetup suspend`:
    from the end of the suspend for 6 s (past commit_ms) nothing may be
    written to or flushed on the cache device (a dm-linear over null_blk)."""
    commit_ms = 4000
    origin = stack.ram(32 * MiB)
    nb, cdev = _nullb_cache(stack, "tcr13a-cdev")
    tc = stack.tiercache(origin, cdev.path, BLK, "writeback",
                         [("commit_ms", commit_ms)], name="tcr13a")
    time.sleep(commit_ms / 1000 + 1)        # udev's probe promotions committed
    s0 = _cache_io(nb, cdev)
    dd_write(tc.path, 2048 * B, rnd("13a-x"))               # + fsync: a commit
    s1 = _cache_io(nb, cdev)
    assert _io_delta(s1, s0)["nullb"]["flushes"] >= 1, \
        f"the null_blk flush counter does not count the fsync's flush: {s0} {s1}"
    y = rnd("13a-y")
    tclib.write_direct(tc.path, 2100 * B, y)                # a change, no commit
    t0 = time.monotonic()
    tc.suspend(timeout=30)
    t_susp = time.monotonic() - t0
    s2 = _cache_io(nb, cdev)
    time.sleep(commit_ms / 1000 + 2)
    s3 = _cache_io(nb, cdev)
    tc.resume()
    assert dd_read(tc.path, 2100 * B, B) == y
    d = _io_delta(s3, s2)
    assert d["nullb"]["flushes"] == 0 and d["nullb"]["write_sectors"] == 0 \
        and d["dm"]["write_sectors"] == 0, \
        (f"I/O reached the cache device while the tiercache device was suspended "
         f"(suspend took {t_susp:.1f} s; {commit_ms / 1000 + 2:.0f} s watched): {d}")


def test_13_idle_cache_does_not_flush(stack):
    """Write, fsync (committed), then idle for 5 s with commit_ms 2000:
    nothing changed, so nothing may be written to or flushed on the cache
    device."""
    commit_ms = 2000
    origin = stack.ram(32 * MiB)
    nb, cdev = _nullb_cache(stack, "tcr13b-cdev")
    tc = stack.tiercache(origin, cdev.path, BLK, "writeback",
                         [("commit_ms", commit_ms)], name="tcr13b")
    time.sleep(commit_ms / 1000 + 1)
    s0 = _cache_io(nb, cdev)
    dd_write(tc.path, 2048 * B, rnd("13b-x"))
    s1 = _cache_io(nb, cdev)
    assert _io_delta(s1, s0)["nullb"]["flushes"] >= 1, \
        f"the null_blk flush counter does not count the fsync's flush: {s0} {s1}"
    time.sleep(2.5 * commit_ms / 1000)
    s2 = _cache_io(nb, cdev)
    d = _io_delta(s2, s1)
    assert d["nullb"]["flushes"] == 0 and d["nullb"]["write_sectors"] == 0 \
        and d["dm"]["write_sectors"] == 0, \
        f"an idle cache with nothing changed wrote or flushed its cache device " \
        f"in {2.5 * commit_ms / 1000:.0f} s: {d}; status {tc.status_line()}"


# ---------------------------------------------------------------- 14

def test_14_passthrough_resume_with_dirty_blocks(stack):
    """A passthrough table loaded while nothing is dirty (accepted), then
    dirty writes through the live writeback table, then `dmsetup resume`:
    the device must not be left suspended, and the writes must be read
    back (and be on the origin if passthrough now runs)."""
    origin = stack.ram(32 * MiB)
    cache = stack.ram(8 * MiB)
    tc = stack.tiercache(origin, cache, BLK, "writeback", name="tcr14")
    X, Y = 2048, 2100
    dd_write(tc.path, X * B, rnd("14-x1"))
    tc.flush()
    assert tc.status()["dirty"] == 0
    tbl = tclib.TierCache.make_table(origin, cache, BLK, "passthrough", fmt=False)
    p = tclib.run(["dmsetup", "load", tc.name, "--table", tbl], check=False, timeout=60)
    assert p.returncode == 0, f"a passthrough load with nothing dirty was refused: {p.stderr}"
    want = {X: rnd("14-x2"), Y: rnd("14-y2")}
    for blk, d in want.items():
        dd_write(tc.path, blk * B, d)
    dirty = tc.status()["dirty"]
    tclib.log(f"dirty before the resume: {dirty}")
    p = tclib.run(["dmsetup", "resume", tc.name], check=False, timeout=60)
    info = dm_info(tc.name)
    assert info is not None, "the device vanished"
    if info.get("State") != "ACTIVE":
        pytest.fail(f"`dmsetup resume` {'failed: ' + clean_err(p.stderr) if p.returncode else 'succeeded'}"
                    f" and the device is left {info.get('State')} with tables "
                    f"'{info.get('Tables present')}' (live table: "
                    f"{tclib.run(['dmsetup', 'table', tc.name], check=False, quiet=True).stdout.strip()})",
                    pytrace=False)
    tclib.run(["dmsetup", "mknodes", tc.name], quiet=True)
    st = tc.status()
    for blk, d in want.items():
        got = dd_read(tc.path, blk * B, B)
        assert got == d, f"block {blk} lost after the resume (mode {st['mode']}, dirty {st['dirty']})"
    if st["mode"] == "passthrough":
        for blk, d in want.items():
            assert dd_read(origin, blk * B, B) == d, \
                f"passthrough runs but block {blk} is not on the origin"
    else:
        assert p.returncode != 0, f"resume succeeded but the mode is {st['mode']}"


# ---------------------------------------------------------------- R

def _dirty_device(stack, tag, n=32):
    origin = stack.ram(32 * MiB)
    cache = stack.ram(8 * MiB)
    tc = stack.tiercache(origin, cache, BLK, "writeback", [("commit_ms", 1000)],
                         name=f"tcr{tag}")
    return origin, cache, tc, _write_dirty(tc, tag, n)


def _writes(origin, cache):
    return {"origin": tclib.block_stat(origin)["write_sectors"],
            "cache": tclib.block_stat(cache)["write_sectors"]}


def test_R_readonly_reload_writes_nothing(stack):
    """A device with dirty blocks reloaded read-only: a `flush` message is
    refused or does nothing, nothing is written to the origin or the cache
    device (3 s watched, commit_ms 1000), and the dirty data reads back."""
    origin, cache, tc, data = _dirty_device(stack, "R1")
    line = tc.table_line()
    tclib.run(["dmsetup", "load", "--readonly", tc.name, "--table", line], timeout=60)
    tclib.run(["dmsetup", "resume", tc.name], timeout=60)
    tclib.run(["dmsetup", "mknodes", tc.name], quiet=True)
    settle_new(tc)
    assert tclib.run(["blockdev", "--getro", tc.path], quiet=True).stdout.strip() == "1"
    w0 = _writes(origin, cache)
    p = tc.message("flush", check=False)
    tclib.log(f"flush message on the read-only table: rc {p.returncode} {p.stderr.strip()}")
    time.sleep(3)
    w1 = _writes(origin, cache)
    bad = [blk for blk, d in data.items() if dd_read(tc.path, blk * B, B) != d]
    w2 = _writes(origin, cache)
    st = tc.status()
    d = {k: w2[k] - w0[k] for k in w0}
    assert d == {"origin": 0, "cache": 0} and not bad, \
        (f"read-only table: sectors written since the reload {d} (before the reads: "
         f"{ {k: w1[k] - w0[k] for k in w0} }), flush message rc {p.returncode}, "
         f"{len(bad)} dirty blocks read wrong; status {st['raw']}")


def test_R_readonly_create_writes_nothing(stack):
    """A cache with committed dirty blocks loaded by a read-only
    `dmsetup create` (no format): creating, reading (hits and misses), a
    `flush` message and `dmsetup remove` write nothing to either device,
    and the dirty data reads back."""
    origin, cache, tc, data = _dirty_device(stack, "R2")
    line = tc.table_line()
    tc.remove()
    w0 = _writes(origin, cache)
    tc2, err, log = create(stack, "tcrR2-ro", line, readonly=True)
    assert tc2 is not None, f"read-only create refused: {clean_err(err)} / {log[-400:]}"
    settle_new(tc2)
    w1 = _writes(origin, cache)
    bad = [blk for blk, d in data.items() if dd_read(tc2.path, blk * B, B) != d]
    dd_read(tc2.path, 5000 * B, B)                          # a miss
    p = tc2.message("flush", check=False)
    time.sleep(3)
    w2 = _writes(origin, cache)
    tc2.remove()
    w3 = _writes(origin, cache)
    steps = {"create (+ udev probe)": {k: w1[k] - w0[k] for k in w0},
             "reads, flush message, 3 s": {k: w2[k] - w1[k] for k in w0},
             "remove": {k: w3[k] - w2[k] for k in w0}}
    written = {s: d for s, d in steps.items() if any(d.values())}
    assert not written and not bad, \
        (f"read-only table wrote sectors: {written}; flush message rc {p.returncode}; "
         f"{len(bad)} dirty blocks read wrong")
