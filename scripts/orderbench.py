#!/usr/bin/python3
# SPDX-License-Identifier: GPL-2.0
"""orderbench.py - what the `ordered` writeback policy costs (issue 12).

  orderbench.py [vm] [options]     boot the test VM once (virtme-ng, the
                                   host's Debian 6.1 kernel, VM boots
                                   serialised by flock on VM_LOCK) and run
                                   'orderbench.py run' in it; print the table
  orderbench.py run [options]      the benchmark itself (root, in the VM)
  orderbench.py report FILE.json   the table again, from a run's JSON

A benchmark, not a test: for every workload the default policy and
`ordered 1` run side by side in the same boot, on the same origin model:

  origin  dm-delay (WRITE_MS on writes and on flushes, reads undelayed)
          over a memory-backed null_blk with a volatile write cache
          (cache_size), so that the origin flushes tiercache sends are
          real, delayed and counted (a RAM disk has no write cache: the
          block layer would complete every flush at once);
  cache   a RAM disk (brd); tiercache writeback, 4 KiB blocks,
          max_flush_kb 1024.

Workloads:

  ext4     mkfs.ext4 on tiercache, mount, full flush; then ROUNDS rounds
           of: remove the tree of two rounds before, untar a tree (a
           tarball of TREE_MIB of /usr/lib/python3* and /usr/share/perl,
           sorted, built once), sync; then a full flush.  Watermarks 100/0: no
           writeback during the workload, the flush writes everything.
  ext4-bg  the same with watermarks BG_HIGH/BG_LOW: background writeback
           runs during the workload.
  ext4-small  as ext4 (watermarks 100/0) on a SMALL_CACHE_MIB cache, less
           than the workload writes: the cache fills; the default policy
           then writes around it, `ordered` makes the writer wait for
           writeback of the older epochs.
  seed     the seed's case (flushbench.py's full32): fio 4 KiB random
           writes, 32 MiB over a 32 MiB origin, no flush, then a full
           flush, on a SEED_MS dm-delay: one epoch, so both policies must
           send the same requests.

Per run: origin write requests (tiercache's wb_requests + write_bypass)
and MiB (the dm-delay device's /sys/block stat), origin flushes (the
null_blk's stat field 16: flush requests the disk executed; the dm-delay
device counts an empty flush as a write of 0 sectors, so its writes minus
tiercache's must equal them, or the run notes it), workload and
flush seconds, epochs opened (status field 25), peak dirty and peak used
slots (status polled every POLL s), write_bypass.  After the timed flush:
the last tree is compared with the tarball (tar --diff, through
tiercache), the file system is unmounted and flushed again, tiercache and
the origin are compared byte for byte and e2fsck -fn checks the origin.

Each pair runs REPS times, the policy that goes first alternating (ABBA).
Under QEMU's emulation (TCG) absolute times mean little: read the
ordered/default ratios (of the means).  See docs/experiments.md.  Needs only the Python standard library, fio,
dmsetup, e2fsprogs and tar.
"""

import argparse
import datetime
import fcntl
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time

SCRIPT = os.path.abspath(__file__)
SCRIPT_DIR = os.path.dirname(SCRIPT)
REPO = os.path.dirname(SCRIPT_DIR)
sys.path.insert(0, SCRIPT_DIR)
import dmioctl  # noqa: E402

NB_CFS = "/sys/kernel/config/nullb"
NB_NAME = "obnb"
SLOW = "ob-slow"
TC = "ob-tc"
MNT = "/tmp/orderbench-mnt"
WORK = "/tmp/orderbench"
TREE_SOURCES = ["/usr/share/perl", "/usr/lib/python3*"]
WORKLOADS = ["ext4", "ext4-bg", "seed", "ext4-small"]
POLICIES = ["default", "ordered"]

T_START = time.monotonic()


def log(msg):
    t = int(time.monotonic() - T_START)
    print(f"{t // 60:3d}:{t % 60:02d} {msg}", flush=True)


class Hang(Exception):
    pass


def sh(cmd, check=True, timeout=600):
    """Run a command, return its stdout.  A command still running after
    `timeout` seconds is killed; one that does not die (stuck in the
    kernel) raises Hang."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        try:
            p.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            raise Hang(f"{' '.join(cmd)}: still running after {timeout} s, does not die")
        raise RuntimeError(f"{' '.join(cmd)}: killed after {timeout} s")
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {err.strip()}")
    return out


def read(path):
    with open(path) as f:
        return f.read().strip()


def write(path, value):
    with open(path, "w") as f:
        f.write(f"{value}\n")


# /sys/block/<dev>/stat (Documentation/admin-guide/iostats.rst)
STAT = ["reads", "reads_merged", "read_sectors", "read_ticks", "writes", "writes_merged",
        "write_sectors", "write_ticks", "in_flight", "io_ticks", "time_in_queue",
        "discards", "discards_merged", "discard_sectors", "discard_ticks",
        "flushes", "flush_ticks"]


def kname(dev):
    st = os.stat(dev)
    return os.path.basename(os.path.realpath(
        f"/sys/dev/block/{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"))


def stat(dev):
    vals = read(f"/sys/block/{kname(dev)}/stat").split()
    return {k: int(v) for k, v in zip(STAT, vals)}


def delta(a, b):
    return {k: b[k] - a[k] for k in a}


# ---------------------------------------------------------------------------
# tiercache status (docs/tiercache.rst, "Status"; fields 24-25 are the epochs)

SPEC_SIZE = dmioctl.SPEC.size
DM_TABLE_STATUS_CMD = 12


def status_text(name):
    """The status line of the first target, by ioctl (DM_TABLE_STATUS):
    `dmsetup status` is a process start, about 0.1 s of CPU under TCG."""
    buf = dmioctl._call(DM_TABLE_STATUS_CMD, name, space=16384)
    hdr = dmioctl.HDR.unpack_from(buf, 0)
    data_size, data_start, target_count = hdr[3], hdr[4], hdr[5]
    if not target_count:
        return ""
    start = data_start + SPEC_SIZE
    return buf[start:buf.index(b"\0", start, data_size)].decode()


def fields(text):
    """{field number: token} of a tiercache status line."""
    return {i + 1: t for i, t in enumerate(text.split())}


def parse(text):
    f = fields(text)
    used, total = f[3].split("/")
    st = {"mode": f[1], "used": int(used), "total": int(total), "dirty": int(f[4]),
          "write_hits": int(f[7]), "write_misses": int(f[8]), "write_bypass": int(f[9]),
          "flush_state": f[10], "wb_blocks": int(f[11]), "wb_requests": int(f[12]),
          "wb_sectors": int(f[13]), "bridged_blocks": int(f[16]),
          "inflight_max": int(f[17]), "error": int(f[18]), "flushes": int(f[19]),
          "meta_commits": int(f[21]), "meta_error": int(f[22]), "cache_failed": int(f[23])}
    if 25 in f:
        st["epoch_oldest"], st["epoch_current"] = int(f[24]), int(f[25])
    return st


def status(name=TC):
    return parse(status_text(name))


class Monitor:
    """Polls the status every `interval` seconds: peak dirty, used, live
    epochs."""

    def __init__(self, interval):
        self.interval = interval
        self.peak = {"dirty": 0, "used": 0, "live_epochs": 0}
        self.samples = 0
        self.lock = threading.Lock()
        self.stop_ev = threading.Event()
        self.th = threading.Thread(target=self.body, daemon=True)

    def sample(self):
        try:
            st = status()
        except (OSError, ValueError, KeyError, IndexError):
            return
        with self.lock:
            self.samples += 1
            self.peak["dirty"] = max(self.peak["dirty"], st["dirty"])
            self.peak["used"] = max(self.peak["used"], st["used"])
            if "epoch_current" in st:
                self.peak["live_epochs"] = max(self.peak["live_epochs"],
                                               st["epoch_current"] - st["epoch_oldest"] + 1)

    def body(self):
        while not self.stop_ev.wait(self.interval):
            self.sample()

    def __enter__(self):
        self.sample()
        self.th.start()
        return self

    def __exit__(self, *exc):
        self.stop_ev.set()
        self.th.join()
        self.sample()


def full_flush(timeout, what, notes=None):
    """The flush message and the wait for the dm event that ends it, by
    ioctl; returns the seconds.  The status is polled as well: a flush
    that has ended (field 19 counted it, nothing dirty, idle) without an
    event that ended the wait is taken as done 2 s later and noted.
    Raises Hang after `timeout` seconds."""
    ev = dmioctl.event_nr(TC)
    before = status()["flushes"]
    res = {}

    def until_done():
        e = ev
        try:
            while True:
                e, text = dmioctl.wait(TC, e)
                st = parse(text)
                if (st["dirty"] == 0 and st["flush_state"] == "idle") or st["error"]:
                    res["t"] = time.monotonic()
                    res["st"] = st
                    return
        except Exception as ex:  # noqa: BLE001 - reported below
            res["err"] = ex
    t0 = time.monotonic()
    dmioctl.message(TC, "flush")
    th = threading.Thread(target=until_done, daemon=True)
    th.start()
    nxt, ended = t0 + 30, None
    while th.is_alive():
        th.join(0.25)
        now = time.monotonic()
        if not th.is_alive():
            break
        st = status()
        if ended is None and st["flushes"] > before and st["dirty"] == 0 and \
                st["flush_state"] == "idle":
            ended = now
        if ended is not None and now - ended > 2:
            if notes is not None:
                notes.append(f"{what}: ended without a dm event that ended the wait")
            res["t"], res["st"] = ended, st
            break
        if now - t0 > timeout:
            raise Hang(f"{what}: no end after {timeout} s: {status_text(TC)}")
        if now > nxt:
            nxt = now + 30
            log(f"  {what}: {now - t0:.0f} s, {status_text(TC)}")
    if "err" in res:
        raise RuntimeError(f"{what}: waiting for the flush event: {res['err']}")
    if res["st"]["error"]:
        raise RuntimeError(f"{what}: writeback error {res['st']['error']}")
    return res["t"] - t0


# ---------------------------------------------------------------------------
# the stack

def nullb_create(mib, cache_mib):
    """A memory-backed null_blk with a volatile write cache of cache_mib
    (flushes are real requests, counted in its stat), no merging, requests
    up to 1 MiB; filled once (memory-backed devices allocate on first
    write, a disk does not)."""
    d = f"{NB_CFS}/{NB_NAME}"
    os.mkdir(d)
    for k, v in [("size", mib), ("memory_backed", 1), ("blocksize", 4096),
                 ("cache_size", cache_mib), ("max_sectors", 2048), ("irqmode", 0),
                 ("queue_mode", 2)]:
        write(f"{d}/{k}", v)
    write(f"{d}/power", 1)
    dev = f"/dev/{NB_NAME}"
    for _ in range(100):
        if os.path.exists(dev):
            break
        time.sleep(0.1)
    q = f"/sys/block/{NB_NAME}/queue"
    write(f"{q}/scheduler", "none")
    write(f"{q}/nomerges", 2)
    sh(["dd", "if=/dev/zero", f"of={dev}", "bs=1M", f"count={mib}", "oflag=direct",
        "conv=fsync", "status=none"])
    if read(f"{q}/write_cache") != "write back":
        raise RuntimeError(f"{dev}: no volatile write cache ({read(q + '/write_cache')})")
    return dev


def nullb_remove():
    d = f"{NB_CFS}/{NB_NAME}"
    if os.path.isdir(d):
        try:
            write(f"{d}/power", 0)
        except OSError:
            pass
        os.rmdir(d)


def dm_create(name, table):
    sh(["dmsetup", "--noudevsync", "create", name, "--table", table])
    sh(["dmsetup", "mknodes", name], check=False)
    dev = f"/dev/mapper/{name}"
    for _ in range(100):
        if os.path.exists(dev):
            return dev
        time.sleep(0.1)
    raise RuntimeError(f"{dev} did not appear")


def dm_remove(name):
    for _ in range(40):
        if subprocess.run(["dmsetup", "info", name], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode != 0:
            return
        if subprocess.run(["dmsetup", "--noudevsync", "remove", name], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode == 0:
            return
        time.sleep(0.5)
    raise RuntimeError(f"cannot remove {name}")


def delay_table(nb, ms):
    n = int(sh(["blockdev", "--getsz", nb]))
    # reads undelayed; writes and flushes ms (dm-delay's third class)
    return f"0 {n} delay {nb} 0 0 {nb} 0 {ms} {nb} 0 {ms}"


def brd_load(mib):
    subprocess.run(["rmmod", "brd"], stderr=subprocess.DEVNULL)
    sh(["modprobe", "brd", "rd_nr=1", f"rd_size={mib * 1024}", "max_part=0"])
    for _ in range(100):
        if os.path.exists("/dev/ram0"):
            return "/dev/ram0"
        time.sleep(0.1)
    raise RuntimeError("/dev/ram0 did not appear")


def teardown():
    subprocess.run(["umount", MNT], stderr=subprocess.DEVNULL)
    for name in (TC, SLOW):
        try:
            dm_remove(name)
        except RuntimeError as e:
            log(f"  warning: {e}")
    nullb_remove()
    subprocess.run(["rmmod", "brd"], stderr=subprocess.DEVNULL)


def build(a, wl, policy, origin_mib, delay_ms, keys):
    nb = nullb_create(origin_mib, a.nb_cache_mib)
    slow = dm_create(SLOW, delay_table(nb, delay_ms))
    cache = brd_load(a.small_cache_mib if wl == "ext4-small" else a.cache_mib)
    kv = dict(keys, max_flush_kb=1024)
    if policy == "ordered":
        kv["ordered"] = 1
    words = ["format", "writeback"] + [f"{k} {v}" for k, v in kv.items()]
    nwords = 2 + 2 * len(kv)
    n = int(sh(["blockdev", "--getsz", slow]))
    table = f"0 {n} tiercache {slow} {cache} 8 {nwords} {' '.join(words)}"
    tc = dm_create(TC, table)
    return nb, slow, tc, table


def settle(dev, quiet_s=0.6, timeout=20):
    """Wait until the device's counters stop moving (udev's probe of a new
    device reads it), so that the probe is not counted."""
    deadline = time.monotonic() + timeout
    prev, since = stat(dev), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.1)
        cur = stat(dev)
        if (cur["reads"], cur["writes"], cur["in_flight"]) != \
                (prev["reads"], prev["writes"], prev["in_flight"]):
            prev, since = cur, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return


def compare(a_dev, b_dev, nbytes):
    """Blocks (1 MiB) that differ between two devices, read with O_DIRECT."""
    import mmap
    bs = 1 << 20
    fa = os.open(a_dev, os.O_RDONLY | os.O_DIRECT)
    fb = os.open(b_dev, os.O_RDONLY | os.O_DIRECT)
    ba, bb = mmap.mmap(-1, bs), mmap.mmap(-1, bs)
    bad, first = 0, None
    try:
        for off in range(0, nbytes, bs):
            n = min(bs, nbytes - off)
            if os.preadv(fa, [ba], off) < n or os.preadv(fb, [bb], off) < n:
                raise RuntimeError(f"short read at {off}")
            if ba[:n] != bb[:n]:
                bad += 1
                first = off if first is None else first
    finally:
        os.close(fa)
        os.close(fb)
    return bad, first


def origin_counts(rec, s_delay0, s_delay1, s_nb0, s_nb1, st0, st1, prefix):
    """Origin counts between two points: data write requests from
    tiercache's counters, their MiB from the dm-delay stat, the empty
    flushes the dm-delay device saw (its writes minus the data writes) and
    the flushes the disk executed."""
    dd, dn = delta(s_delay0, s_delay1), delta(s_nb0, s_nb1)
    writes = (st1["wb_requests"] - st0["wb_requests"]) + (st1["write_bypass"] - st0["write_bypass"])
    rec[prefix + "origin_writes"] = writes
    rec[prefix + "origin_mib"] = round(dd["write_sectors"] / 2048, 2)
    rec[prefix + "origin_flush_bios"] = dd["writes"] - writes
    rec[prefix + "origin_flushes"] = dn["flushes"]
    rec[prefix + "origin_reads"] = dd["reads"]
    rec[prefix + "wb_mib"] = round((st1["wb_sectors"] - st0["wb_sectors"]) / 2048, 2)
    rec[prefix + "delay_stat"] = dd
    rec[prefix + "nullb_stat"] = dn


# ---------------------------------------------------------------------------
# workloads

def make_tree(mib):
    """A tarball of about `mib` MiB of real files (text, many small ones),
    the same in every run: sorted walk of TREE_SOURCES."""
    os.makedirs(WORK, exist_ok=True)
    path = f"{WORK}/tree.tar"
    limit = mib << 20
    total = nfiles = 0
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        srcs = sorted(p for pat in TREE_SOURCES for p in glob.glob(pat) if os.path.isdir(p))
        for src in srcs:
            for root, dirs, files in os.walk(src):
                dirs[:] = sorted(d for d in dirs if d not in ("__pycache__", "site-packages",
                                                              "dist-packages"))
                for fn in sorted(files):
                    p = os.path.join(root, fn)
                    if not os.path.isfile(p) or os.path.islink(p):
                        continue
                    sz = os.path.getsize(p)
                    if total + sz > limit:
                        continue
                    tar.add(p, arcname="tree" + p, recursive=False)
                    total += sz
                    nfiles += 1
                if total >= limit - 4096:
                    break
    log(f"tree: {nfiles} files, {total / 1048576:.1f} MiB of data ({os.path.getsize(path) / 1048576:.1f}"
        f" MiB tarball) from {', '.join(srcs)}")
    return path, nfiles, total


def run_ext4(a, rec, tarball, keys):
    nb, slow, tc, table = build(a, rec["workload"], rec["policy"], a.fs_mib, a.write_ms, keys)
    rec["table"] = table
    sh(["mkfs.ext4", "-q", "-F", "-b", "4096", "-E",
        "nodiscard,lazy_itable_init=0,lazy_journal_init=0", tc])
    os.makedirs(MNT, exist_ok=True)
    sh(["mount", "-t", "ext4", tc, MNT])
    rec["setup_flush_s"] = round(full_flush(a.flush_timeout, "flush after mkfs", rec["notes"]), 3)
    settle(tc)
    dmioctl.message(TC, "stats reset")
    s_d0, s_n0, st0 = stat(slow), stat(nb), status()
    rec["epoch_start"] = st0.get("epoch_current")
    rounds = []
    with Monitor(a.poll) as mon:
        t0 = time.monotonic()
        for r in range(a.rounds):
            tr = time.monotonic()
            d = f"{MNT}/d{r % 2}"
            if os.path.exists(d):
                shutil.rmtree(d)
            os.mkdir(d)
            sh(["tar", "-xf", tarball, "-C", d], timeout=a.step_timeout)
            t_tar = time.monotonic() - tr
            sh(["sync"], timeout=a.step_timeout)
            mon.sample()
            st = status()
            rounds.append({"untar_s": round(t_tar, 2), "round_s": round(time.monotonic() - tr, 2),
                           "dirty": st["dirty"], "used": st["used"],
                           "epoch_oldest": st.get("epoch_oldest"),
                           "epoch_current": st.get("epoch_current")})
            log(f"  round {r + 1}/{a.rounds}: untar {t_tar:.1f} s, sync {rounds[-1]['round_s'] - t_tar:.1f} s;"
                f" dirty {st['dirty']}, used {st['used']}, epochs {st.get('epoch_oldest')}..{st.get('epoch_current')}")
        rec["workload_s"] = round(time.monotonic() - t0, 3)
        mon.sample()
        s_d1, s_n1, st1 = stat(slow), stat(nb), status()
        rec["dirty_before_flush"] = st1["dirty"]
        rec["flush_s"] = round(full_flush(a.flush_timeout, "timed flush", rec["notes"]), 3)
    s_d2, s_n2, st2 = stat(slow), stat(nb), status()
    rec["rounds"] = rounds
    finish(rec, mon, s_d0, s_d1, s_d2, s_n0, s_n1, s_n2, st0, st1, st2)
    # checks: the last tree through tiercache, then the origin alone
    sh(["sh", "-c", "echo 3 >/proc/sys/vm/drop_caches"])
    p = subprocess.run(["tar", "--diff", "-f", tarball, "-C", f"{MNT}/d{(a.rounds - 1) % 2}"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    rec["check_tree"] = "ok" if p.returncode == 0 else "DIFFERS: " + p.stdout.strip()[:300]
    sh(["umount", MNT])
    rec["final_flush_s"] = round(full_flush(a.flush_timeout, "flush after umount", rec["notes"]), 3)
    check_origin(rec, tc, slow, a.fs_mib << 20, fsck=True)


def run_seed(a, rec, keys):
    nb, slow, tc, table = build(a, "seed", rec["policy"], a.seed_mib, a.seed_ms, keys)
    rec["table"] = table
    settle(tc)
    dmioctl.message(TC, "stats reset")
    s_d0, s_n0, st0 = stat(slow), stat(nb), status()
    rec["epoch_start"] = st0.get("epoch_current")
    size = a.seed_mib << 20
    with Monitor(a.poll) as mon:
        t0 = time.monotonic()
        sh(["fio", "--name=orderbench", f"--filename={tc}", "--bs=4k", "--iodepth=8",
            "--direct=1", "--ioengine=libaio", "--readwrite=randwrite",
            f"--randseed={a.fio_seed}", f"--size={size}", "--output=/dev/null"], timeout=a.step_timeout)
        rec["workload_s"] = round(time.monotonic() - t0, 3)
        mon.sample()
        s_d1, s_n1, st1 = stat(slow), stat(nb), status()
        rec["dirty_before_flush"] = st1["dirty"]
        rec["flush_s"] = round(full_flush(a.flush_timeout, "timed flush", rec["notes"]), 3)
    s_d2, s_n2, st2 = stat(slow), stat(nb), status()
    finish(rec, mon, s_d0, s_d1, s_d2, s_n0, s_n1, s_n2, st0, st1, st2)
    check_origin(rec, tc, slow, size, fsck=False)


def finish(rec, mon, s_d0, s_d1, s_d2, s_n0, s_n1, s_n2, st0, st1, st2):
    origin_counts(rec, s_d0, s_d2, s_n0, s_n2, st0, st2, "")
    origin_counts(rec, s_d0, s_d1, s_n0, s_n1, st0, st1, "wl_")
    origin_counts(rec, s_d1, s_d2, s_n1, s_n2, st1, st2, "fl_")
    rec["epochs"] = (st2["epoch_current"] - st0["epoch_current"]) if "epoch_current" in st2 else None
    rec["epoch_end"] = st2.get("epoch_current")
    rec["peak_dirty"] = mon.peak["dirty"]
    rec["peak_used"] = mon.peak["used"]
    rec["peak_live_epochs"] = mon.peak["live_epochs"]
    rec["status_samples"] = mon.samples
    rec["write_bypass"] = st2["write_bypass"]
    rec["wb_requests"] = st2["wb_requests"]
    rec["wb_blocks"] = st2["wb_blocks"]
    rec["slots"] = st2["total"]
    rec["status_end"] = status_text(TC)
    if rec["origin_flush_bios"] != rec["origin_flushes"]:
        rec["notes"].append(f"the dm-delay device saw {rec['origin_flush_bios']} writes beyond"
                            f" tiercache's {rec['origin_writes']}, the disk {rec['origin_flushes']}"
                            " flushes: the counts disagree")


def check_origin(rec, tc, slow, nbytes, fsck):
    bad, first = compare(tc, slow, nbytes)
    rec["check_origin"] = "ok" if not bad else f"DIFFERS: {bad} MiB, first at byte {first}"
    if fsck:
        p = subprocess.run(["e2fsck", "-fn", slow], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        rec["check_fsck"] = "ok" if p.returncode == 0 else \
            f"e2fsck rc {p.returncode}: " + " | ".join(p.stdout.strip().splitlines()[-4:])


def calibrate(a):
    """What the counters count: one 4 KiB write and three fsyncs on a
    dm-delay device over the null_blk."""
    nb = nullb_create(16, a.nb_cache_mib)
    slow = dm_create(SLOW, delay_table(nb, 0))
    try:
        d0, n0 = stat(slow), stat(nb)
        import mmap
        buf = mmap.mmap(-1, 4096)
        fd = os.open(slow, os.O_RDWR | os.O_DIRECT)
        try:
            os.pwritev(fd, [buf], 0)
            for _ in range(3):
                os.fsync(fd)
        finally:
            os.close(fd)
        d, n = delta(d0, stat(slow)), delta(n0, stat(nb))
        cal = {"delay_writes": d["writes"], "delay_sectors": d["write_sectors"],
               "delay_flushes": d["flushes"], "nullb_writes": n["writes"],
               "nullb_flushes": n["flushes"]}
        log(f"calibration, 1 write of 4 KiB + 3 fsyncs: dm-delay counts {cal['delay_writes']} writes"
            f" ({cal['delay_sectors']} sectors), {cal['delay_flushes']} flushes; null_blk"
            f" {cal['nullb_writes']} writes, {cal['nullb_flushes']} flushes")
        return cal
    finally:
        dm_remove(SLOW)
        nullb_remove()


def keys_of(a, wl):
    if wl in ("ext4", "ext4-small"):
        return {"high_watermark": 100, "low_watermark": 0}
    if wl == "ext4-bg":
        return {"high_watermark": a.bg_high, "low_watermark": a.bg_low}
    return {}


def run_case(a, wl, policy, rep, tarball):
    rec = {"workload": wl, "policy": policy, "rep": rep + 1, "error": None, "notes": []}
    keys = keys_of(a, wl)
    rec["keys"] = keys
    rec["delay_ms"] = a.seed_ms if wl == "seed" else a.write_ms
    tag = f"[{wl} {policy} #{rep + 1}]"
    log(f"{tag} {'fio' if wl == 'seed' else 'ext4'}, dm-delay {rec['delay_ms']} ms,"
        f" keys {keys or 'defaults'}")
    try:
        if wl == "seed":
            run_seed(a, rec, keys)
        else:
            run_ext4(a, rec, tarball, keys)
        log(f"{tag} workload {rec['workload_s']:.1f} s, flush {rec['flush_s']:.2f} s,"
            f" origin {rec['origin_writes']} writes ({rec['fl_origin_writes']} in the flush),"
            f" {rec['origin_mib']} MiB, {rec['origin_flushes']} flushes; epochs {rec['epochs']},"
            f" peak dirty {rec['peak_dirty']}, peak used {rec['peak_used']},"
            f" bypass {rec['write_bypass']}; checks: origin {rec['check_origin']}"
            f"{', tree ' + rec['check_tree'] if 'check_tree' in rec else ''}"
            f"{', fsck ' + rec['check_fsck'] if 'check_fsck' in rec else ''}"
            f"{'; ' + '; '.join(rec['notes']) if rec['notes'] else ''}")
    except Hang as e:
        rec["error"] = f"HANG: {e}"
        log(f"{tag} {rec['error']}")
        subprocess.run(["sh", "-c", "echo w >/proc/sysrq-trigger"])
    except (RuntimeError, OSError, ValueError, KeyError, subprocess.TimeoutExpired) as e:
        rec["error"] = f"{type(e).__name__}: {e}"
        log(f"{tag} ERROR {rec['error']}")
        try:
            rec["status_end"] = status_text(TC)
        except OSError:
            pass
    return rec


def warmup(a, tarball):
    """Read the tools once (the first fio, mkfs, tar or e2fsck of a boot
    loads them from the host over 9p): otherwise the policy that runs
    first pays for it."""
    nb = nullb_create(64, a.nb_cache_mib)
    try:
        sh(["fio", "--name=warmup", f"--filename={nb}", "--bs=4k", "--iodepth=8", "--direct=1",
            "--ioengine=libaio", "--readwrite=randwrite", "--size=4M", "--output=/dev/null"])
        sh(["mkfs.ext4", "-q", "-F", "-b", "4096", "-E",
            "nodiscard,lazy_itable_init=0,lazy_journal_init=0", nb])
        os.makedirs(MNT, exist_ok=True)
        sh(["mount", "-t", "ext4", nb, MNT])
        try:
            if tarball:
                sh(["tar", "-xf", tarball, "-C", MNT])
                sh(["tar", "--diff", "-f", tarball, "-C", MNT])
            sh(["sync"])
        finally:
            sh(["umount", MNT])
        sh(["e2fsck", "-fn", nb])
    finally:
        nullb_remove()
    log("warm-up done (fio, mkfs.ext4, tar, e2fsck)")


def cmd_run(a):
    os.environ.update(DM_DISABLE_UDEV="1", LC_ALL="C")
    os.makedirs(a.out, exist_ok=True)
    for m in ("dm-mod", "dm-delay", "libcrc32c"):
        subprocess.run(["modprobe", m], stderr=subprocess.DEVNULL)
    subprocess.run(["modprobe", "null_blk", "nr_devices=0"], check=True)
    if not os.path.isdir(NB_CFS):
        subprocess.run(["mount", "-t", "configfs", "none", "/sys/kernel/config"])
    if not os.path.isdir("/sys/module/dm_tiercache"):
        sh(["insmod", a.ko])
    teardown()
    meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
            "kernel": os.uname().release, "ko": a.ko, "cpus": os.cpu_count(),
            "ko_sha256": hashlib.sha256(open(a.ko, "rb").read()).hexdigest(),
            "args": {k: v for k, v in vars(a).items() if k != "func"}}
    meta["ko_name"] = a.ko_name or a.ko
    log(f"kernel {meta['kernel']}, {meta['cpus']} cpus, module {a.ko}")
    meta["calibration"] = calibrate(a)
    tarball = None
    if any(w.startswith("ext4") for w in a.workloads):
        tarball, nfiles, nbytes = make_tree(a.tree_mib)
        meta["tree_files"], meta["tree_mib"] = nfiles, round(nbytes / 1048576, 2)
    if a.warmup:
        warmup(a, tarball)
    records = []
    out = os.path.join(a.out, "orderbench.json")

    def save():
        with open(out, "w") as f:
            json.dump({"meta": meta, "records": records}, f, indent=1)
    hung = False
    for wl in a.workloads:
        if hung:
            break
        for rep in range(a.reps):
            # ABBA: the policy that goes first alternates between repetitions
            order = a.policies if rep % 2 == 0 else a.policies[::-1]
            for policy in order:
                rec = run_case(a, wl, policy, rep, tarball)
                records.append(rec)
                save()
                if rec["error"] and rec["error"].startswith("HANG"):
                    log("a flush hangs: stopping here (the devices cannot be removed)")
                    hung = True
                    break
                teardown()
            if hung:
                break
    print()
    print_table(records, meta, sys.stdout)
    with open(os.path.join(a.out, "tables.md"), "w") as f:
        print_table(records, meta, f)
    return 1 if any(r["error"] for r in records) else 0


# ---------------------------------------------------------------------------
# the table

COLS = [("origin writes", "origin_writes", "{}"), ("MiB", "origin_mib", "{:.1f}"),
        ("flushes", "origin_flushes", "{}"), ("workload s", "workload_s", "{:.1f}"),
        ("flush s", "flush_s", "{:.2f}"), ("writes in flush", "fl_origin_writes", "{}"),
        ("flushes in flush", "fl_origin_flushes", "{}"), ("epochs", "epochs", "{}"),
        ("peak dirty", "peak_dirty", "{}"), ("peak used", "peak_used", "{}"),
        ("bypass", "write_bypass", "{}")]


def fmt(fmtstr, v):
    return "-" if v is None else fmtstr.format(v)


def ratio(o, d):
    if o is None or d is None:
        return "-"
    if d == 0:
        return "=" if o == 0 else f"{o:g} vs 0"
    return f"{o / d:.2f}x"


def mean(vals):
    vals = [v for v in vals if v is not None]
    return sum(vals) / len(vals) if vals else None


def print_table(records, meta, f):
    a = meta.get("args", {})
    print(f"orderbench: {meta.get('date')}, kernel {meta.get('kernel')}, {meta.get('cpus')} cpus,"
          f" QEMU {a.get('accel')}, module {meta.get('ko_name') or meta.get('ko')}"
          f" (sha256 {meta.get('ko_sha256', '')[:12]})", file=f)
    print(f"origin: dm-delay (writes and flushes delayed; {a.get('write_ms')} ms for ext4,"
          f" {a.get('seed_ms')} ms for seed) over null_blk with a {a.get('nb_cache_mib')} MiB"
          f" volatile cache; cache: {a.get('cache_mib')} MiB brd; 4 KiB blocks, max_flush_kb 1024", file=f)
    if meta.get("tree_files"):
        print(f"ext4: {a.get('fs_mib')} MiB file system, {a.get('rounds')} rounds of untar"
              f" ({meta['tree_files']} files, {meta['tree_mib']} MiB) + sync, then a full flush;"
              f" watermarks ext4 100/0, ext4-bg {a.get('bg_high')}/{a.get('bg_low')},"
              f" ext4-small 100/0 on a {a.get('small_cache_mib')} MiB cache", file=f)
    print(f"seed: fio 4 KiB random writes, {a.get('seed_mib')} MiB over {a.get('seed_mib')} MiB,"
          " module default watermarks, no flush", file=f)
    print("origin writes, MiB, flushes: workload + flush; 'in flush': during the timed flush only;"
          " epochs: opened during the workload (status field 25); peak: status polled every"
          f" {a.get('poll')} s and at each sync; #: repetition (the policy that runs first"
          " alternates)", file=f)
    print(file=f)
    hdr = ["workload", "policy", "#"] + [c[0] for c in COLS] + ["checks"]
    rows = []
    by = {}
    for r in records:
        by.setdefault((r["workload"], r["policy"]), []).append(r)
    for (wl, pol), rs in by.items():
        for r in rs:
            if r.get("error"):
                rows.append([wl, pol, r.get("rep", 1), "ERROR " + r["error"][:200]])
                continue
            checks = [r.get("check_origin"), r.get("check_tree"), r.get("check_fsck")]
            bad = [c for c in checks if c and c != "ok"]
            rows.append([wl, pol, r.get("rep", 1)] + [fmt(c[2], r.get(c[1])) for c in COLS]
                        + ["; ".join(bad) if bad else "ok"])
    for wl in dict.fromkeys(r["workload"] for r in records):
        o = [r for r in by.get((wl, "ordered"), []) if not r.get("error")]
        d = [r for r in by.get((wl, "default"), []) if not r.get("error")]
        if o and d:
            rows.append([f"**{wl}**", "**ordered/default**", "mean"]
                        + [ratio(mean(r.get(c[1]) for r in o), mean(r.get(c[1]) for r in d))
                           for c in COLS] + [""])
    print("| " + " | ".join(hdr) + " |", file=f)
    print("|" + "|".join("---" for _ in hdr) + "|", file=f)
    for row in rows:
        print("| " + " | ".join(str(x) for x in row) + " |", file=f)


def cmd_report(a):
    with open(a.json) as f:
        d = json.load(f)
    print_table(d["records"], d["meta"], sys.stdout)
    return 0


# ---------------------------------------------------------------------------
# the boot (host side)

def cmd_vm(a):
    kver = a.kver or sorted((k for k in os.listdir("/lib/modules") if k.startswith("6.1.")),
                            key=lambda s: [int(x) if x.isdigit() else x
                                           for x in s.replace("-", ".").split(".")])[-1]
    if not shutil.which("vng"):
        raise SystemExit("orderbench: vng (virtme-ng) missing: make test installs it")
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = os.path.abspath(a.out or os.path.join(REPO, "results", "orderbench", stamp))
    os.makedirs(out, exist_ok=True)
    ko = a.ko
    if not ko:
        subprocess.run(["make", "-C", REPO, f"KVER={kver}"], check=True, stdout=subprocess.DEVNULL)
        ko = os.path.join(REPO, "dm-tiercache", "dm-tiercache.ko")
    # the module measured stays beside the results
    shutil.copy(ko, os.path.join(out, "dm-tiercache.ko"))
    with open(os.path.join(out, "module.txt"), "w") as f:
        f.write(f"{os.path.abspath(ko)}\n")
    kvm = os.access("/dev/kvm", os.R_OK | os.W_OK) and \
        (os.path.isdir("/sys/module/kvm_intel") or os.path.isdir("/sys/module/kvm_amd"))
    inner = ["/usr/bin/python3", SCRIPT, "run", "--out", out,
             "--ko", os.path.join(out, "dm-tiercache.ko"), "--ko-name", os.path.abspath(ko),
             "--accel", "kvm" if kvm else "tcg"] + a.rest
    env = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin PYTHONDONTWRITEBYTECODE=1"
    script = (f"dmesg -w >{out}/dmesg.txt 2>&1 & "
              f"env {env} {' '.join(inner)} 2>&1 | tee {out}/log; "
              f"echo ${{PIPESTATUS[0]}} >{out}/rc; sync")
    vng = ["vng", "--run", f"/boot/vmlinuz-{kver}", "--force-9p", "--memory", a.memory,
           "--cpus", str(a.cpus), "--rwdir", out, "--exec", f"bash -c '{script}'"]
    if not kvm:
        vng.append("--disable-kvm")
    print(f"orderbench: results in {out}; module {ko}; kernel {kver};"
          f" {'KVM' if kvm else 'no KVM (TCG emulation)'}", flush=True)
    lock_fd = None
    if a.vm_lock:
        lock_fd = os.open(a.vm_lock, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"orderbench: waiting for {a.vm_lock} (another VM boot holds it)", flush=True)
            t = time.monotonic()
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            print(f"orderbench: waited {time.monotonic() - t:.0f} s", flush=True)
    t0 = time.monotonic()
    try:
        p = subprocess.run(["timeout", "-k", "30", str(a.vm_timeout)] + vng,
                           stdin=subprocess.DEVNULL)
    finally:
        if lock_fd is not None:
            os.close(lock_fd)
    print(f"orderbench: VM exited ({p.returncode}) after {time.monotonic() - t0:.0f} s", flush=True)
    try:
        rc = int(read(os.path.join(out, "rc")))
    except (OSError, ValueError):
        raise SystemExit(f"orderbench: the VM left no exit status: see {out}/log and dmesg.txt")
    return rc


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    v = sub.add_parser("vm", help="boot the VM and run the benchmark in it (default)")
    v.add_argument("--ko", default=os.environ.get("TC_KO"),
                   help="module to measure (default: $TC_KO, else build dm-tiercache/)")
    v.add_argument("--out", help="results directory (default results/orderbench/<stamp>)")
    v.add_argument("--kver", default=os.environ.get("KVER"))
    v.add_argument("--memory", default="3G")
    v.add_argument("--cpus", type=int, default=2)
    v.add_argument("--vm-lock", default=os.environ.get("TC_VM_LOCK", "/tmp/tiercache-vm.lock"))
    v.add_argument("--vm-timeout", type=int, default=1800)
    v.add_argument("rest", nargs=argparse.REMAINDER, help="options for 'run' (after --)")
    r = sub.add_parser("run", help="the benchmark (root, in the VM)")
    r.add_argument("--out", required=True)
    r.add_argument("--ko", default=os.path.join(REPO, "dm-tiercache", "dm-tiercache.ko"))
    r.add_argument("--ko-name", help="where the module came from (for the report)")
    r.add_argument("--accel", default="?", help="tcg or kvm (for the report)")
    r.add_argument("--workloads", type=lambda s: s.split(","), default=WORKLOADS)
    r.add_argument("--policies", type=lambda s: s.split(","), default=POLICIES)
    r.add_argument("--write-ms", type=int, default=20, help="ext4: dm-delay write and flush delay")
    r.add_argument("--seed-ms", type=int, default=100, help="seed: dm-delay write and flush delay")
    r.add_argument("--fs-mib", type=int, default=256, help="ext4: origin and file system size")
    r.add_argument("--cache-mib", type=int, default=256, help="brd cache size")
    r.add_argument("--small-cache-mib", type=int, default=48,
                   help="ext4-small: brd cache size (less than the workload writes)")
    r.add_argument("--nb-cache-mib", type=int, default=64, help="null_blk volatile cache size")
    r.add_argument("--tree-mib", type=int, default=24, help="data in the tarball")
    r.add_argument("--rounds", type=int, default=3)
    r.add_argument("--bg-high", type=int, default=4, help="ext4-bg high_watermark")
    r.add_argument("--bg-low", type=int, default=1, help="ext4-bg low_watermark")
    r.add_argument("--seed-mib", type=int, default=32)
    r.add_argument("--fio-seed", type=int, default=20240229)
    r.add_argument("--reps", type=int, default=2, help="repetitions of each pair")
    r.add_argument("--no-warmup", dest="warmup", action="store_false")
    r.add_argument("--poll", type=float, default=0.5, help="status poll interval")
    r.add_argument("--flush-timeout", type=int, default=300)
    r.add_argument("--step-timeout", type=int, default=300,
                   help="seconds for one untar, sync or fio: a hang stops the run")
    p = sub.add_parser("report", help="the table of a run's JSON")
    p.add_argument("json")
    argv = sys.argv[1:]
    if not argv or argv[0] not in ("vm", "run", "report", "-h", "--help"):
        argv = ["vm"] + argv
    a = ap.parse_args(argv)
    if a.cmd == "vm":
        if a.rest and a.rest[0] == "--":
            a.rest = a.rest[1:]
        return cmd_vm(a)
    return {"run": cmd_run, "report": cmd_report}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
