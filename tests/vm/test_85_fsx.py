# SPDX-License-Identifier: GPL-2.0
"""xfstests' fsx and fsstress on ext4 over tiercache.

A small cache (eviction and write-around), background writeback always busy
(low watermarks), and a control thread racing the file system: full flushes,
cleaner on/off, `set` of every key.  fsx checks every read against its own
model (buffered, O_DIRECT, O_DIRECT+AIO); fsstress loads the metadata.
Then: e2fsck -fn of the cached device, a full flush (drain), the table
swapped to linear over the origin: the origin alone must be byte for byte
what the cached device showed, and e2fsck -fn clean.

xfstests is built by tests/xfstests/setup.sh (called by tests/install-deps.sh)
into /opt/tiercache-test/xfstests; XFSTESTS_DIR overrides.  Duration:
TC_FSX_SECONDS (default 30; tests/xfstests/run.sh runs it longer),
seed: TC_FSX_SEED (default 1).
"""

import glob
import hashlib
import os
import random
import subprocess
import threading
import time
from pathlib import Path

import pytest

import tclib
from tclib import MiB

pytestmark = [pytest.mark.module, pytest.mark.usefixtures("tc_module")]

SECONDS = int(os.environ.get("TC_FSX_SECONDS", "30"))
SEED = int(os.environ.get("TC_FSX_SEED", "1"))


def xfstests_dir():
    d = os.environ.get("XFSTESTS_DIR")
    if not d:
        done = sorted(glob.glob("/opt/tiercache-test/xfstests/*/.done"),
                      key=os.path.getmtime)
        d = os.path.dirname(done[-1]) if done else None
    if not d or not os.access(os.path.join(d, "ltp", "fsx"), os.X_OK):
        pytest.fail("xfstests is not built: run tests/xfstests/setup.sh "
                    "(tests/install-deps.sh does)", pytrace=False)
    return Path(d)


def sha256_direct(path, size):
    h = hashlib.sha256()
    off = 0
    while off < size:
        n = min(4 * MiB, size - off)
        h.update(tclib.read_direct(path, off, n))
        off += n
    return h.hexdigest()


class Control(threading.Thread):
    """Races the file system with messages until stopped."""

    def __init__(self, tc, seed, total):
        super().__init__(daemon=True)
        self.tc = tc
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.counts = {}
        self.error = None
        self.max_used = 0
        self.total = total
        self.high, self.low = 5, 1
        self.cleaner = False

    def msg(self, what, *words):
        self.tc.message(*words)
        self.counts[what] = self.counts.get(what, 0) + 1

    def step(self):
        r = self.rng.random()
        if r < 0.15:
            self.msg("flush", "flush")
        elif r < 0.30:
            self.cleaner = not self.cleaner
            self.msg("cleaner " + ("on" if self.cleaner else "off"),
                     "cleaner", "on" if self.cleaner else "off")
        elif r < 0.50:
            # keep low < high whatever the order of the two messages
            h = self.rng.randint(2, 30)
            lo = self.rng.randint(0, h - 1)
            if lo < self.high:
                self.msg("set low_watermark", "set", "low_watermark", str(lo))
                self.msg("set high_watermark", "set", "high_watermark", str(h))
            else:
                self.msg("set high_watermark", "set", "high_watermark", str(h))
                self.msg("set low_watermark", "set", "low_watermark", str(lo))
            self.high, self.low = h, lo
        elif r < 0.62:
            self.msg("set flush_depth", "set", "flush_depth",
                     str(self.rng.choice([1, 2, 8, 32, 128, 512])))
        elif r < 0.74:
            self.msg("set max_flush_kb", "set", "max_flush_kb",
                     str(self.rng.choice([64, 128, 512, 1024, 4096])))
        elif r < 0.86:
            self.msg("set bridge_gap_kb", "set", "bridge_gap_kb",
                     str(self.rng.choice([0, 4, 16, 64])))
        else:
            self.msg("set flush_on_suspend", "set", "flush_on_suspend",
                     str(self.rng.randint(0, 1)))

    def run(self):
        try:
            while not self.stop.is_set():
                self.step()
                st = self.tc.status()
                self.max_used = max(self.max_used, st["used"])
                self.stop.wait(self.rng.uniform(0.05, 1.0))
        except Exception as e:  # reported by the test
            self.error = e


def spawn(cmd, log):
    tclib.log("$ " + " ".join(map(str, cmd)) + " &")
    return subprocess.Popen([str(c) for c in cmd], stdout=log, stderr=subprocess.STDOUT,
                            env=tclib.ENV, cwd=tclib.WORKDIR, start_new_session=True)


def test_fsx_fsstress_ext4(stack):
    x = xfstests_dir()
    fsx, fsstress = x / "ltp" / "fsx", x / "ltp" / "fsstress"
    s = stack.setup(origin_mib=256, cache_mib=16, block=8,
                    keys={"high_watermark": 5, "low_watermark": 1})
    tc = s.tc
    st0 = tc.status()
    work = Path(tclib.WORKDIR) / f"fsx-{os.getpid()}"
    mnt = work / "mnt"
    mnt.mkdir(parents=True, exist_ok=True)
    tclib.run(["mkfs.ext4", "-q", "-F", tc.path], timeout=300)
    tclib.run(["mount", "-t", "ext4", tc.path, str(mnt)])
    # torn down before the devices below it, however the test ends
    stack._defer(lambda: os.path.ismount(mnt) and
                 tclib.run(["umount", "-l", str(mnt)], check=False))
    procs, logs = {}, {}
    ctl = Control(tc, SEED, st0["total"])
    try:
        for d in ("buf", "dio", "aio", "stress"):
            (mnt / d).mkdir()
        dur = f"--duration={SECONDS}"
        jobs = {
            # buffered, mmap, fallocate/punch/zero/collapse/insert; 64 MiB of files
            # in all (4x the cache), well below the 256 MiB file system (ENOSPC
            # fails fsx)
            "fsx-buffered": [fsx, "-q", "-S", SEED, "-l", 24 * MiB, "-o", MiB, "-N", 10**9,
                             dur, "-P", work, mnt / "buf" / "f"],
            "fsx-odirect": [fsx, "-q", "-Z", "-R", "-W", "-r", 4096, "-w", 4096,
                            "-S", SEED + 1, "-l", 24 * MiB, "-o", MiB, "-N", 10**9, dur,
                            "-P", work, mnt / "dio" / "f"],
            "fsx-odirect-aio": [fsx, "-q", "-Z", "-A", "-R", "-W", "-r", 4096, "-w", 4096,
                                "-S", SEED + 2, "-l", 16 * MiB, "-o", 512 * 1024,
                                "-N", 10**9, dur, "-P", work, mnt / "aio" / "f"],
        }
        ctl.start()
        for name, cmd in jobs.items():
            logs[name] = open(work / f"{name}.log", "w+")
            procs[name] = spawn(cmd, logs[name])
        # fsstress in bounded batches until the fsx runs end
        logs["fsstress"] = open(work / "fsstress.log", "w+")
        batches = 0
        deadline = time.monotonic() + SECONDS + 600
        while any(p.poll() is None for p in procs.values()):
            assert time.monotonic() < deadline, "fsx still running 600 s after its duration"
            p = spawn([fsstress, "-d", mnt / "stress", "-n", 400, "-p", 4, "-c",
                       "-s", SEED * 1000 + batches], logs["fsstress"])
            try:
                rc = p.wait(timeout=max(60, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                p.wait(timeout=30)
                raise AssertionError("an fsstress batch of 4x400 ops did not end")
            batches += 1
            assert rc == 0, f"fsstress batch {batches} rc {rc}: " + \
                tail(logs["fsstress"])
        for name, p in procs.items():
            rc = p.wait(timeout=60)
            assert rc == 0, f"{name} failed (rc {rc}):\n{tail(logs[name])}"
    finally:
        ctl.stop.set()
        ctl.join(timeout=180)
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait(timeout=30)
        for f in logs.values():
            f.close()
    tclib.log(f"control: {ctl.counts}; fsstress batches {batches}; "
              f"max used {ctl.max_used}/{ctl.total}")
    assert not ctl.is_alive(), "the control thread is stuck in a message"
    assert ctl.error is None, f"control thread: {ctl.error!r}"
    tc.message("cleaner", "off")
    st = tc.status()
    tclib.log(f"after the run: {st['raw']}")
    tclib.run(["umount", str(mnt)], timeout=300)

    # the conditions the test is about did happen
    assert ctl.max_used >= st["total"] * 0.9, \
        f"the cache never filled ({ctl.max_used}/{st['total']}): no eviction"
    assert st["write_bypass"] > 0, "no write went around the cache"
    assert st["wb_blocks"] > 0, "no background writeback"
    assert sum(ctl.counts.values()) >= 5, f"control thread barely ran: {ctl.counts}"

    p = tclib.run(["e2fsck", "-fn", tc.path], check=False, timeout=600)
    assert p.returncode == 0, f"e2fsck -fn on the cached device: rc {p.returncode}\n" \
        f"{p.stdout[-3000:]}{p.stderr[-1000:]}"
    tc.flush()
    size = tclib.size_bytes(tc.path)
    h_cached = sha256_direct(tc.path, size)
    n = tclib.size_sectors(tc.path)
    tc.reload(f"0 {n} linear {s.origin.path} 0")
    assert tc.table_line().split()[2] == "linear", tc.table_line()
    tclib.flushbufs(tc.path)
    h_origin = sha256_direct(s.origin.path, size)
    assert h_origin == h_cached, "after a full flush the origin differs from the cached device"
    p = tclib.run(["e2fsck", "-fn", tc.path], check=False, timeout=600)
    assert p.returncode == 0, f"e2fsck -fn on the origin alone: rc {p.returncode}\n" \
        f"{p.stdout[-3000:]}{p.stderr[-1000:]}"


def tail(f, n=4000):
    f.flush()
    f.seek(0)
    return f.read()[-n:]
