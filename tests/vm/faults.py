# SPDX-License-Identifier: GPL-2.0
"""Helpers of the fault-injection and review regression tests.

Shared by test_90_review_a.py .. test_93_review_d.py (and test_81's
fsync_path).  Where the tests' former copies differed (poll step,
timeout, scratch-file prefix), the difference is a parameter that the
caller passes."""

import os
import random
import subprocess
import threading
import time
from pathlib import Path

import tcdisk
import tclib
from tclib import MiB

B = 4096            # tiercache block (8 sectors)


# ---------------------------------------------------------------- generic

def rnd(seed, n=B):
    """`n` pseudo-random bytes, the same for the same seed."""
    return random.Random(seed).randbytes(n)


def wait_until(cond, timeout, what, step=0.02):
    """Poll cond() until true; AssertionError naming `what` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(step)


class Bg:
    """A function run in a daemon thread, joined with a deadline."""

    def __init__(self, fn, *args):
        self.value = self.error = None
        self.t0 = time.monotonic()
        self.t1 = None

        def body():
            try:
                self.value = fn(*args)
            except BaseException as e:     # noqa: B902 - reported by join()
                self.error = e
            self.t1 = time.monotonic()
        self.thread = threading.Thread(target=body, daemon=True)
        self.thread.start()

    def alive(self):
        return self.thread.is_alive()

    def join(self, timeout, what):
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise AssertionError(f"{what} did not complete within {timeout}s "
                                 f"(stuck in the kernel?)")
        return self

    def result(self):
        if self.error is not None:
            raise self.error
        return self.value

    def seconds(self):
        return (self.t1 or time.monotonic()) - self.t0


class BgCmd:
    """A child process whose end is awaited with a deadline."""

    def __init__(self, cmd, what):
        self.what = what
        tclib.log(f"background ({what}): {' '.join(map(str, cmd))[:200]}")
        self.p = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=tclib.ENV)
        self.rc = None
        self.err = ""

    def wait(self, timeout):
        """The exit code, or None if still running after `timeout` s."""
        if self.rc is not None:
            return self.rc
        try:
            out, err = self.p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        self.rc, self.err = self.p.returncode, (out + err).strip()
        tclib.log(f"background ({self.what}) ended: rc={self.rc} {self.err[:300]}")
        return self.rc

    def kill(self):
        if self.rc is None:
            self.p.kill()


# How long a test may wait for fio to get going (its jobs started, its IO
# counted): at least the test's own figure, or TC_FIO_START_S if longer
# (tests/debug/run.sh: fio's start takes minutes on the debug kernel).
FIO_START_S = float(os.environ.get("TC_FIO_START_S", "0"))


def fio_start_s(seconds):
    return max(seconds, FIO_START_S)


def start_fio(cmd):
    """A command (fio) in the background, logged; stdout and stderr kept."""
    tclib.log("$ " + " ".join(cmd) + " &")
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=tclib.ENV, cwd=tclib.WORKDIR)


def stop_fio(fio):
    """Stop a start_fio() process (terminate; kill if it has not ended
    30 s later); its output."""
    if fio.poll() is None:
        fio.terminate()
    try:
        out, _ = fio.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        fio.kill()
        out, _ = fio.communicate(timeout=10)
    return out


# ---------------------------------------------------------------- dm tables

def swap(dev, table, timeout=30):
    """Replace a dm device's table (suspend, load, resume)."""
    dev.suspend(timeout=timeout)
    dev.reload(table)


def linear_with_error(backing, start, length, total=None):
    """dm-linear over `backing` with sectors [start, start+length) failing."""
    total = tclib.size_sectors(backing) if total is None else total
    rows = []
    if start:
        rows.append(f"0 {start} linear {backing} 0")
    rows.append(f"{start} {length} error")
    end = start + length
    if end < total:
        rows.append(f"{end} {total - end} linear {backing} {end}")
    return "\n".join(rows)


def load_table(tc, table, readonly):
    """Suspend, load `table` (read-only or not), resume."""
    tc.suspend(timeout=30)
    tclib.run(["dmsetup", "load"] + (["--readonly"] if readonly else []) +
              [tc.name, "--table", table], timeout=60)
    tc.resume()
    tclib.run(["udevadm", "settle", "--timeout=30"], check=False, quiet=True)


def dm_info(name):
    """`dmsetup info NAME` as a dict, None if there is no such device."""
    p = tclib.run(["dmsetup", "info", name], check=False, quiet=True, timeout=30)
    if p.returncode != 0:
        return None
    d = {}
    for ln in p.stdout.splitlines():
        if ":" in ln:
            k, v = ln.split(":", 1)
            d[k.strip()] = v.strip()
    return d


def clean_err(s):
    """dmsetup's stderr without its udev notice."""
    return " ".join(x for x in s.splitlines()
                    if x.strip() and not x.startswith(("Udev is running", "Command failed")))


# ---------------------------------------------------------------- devices

def named_nullb(stack, name, size_mib, step=0.02):
    """A memory-backed null_blk device with its own name (a stuck device
    can be left behind without breaking the next test's Stack); `step`:
    the poll step of the wait for its device node."""
    cfs = Path("/sys/kernel/config/nullb")
    if not cfs.exists():
        tclib.run(["modprobe", "null_blk", "nr_devices=0"])
    d = cfs / name
    d.mkdir()
    stack._defer(stack._rm_nullb, d)
    for k, v in dict(size=size_mib, memory_backed=1, blocksize=512).items():
        (d / k).write_text(f"{v}\n")
    (d / "power").write_text("1\n")
    path = f"/dev/{name}"
    wait_until(lambda: Path(path).exists(), 5, f"{path}", step=step)
    return path


def find_in_device(path, data, align=B):
    """Byte offset (a multiple of `align`) where `data` sits on a device."""
    img = tclib.read_direct(path, 0, tclib.size_bytes(path))
    pos = img.find(data)
    while pos >= 0 and pos % align:
        pos = img.find(data, pos + 1)
    assert pos >= 0, f"{len(data)} bytes not found on {path}"
    return pos


def fsync_path(path):
    """fsync of a file, directory or device (of a tiercache device: a
    REQ_PREFLUSH, i.e. a metadata commit)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def dirty_blocks(tc, m, first, n, seed):
    """Make blocks [first, first + n) dirty (O_DIRECT, one block a write)."""
    with tclib.Workload(tc.path, m, seed=seed) as wl:
        for b in range(first, first + n):
            wl.write_direct(b * B, B)


def dirty_tiercache(stack, base, n, seed, write_seed):
    """A writeback tiercache (8-sector blocks) over a 32 MiB RAM origin
    seeded with `seed` and an 8 MiB RAM cache, blocks [base, base + n)
    made dirty (Workload seed `write_seed`).  Returns (origin, model,
    tc, table line)."""
    ram = stack.ram(32 * MiB)
    m = tclib.seeded_origin(ram, seed=seed)
    tc = stack.tiercache(ram, stack.ram(8 * MiB), 8, "writeback")
    dirty_blocks(tc, m, base, n, seed=write_seed)
    return ram, m, tc, tc.table_line()


# ---------------------------------------------------------------- I/O in a child process

def scratch(prefix, tag):
    """A scratch file name in the work directory: PREFIX-PID-TAG."""
    return os.path.join(tclib.WORKDIR, f"{prefix}-{os.getpid()}-{tag}")


def dd_read(path, off, n, timeout=30, *, prefix):
    """O_DIRECT read in a child process (cannot block the test)."""
    out = scratch(prefix, "read")
    try:
        tclib.run(["dd", f"if={path}", f"of={out}", f"bs={n}", "count=1", f"skip={off}",
                   "iflag=direct,skip_bytes", "status=none"], timeout=timeout)
        data = Path(out).read_bytes()
    finally:
        if os.path.exists(out):
            os.unlink(out)
    assert len(data) == n, f"short read of {path} at {off}: {len(data)}/{n}"
    return data


def dd_write(path, off, data, sync="fsync", timeout=30, check=True, *, prefix):
    """O_DIRECT write in a child process; sync: 'fsync' (then fsync),
    'dsync' (O_DSYNC) or None."""
    src = scratch(prefix, "write")
    Path(src).write_bytes(data)
    oflag = "direct,seek_bytes" + (",dsync" if sync == "dsync" else "")
    conv = "notrunc" + (",fsync" if sync == "fsync" else "")
    try:
        return tclib.run(["dd", f"if={src}", f"of={path}", f"bs={len(data)}", "count=1",
                          f"seek={off}", f"oflag={oflag}", f"conv={conv}", "status=none"],
                         timeout=timeout, check=check)
    finally:
        os.unlink(src)


# ---------------------------------------------------------------- on-disk format (tcdisk.py)

def superblock(cache):
    sb = tcdisk.decode_sb(tclib.read_direct(cache, 0, B))
    return {"seq": sb.commit_seq, "slots": sb.nr_slots, "data_start": sb.data_start,
            "gen": sb.gen, "failed": sb.failed}


def committed_dirty(cache):
    """{origin block: slot} of the committed dirty entries on a cache device
    (of its superblock's format generation)."""
    sb = tcdisk.decode_sb(tclib.read_direct(cache, 0, B))
    raw = tclib.read_direct(cache, tcdisk.META_START * 512, sb.entries_bytes)
    return {e.block: s for s, e in tcdisk.entries(raw, sb) if e.state == tcdisk.DIRTY}
