#!/usr/bin/python3
# SPDX-License-Identifier: GPL-2.0
"""flushbench.py - the flush-linearisation experiment of dm-tiercache.

  flushbench.py run [options]      inside the test VM, as root: for every
                                   slow-disk model, case and cache system,
                                   build the stack (scripts/stack.sh), run
                                   fio 4 KiB random writes, time a full
                                   flush and count what the slow disk got
  flushbench.py report DIR...      tables, CSV and chart from the JSON files
                                   that 'run' wrote

'run' needs only the Python standard library, fio, dmsetup and the tools
stack.sh needs; 'report --chart' needs matplotlib (python3-matplotlib).
"""

import argparse
import csv
import datetime
import glob
import json
import math
import mmap
import os
import platform
import re
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dmioctl  # noqa: E402

SCRIPT_DIR = os.path.dirname(os.path.abspath(__file__))
STACK = os.path.join(SCRIPT_DIR, "stack.sh")
STACK_NAME = "fbench"

# name, slow disk MiB, cache MiB, MiB written, MiB region written over,
# tiercache flush_depth (None = module default)
DEFAULT_CASES = "full32:32:512:32,first64:256:512:64,sparse64:256:512:64:256"
CASE_NOTES = {
    "full32": "32 MiB slow disk, 32 MiB of 4 KiB random writes covering all of it",
    "first64": "256 MiB slow disk, 64 MiB of 4 KiB random writes over its first 64 MiB",
    "sparse64": "256 MiB slow disk, 64 MiB of 4 KiB random writes spread over all 256 MiB",
}
PEERS = ["bcache", "dm-cache", "dm-writecache", "opencas"]
DEFAULT_SYSTEMS = "bare,tiercache,dm-writecache,dm-cache,bcache,opencas"

# The seed's published full-flush times (seconds) on dm-delay 1000 ms, for
# 32 MiB and 64 MiB of 4 KiB random writes over a contiguous region.
PUBLISHED = {("bcache", 32): 170, ("bcache", 64): 300,
             ("opencas", 32): 15, ("opencas", 64): 35}


def published(rec):
    """The seed's figure for this record's system and case, or None."""
    if rec.get("model") != "delay" or rec.get("delay_ms", 1000) != 1000 or \
            rec.get("region_mib") != rec.get("fio_mib"):
        return None
    return PUBLISHED.get((rec.get("kind"), rec.get("fio_mib")))


T_START = time.monotonic()


def log(msg):
    t = int(time.monotonic() - T_START)
    print(f"{t // 60:3d}:{t % 60:02d} {msg}", flush=True)


class Case:
    def __init__(self, spec, sparse_depth):
        parts = spec.split(":")
        if len(parts) not in (4, 5) or not re.match(r"^[A-Za-z][A-Za-z0-9_]*$", parts[0]):
            raise SystemExit(f"flushbench: invalid case '{spec}' (expected NAME:FSIZE:RSIZE:FIOSIZE[:REGION], sizes in MiB)")
        try:
            nums = [int(x) for x in parts[1:]]
        except ValueError:
            raise SystemExit(f"flushbench: invalid case '{spec}': sizes must be whole MiB")
        self.name = parts[0]
        self.fsize, self.rsize, self.fio_mib = nums[:3]
        self.region_mib = nums[3] if len(nums) == 4 else self.fio_mib
        if min(nums) <= 0:
            raise SystemExit(f"flushbench: invalid case '{spec}': sizes must be at least 1 MiB")
        if self.region_mib > self.fsize:
            raise SystemExit(f"flushbench: case {self.name}: region {self.region_mib} MiB exceeds the slow disk ({self.fsize} MiB)")
        if self.fio_mib > self.region_mib:
            raise SystemExit(f"flushbench: case {self.name}: {self.fio_mib} MiB written exceeds the region ({self.region_mib} MiB)")
        if self.fio_mib * 2 > self.rsize:
            raise SystemExit(f"flushbench: case {self.name}: {self.fio_mib} MiB written must be at most half the cache ({self.rsize} MiB), or writeback starts during fio")
        self.sparse = self.region_mib > self.fio_mib
        # A sparse flush has thousands of runs: allow many in flight.
        self.flush_depth = sparse_depth if self.sparse and sparse_depth else None

    def desc(self):
        if self.name in CASE_NOTES and self.spec_default():
            return CASE_NOTES[self.name]
        where = (f"spread over {self.region_mib} MiB" if self.sparse
                 else f"over the first {self.region_mib} MiB")
        return (f"{self.fsize} MiB slow disk, {self.rsize} MiB cache, {self.fio_mib} MiB of "
                f"4 KiB random writes {where}")

    def spec_default(self):
        return f"{self.name}:{self.fsize}:{self.rsize}:{self.fio_mib}" in DEFAULT_CASES

    def as_dict(self):
        return {"case": self.name, "fsize_mib": self.fsize, "rsize_mib": self.rsize,
                "fio_mib": self.fio_mib, "region_mib": self.region_mib,
                "tc_flush_depth": self.flush_depth}


# ---------------------------------------------------------------------------
# small helpers

def sh(cmd, check=True, timeout=None):
    """Run a command, return stdout; raise with stderr on failure."""
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr.strip()}")
    return p.stdout


def read_file(path):
    with open(path) as f:
        return f.read().strip()


def write_file(path, value):
    with open(path, "w") as f:
        f.write(str(value))


def disk_stat(kname):
    """writes completed, writes merged, sectors written of /sys/block/KNAME."""
    f = read_file(f"/sys/block/{kname}/stat").split()
    return {"reads": int(f[0]), "read_sectors": int(f[2]),
            "writes": int(f[4]), "merges": int(f[5]), "sectors": int(f[6])}


def stat_delta(a, b):
    return {k: b[k] - a[k] for k in a}


def dm_status(name):
    """Tokens of 'dmsetup status NAME' after '<start> <len> <target>'."""
    return sh(["dmsetup", "status", name]).split()[3:]


def human_kib(v):
    """bcache's human-readable sizes (12.3k, 1.5M, 0.0k) to KiB."""
    m = re.match(r"^([0-9.]+)([kMGT]?)", v.strip())
    if not m:
        return None
    mult = {"": 1 / 1024, "k": 1, "M": 1024, "G": 1024 ** 2, "T": 1024 ** 3}[m.group(2)]
    return float(m.group(1)) * mult


class Progress:
    """Print a progress line every `interval` seconds."""

    def __init__(self, prefix, interval):
        self.prefix = prefix
        self.interval = interval
        self.t0 = time.monotonic()
        self.next = self.t0 + interval

    def due(self):
        return time.monotonic() >= self.next

    def say(self, what):
        now = time.monotonic()
        self.next = now + self.interval
        log(f"{self.prefix} {now - self.t0:7.1f} s  {what}")


# ---------------------------------------------------------------------------
# flush procedures: each returns (seconds, error or None, extra dict)

class Timeout(Exception):
    pass


def await_thread(fn, t0, prog, timeout, progress):
    """Run fn() in a thread until it returns, printing progress() every
    progress interval; Timeout `timeout` seconds after t0.  Returns a dict
    with "v" (what fn returned) and "t" (time.monotonic() when it
    returned), or "err"."""
    res = {}

    def body():
        try:
            res["v"] = fn()
            res["t"] = time.monotonic()
        except Exception as e:  # noqa: BLE001 - reported by the caller
            res["err"] = e
    th = threading.Thread(target=body, daemon=True)
    th.start()
    while th.is_alive():
        if time.monotonic() - t0 > timeout:
            raise Timeout()
        if prog.due():
            prog.say(progress())
        th.join(0.02)
    return res


def flush_tiercache(info, prog, timeout):
    """A full flush: the flush message and the wait for the dm event that
    ends it go by ioctl (dmioctl.py), so the time is the device's."""
    name = info["DM_NAME"]
    event = dmioctl.event_nr(name)

    def until_done():
        """The time of the event that ended the flush (the status comes
        with the wait: nothing is started between the event and the clock)."""
        ev = event
        while True:
            ev, text = dmioctl.wait(name, ev)
            t = time.monotonic()
            st = text.split()
            if (st[3] == "0" and st[9] == "idle") or st[17] != "0":
                return t
    def progress():
        st = dm_status(name)
        return f"dirty {st[3]} blocks, {st[9]}, {st[11]} origin writes issued"
    t0 = time.monotonic()
    dmioctl.message(name, "flush")
    res = await_thread(until_done, t0, prog, timeout, progress)
    if "err" in res:
        return time.monotonic() - t0, f"waiting for the flush: {res['err']}", {}
    secs = res["v"] - t0
    st = dm_status(name)
    keys = ["wb_blocks", "wb_requests", "wb_sectors", "avg_write_kb", "merge_ratio",
            "bridged_blocks", "inflight_max", "error", "flushes"]
    extra = {"tc_" + k: st[10 + i] for i, k in enumerate(keys)}
    extra["tc_status"] = " ".join(st)
    if st[17] != "0":
        return secs, f"tiercache latched error {st[17]}", extra
    return secs, None, extra


def flush_bcache(info, prog, timeout):
    d = f"/sys/block/{info['BCACHE_DEV']}/bcache"
    t0 = time.monotonic()
    # As published: writeback as fast as allowed, no delay, then writethrough
    # (no new dirty data) and wait for the backing device to be clean.
    write_file(f"{d}/writeback_delay", 0)
    write_file(f"{d}/writeback_rate", 2147483647)
    write_file(f"{d}/cache_mode", "writethrough")
    while read_file(f"{d}/state") != "clean":
        if time.monotonic() - t0 > timeout:
            raise Timeout()
        if prog.due():
            prog.say(f"dirty_data {read_file(d + '/dirty_data')}, state {read_file(d + '/state')}")
        time.sleep(0.05)
    return time.monotonic() - t0, None, {}


def dmcache_dirty(name):
    return int(dm_status(name)[10])


def flush_dmcache(info, prog, timeout):
    name = info["DM_NAME"]
    tok = sh(["dmsetup", "table", name]).split()
    # start len cache meta cache origin bs #feat feat... policy #args args...
    nfeat = int(tok[7])
    new = tok[:8 + nfeat] + ["cleaner", "0"]
    t0 = time.monotonic()
    sh(["dmsetup", "--noudevsync", "reload", name, "--table", " ".join(new)])
    sh(["dmsetup", "--noudevsync", "resume", name])
    while True:
        dirty = dmcache_dirty(name)
        if dirty == 0:
            break
        if time.monotonic() - t0 > timeout:
            raise Timeout()
        if prog.due():
            prog.say(f"dirty {dirty} blocks")
        time.sleep(0.1)
    return time.monotonic() - t0, None, {}


def flush_writecache(info, prog, timeout):
    """dm-writecache's flush message returns when the flush is done; sent by
    ioctl like tiercache's."""
    name = info["DM_NAME"]

    def progress():
        st = dm_status(name)
        return f"{int(st[1]) - int(st[2])} blocks in use, {st[3]} under writeback"
    t0 = time.monotonic()
    res = await_thread(lambda: dmioctl.message(name, "flush"), t0, prog, timeout, progress)
    if "err" in res:
        return time.monotonic() - t0, f"flush message failed: {res['err']}", {}
    secs = res["t"] - t0
    st = dm_status(name)
    if st[0] != "0":
        return secs, f"dm-writecache error {st[0]}", {}
    return secs, None, {}


def opencas_stats(info):
    """casadm --stats as {field: value} (its CSV output: a header line and
    a value line)."""
    out = sh([info["CASADM"], "--stats", "--cache-id", info["OPENCAS_CACHE_ID"],
              "--output-format", "csv"], timeout=60)
    lines = [ln for ln in out.splitlines() if ln.strip()]
    rows = list(csv.reader(lines[-2:]))
    return dict(zip(rows[0], rows[1]))


def opencas_dirty(info):
    """Dirty 4 KiB blocks of the cache."""
    st = opencas_stats(info)
    for k, v in st.items():
        if k.startswith("Dirty") and "4KiB" in k:
            return int(float(v))
    raise ValueError("no 'Dirty [4KiB Blocks]' in casadm --stats")


def flush_opencas(info, prog, timeout):
    """As the seed did: casadm --flush-cache, which returns when every dirty
    line is on the core device."""
    cmd = [info["CASADM"], "--flush-cache", "--cache-id", info["OPENCAS_CACHE_ID"]]

    def progress():
        try:
            return f"dirty {opencas_dirty(info)} blocks"
        except (RuntimeError, OSError, ValueError, IndexError, subprocess.TimeoutExpired) as e:
            return f"flushing ({e})"
    t0 = time.monotonic()
    res = await_thread(lambda: sh(cmd), t0, prog, timeout, progress)
    if "err" in res:
        return time.monotonic() - t0, f"casadm --flush-cache failed: {res['err']}", {}
    secs = res["t"] - t0
    left = opencas_dirty(info)
    if left:
        return secs, f"Open CAS still has {left} dirty blocks after its flush", {}
    return secs, None, {}


FLUSH = {"tiercache": flush_tiercache, "bcache": flush_bcache,
         "dm-cache": flush_dmcache, "dm-writecache": flush_writecache,
         "opencas": flush_opencas}


def dirty_now(kind, info):
    try:
        if kind == "tiercache":
            return int(dm_status(info["DM_NAME"])[3])
        if kind == "dm-cache":
            return dmcache_dirty(info["DM_NAME"])
        if kind == "opencas":
            return opencas_dirty(info)
        if kind == "bcache":
            kib = human_kib(read_file(f"/sys/block/{info['BCACHE_DEV']}/bcache/dirty_data"))
            return None if kib is None else int(kib / 4)
    except (RuntimeError, OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        pass
    return None


# ---------------------------------------------------------------------------
# compare what the cache presents with what the slow disk holds after a flush

def compare_devices(top, slow, slow_offset, nbytes):
    """Return (mismatching 4 KiB blocks, first mismatching byte offset)."""
    chunk = 1 << 20
    a = mmap.mmap(-1, chunk)
    b = mmap.mmap(-1, chunk)
    fa = os.open(top, os.O_RDONLY | os.O_DIRECT)
    fb = os.open(slow, os.O_RDONLY | os.O_DIRECT)
    bad, first = 0, None
    try:
        off = 0
        while off < nbytes:
            n = min(chunk, nbytes - off)
            va = memoryview(a)[:n]
            vb = memoryview(b)[:n]
            if os.preadv(fa, [va], off) != n or os.preadv(fb, [vb], off + slow_offset) != n:
                raise RuntimeError(f"short read at {off}")
            if va != vb:
                for i in range(0, n, 4096):
                    if va[i:i + 4096] != vb[i:i + 4096]:
                        bad += 1
                        if first is None:
                            first = off + i
            va.release()
            vb.release()
            off += n
    finally:
        os.close(fa)
        os.close(fb)
    return bad, first


# ---------------------------------------------------------------------------
# run

def stack_create(args_list):
    p = subprocess.run([STACK, "create", STACK_NAME] + args_list, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"stack.sh create failed: {p.stderr.strip()}")
    info = {}
    for line in p.stdout.splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            info[k] = v
    return info


def stack_remove():
    p = subprocess.run([STACK, "remove", STACK_NAME], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"stack.sh remove failed: {p.stderr.strip()}")


def model_args(a, model):
    fill = ["--slow-fill", str(a.slow_fill)]
    if model == "delay":
        return ["--slow", "delay", "--slow-backing", a.slow_backing,
                "--read-delay-ms", str(a.read_delay_ms), "--write-delay-ms", str(a.delay_ms)] + fill
    return ["--slow", "hdd", "--hdd-nsec", str(a.hdd_nsec), "--hdd-mbps", str(a.hdd_mbps),
            "--hdd-depth", str(a.hdd_depth), "--hdd-sched", a.hdd_sched,
            "--hdd-max-kb", str(a.hdd_max_kb)] + fill


def model_desc(a, model):
    if model == "delay":
        back = "RAM disk" if a.slow_backing == "ram" else "loop file"
        return f"dm-delay {a.delay_ms} ms write / {a.read_delay_ms} ms read over a {back}"
    cap = f", {a.hdd_mbps} MB/s" if a.hdd_mbps else ""
    return (f"HDD-like null_blk {a.hdd_nsec / 1e6:g} ms per request{cap}, "
            f"queue depth {a.hdd_depth}, {a.hdd_sched}, requests up to {a.hdd_max_kb} KiB")


def system_args(system, case, a):
    if system == "bare":
        return ["--system", "none"], "none"
    m = re.match(r"^tiercache-b(\d+)$", system)
    if m:
        opts = ["--system", "tiercache", "--opt", f"bridge_gap_kb={m.group(1)}"]
        if case.flush_depth:
            opts += ["--opt", f"flush_depth={case.flush_depth}"]
        return opts, "tiercache"
    if system == "bcache" and a.bcache_writeback_delay is not None:
        return ["--system", system, "--bcache-writeback-delay", str(a.bcache_writeback_delay)], system
    if system == "opencas" and not a.opencas_dir:
        raise SystemExit("flushbench: opencas needs --opencas-dir (a build by scripts/opencas.sh)")
    if system in PEERS:
        return ["--system", system], system
    raise SystemExit(f"flushbench: unknown system '{system}'")


def run_fio(dev, region_bytes, io_bytes, a, runtime, prog, slow_kname):
    cmd = ["fio", "--name=flushbench", f"--filename={dev}", "--bs=4k", "--iodepth=8",
           "--direct=1", "--ioengine=libaio", "--readwrite=randwrite",
           f"--randseed={a.seed}", f"--size={region_bytes}", "--output-format=json",
           "--eta=never"]
    if io_bytes != region_bytes:
        cmd.append(f"--io_size={io_bytes}")
    if runtime:
        cmd.append(f"--runtime={runtime}")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    s0 = disk_stat(slow_kname)
    while p.poll() is None:
        if time.monotonic() - t0 > a.fio_timeout:
            p.kill()
            p.wait()
            raise Timeout()
        if prog.due():
            prog.say(f"fio running, slow disk got {disk_stat(slow_kname)['writes'] - s0['writes']} writes")
        time.sleep(0.1)
    out, err = p.communicate()
    if p.returncode != 0:
        raise RuntimeError(f"fio failed: {err.strip()}")
    # fio may print warnings before the JSON document
    job = json.loads(out[out.index("{"):])["jobs"][0]["write"]
    return {"fio_iops": round(job["iops"], 1), "fio_ios": job["total_ios"],
            "fio_bytes": job["io_bytes"], "fio_seconds": round(job["runtime"] / 1000.0, 3)}


def step_summary(rec):
    if rec["error"]:
        return f"ERROR {rec['error']}"
    if rec["kind"] == "none":
        return f"fio {rec['fio_iops']:.0f} IOPS"
    fl = rec.get("flush_seconds")
    return (f"wrote {rec['absorbed_mib']:g} MiB ({rec['absorbed_pct']:g}%), flush "
            f"{'-' if fl is None else f'{fl:.2f} s'}, {rec.get('origin_writes')} origin writes,"
            f" check {rec['check']}")


def run_one(a, model, case, system):
    tag = f"[{model} {case.name}] {system}:"
    rec = {"model": model, "model_desc": model_desc(a, model), "system": system,
           "cache_kind": a.cache, "error": None, "check": "skipped",
           "delay_ms": a.delay_ms if model == "delay" else None}
    rec.update(case.as_dict())
    sargs, kind = system_args(system, case, a)
    rec["kind"] = kind
    log(f"{tag} building stack")
    t_build = time.monotonic()
    try:
        info = stack_create(sargs + model_args(a, model) + [
            "--slow-size", f"{case.fsize}M", "--cache", a.cache,
            "--cache-size", f"{case.rsize}M"])
    except RuntimeError as e:
        rec["error"] = str(e)
        log(f"{tag} ERROR {e}")
        return rec
    rec["table"] = info.get("TABLE", "")
    prog = Progress(tag, a.progress)
    try:
        top, slow, slow_k = info["TOP_DEV"], info["SLOW_DEV"], info["SLOW_KNAME"]
        log(f"{tag} stack ready in {time.monotonic() - t_build:.1f} s: {top} over {slow}"
            f"{' (' + info['CACHE_DEV'] + ')' if 'CACHE_DEV' in info else ''}")
        q = f"/sys/block/{slow_k}/queue"
        rec["slow_max_sectors_kb"] = int(read_file(f"{q}/max_sectors_kb"))
        rec["slow_max_segments"] = int(read_file(f"{q}/max_segments"))
        if kind == "tiercache":
            sh(["dmsetup", "message", info["DM_NAME"], "0", "stats", "reset"])
        top_bytes = int(sh(["blockdev", "--getsize64", top]))
        region = case.region_mib << 20
        io = case.fio_mib << 20
        if region > top_bytes:
            # bcache keeps its superblock at the start of the slow disk
            region = top_bytes // 4096 * 4096
            io = min(io, region)
            rec["note"] = f"region capped to the {top_bytes} byte device"
        s0 = disk_stat(slow_k)
        cap = a.bare_runtime if kind == "none" else (a.fio_runtime or None)
        log(f"{tag} fio {io / 1048576:g} MiB of 4 KiB random writes over {region / 1048576:g} MiB"
            f"{f' (at most {cap} s)' if cap else ''}")
        rec.update(run_fio(top, region, io, a, cap, prog, slow_k))
        rec["fio_cap_s"] = cap
        rec["intended_mib"] = io / 1048576
        rec["absorbed_mib"] = round(rec["fio_bytes"] / 1048576, 2)
        rec["absorbed_pct"] = round(100.0 * rec["fio_bytes"] / io, 1)
        rec["published_flush_s"] = published(rec)
        s1 = disk_stat(slow_k)
        d = stat_delta(s0, s1)
        rec.update({"origin_writes_fio": d["writes"], "origin_sectors_fio": d["sectors"],
                    "origin_merges_fio": d["merges"]})
        log(f"{tag} fio {rec['fio_iops']:.0f} IOPS over {rec['fio_seconds']:.1f} s, wrote"
            f" {rec['absorbed_mib']:g} of {io / 1048576:g} MiB ({rec['absorbed_pct']:g}%);"
            f" slow disk got {d['writes']} writes meanwhile")
        if kind == "none":
            return rec
        rec["dirty_before_flush"] = dirty_now(kind, info)
        log(f"{tag} full flush starts ({rec['dirty_before_flush']} dirty blocks)"
            if rec["dirty_before_flush"] is not None else f"{tag} full flush starts")
        prog = Progress(tag, a.progress)
        try:
            secs, err, extra = FLUSH[kind](info, prog, a.flush_timeout)
        except Timeout:
            secs, err, extra = None, f"flush did not finish within {a.flush_timeout} s", {}
        s2 = disk_stat(slow_k)
        d = stat_delta(s1, s2)
        rec.update(extra)
        rec.update({"flush_seconds": None if secs is None else round(secs, 3),
                    "origin_writes_flush": d["writes"], "origin_sectors_flush": d["sectors"],
                    "origin_merges_flush": d["merges"], "origin_reads_flush": d["reads"],
                    "origin_read_sectors_flush": d["read_sectors"]})
        rec["origin_writes"] = rec["origin_writes_fio"] + d["writes"]
        rec["origin_sectors"] = rec["origin_sectors_fio"] + d["sectors"]
        rec["avg_write_kb"] = (round(rec["origin_sectors"] / 2 / rec["origin_writes"], 1)
                               if rec["origin_writes"] else None)
        if err:
            rec["error"] = err
            log(f"{tag} ERROR {err}")
        else:
            log(f"{tag} flushed in {secs:.2f} s: {d['writes']} origin writes during the flush,"
                f" {rec['origin_writes']} in all, {rec['avg_write_kb']} KiB on average;"
                f" {d['reads']} origin reads during the flush")
        if a.check and not err:
            off = int(info.get("BCACHE_DATA_OFFSET") or 0) * 512
            bad, first = compare_devices(top, slow, off, region)
            rec["check"] = "ok" if bad == 0 else f"MISMATCH: {bad} blocks, first at byte {first}"
            log(f"{tag} slow disk {'matches' if bad == 0 else 'DIFFERS FROM'} the cached device"
                f" over the {region >> 20} MiB written{'' if bad == 0 else ': ' + rec['check']}")
    except (RuntimeError, OSError, ValueError, KeyError, IndexError, Timeout) as e:
        rec["error"] = rec.get("error") or f"{type(e).__name__}: {e}"
        log(f"{tag} ERROR {rec['error']}")
    finally:
        try:
            stack_remove()
        except RuntimeError as e:
            rec["error"] = rec["error"] or str(e)
            log(f"{tag} ERROR {e}")
    return rec


# ---------------------------------------------------------------------------
# the plan of a run and its ETA

# Rough seconds per step on a 2-core machine under QEMU TCG (the
# development machine), from the runs in docs/experiments.md, in two parts:
# the overhead (building and removing the stack, starting fio, reading the
# region back twice), which follows the CPU, and the work (fio and the
# flush), which mostly waits for the slow disk or the fio cap.
def estimate(a, model, case, system):
    """(overhead, work) seconds of one step."""
    kind = system_args(system, case, a)[1]
    mib, region = case.fio_mib, case.region_mib
    cap = a.fio_runtime or 0
    base = 25.0 + (case.fsize / 100.0 if a.slow_fill else 0)
    if a.check and kind != "none":
        base += region / 20.0
    if kind == "none":
        return base, float(a.bare_runtime)
    delay = model == "delay"
    sparse = case.sparse
    if kind == "tiercache":
        fio, flush = mib / 60.0, (1.5 if delay else 0.02 * mib * (4 if sparse else 1))
    elif kind == "dm-writecache":
        fio, flush = mib / 60.0, (2.0 if delay else (1.5 * mib if sparse else 0.03 * mib))
    elif kind == "dm-cache":
        # 4 KiB write misses go to the slow disk: about 10 IOPS on dm-delay
        full = mib * 256 / (10.0 if delay else 150.0)
        fio = min(cap, full) if cap else full
        flush = 2.0 + 0.1 * fio
    elif kind == "bcache":
        fio = mib / 15.0
        flush = mib * (5.0 if delay else (2.5 if sparse else 0.6))
    else:   # opencas
        fio = mib / 15.0
        flush = mib * 0.3
    if cap:
        fio = min(fio, cap)
    return base, fio + flush


def _clamp(v, lo, hi):
    return min(hi, max(lo, v))


class Plan:
    """Steps of a run with estimated durations, refined as they finish.
    The overheads of all steps are scaled by how the finished steps'
    overheads compared with their estimates (the machine's speed); a system
    that has finished a step already has its remaining steps scaled by how
    that went (its own speed)."""

    def __init__(self, steps, after=0.0, t0_epoch=None):
        self.steps = steps              # [(model, case, system, (overhead, work))]
        self.done = []                  # [(system, overhead, work, actual)]
        self.after = after              # estimate of what follows this run
        self.t0_wall = t0_epoch or time.time()

    def overhead_factor(self):
        if not self.done:
            return 1.0
        spent = sum(max(0.0, t - w) for _, _, w, t in self.done)
        return _clamp(spent / max(1e-6, sum(o for _, o, _, _ in self.done)), 0.5, 4.0)

    def expect(self, system, est, fo):
        o, w = est
        mine = [(oo * fo + ww, t) for s, oo, ww, t in self.done if s == system]
        fs = _clamp(sum(t for _, t in mine) / max(1e-6, sum(e for e, _ in mine)), 0.3, 3.0) \
            if mine else 1.0
        return (o * fo + w) * fs

    def left(self):
        fo = self.overhead_factor()
        rest = self.steps[len(self.done):]
        return sum(self.expect(s, est, fo) for _, _, s, est in rest) + self.after

    def finish(self, system, est, actual):
        self.done.append((system, est[0], est[1], actual))

    def line(self):
        el = time.time() - self.t0_wall
        left = self.left()
        return (f"{len(self.done)}/{len(self.steps)} steps, {clock(el)} elapsed,"
                f" ETA {clock(el + left)} (about {clock(left)} left)")


def clock(secs):
    secs = int(round(max(0, secs)))
    return f"{secs // 60}:{secs % 60:02d}"


def make_plan(a):
    cases = [Case(s, a.sparse_flush_depth) for s in a.cases.split(",") if s]
    models = [m for m in a.models.split(",") if m]
    for m in models:
        if m not in ("delay", "hdd"):
            raise SystemExit(f"flushbench: unknown model '{m}' (delay, hdd)")
    systems = [s for s in a.systems.split(",") if s]
    if "tiercache" in systems:
        i = systems.index("tiercache")
        systems[i:i + 1] = [f"tiercache-b{b}" for b in a.tc_bridges.split(",")]
    for s in systems:
        system_args(s, cases[0], a)
    steps = [(m, c, s, estimate(a, m, c, s)) for m in models for c in cases for s in systems]
    return models, cases, systems, steps


def cmd_plan(a):
    """Print the estimated seconds of a run with these options."""
    print(round(sum(o + w for *_, (o, w) in make_plan(a)[3])))
    return 0


def cmd_run(a):
    if os.geteuid() != 0:
        raise SystemExit("flushbench: run needs root")
    for tool in ("fio", "dmsetup", "blockdev"):
        if subprocess.run(["sh", "-c", f"command -v {tool}"], stdout=subprocess.DEVNULL).returncode:
            raise SystemExit(f"flushbench: {tool} not found")
    models, cases, systems, steps = make_plan(a)
    if a.opencas_dir:
        os.environ["OPENCAS_DIR"] = a.opencas_dir
    plan = Plan(steps, a.eta_after, a.t0_epoch)
    if a.t0_epoch:
        # every line shows the time since the start of the whole run
        global T_START
        T_START = time.monotonic() - max(0.0, time.time() - a.t0_epoch)
    os.makedirs(a.out, exist_ok=True)
    out = os.path.join(a.out, f"{a.tag}.json")
    meta = {"kernel": platform.release(), "started": datetime.datetime.now().isoformat(timespec="seconds"),
            "argv": sys.argv[1:], "seed": a.seed, "cache_kind": a.cache,
            "fio_runtime": a.fio_runtime,
            "models": {m: model_desc(a, m) for m in models},
            "cases": {c.name: c.desc() for c in cases}}
    records = []

    def save():
        tmp = out + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"meta": meta, "records": records}, f, indent=1)
        os.replace(tmp, out)

    def on_signal(signum, frame):
        raise KeyboardInterrupt()
    signal.signal(signal.SIGTERM, on_signal)
    # Leftovers of an interrupted run would block every create.
    subprocess.run([STACK, "remove", STACK_NAME], stdout=subprocess.DEVNULL)
    log(f"plan: {len(steps)} steps ({len(models)} model(s) x {len(cases)} case(s) x"
        f" {len(systems)} systems), about {clock(plan.left())} "
        f"({'fio at most ' + str(a.fio_runtime) + ' s' if a.fio_runtime else 'every system writes everything'})")
    try:
        for m, c, s, est in steps:
            if s == systems[0]:
                log(f"== {model_desc(a, m)} | {c.name}: {c.desc()}")
            t = time.monotonic()
            rec = run_one(a, m, c, s)
            records.append(rec)
            save()
            plan.finish(s, est, time.monotonic() - t)
            log(f"step {plan.line()} | {m} {c.name} {s}: {step_summary(rec)}")
    except KeyboardInterrupt:
        log("flushbench: interrupted; tearing down")
        subprocess.run([STACK, "remove", STACK_NAME])
        meta["interrupted"] = True
        save()
        return 130
    meta["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
    try:
        meta["tiercache_srcversion"] = read_file("/sys/module/dm_tiercache/srcversion")
    except OSError:
        pass
    save()
    log(f"flushbench: results in {out}")
    print_tables(records, sys.stdout)
    return 1 if any(r["error"] for r in records) else 0


# ---------------------------------------------------------------------------
# report

def fmt(v, spec):
    if v is None:
        return "-"
    if spec == "int":
        return f"{round(v)}"
    if spec == "s":
        return f"{v:.2f}" if v < 100 else f"{v:.0f}"
    if spec == "x":
        return f"{v:.2f}x" if v < 10 else f"{v:.0f}x"
    if spec == "mib":
        return f"{v:.1f}" if v < 10 else f"{v:.0f}"
    if spec == "pct":
        return f"{v:.1f}" if v < 10 else f"{v:.0f}"
    return f"{v:.1f}"


def groups(records):
    out = {}
    for r in records:
        out.setdefault((r["model_desc"], r["case"]), []).append(r)
    return out


def reference(rows):
    tcs = [r for r in rows if r.get("kind") == "tiercache" and r.get("origin_writes") and not r["error"]]
    if not tcs:
        return None
    # the most merging variant (largest bridge) is the product's answer
    return max(tcs, key=lambda r: int(r["system"].split("-b")[1]))


def add_ratios(records):
    for rows in groups(records).values():
        ref = reference(rows)
        for r in rows:
            r["ref"] = ref["system"] if ref else None
            r["time_vs_ref"] = r["writes_vs_ref"] = None
            if not ref or r["kind"] == "none" or r["error"]:
                continue
            if (r.get("absorbed_pct") or 100) < PARTIAL_PCT:
                continue    # it flushed less than tiercache did: no ratio
            if r.get("flush_seconds") and ref.get("flush_seconds"):
                r["time_vs_ref"] = r["flush_seconds"] / ref["flush_seconds"]
            if r.get("origin_writes") and ref.get("origin_writes"):
                r["writes_vs_ref"] = r["origin_writes"] / ref["origin_writes"]


COLUMNS = [("system", "system", None), ("written MiB", "absorbed_mib", "mib"),
           ("%", "absorbed_pct", "pct"), ("fio s", "fio_seconds", "s"),
           ("fio IOPS", "fio_iops", "int"),
           ("flush s", "flush_seconds", "s"), ("seed's s", "published_flush_s", "int"),
           ("origin writes", "origin_writes", "int"),
           ("in flush", "origin_writes_flush", "int"), ("avg KiB", "avg_write_kb", "f"),
           ("reads", "origin_reads_flush", "int"),
           ("time/tc", "time_vs_ref", "x"), ("writes/tc", "writes_vs_ref", "x"),
           ("check", "check", None)]
# what the bare slow disk shows
BARE_KEYS = ("system", "absorbed_mib", "absorbed_pct", "fio_seconds", "fio_iops")
# below this share of the intended data a system is called out under its table
PARTIAL_PCT = 99.0


def table_lines(rows):
    cells = [[h for h, _, _ in COLUMNS]]
    for r in rows:
        line = []
        for _, key, spec in COLUMNS:
            v = r.get(key)
            if r["kind"] == "none" and key not in BARE_KEYS:
                v = None
            line.append(str(v if v is not None else "-") if spec is None else fmt(v, spec))
        if r["error"]:
            line[-1] = "ERROR"
        cells.append(line)
    w = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
    lines = []
    for n, c in enumerate(cells):
        lines.append("  ".join(c[0].ljust(w[0]) if i == 0 else c[i].rjust(w[i]) if i < len(c) - 1
                               else c[i] for i in range(len(c))).rstrip())
        if n == 0:
            lines.append("  ".join("-" * x for x in w))
    return lines


def print_tables(records, out, markdown=False, notes=()):
    add_ratios(records)
    for n in notes:
        print(f"\n**{n}**" if markdown else f"\n{n}", file=out)
    for (mdesc, case), rows in groups(records).items():
        r0 = rows[0]
        head = (f"{mdesc} | {case}: {r0['fsize_mib']} MiB slow disk, {r0['rsize_mib']} MiB "
                f"{r0.get('cache_kind', 'ram')} cache, {r0['fio_mib']} MiB written over "
                f"{r0['region_mib']} MiB")
        if markdown:
            print(f"\n**{head}**\n", file=out)
            print("| " + " | ".join(h for h, _, _ in COLUMNS) + " |", file=out)
            print("|" + "|".join("---" for _ in COLUMNS) + "|", file=out)
            for line in table_lines(rows)[2:]:
                print("| " + " | ".join(re.split(r"\s{2,}", line.strip())) + " |", file=out)
        else:
            print(f"\n{head}", file=out)
            for line in table_lines(rows):
                print("  " + line, file=out)
        if markdown:
            print("", file=out)
        for line in table_notes(rows):
            print(f"{'* ' if markdown else '  '}{line}", file=out)


def table_notes(rows):
    """The lines under a table: errors, systems that did not write all
    they were given within the fio cap, what the columns compare."""
    notes = []
    for r in rows:
        if r["error"]:
            notes.append(f"{r['system']}: ERROR {r['error']}")
    for r in rows:
        if r["kind"] == "none" or r["error"] or r.get("absorbed_pct") is None:
            continue
        if r["absorbed_pct"] < PARTIAL_PCT:
            notes.append(
                f"{r['system']} wrote only {r['absorbed_mib']:g} of {r['intended_mib']:g} MiB"
                f" ({r['absorbed_pct']:g}%) in the {r['fio_cap_s']} s fio cap"
                f" ({r['fio_iops']:.0f} IOPS): its flush time and request counts cover only that."
                + (f" Its 4 KiB write misses went to the slow disk during fio"
                   f" ({r['origin_writes_fio']} writes)." if r["kind"] == "dm-cache" else ""))
    r0 = rows[0]
    cap = next((r.get("fio_cap_s") for r in rows if r["kind"] != "none"), None)
    notes.append("written MiB, % = what fio wrote through the system"
                 + (f" within its {cap} s cap (the seed's --runtime=15, not time-based)" if cap
                    else " (no cap: every system writes everything)")
                 + "; origin writes = writes the slow disk completed from the start of fio to"
                   " the end of the flush")
    if any(r.get("published_flush_s") for r in rows):
        notes.append("seed's s = the flush time the seed published for this case"
                     f" ({r0['fio_mib']} MiB on dm-delay 1000 ms)")
    ref = reference(rows)
    if ref:
        notes.append(f"x/tc = ratio to {ref['system']}")
    return notes


CSV_FIELDS = ["model", "case", "system", "fsize_mib", "rsize_mib", "fio_mib", "region_mib",
              "cache_kind", "fio_cap_s", "intended_mib", "absorbed_mib", "absorbed_pct",
              "fio_iops", "fio_seconds", "fio_ios", "flush_seconds", "published_flush_s",
              "origin_writes", "origin_sectors", "avg_write_kb", "origin_writes_fio",
              "origin_writes_flush", "origin_sectors_flush", "origin_merges_flush",
              "origin_reads_flush", "origin_read_sectors_flush",
              "dirty_before_flush", "time_vs_ref", "writes_vs_ref", "ref", "check", "error",
              "tc_wb_requests", "tc_avg_write_kb", "tc_merge_ratio", "tc_bridged_blocks",
              "tc_inflight_max", "model_desc", "table"]


def chart(records, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    add_ratios(records)
    cases = []
    for r in records:
        if r["case"] not in cases:
            cases.append(r["case"])
    models = []
    for r in records:
        if r["model_desc"] not in models:
            models.append(r["model_desc"])
    systems = []
    for r in records:
        if r["kind"] != "none" and r["system"] not in systems:
            systems.append(r["system"])
    colors = ["#4c72b0", "#dd8452", "#55a868", "#c44e52"]
    metrics = [("flush_seconds", "full flush time (s)"),
               ("origin_writes", "write requests the slow disk received")]
    fig, axes = plt.subplots(len(cases), 2, figsize=(13, 2.2 + 1.0 * len(systems) * len(cases)),
                             squeeze=False)
    bar_h = 0.8 / max(1, len(models))
    seed_labelled = False
    for ci, case in enumerate(cases):
        for mi, (key, label) in enumerate(metrics):
            ax = axes[ci][mi]
            vals_all = []
            for k, mdesc in enumerate(models):
                ys, vals, rs = [], [], []
                for si, s in enumerate(systems):
                    r = next((x for x in records if x["case"] == case and x["model_desc"] == mdesc
                              and x["system"] == s), None)
                    v = r.get(key) if r and not r["error"] else None
                    if v:
                        ys.append(si + (k - (len(models) - 1) / 2) * bar_h)
                        vals.append(v)
                        rs.append(r)
                ax.barh(ys, vals, height=bar_h * 0.95, color=colors[k % len(colors)],
                        label=mdesc if ci == 0 and mi == 0 else None)
                for y, v, r in zip(ys, vals, rs):
                    txt = fmt(v, "s") if key == "flush_seconds" else f"{int(v)}"
                    if r.get("absorbed_pct") is not None and r["absorbed_pct"] < PARTIAL_PCT:
                        txt += f"  (wrote {r['absorbed_pct']:g}% in {r['fio_cap_s']} s)"
                    if key == "flush_seconds" and r.get("published_flush_s"):
                        txt += f"  (seed: {r['published_flush_s']} s)"
                    pub = r.get("published_flush_s") if key == "flush_seconds" else None
                    ax.text(max(v, pub or 0) * 1.12, y, txt, va="center", fontsize=8)
                vals_all += vals
                if key == "flush_seconds":
                    pub = [(y, r["published_flush_s"]) for y, r in zip(ys, rs)
                           if r.get("published_flush_s")]
                    if pub:
                        ax.scatter([p for _, p in pub], [y for y, _ in pub], marker="|", s=300,
                                   color="black", zorder=3,
                                   label="seed's published flush time" if not seed_labelled else None)
                        seed_labelled = True
                        vals_all += [p for _, p in pub]
            ax.set_xscale("log")
            if vals_all:
                ax.set_xlim(min(vals_all) / 2, max(vals_all) * 8)
            ax.set_yticks(range(len(systems)))
            ax.set_yticklabels(systems)
            for t in ax.get_yticklabels():
                if t.get_text().startswith("tiercache"):
                    t.set_fontweight("bold")
            ax.invert_yaxis()
            ax.grid(axis="x", which="major", alpha=0.3)
            r0 = next(x for x in records if x["case"] == case)
            ax.set_title(f"{case}: {r0['fio_mib']} MiB over {r0['region_mib']} MiB of a "
                         f"{r0['fsize_mib']} MiB disk - {label}", fontsize=9)
    caps = {r.get("fio_cap_s") for r in records if r["kind"] != "none"}
    cap = next(iter(caps)) if len(caps) == 1 else None
    fig.suptitle("Full flush after 4 KiB random writes"
                 + (f" (fio at most {cap} s)" if cap else "")
                 + " - log scale, shorter is better", fontsize=12)
    fig.legend(loc="lower center", ncol=len(models) + 1, fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.04, 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def load(paths):
    records, metas = [], []
    for p in paths:
        files = sorted(glob.glob(os.path.join(p, "*.json"))) if os.path.isdir(p) else [p]
        for f in files:
            if os.path.basename(f) == "results.json":
                continue
            with open(f) as fh:
                d = json.load(fh)
            metas.append(d.get("meta", {}))
            records += d.get("records", [])
    return records, metas


def cmd_report(a):
    records, metas = load(a.inputs)
    if not records:
        raise SystemExit("flushbench: no results found in " + " ".join(a.inputs))
    add_ratios(records)
    out_dir = a.out or (a.inputs[0] if os.path.isdir(a.inputs[0]) else os.path.dirname(a.inputs[0]))
    # what the host side had to say (experiment.sh: a peer that was skipped)
    notes = []
    for p in a.inputs:
        f = os.path.join(p if os.path.isdir(p) else os.path.dirname(p), "notes.txt")
        if os.path.exists(f):
            with open(f) as fh:
                notes += [ln.strip() for ln in fh if ln.strip()]
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"meta": metas, "records": records}, f, indent=1)
    with open(os.path.join(out_dir, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in records:
            w.writerow(r)
    with open(os.path.join(out_dir, "tables.txt"), "w") as f:
        print_tables(records, f, notes=notes)
    with open(os.path.join(out_dir, "tables.md"), "w") as f:
        print_tables(records, f, markdown=True, notes=notes)
    print_tables(records, sys.stdout, notes=notes)
    print(f"\nflushbench: {out_dir}/results.json, results.csv, tables.txt, tables.md")
    if not a.no_chart:
        png = a.chart or os.path.join(out_dir, "flush.png")
        try:
            chart(records, png)
            print(f"flushbench: chart {png}")
        except ImportError:
            print("flushbench: matplotlib missing (apt-get install python3-matplotlib): no chart",
                  file=sys.stderr)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the experiment (root, in the VM)")
    pl = sub.add_parser("plan", help="print the estimated seconds of a run (same options)")
    run_args(r)
    run_args(pl)
    p = sub.add_parser("report", help="tables, CSV and chart")
    p.add_argument("inputs", nargs="+", help="result directories or JSON files")
    p.add_argument("--out", help="output directory (default: the first input)")
    p.add_argument("--chart", help="PNG path (default: OUT/flush.png)")
    p.add_argument("--no-chart", action="store_true")
    a = ap.parse_args()
    return {"run": cmd_run, "plan": cmd_plan, "report": cmd_report}[a.cmd](a)


def run_args(r):
    r.add_argument("--out", default="results/experiment", help="directory for the JSON file")
    r.add_argument("--tag", default="run", help="JSON file name (without .json)")
    r.add_argument("--models", default="delay,hdd", help="slow-disk models: delay,hdd")
    r.add_argument("--cases", default=DEFAULT_CASES,
                   help="NAME:FSIZE:RSIZE:FIOSIZE[:REGION],... in MiB (default: %(default)s)")
    r.add_argument("--systems", default=DEFAULT_SYSTEMS,
                   help="bare (fio on the slow disk), tiercache (one run per --tc-bridges"
                   " value), bcache, dm-cache, dm-writecache, opencas (needs --opencas-dir)")
    r.add_argument("--opencas-dir", default=None,
                   help="Open CAS built by scripts/opencas.sh (cas_cache.ko and casadm)")
    r.add_argument("--fio-runtime", type=int, default=15,
                   help="cap every system's fio at this many seconds, as the seed did"
                   " (fio ends then or when all is written; 0 = no cap: everything is written)")
    r.add_argument("--t0-epoch", type=float, default=None,
                   help="wall-clock start of the whole run (elapsed time and ETA)")
    r.add_argument("--eta-after", type=float, default=0.0,
                   help="estimated seconds of what follows this run (later VM boots)")
    r.add_argument("--slow-fill", type=int, choices=[0, 1], default=1,
                   help="write the whole slow disk once before each case (brd and null_blk"
                   " allocate a page on a sector's first write, a disk does not)")
    r.add_argument("--tc-bridges", default="0,64,128", help="tiercache bridge_gap_kb values")
    r.add_argument("--sparse-flush-depth", type=int, default=4096,
                   help="tiercache flush_depth for sparse cases (0 = module default)")
    r.add_argument("--cache", default="ram", choices=["ram", "ssd"], help="cache device kind")
    r.add_argument("--delay-ms", type=int, default=1000, help="dm-delay write delay")
    r.add_argument("--read-delay-ms", type=int, default=0, help="dm-delay read delay")
    r.add_argument("--slow-backing", default="ram", choices=["ram", "file"])
    r.add_argument("--hdd-nsec", type=int, default=8000000, help="null_blk completion_nsec")
    r.add_argument("--hdd-mbps", type=int, default=150, help="null_blk mbps (0 = no cap)")
    r.add_argument("--hdd-depth", type=int, default=1, help="null_blk hw_queue_depth")
    r.add_argument("--hdd-sched", default="mq-deadline")
    r.add_argument("--hdd-max-kb", type=int, default=1024, help="null_blk max_sectors in KiB")
    r.add_argument("--bcache-writeback-delay", type=int, default=None,
                   help="bcache writeback_delay before attach (default: bcache's 30 s)")
    r.add_argument("--seed", type=int, default=20240229, help="fio --randseed")
    r.add_argument("--bare-runtime", type=int, default=10, help="seconds of fio on the bare slow disk")
    r.add_argument("--fio-timeout", type=int, default=7200)
    r.add_argument("--flush-timeout", type=int, default=3600)
    r.add_argument("--progress", type=float, default=30.0,
                   help="seconds between progress lines within a step")
    r.add_argument("--no-check", dest="check", action="store_false",
                   help="skip comparing the slow disk with the cached device after the flush")


if __name__ == "__main__":
    sys.exit(main())
