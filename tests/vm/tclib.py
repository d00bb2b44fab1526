# SPDX-License-Identifier: GPL-2.0
"""Helpers for the in-VM tests of dm-tiercache.

Everything here runs as root inside the test VM (see tests/vm/inside.sh).
The interface under test is docs/tiercache.rst: the table line, the
positional status fields and the messages.

Resources (RAM disks, dm devices, null_blk devices) are created through a
Stack, which tears them down in reverse order however the test ends.
"""

import contextlib
import math
import mmap
import os
import random
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import tcdisk

REPO = Path(__file__).resolve().parents[2]
KO = Path(os.environ.get("TIERCACHE_KO", REPO / "dm-tiercache" / "dm-tiercache.ko"))
MODNAME = "dm_tiercache"
TARGET = "tiercache"

SECTOR = 512
# A new disk is probed (udev's blkid, partition scan) as soon as it exists:
# its first and last blocks may already be cached (clean) when a test
# starts.  Tests that count hits/misses stay this far from both ends.
SCAN_MARGIN = 4 * 1024 * 1024
KiB = 1024
MiB = 1024 * 1024

ENV = dict(os.environ, DM_DISABLE_UDEV="1", LC_ALL="C")

# writable scratch directory (the guest's root file system is read-only)
WORKDIR = os.environ.get("TMPDIR", "/tmp")

# dm devices owned by module-scoped stacks: the per-test clean-slate check
# leaves them alone (and those of TC_KEEP_DM: a run inside a test's run)
KEEP = set(os.environ.get("TC_KEEP_DM", "").split())


class CmdError(Exception):
    def __init__(self, cmd, rc, out, err):
        self.cmd, self.rc, self.out, self.err = cmd, rc, out, err
        super().__init__(f"command failed (rc={rc}): {shlex.join(cmd)}\n"
                         f"stdout: {out.strip()}\nstderr: {err.strip()}")


_T0 = time.monotonic()


def log(msg):
    """A line on stderr (pytest.log), with the seconds since the run began:
    where a slow test spends its time."""
    print(f"[tclib {time.monotonic() - _T0:7.1f}] {msg}", file=sys.stderr, flush=True)


def run(cmd, check=True, timeout=120, input=None, quiet=False, cwd=None):
    """Run a command (list or string), return CompletedProcess (text).

    On timeout the command is killed and TimeoutExpired raised without
    waiting for it to die (a command stuck in the kernel cannot die).
    """
    if isinstance(cmd, str):
        cmd = shlex.split(cmd)
    cmd = [str(c) for c in cmd]
    if not quiet:
        log("$ " + shlex.join(cmd))
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                         text=True, env=ENV, cwd=cwd)
    try:
        out, err = p.communicate(input=input, timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        try:
            p.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            log(f"pid {p.pid} does not die (stuck in the kernel?)")
        log(f"TIMEOUT after {timeout}s: {shlex.join(cmd)}")
        raise subprocess.TimeoutExpired(cmd, timeout)
    except BaseException:
        # the test's time limit (conftest.py) or ^C: the command must not
        # outlive its test, holding devices the next one needs
        p.kill()
        raise
    cp = subprocess.CompletedProcess(cmd, p.returncode, out, err)
    if check and p.returncode != 0:
        raise CmdError(cmd, p.returncode, out, err)
    return cp


def kmsg(text):
    """Write a marker line into the kernel log."""
    try:
        with open("/dev/kmsg", "w") as f:
            f.write(f"tiercache-test: {text}\n")
    except OSError:
        pass


def dmesg_lines():
    return run(["dmesg"], quiet=True).stdout.splitlines()


class KmsgCursor:
    """Collect kernel log lines written after creation (via a marker)."""

    _n = 0

    def __init__(self, tag="mark"):
        KmsgCursor._n += 1
        self.marker = f"tiercache-test: {tag}-{os.getpid()}-{KmsgCursor._n}-{time.monotonic_ns()}"
        kmsg(self.marker.split(": ", 1)[1])

    def lines(self):
        out = dmesg_lines()
        for i in range(len(out) - 1, -1, -1):
            if self.marker in out[i]:
                return out[i + 1:]
        return out  # marker rotated out (unlikely): return everything


# ---------------------------------------------------------------- stuck tasks

PF_KTHREAD = 0x00200000


def _task_stats():
    """/proc/PID/task/TID/stat of every thread; a process that exits during
    the walk is skipped (pathlib's glob lets that error out)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            yield Path(f"/proc/{pid}/task/{tid}/stat")


def blocked_tasks():
    """Threads of user processes in uninterruptible sleep (state D), as
    {tid: comm}.  Every thread is looked at: a process that exited with a
    thread stuck in the kernel is a zombie whose stuck thread lives on.
    Kernel threads are left out (a flusher waiting for its IO is routine)."""
    out = {}
    for tid_stat in _task_stats():
        try:
            stat = tid_stat.read_text()
        except OSError:
            continue                    # gone meanwhile
        # "tid (comm) state ppid pgrp session tty tpgid flags ...": comm may
        # hold spaces and parentheses, the fields after its last ")" do not
        head, _, rest = stat.rpartition(")")
        fields = rest.split()
        if len(fields) > 6 and fields[0] == "D" and not int(fields[6]) & PF_KTHREAD:
            out[int(tid_stat.parent.name)] = head.partition("(")[2]
    return out


def stuck_tasks(patience=30.0, poll=1.0):
    """Threads that stay in state D for @patience seconds: IO or a dm ioctl
    the kernel does not complete.  {tid: comm}; empty at once when no
    thread is in state D."""
    stuck = blocked_tasks()
    end = time.monotonic() + patience
    while stuck and time.monotonic() < end:
        time.sleep(poll)
        now = blocked_tasks()
        stuck = {t: c for t, c in stuck.items() if now.get(t) == c}
    return stuck


def sysrq(key):
    """Ask the kernel for a report (w: blocked tasks, l: every CPU's stack)."""
    try:
        Path("/proc/sysrq-trigger").write_text(key + "\n")
    except OSError:
        pass


# ---------------------------------------------------------------- block devs

def devno(path):
    st = os.stat(path)
    return f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"


def size_sectors(path):
    return int(run(["blockdev", "--getsz", path], quiet=True).stdout)


def size_bytes(path):
    return size_sectors(path) * SECTOR


STAT_FIELDS = ["reads", "reads_merged", "read_sectors", "read_ticks",
               "writes", "writes_merged", "write_sectors", "write_ticks",
               "in_flight", "io_ticks", "time_in_queue",
               "discards", "discards_merged", "discard_sectors", "discard_ticks",
               "flushes", "flush_ticks"]


def block_stat(path):
    """/sys/block/<dev>/stat of a block device node as a dict."""
    vals = Path(f"/sys/dev/block/{devno(path)}/stat").read_text().split()
    return {k: int(v) for k, v in zip(STAT_FIELDS, vals)}


def settle(path, quiet_s=0.6, timeout=20):
    """Wait until the device's read/write counters stop moving (e.g. the
    kernel's partition scan of a new disk); return its stat."""
    deadline = time.monotonic() + timeout
    prev, since = block_stat(path), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.1)
        cur = block_stat(path)
        if (cur["reads"], cur["writes"], cur["in_flight"]) != \
                (prev["reads"], prev["writes"], prev["in_flight"]):
            prev, since = cur, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return cur
    return prev


def stat_delta(after, before):
    return {k: after[k] - before[k] for k in after}


def stat_delta_when(path, before, ok, timeout=5):
    """The device's stat delta since `before` once ok(delta) holds (or at
    the timeout).  A request-based disk (null_blk, scsi_debug) completes the
    bio, waking the submitter, before it accounts the request, so a stat
    read just after the I/O returns can still miss it."""
    deadline = time.monotonic() + timeout
    while True:
        d = stat_delta(block_stat(path), before)
        if ok(d) or time.monotonic() >= deadline:
            return d
        time.sleep(0.05)


def sysfs_queue(path, attr):
    return Path(f"/sys/dev/block/{devno(path)}/queue/{attr}").read_text().strip()


BLKDISCARD = 0x1277


def discard(path, offset, length):
    """BLKDISCARD ioctl (blkdiscard(8) would first probe the device with
    libblkid, i.e. read it, which disturbs the cache's counters)."""
    import fcntl
    import struct
    log(f"BLKDISCARD {path} offset {offset} length {length}")
    fd = os.open(path, os.O_WRONLY)
    try:
        fcntl.ioctl(fd, BLKDISCARD, struct.pack("QQ", offset, length))
    finally:
        os.close(fd)


def flushbufs(path):
    run(["blockdev", "--flushbufs", path], quiet=True)


def drop_caches():
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def aligned_buf(size):
    """Page-aligned anonymous buffer usable for O_DIRECT."""
    return mmap.mmap(-1, max(size, mmap.PAGESIZE))


def write_direct(path, offset, data):
    """O_DIRECT write of bytes-like data (offset/len multiples of 512)."""
    buf = aligned_buf(len(data))
    buf[:len(data)] = data
    fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
    try:
        n = os.pwrite(fd, memoryview(buf)[:len(data)], offset)
        assert n == len(data), f"short write {n} != {len(data)} at {offset}"
    finally:
        os.close(fd)
        buf.close()


def read_direct(path, offset, length):
    buf = aligned_buf(length)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        n = os.preadv(fd, [memoryview(buf)[:length]], offset)
        assert n == length, f"short read {n} != {length} at {offset}"
        return bytes(buf[:length])
    finally:
        os.close(fd)
        buf.close()


def fill_device(path, data, chunk=MiB):
    """Write data to the start of the device with O_DIRECT, in chunks."""
    buf = aligned_buf(chunk)
    fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
    try:
        mv = memoryview(data)
        for off in range(0, len(data), chunk):
            n = min(chunk, len(data) - off)
            buf[:n] = mv[off:off + n]
            assert os.pwrite(fd, memoryview(buf)[:n], off) == n
        os.fsync(fd)
    finally:
        os.close(fd)
        buf.close()


def hexdump16(b):
    return " ".join(f"{x:02x}" for x in b[:16])


def compare(expected, got, base, what=""):
    """Assert two byte strings are equal, naming the first bad offset."""
    if expected == got:
        return
    n = min(len(expected), len(got))
    if len(expected) != len(got):
        raise AssertionError(f"{what}: length {len(got)} != expected {len(expected)}")
    # find first mismatch quickly: bisect on equal halves
    lo = 0
    step = 1 << 20
    while step >= 1:
        while lo + step <= n and expected[lo:lo + step] == got[lo:lo + step]:
            lo += step
        step >>= 1
    first = lo
    # count mismatching sectors in this chunk
    bad_sectors = sum(1 for s in range(0, n, SECTOR)
                      if expected[s:s + SECTOR] != got[s:s + SECTOR])
    last = n - 1
    while last > first and expected[last] == got[last]:
        last -= 1
    raise AssertionError(
        f"{what}: data mismatch at device offset {base + first} "
        f"(sector {(base + first) // SECTOR}, 4k-block {(base + first) // 4096}); "
        f"last mismatch in this chunk at {base + last}; "
        f"{bad_sectors} bad 512B sectors in [{base}, {base + n}); "
        f"expected {hexdump16(expected[first:])} got {hexdump16(got[first:])}")


# ---------------------------------------------------------------- model

# (size, seed) -> (pattern, generator state after it): under emulation a
# 64 MiB pattern takes seconds to generate, and most tests ask for the same few
_PATTERNS = {}
_PATTERNS_MAX_BYTES = 256 * MiB


def seeded_pattern(size, seed):
    """The `size` bytes random.Random(seed) gives first, and its state after."""
    key = (size, seed)
    hit = _PATTERNS.get(key)
    if hit is None:
        rng = random.Random(seed)
        hit = (rng.randbytes(size), rng.getstate())
        while _PATTERNS and sum(len(p) for p, _ in _PATTERNS.values()) + size > \
                _PATTERNS_MAX_BYTES:
            _PATTERNS.pop(next(iter(_PATTERNS)))
        if size <= _PATTERNS_MAX_BYTES:
            _PATTERNS[key] = hit
    return hit


class Model:
    """Expected content of a device; seeded pattern writes; verification."""

    def __init__(self, size, seed=1, initial=None):
        self.size = size
        self.rng = random.Random(seed)
        if initial is None:
            # as self.rng.randbytes(size), made once per (size, seed)
            initial, state = seeded_pattern(size, seed)
            self.rng.setstate(state)
        assert len(initial) == size
        self.data = bytearray(initial)
        self.stats = {"direct_writes": 0, "buffered_writes": 0, "bytes": 0,
                      "reads": 0}

    def verify_device(self, path, chunk=MiB, what=None, start=0, end=None):
        """O_DIRECT read of [start, end) compared with the model."""
        end = self.size if end is None else end
        what = what or f"verify {path}"
        buf = aligned_buf(chunk)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            mv = memoryview(self.data)
            for off in range(start, end, chunk):
                n = min(chunk, end - off)
                got = os.preadv(fd, [memoryview(buf)[:n]], off)
                assert got == n, f"short read {got} at {off}"
                if buf[:n] != mv[off:off + n]:
                    compare(bytes(mv[off:off + n]), bytes(buf[:n]), off, what)
        finally:
            os.close(fd)
            buf.close()

    def verify_buffered(self, path, nreads=64, seed=7, what=None):
        """Random unaligned buffered reads (after dropping the page cache)."""
        what = what or f"buffered verify {path}"
        flushbufs(path)
        rng = random.Random(seed)
        fd = os.open(path, os.O_RDONLY)
        try:
            for _ in range(nreads):
                length = rng.randint(1, 256 * KiB)
                off = rng.randrange(0, self.size - length)
                got = os.pread(fd, length, off)
                exp = bytes(self.data[off:off + length])
                if got != exp:
                    compare(exp, got, off, what)
        finally:
            os.close(fd)


class Workload:
    """Seeded mix of writes and verifying reads against a Model.

    Request sizes are 512 B .. 1 MiB (log-uniform); "aligned" requests are
    sector aligned and use O_DIRECT with page-aligned buffers, some of them
    block aligned; "unaligned" requests have byte offsets/lengths and go
    through the page cache.  Sequential streams continue where the previous
    request of the stream ended.
    """

    def __init__(self, path, model, seed=1, block_bytes=4096, region=None):
        self.path = path
        self.m = model
        self.rng = random.Random(seed)
        self.bb = block_bytes
        self.region = region or (0, model.size)
        self.buf = aligned_buf(MiB)
        self.fd_d = os.open(path, os.O_RDWR | os.O_DIRECT)
        self.fd_b = os.open(path, os.O_RDWR)
        self.seq_pos = self.region[0]
        self.log = []

    def close(self):
        os.fsync(self.fd_b)
        os.close(self.fd_b)
        os.close(self.fd_d)
        self.buf.close()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()

    def _size(self, lo=SECTOR, hi=MiB):
        return int(math.exp(self.rng.uniform(math.log(lo), math.log(hi))))

    def _pick(self, length, align, sequential):
        lo, hi = self.region
        if sequential:
            off = self.seq_pos
            off -= off % align
            if off + length > hi:
                off = lo
        else:
            off = self.rng.randrange(lo, hi - length + 1)
            off -= off % align
            off = max(off, lo)
        self.seq_pos = off + length
        return off

    def write_direct(self, off, length):
        data = self.rng.randbytes(length)
        self.buf[:length] = data
        n = os.pwrite(self.fd_d, memoryview(self.buf)[:length], off)
        assert n == length, f"short direct write {n}/{length} at {off}"
        self.m.data[off:off + length] = data
        self.m.stats["direct_writes"] += 1
        self.m.stats["bytes"] += length

    def write_buffered(self, off, length):
        data = self.rng.randbytes(length)
        n = os.pwrite(self.fd_b, data, off)
        assert n == length, f"short buffered write {n}/{length} at {off}"
        self.m.data[off:off + length] = data
        self.m.stats["buffered_writes"] += 1
        self.m.stats["bytes"] += length

    def read_check(self, off, length, direct):
        if direct:
            n = os.preadv(self.fd_d, [memoryview(self.buf)[:length]], off)
            got = bytes(self.buf[:n])
        else:
            got = os.pread(self.fd_b, length, off)
        self.m.stats["reads"] += 1
        exp = bytes(self.m.data[off:off + length])
        if got != exp:
            compare(exp, got, off, f"read-back ({'direct' if direct else 'buffered'}) "
                                   f"after {len(self.log)} ops")

    def step(self, read_frac=0.25, unaligned_frac=0.3, seq_frac=0.3,
             block_aligned_frac=0.5, max_len=MiB):
        r = self.rng.random
        sequential = r() < seq_frac
        is_read = r() < read_frac
        if r() < unaligned_frac:
            length = max(1, self._size(SECTOR, max_len) - self.rng.randrange(0, SECTOR))
            off = self._pick(length, 1, sequential)
            kind = ("read" if is_read else "write") + "-buffered"
            if is_read:
                self.read_check(off, length, False)
            else:
                self.write_buffered(off, length)
        else:
            if r() < block_aligned_frac:
                align = self.bb
                length = max(self.bb, self._size(self.bb, max_len) // self.bb * self.bb)
            else:
                align = SECTOR
                length = max(SECTOR, self._size(SECTOR, max_len) // SECTOR * SECTOR)
            off = self._pick(length, align, sequential)
            kind = ("read" if is_read else "write") + "-direct"
            if is_read:
                self.read_check(off, length, True)
            else:
                self.write_direct(off, length)
        self.log.append((kind, off, length, sequential))

    def run(self, nops, **kw):
        for _ in range(nops):
            self.step(**kw)
        os.fsync(self.fd_b)

    def summary(self):
        kinds = {}
        for k, _, ln, seq in self.log:
            key = k + ("-seq" if seq else "-rand")
            c = kinds.setdefault(key, [0, 0])
            c[0] += 1
            c[1] += ln
        return ", ".join(f"{k}={c[0]}/{c[1] // KiB}KiB" for k, c in sorted(kinds.items()))


# ---------------------------------------------------------------- dm

def dm_names():
    out = run(["dmsetup", "ls"], quiet=True).stdout
    if "No devices found" in out:
        return []
    return [ln.split()[0] for ln in out.splitlines() if ln.strip()]


def ensure_node(name):
    """/dev/mapper/<name>, made by dmsetup itself (DM_DISABLE_UDEV=1 in
    ENV); `dmsetup mknodes` only when it is missing: a process costs about
    0.3 s under emulation, and a suite creates some 800 devices."""
    if not os.path.exists(f"/dev/mapper/{name}"):
        run(["dmsetup", "mknodes", name], quiet=True)


class DmDevice:
    def __init__(self, name, table):
        self.name = name
        self.table = table
        self.path = f"/dev/mapper/{name}"
        self.removed = False

    @classmethod
    def create(cls, name, table, **kw):
        run(["dmsetup", "create", name, "--table", table])
        ensure_node(name)
        dev = cls(name, table, **kw) if kw else cls(name, table)
        return dev

    def reload(self, table, resume=True):
        run(["dmsetup", "reload", self.name, "--table", table])
        if resume:
            self.resume()
            self.table = table

    def suspend(self, timeout=300):
        run(["dmsetup", "suspend", self.name], timeout=timeout)

    def resume(self):
        run(["dmsetup", "resume", self.name])
        ensure_node(self.name)

    def message(self, *words, check=True):
        return run(["dmsetup", "message", self.name, "0"] + [str(w) for w in words],
                   check=check)

    def status_line(self):
        return run(["dmsetup", "status", self.name], quiet=True).stdout.strip()

    def table_line(self):
        return run(["dmsetup", "table", self.name], quiet=True).stdout.strip()

    def event_nr(self):
        return int(run(["dmsetup", "info", "-c", "--noheadings", "-o", "events",
                        self.name], quiet=True).stdout.strip())

    def wait_event(self, event_nr, timeout=120):
        """dmsetup wait NAME event_nr: returns when the counter moves past."""
        try:
            run(["dmsetup", "wait", self.name, str(event_nr)], timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"dmsetup wait {self.name} {event_nr}: no dm event "
                                 f"within {timeout}s; status: {self.status_line()}")

    def stat(self):
        return block_stat(self.path)

    def remove(self, patience=60):
        """dmsetup remove, waiting out udev: a device whose reads fail
        slowly (dm-delay over error) can be held open by udev's blkid probe
        for longer than `dmsetup remove --retry` retries (about 5 s).  Retry
        for `patience` seconds after settling udev; a device still open
        then is a real leak and the error names who holds it."""
        if self.removed:
            return
        deadline = time.monotonic() + patience
        while True:
            try:
                run(["dmsetup", "remove", "--retry", self.name], timeout=300)
                break
            except CmdError as e:
                if time.monotonic() >= deadline:
                    raise CmdError(e.cmd, e.rc, e.out,
                                   f"{e.err}\nopen count/holders: {self._holders()}")
                run(["udevadm", "settle", "--timeout=30"], check=False, quiet=True)
                time.sleep(1)
        self.removed = True

    def _holders(self):
        info = run(["dmsetup", "info", "-c", "--noheadings", "-o", "open,blkdevname",
                    self.name], check=False, quiet=True).stdout.strip()
        try:
            dev = info.split(":")[-1]
            return f"{info}; holders {os.listdir(f'/sys/block/{dev}/holders')}"
        except (OSError, IndexError):
            return info

    def __repr__(self):
        return f"<dm {self.name}: {self.table}>"


# ---------------------------------------------------------------- tiercache

STATUS_FIELDS = ["mode", "block_size", "used_total", "dirty", "read_hits",
                 "read_misses", "write_hits", "write_misses", "write_bypass",
                 "flush_state", "wb_blocks", "wb_requests", "wb_sectors",
                 "avg_write_kb", "merge_ratio", "bridged_blocks", "inflight_max",
                 "error", "flushes", "cleaner", "meta_commits", "meta_error",
                 "cache_failed", "epoch_oldest", "epoch_current"]
# Appended fields a module may not print yet (None when absent); the two
# epoch fields come together
STATUS_OPTIONAL = ("cache_failed", "epoch_oldest", "epoch_current")
MODES = ("writeback", "writethrough", "passthrough")
FLUSH_STATES = ("idle", "flushing", "background", "cleaning")


class StatusError(AssertionError):
    pass


def parse_status(line):
    """Map a tiercache status line (docs/tiercache.rst, Status) to a dict.

    Accepts the line with or without the leading '<start> <len> tiercache'.
    Validates every documented field's syntax; the fields of
    STATUS_OPTIONAL are None when the module does not print them (the
    epochs, 24 and 25, both or neither, and epoch_oldest <= epoch_current);
    extra (appended) fields are kept in 'extra'.
    """
    words = line.split()
    d = {}
    if len(words) >= 3 and words[2] == TARGET:
        d["start"], d["len"] = int(words[0]), int(words[1])
        words = words[3:]
    required = len(STATUS_FIELDS) - len(STATUS_OPTIONAL)
    if len(words) < required:
        raise StatusError(f"status has {len(words)} fields, expected >= "
                          f"{required}: {line!r}")
    raw = dict(zip(STATUS_FIELDS, words))

    def num(k, pat=r"-?\d+"):
        if not re.fullmatch(pat, raw[k]):
            raise StatusError(f"status field {k}={raw[k]!r} malformed in {line!r}")
        return int(raw[k])

    if raw["mode"] not in MODES:
        raise StatusError(f"status mode {raw['mode']!r} not one of {MODES}")
    d["mode"] = raw["mode"]
    d["block_size"] = num("block_size", r"\d+")
    m = re.fullmatch(r"(\d+)/(\d+)", raw["used_total"])
    if not m:
        raise StatusError(f"status used/total {raw['used_total']!r} malformed")
    d["used"], d["total"] = int(m.group(1)), int(m.group(2))
    for k in ("dirty", "read_hits", "read_misses", "write_hits", "write_misses",
              "write_bypass", "wb_blocks", "wb_requests", "wb_sectors",
              "avg_write_kb", "bridged_blocks", "inflight_max", "flushes"):
        d[k] = num(k, r"\d+")
    if raw["flush_state"] not in FLUSH_STATES:
        raise StatusError(f"status flush_state {raw['flush_state']!r} not one of "
                          f"{FLUSH_STATES}")
    d["flush_state"] = raw["flush_state"]
    if not re.fullmatch(r"\d+\.\d\d", raw["merge_ratio"]):
        raise StatusError(f"status merge_ratio {raw['merge_ratio']!r} is not a "
                          f"number with two decimals")
    d["merge_ratio"] = float(raw["merge_ratio"])
    d["error"] = num("error", r"0|-\d+")
    d["cleaner"] = num("cleaner", r"[01]")
    d["meta_commits"] = num("meta_commits", r"\d+")
    d["meta_error"] = num("meta_error", r"0|-\d+")
    d["cache_failed"] = num("cache_failed", r"0|-\d+") if "cache_failed" in raw else None
    if ("epoch_oldest" in raw) != ("epoch_current" in raw):
        raise StatusError(f"status has epoch_oldest without epoch_current: {line!r}")
    for k in ("epoch_oldest", "epoch_current"):
        d[k] = num(k, r"\d+") if k in raw else None
    if d["epoch_oldest"] is not None and d["epoch_oldest"] > d["epoch_current"]:
        raise StatusError(f"status epoch_oldest {d['epoch_oldest']} is after epoch_current "
                          f"{d['epoch_current']} in {line!r}")
    d["extra"] = words[len(STATUS_FIELDS):]
    d["raw"] = line
    return d


def tc_slots(cache_sectors, block=8):
    """Slots of a cache device a format makes (tc_disk_layout())."""
    return tcdisk.layout(cache_sectors, block)[0]


def tc_data_start(cache_sectors, block=8):
    """First sector of the data area of a cache device a format makes."""
    return tcdisk.layout(cache_sectors, block)[1]


class TierCache(DmDevice):
    """A tiercache dm device built from the documented table line."""

    def __init__(self, name, table, origin=None, cache=None):
        super().__init__(name, table)
        self.origin = origin
        self.cache = cache

    @staticmethod
    def make_table(origin, cache, block=8, mode=None, keys=(), length=None,
                   nfeat=None, fmt=True):
        """fmt: add the 'format' feature argument (a new cache; not
        re-emitted by dmsetup table, ignored by a reload)."""
        length = size_sectors(origin) if length is None else length
        feat = (["format"] if fmt else []) + ([mode] if mode else [])
        for k, v in (keys.items() if isinstance(keys, dict) else keys):
            feat += [k, str(v)]
        n = len(feat) if nfeat is None else nfeat
        return " ".join([f"0 {length} {TARGET} {origin} {cache} {block} {n}"] + feat)

    def status(self):
        return parse_status(self.status_line())


    def wait_idle(self, timeout=120, want_clean=True):
        """Poll until flush_state is idle (and dirty == 0 if want_clean)."""
        deadline = time.monotonic() + timeout
        while True:
            st = self.status()
            if st["flush_state"] == "idle" and (not want_clean or st["dirty"] == 0
                                                or st["error"]):
                return st
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: not idle/clean after {timeout}s: "
                                     f"{st['raw']}")
            time.sleep(0.1)

    def flush(self, timeout=180, expect_clean=True):
        """Full flush: message, dmsetup wait on the event, then check status."""
        before = self.status()
        ev = self.event_nr()
        self.message("flush")
        self.wait_event(ev, timeout=timeout)
        st = self.wait_idle(timeout=timeout, want_clean=expect_clean)
        if expect_clean:
            assert st["error"] == 0, f"flush latched error {st['error']}: {st['raw']}"
            assert st["dirty"] == 0, f"dirty {st['dirty']} after flush: {st['raw']}"
            assert st["flushes"] >= before["flushes"] + 1, \
                f"flushes did not advance ({before['flushes']} -> {st['flushes']})"
        return st


# ---------------------------------------------------------------- modules

def module_loaded(name=MODNAME):
    return Path(f"/sys/module/{name}").exists()


def ensure_module():
    """Load dm-tiercache.ko if needed; fail (not skip) if it cannot be."""
    import pytest
    if module_loaded():
        return
    if not KO.exists():
        pytest.fail(f"{KO} does not exist: the module was not built", pytrace=False)
    run(["modprobe", "dm-mod"], check=False)
    run(["modprobe", "libcrc32c"], check=False)   # insmod does not resolve it
    p = run(["insmod", str(KO)], check=False)
    if p.returncode != 0 or not module_loaded():
        pytest.fail(f"insmod {KO} failed: {p.stderr.strip()}\n"
                    + "\n".join(dmesg_lines()[-20:]), pytrace=False)


def unload_module():
    run(["rmmod", MODNAME])


# ---------------------------------------------------------------- stack

class Setup:
    def __init__(self, origin, cache, tc, model):
        self.origin, self.cache, self.tc, self.model = origin, cache, tc, model


class Stack:
    """Owns test resources; close() tears everything down in reverse order."""

    RD_NR = 6
    RD_SIZE_KIB = 256 * 1024

    def __init__(self, prefix="tc", keep=False):
        self.prefix = prefix
        self.keep = keep
        self.es = contextlib.ExitStack()
        self.brd_next = 0
        self.nullb_next = 0
        self.n = 0
        self.errors = []

    def _name(self, kind):
        self.n += 1
        return f"{self.prefix}-{kind}{self.n}"

    def close(self):
        try:
            self.es.close()
        except Exception as e:  # keep going, report later
            self.errors.append(repr(e))
        return self.errors

    def _defer(self, fn, *a):
        def wrapped():
            try:
                fn(*a)
            except Exception as e:
                self.errors.append(f"teardown {fn.__name__}{a}: {e}")
        self.es.callback(wrapped)

    # --- RAM disks
    def _load_brd(self):
        if Path("/sys/module/brd").exists():
            self._unload_brd()  # leftover of an earlier test: start empty
        run(["modprobe", "brd", f"rd_nr={self.RD_NR}", f"rd_size={self.RD_SIZE_KIB}"])
        self._defer(self._unload_brd)

    @staticmethod
    def _unload_brd():
        for _ in range(50):
            if run(["rmmod", "brd"], check=False, quiet=True).returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError("rmmod brd failed: a RAM disk is still in use")

    def ram(self, size):
        """A RAM disk of `size` bytes (a brd disk, sliced with dm-linear)."""
        assert size % SECTOR == 0 and size <= self.RD_SIZE_KIB * KiB
        if self.brd_next == 0:
            self._load_brd()
        assert self.brd_next < self.RD_NR, "out of RAM disks"
        dev = f"/dev/ram{self.brd_next}"
        self.brd_next += 1
        if size == self.RD_SIZE_KIB * KiB:
            return dev
        return self.dm(self._name("ram"), f"0 {size // SECTOR} linear {dev} 0").path

    # --- null_blk (configfs), discard capable, memory backed
    def nullb(self, size_mib, discard=True, blocksize=512, **attrs):
        cfs = Path("/sys/kernel/config")
        if not (cfs / "nullb").exists():
            run(["modprobe", "null_blk", "nr_devices=0"])
            if not (cfs / "nullb").exists():
                run(["mount", "-t", "configfs", "none", str(cfs)], check=False)
        name = f"tcnb{self.nullb_next}"
        self.nullb_next += 1
        d = cfs / "nullb" / name
        d.mkdir()
        self._defer(self._rm_nullb, d)
        settings = dict(size=size_mib, memory_backed=1, blocksize=blocksize,
                        discard=int(discard))
        settings.update(attrs)
        for k, v in settings.items():
            (d / k).write_text(f"{v}\n")
        (d / "power").write_text("1\n")
        path = f"/dev/{name}"
        for _ in range(50):
            if Path(path).exists():
                break
            time.sleep(0.1)
        assert Path(path).exists(), f"{path} did not appear"
        return path

    @staticmethod
    def _rm_nullb(d):
        try:
            (d / "power").write_text("0\n")
        except OSError:
            pass
        d.rmdir()

    # --- dm devices
    def dm(self, name, table, cls=DmDevice, **kw):
        dev = cls.create(name, table, **kw)
        if self.keep:
            KEEP.add(name)
            self._defer(KEEP.discard, name)
        self._defer(dev.remove)
        return dev

    def linear(self, backing, length=None, name=None):
        length = size_sectors(backing) if length is None else length
        return self.dm(name or self._name("lin"), f"0 {length} linear {backing} 0")

    def slow(self, size=None, read_ms=0, write_ms=0, backing=None, name=None):
        """dm-delay over a RAM disk (or `backing`): the slow origin."""
        backing = backing or self.ram(size)
        n = size_sectors(backing)
        return self.dm(name or self._name("slow"),
                       f"0 {n} delay {backing} 0 {read_ms} {backing} 0 {write_ms}")

    def flakey_table(self, backing, up=3600, down=0, features=()):
        n = size_sectors(backing)
        t = f"0 {n} flakey {backing} 0 {up} {down}"
        if features:
            t += f" {len(features)} " + " ".join(features)
        return t

    def setup(self, origin_mib=64, cache_mib=16, block=8, mode=None, keys=(),
              read_ms=0, write_ms=0, seed=None):
        """Slow origin (dm-delay over RAM) + RAM cache + tiercache.

        With a seed, the origin is first filled with a seeded pattern and
        the returned .model holds it.
        """
        backing = self.ram(origin_mib * MiB)
        # seeded on the RAM disk: a write through dm-delay waits write_ms
        model = seeded_origin(backing, seed=seed) if seed is not None else None
        origin = self.slow(backing=backing, read_ms=read_ms, write_ms=write_ms)
        cache = self.ram(cache_mib * MiB)
        tc = self.tiercache(origin.path, cache, block, mode, keys)
        return Setup(origin, cache, tc, model)

    def tiercache(self, origin, cache, block=8, mode=None, keys=(), name=None,
                  length=None, fmt=True):
        ensure_module()
        table = TierCache.make_table(origin, cache, block, mode, keys, length,
                                     fmt=fmt)
        tc = self.dm(name or self._name("cache"), table, cls=TierCache,
                     origin=origin, cache=cache)
        # udev (virtme-ng starts it when present) probes a new disk
        # asynchronously: let those reads finish before the test counts
        # (under load the probe can start late: wait for udev's queue too)
        run(["udevadm", "settle", "--timeout=30"], check=False, quiet=True)
        settle(tc.path, quiet_s=0.3)
        return tc


def seeded_origin(path, seed=1, size=None):
    """Fill a device with a seeded pattern; return the Model for it."""
    size = size or size_bytes(path)
    m = Model(size, seed=seed)
    fill_device(path, m.data)
    return m


def fio(args, timeout=600, check=True):
    """Run fio with common options; returns CompletedProcess."""
    cmd = ["fio", "--output-format=normal", "--eta=never", "--verify_state_save=0"] + list(args)
    return run(cmd, timeout=timeout, check=check, cwd=WORKDIR)
