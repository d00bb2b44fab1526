# SPDX-License-Identifier: GPL-2.0
"""The guest side of the QEMU-kill crash test (tests/crash/qemu_kill.sh).

    phase.py write RESDIR    boot 1: format, flushed rounds, then unflushed
                             writes until QEMU is killed
    phase.py check RESDIR    boot 2: load the cache, verify, flush, verify
                             the origin; writes RESDIR/verdict.json

RESDIR is the host directory shared read-write over 9p.  It holds
params.json (written by the host: seed, sizes, module and tool paths).

Every 4 KiB block written carries a header naming its block and version,
and a body derived from (seed, block, version), so any block read back
names the write it came from and is checked byte for byte.  Versions
below UNFLUSHED_BASE are writes of the flushed rounds; version
UNFLUSHED_BASE + i is step i of the unflushed phase, whose block is a
deterministic function of i (sched()).  The origin starts as base(b) per
block (filled by the host).

Durable records (journal.jsonl, appended and fsynced over 9p):
  {"kind": "round", ...}  after a round's flush point completed: the
                          writes it made (block -> version)
  {"kind": "plan", ...}   the unflushed phase's block pool
  {"kind": "upto", ...}   no unflushed step >= steps was issued yet (the
                          bound is written before the steps are)
"""

import hashlib
import json
import os
import random
import struct
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vm"))
import tcdisk  # noqa: E402
import tclib  # noqa: E402

B = 4096
UNFLUSHED_BASE = 1_000_000
HDR = struct.Struct("<8sQQQ")          # magic, block, version, seed
MAGIC = b"TCCRASH1"
NAME = "tc-crash"
# no watermark writeback: every block dirty at the last flush point is
# still dirty at the crash (the target is never told to flush), except,
# under ordered, what a full span of epochs made writeback send (checked
# on the origin instead)
KEYS = {"high_watermark": 100, "low_watermark": 0}
PROGRESS_STEP = 32                     # unflushed steps per "upto" record


def base(seed, b):
    """The origin's initial content of block b (the host fills it)."""
    return hashlib.shake_128(f"base:{seed}:{b}".encode()).digest(B)


def block_data(seed, b, v):
    body = hashlib.shake_128(f"data:{seed}:{b}:{v}".encode()).digest(B - HDR.size)
    return HDR.pack(MAGIC, b, v, seed) + body


def sched(seed, pool, i):
    """Block of unflushed step i."""
    h = hashlib.blake2b(f"sched:{seed}:{i}".encode(), digest_size=8).digest()
    return pool[int.from_bytes(h, "little") % len(pool)]


def log(msg):
    print(f"[phase] {msg}", file=sys.stderr, flush=True)


class Journal:
    def __init__(self, path):
        self.f = open(path, "a")

    def add(self, rec):
        self.f.write(json.dumps(rec, separators=(",", ":")) + "\n")
        self.f.flush()
        os.fsync(self.f.fileno())


def read_journal(path):
    """Complete records only: a line cut by the kill is not a record."""
    recs = []
    for line in Path(path).read_text().split("\n"):
        try:
            recs.append(json.loads(line))
        except ValueError:
            pass
    return recs


def find_disks(p):
    """The cache and origin disks, by size (the host makes them different
    sizes); the serial virtme-ng sets is the host file's path cut to 20
    characters, too short to tell the two apart."""
    found = {}
    for d in sorted(Path("/sys/block").iterdir()):
        size = int((d / "size").read_text()) * 512
        serial = (d / "serial").read_text().strip() if (d / "serial").exists() else ""
        log(f"disk {d.name}: {size} bytes, serial {serial!r}")
        for role in ("cache", "origin"):
            if size == p[f"{role}_bytes"]:
                assert role not in found, f"two disks of the {role}'s size"
                found[role] = f"/dev/{d.name}"
    assert set(found) == {"cache", "origin"}, f"disks not found: {found}"
    return found["cache"], found["origin"]


def start_dmesg(res, boot):
    # streamed to the host: boot 1's log survives the kill
    return subprocess.Popen(["dmesg", "-w"], stdout=open(res / f"dmesg-{boot}.txt", "w"),
                            stderr=subprocess.STDOUT)


def load_module(p):
    tclib.run(["modprobe", "dm-mod"], check=False)
    tclib.run(["modprobe", "libcrc32c"], check=False)   # insmod does not resolve it
    tclib.run(["insmod", p["ko"]])


def table(p, cache, origin, fmt):
    keys = dict(KEYS, commit_ms=p["commit_ms"])
    if p.get("ordered"):
        keys["ordered"] = 1
    return tclib.TierCache.make_table(origin, cache, 8, "writeback", keys, fmt=fmt)


# ---------------------------------------------------------------- boot 1

def write_phase(res, p):
    seed = p["seed"]
    cache, origin = find_disks(p)
    nblocks = p["origin_bytes"] // B
    # the host filled the origin and left the cache blank: check both, so
    # a swapped pair cannot pass unnoticed
    assert tclib.read_direct(origin, 0, B) == base(seed, 0), "origin block 0 is not base(0)"
    assert tclib.read_direct(origin, (nblocks - 1) * B, B) == base(seed, nblocks - 1)
    assert tclib.read_direct(cache, 0, B) == bytes(B), "the cache disk is not blank"
    load_module(p)
    tc = tclib.TierCache.create(NAME, table(p, cache, origin, fmt=True))
    log(f"created: {tc.status_line()}")

    j = Journal(res / "journal.jsonl")
    buf = tclib.aligned_buf(B)
    fd = os.open(tc.path, os.O_RDWR | os.O_DIRECT)
    fd_fua = os.open(tc.path, os.O_RDWR | os.O_DIRECT | os.O_DSYNC)  # each write FUA

    def put(f, b, v):
        buf[:B] = block_data(seed, b, v)
        n = os.pwrite(f, memoryview(buf)[:B], b * B)
        assert n == B, f"short write {n} at block {b}"

    rng = random.Random(seed)
    state = {}
    v = 0
    for r in range(p["rounds"]):
        kind = "fsync" if r % 2 == 0 else "fua"
        writes = {}
        for _ in range(p["round_writes"]):
            # a third rewrites blocks of earlier rounds (new versions)
            if state and rng.random() < 0.33:
                b = rng.choice(sorted(state))
            else:
                b = rng.randrange(nblocks)
            v += 1
            put(fd if kind == "fsync" else fd_fua, b, v)
            writes[b] = v
        if kind == "fsync":
            os.fsync(fd)            # REQ_PREFLUSH on the dm device
        state.update(writes)
        j.add({"kind": "round", "round": r, "type": kind,
               "writes": {str(b): x for b, x in writes.items()}})
        log(f"round {r} ({kind}): {len(writes)} blocks, {len(state)} written in all; "
            f"{tc.status_line()}")

    # unflushed phase: rewrites of flushed blocks and new blocks, cycling
    # over a fixed pool so the cache never fills however long it runs
    old = sorted(state)
    new = sorted(set(rng.sample(range(nblocks), p["new_blocks"] * 2)) - set(state))
    pool = rng.sample(old, min(len(old), p["rewrite_blocks"])) + new[:p["new_blocks"]]
    j.add({"kind": "plan", "pool": pool, "base": UNFLUSHED_BASE})
    deadline = time.monotonic() + p["unflushed_max_s"]
    i = 0
    ready = False
    while time.monotonic() < deadline:
        if i % PROGRESS_STEP == 0:
            j.add({"kind": "upto", "steps": i + PROGRESS_STEP})
        put(fd, sched(seed, pool, i), UNFLUSHED_BASE + i)
        i += 1
        if i == p["ready_after"] and not ready:
            (res / "ready").write_text(f"{i}\n")
            ready = True
            log(f"ready after {i} unflushed writes: {tc.status_line()}")
    # not killed: the host reports it
    (res / "not-killed").write_text(f"{i} unflushed writes, no kill within "
                                    f"{p['unflushed_max_s']} s\n")
    log("the unflushed phase ran out of time without a kill")


# ---------------------------------------------------------------- boot 2

class Checker:
    def __init__(self, p, recs):
        self.seed = p["seed"]
        self.nblocks = p["origin_bytes"] // B
        self.acked = {}         # block -> version at the last flush point
        rounds = [r for r in recs if r["kind"] == "round"]
        for r in rounds:
            self.acked.update({int(b): v for b, v in r["writes"].items()})
        self.rounds = len(rounds)
        plans = [r for r in recs if r["kind"] == "plan"]
        assert len(plans) == 1, f"journal has {len(plans)} plan records"
        self.pool = plans[0]["pool"]
        self.upto = max((r["steps"] for r in recs if r["kind"] == "upto"), default=0)
        # blocks that may hold a write made after the last flush point
        self.late = {}
        for i in range(self.upto):
            self.late.setdefault(sched(self.seed, self.pool, i), set()).add(i)
        self.written = set(self.acked) | set(self.late)
        self.errors = []        # the first mismatches, for the verdict
        self.nbad = 0
        self.stats = {"acked_exact": 0, "acked_later": 0, "late_survived": 0,
                      "base": 0}

    def error(self, msg):
        self.nbad += 1
        if len(self.errors) < 50:
            self.errors.append(msg)
        if self.nbad <= 200:
            log("MISMATCH " + msg)

    def name(self, b, got, v):
        if v is not None:
            return f"version {v}"
        if got == base(self.seed, b):
            return "the origin's old content"
        return "unknown data " + got[:16].hex()

    def judge(self, b, got, what):
        """Is got an allowed content of block b?  Returns a digest."""
        hdr = HDR.unpack_from(got)
        known = hdr[0] == MAGIC and hdr[1] == b and hdr[3] == self.seed
        if known and got != block_data(self.seed, b, hdr[2]):
            self.error(f"{what}: block {b} version {hdr[2]}: header right, body corrupt")
            return
        v = hdr[2] if known else None
        if b in self.acked:
            if v == self.acked[b]:
                self.stats["acked_exact"] += 1
            elif v is not None and v >= UNFLUSHED_BASE and v - UNFLUSHED_BASE in self.late.get(b, ()):
                self.stats["acked_later"] += 1
            else:
                self.error(f"{what}: block {b} acknowledged before the last flush point as "
                           f"version {self.acked[b]}, reads {self.name(b, got, v)}")
        elif v is not None and v >= UNFLUSHED_BASE and v - UNFLUSHED_BASE in self.late.get(b, ()):
            self.stats["late_survived"] += 1
        elif got == base(self.seed, b):
            self.stats["base"] += 1
        else:
            self.error(f"{what}: block {b} (not acknowledged) reads {self.name(b, got, v)}, "
                       f"neither the origin's base content nor an unflushed write of it")

    def on_origin(self, path, b):
        """Does block b of path hold its acknowledged version (or a later
        unflushed one)?"""
        got = tclib.read_direct(path, b * B, B)
        hdr = HDR.unpack_from(got)
        if hdr[0] != MAGIC or hdr[1] != b or hdr[3] != self.seed or \
                got != block_data(self.seed, b, hdr[2]):
            return False
        v = hdr[2]
        return v == self.acked[b] or \
            (v >= UNFLUSHED_BASE and v - UNFLUSHED_BASE in self.late.get(b, ()))

    def scan(self, path, what, chunk=256):
        """O_DIRECT read of every block; judge each; return their digests."""
        digests = []
        n = chunk * B
        buf = tclib.aligned_buf(n)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            for b0 in range(0, self.nblocks, chunk):
                k = min(chunk, self.nblocks - b0)
                got = os.preadv(fd, [memoryview(buf)[:k * B]], b0 * B)
                assert got == k * B, f"short read at block {b0}"
                for j in range(k):
                    blk = bytes(buf[j * B:(j + 1) * B])
                    self.judge(b0 + j, blk, what)
                    digests.append(hashlib.blake2b(blk, digest_size=16).digest())
        finally:
            os.close(fd)
            buf.close()
        return digests


def cache_entries(cache):
    """(commit_seq, committed dirty versions as a list of (block, epoch),
    uncommitted dirty entries) read from the cache device (tcdisk.py).  Entries newer than
    the superblock's commit_seq belong to an unfinished commit and do not
    count; entries of another format generation read as empty."""
    raw = tclib.read_direct(cache, 0, B)
    assert raw[:8] == tcdisk.MAGIC, f"no superblock on {cache}: {raw[:8]!r}"
    sb = tcdisk.decode_sb(raw)
    area = tclib.read_direct(cache, tcdisk.META_START * 512, sb.entries_bytes)
    dirty, uncommitted = [], 0
    for _s, e in tcdisk.entries(area, sb):
        if e.state == tcdisk.DIRTY:
            dirty.append((e.block, e.epoch))
        elif e.state == tcdisk.UNCOMMITTED and e.dirty:
            uncommitted += 1
    return sb.commit_seq, dirty, uncommitted


def check_phase(res, p):
    v = {"ok": False, "errors": [], "checks": {}}
    cache, origin = find_disks(p)
    recs = read_journal(res / "journal.jsonl")
    c = Checker(p, recs)
    v["checks"]["journal"] = {"rounds": c.rounds, "acked_blocks": len(c.acked),
                              "unflushed_steps_bound": c.upto,
                              "late_blocks": len(c.late), "written_blocks": len(c.written)}
    log(f"journal: {v['checks']['journal']}")
    assert c.rounds == p["rounds"], f"journal has {c.rounds} of {p['rounds']} rounds"

    def fail(msg):
        v["errors"].append(msg)
        log("FAIL " + msg)

    # the crash image as left by the kill, before the module touches it
    commit_seq, dirty, uncommitted = cache_entries(cache)
    v["checks"]["entries"] = {"commit_seq": commit_seq, "dirty": len(dirty),
                              "uncommitted_dirty": uncommitted}
    blocks = [b for b, _e in dirty]
    # under ordered, one version per epoch; else one per block
    if len(set(dirty)) != len(dirty) or \
            (not p.get("ordered") and len(set(blocks)) != len(blocks)):
        fail("two committed dirty entries for one block"
             + (" in one epoch" if p.get("ordered") else ""))
    epochs = sorted({e for _b, e in dirty})
    v["checks"]["entries"]["versions"] = len(dirty) - len(set(blocks))
    v["checks"]["entries"]["epochs"] = len(epochs)
    stray = sorted(set(blocks) - c.written)
    if stray:
        fail(f"{len(stray)} committed dirty entries name blocks never written: {stray[:10]}")
    missing = sorted(set(c.acked) - set(blocks))
    written_back = []
    if missing and p.get("ordered"):
        # Under ordered, writeback runs whatever the watermarks once 255
        # epochs are live (a flush waits for the oldest to go): a block
        # written back and recorded clean before the crash has no dirty
        # entry, and the origin, as the kill left it, holds its version.
        written_back = [b for b in missing if c.on_origin(origin, b)]
        missing = [b for b in missing if b not in set(written_back)]
    v["checks"]["entries"]["written_back"] = len(written_back)
    if missing:
        fail(f"{len(missing)} blocks acknowledged before the last flush point have no "
             f"committed dirty entry" + (" and are not on the origin" if p.get("ordered")
                                          else "") + f": {missing[:10]}")

    tool = Path(p["tool"])
    if tool.exists():
        t = tclib.run([str(tool), "check", cache], check=False)
        v["checks"]["tool_check"] = t.returncode
        log(f"tiercache check: rc {t.returncode}\n{t.stdout}{t.stderr}")
        if t.returncode != 0:
            fail(f"tiercache check {cache}: rc {t.returncode}: {(t.stdout + t.stderr).strip()[-300:]}")
    else:
        v["checks"]["tool_check"] = f"skipped: {tool} not built"

    load_module(p)
    tc = tclib.TierCache.create(NAME, table(p, cache, origin, fmt=False))
    st = tc.status()
    lo, hi = len(c.acked) - len(written_back), len(c.written)
    v["checks"]["status_dirty"] = {"dirty": st["dirty"], "min": lo, "max": hi,
                                   "entries": len(dirty), "raw": st["raw"]}
    log(f"loaded: {st['raw']} (dirty allowed {lo}..{hi})")
    if not lo <= st["dirty"] <= hi:
        fail(f"status dirty {st['dirty']} after the crash: want {lo} (dirty at the last "
             f"flush point) .. {hi} (plus every block written after it)")
    if st["dirty"] != len(dirty):
        fail(f"status dirty {st['dirty']} != {len(dirty)} committed dirty entries on disk")
    if p.get("ordered") and epochs:
        # the load resumes the epochs: the oldest is the oldest on disk,
        # writes go to a new one after the newest
        got = (st["epoch_oldest"], st["epoch_current"])
        want = (epochs[0], epochs[-1] + 1)
        v["checks"]["epochs"] = {"status": got, "entries": [epochs[0], epochs[-1]]}
        if got != want and got != (epochs[0], epochs[-1]):
            fail(f"status epochs {got} after the load: the entries hold epochs "
                 f"{epochs[0]}..{epochs[-1]}")
    if p.get("ordered") and not v["checks"]["entries"]["versions"]:
        fail("no block has two versions on the crash image: the ordered run "
             "tested no copy on write")

    def scan(path, what, key):
        c.nbad, c.errors, c.stats = 0, [], dict.fromkeys(c.stats, 0)
        digests = c.scan(path, what)
        v["checks"][key] = dict(c.stats, mismatches=c.nbad)
        v.setdefault("mismatches", []).extend(c.errors)
        log(f"{what}: {c.stats}, {c.nbad} mismatching blocks")
        if c.nbad:
            fail(f"{what}: {c.nbad} blocks hold what they must not, first: {c.errors[0]}")
        return digests

    seen = scan(tc.path, "through the target", "through_target")

    tc.flush(timeout=600)
    tc.remove()
    _seq, dirty2, _u = cache_entries(cache)
    if dirty2:
        fail(f"{len(dirty2)} dirty entries left on the cache after the flush")
    seen2 = scan(origin, "origin after the flush", "origin")
    differ = [b for b in range(c.nblocks) if seen[b] != seen2[b]]
    if differ:
        fail(f"{len(differ)} origin blocks differ from what the target read before the "
             f"flush: {differ[:10]}")
    tclib.run(["rmmod", tclib.MODNAME])
    v["ok"] = not v["errors"]
    return v


def main():
    what, res = sys.argv[1], Path(sys.argv[2])
    p = json.loads((res / "params.json").read_text())
    tclib.kmsg(f"crash test: {what}")
    dm = start_dmesg(res, "boot1" if what == "write" else "boot2")
    try:
        if what == "write":
            write_phase(res, p)
        else:
            try:
                v = check_phase(res, p)
            except Exception as e:          # noqa: BLE001 - reported in the verdict
                import traceback
                traceback.print_exc()
                v = {"ok": False, "errors": [f"boot 2 aborted: {e!r}"]}
            (res / "verdict.json").write_text(json.dumps(v, indent=1) + "\n")
            log(f"verdict: {'PASS' if v['ok'] else 'FAIL'} {v['errors'][:5]}")
    finally:
        time.sleep(1)
        dm.terminate()
        os.sync()


if __name__ == "__main__":
    main()
