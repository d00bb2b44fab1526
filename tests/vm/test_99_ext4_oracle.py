# SPDX-License-Identifier: GPL-2.0
"""The replay oracle on a file system (issue 12, "Proof"): is the origin
alone, at every instant of writeback, a file system that a power cut of
the cached device could have left?

dm-log-writes sits between tiercache and the origin (a RAM disk) and
records the origin's writes in the order they became durable.  ext4 lives
on tiercache; a writer creates files and fsyncs each one while fsstress
churns the metadata (with fsyncs of its own), and background writeback
runs all along (a small cache, low watermarks).  A watcher polls the
status: each time epoch_oldest (field 24) moves to N, every write of the
epochs before N is on the origin and flushed, so it drops the mark
`ep-N` into the origin's log (dm-log-writes logs a write before the
flush that made it durable, and a mark when it arrives: a retired
epoch's writes always precede its mark).

Then the log is replayed from the end of mkfs onto a RAM disk, and at
every FLUSH or FUA entry and at 200 or more other points (every Nth
write) a copy of the origin alone is judged by the sector rule below, and
every TC_ORACLE_FSCK_EVERY-th one (and the last) checked:
  - e2fsck recovers the journal, then `e2fsck -fp` (forced) repairs by
    itself whatever it finds;
  - under `ordered`, every file whose fsync returned while epoch_current
    was c is there with its data, byte for byte, once the mark ep-N with
    N > c has been replayed (its data and its journal commit are in
    epochs up to c).
A second dm-log-writes log sits above tiercache (the upper log: the
data of every write ext4 sent the cached device), and the block layer's
trace events give each of those bios its issue and completion time.
Each replayed state is also judged sector by sector against them
(tests/vm/powercut.py): is it a state the cached device could have had
after a power cut?  That is the module's promise itself, checked without
trusting e2fsck to notice; a state e2fsck cannot repair is reported with
that verdict (a damaged state the sector rule allows points at the file
system, not at the order of writeback).

Under `ordered 1` every state must pass the sector rule, leave the
boot-time check (`e2fsck -fp`) nothing it cannot repair by itself, and
hold its fsynced files.  Not `e2fsck -fn` clean: ext4 alone, with no
cache, leaves states whose i_blocks is one block off at legal cuts of
this workload (the control, tests/vm/control_99_ext4_alone.py), which
the boot-time check corrects.  Under the default policy the same
workload and the same replay must reach a state the sector rule refuses,
or the oracle has no teeth.

TC_ORACLE_SEED selects the workload's seed (default 1).
TC_ORACLE_FSCK_EVERY=N checks only every Nth state with e2fsck and the
fsynced files, and always the last (default 8: about 25 of the 200 or so
states in `make test`, which must fit CI's time; 1 checks all); the
sector rule still judges every one.
The debug kernel's lane sets it (tests/debug/run.sh): there e2fsck of
400 states alone takes over an hour.
"""

import os
import queue
import random
import signal
import subprocess
import tempfile
import threading
import time

import pytest

import logwrites
import powercut
import tclib
from tclib import MiB
from faults import fsync_path, swap
from test_85_fsx import xfstests_dir

pytestmark = [pytest.mark.module, pytest.mark.usefixtures("tc_module")]

SEED = int(os.environ.get("TC_ORACLE_SEED", "1"))
FSCK_EVERY = max(1, int(os.environ.get("TC_ORACLE_FSCK_EVERY", "8")))
ORIGIN_MIB = 32
CACHE_MIB = 8
LOG_MIB = 192
NFILES = 24
WORKERS = 2         # states checked at once (each on its own RAM disk)
MIN_OTHER_POINTS = 200
# small origin requests: more writes between two flushes, so that 200
# points of the replay fall between flushes whatever the run's timing
KEYS = {"high_watermark": 20, "low_watermark": 5, "commit_ms": 1000,
        "max_flush_kb": 64}


def e2fsck(dev, *args):
    # the device's page cache may hold blocks read before the writes that
    # went to it through a stacked device (a udev probe of a new device
    # while log-writes already holds it open): e2fsck reads buffered
    tclib.flushbufs(dev)
    p = subprocess.run(["e2fsck", *args, dev], capture_output=True, text=True,
                       timeout=300)
    return p.returncode, p.stdout + p.stderr


def unmount(mnt):
    """Clean-up: unmount if still mounted (lazily if busy)."""
    if os.path.ismount(mnt) and tclib.run(["umount", mnt], check=False,
                                          timeout=300).returncode:
        tclib.run(["umount", "-l", mnt], check=False)


def content(name, size):
    rng = random.Random(f"{SEED}-{name}")
    return rng.randbytes(size)


class EpochMarks(threading.Thread):
    """Drops the mark ep-N into the origin's log when epoch_oldest becomes N."""

    def __init__(self, tc, lw):
        super().__init__(daemon=True)
        self.tc, self.lw = tc, lw
        self.stop = threading.Event()
        self.marked = []
        self.error = None

    def run(self):
        last = 0
        try:
            while not self.stop.is_set():
                old = self.tc.status()["epoch_oldest"] or 0
                if old > last:
                    self.lw.message("mark", f"ep-{old}")
                    self.marked.append(old)
                    last = old
                time.sleep(0.02)
        except Exception as e:  # noqa: BLE001 (reported by the test)
            self.error = e


def writer(mnt, tc, rng):
    """Write-once files, each fsynced (and its directory): returns
    [(name, size, epoch_current after the fsync)].  Churn between them:
    a file rewritten in place, files unlinked."""
    done = []
    d = os.path.join(mnt, "kept")
    os.mkdir(d)
    fsync_path(mnt)
    churn = os.path.join(mnt, "churn")
    os.mkdir(churn)
    for i in range(NFILES):
        name = f"f{i:03d}"
        size = rng.choice([rng.randrange(1, 4096), rng.randrange(4096, 96 * 1024)])
        p = os.path.join(d, name)
        with open(p, "wb") as f:
            f.write(content(name, size))
            f.flush()
            os.fsync(f.fileno())
        fsync_path(d)
        done.append((name, size, tc.status()["epoch_current"] or 0))
        # churn: not verified, only there to move metadata about
        q = os.path.join(churn, f"c{i % 7}")
        with open(q, "ab") as f:
            f.write(rng.randbytes(rng.randrange(512, 32 * 1024)))
        victim = os.path.join(churn, f"c{rng.randrange(7)}")
        if i % 5 == 4 and os.path.exists(victim):
            os.unlink(victim)
    return done


def run_workload(stack, tc, lw, up, ordered):
    mnt = tempfile.mkdtemp(prefix="tcoracle.")
    tclib.run(["mount", "-t", "ext4", up.path, mnt])
    stack._defer(unmount, mnt)
    marks = EpochMarks(tc, lw)
    marks.start()
    fss = subprocess.Popen(
        [str(xfstests_dir() / "ltp" / "fsstress"), "-d", os.path.join(mnt, "stress"),
         "-n", "120", "-p", "2", "-s", str(SEED), "-f", "fsync=4", "-f", "fdatasync=2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        files = writer(mnt, tc, random.Random(SEED))
    finally:
        try:
            _, err = fss.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            fss.kill()
            raise
    assert fss.returncode == 0, f"fsstress failed ({fss.returncode}): {err[-2000:]}"
    tclib.run(["umount", mnt], timeout=300)
    os.rmdir(mnt)
    st = tc.flush(timeout=600)
    # the last retirements: give the watcher a look at the final status
    time.sleep(0.3)
    marks.stop.set()
    marks.join(timeout=30)
    assert marks.error is None, f"epoch watcher: {marks.error!r}"
    lw.message("mark", "end")
    up.message("mark", "end")
    tclib.log(f"{'ordered' if ordered else 'default'}: {len(files)} files, "
              f"epochs to {st['epoch_current']}, marks {len(marks.marked)}, "
              f"origin writes {st['wb_requests']}, bridged {st['bridged_blocks']}")
    return files


def checkpoints(log, start):
    """FLUSH/FUA entries after start, and every Nth write: (points, n_other)."""
    ents = log.entries[start + 1:]
    durable = {e.index for e in ents if e.flags & (logwrites.FLUSH | logwrites.FUA)}
    writes = [e.index for e in ents if e.is_write and e.index not in durable]
    step = max(1, len(writes) // (MIN_OTHER_POINTS + 20))
    other = set(writes[step - 1::step])
    return sorted(durable | other), len(other)


def check_state(chk, files, fixed=None):
    """e2fsck of the replayed copy: journal recovery, then the check a boot
    runs (`-fp`, forced): it must leave nothing for a person to repair
    (what it repaired by itself goes on @fixed); then the files that must
    be there.  Returns None or a description of what is wrong."""
    rc, out = e2fsck(chk, "-y", "-E", "journal_only")
    if rc & ~1:
        return f"journal recovery: e2fsck rc {rc}: {out[-1500:]}"
    rc, out = e2fsck(chk, "-fp")
    if rc & ~1:
        return f"e2fsck -fp rc {rc}: {out[-1500:]}"
    # rc 1 alone is common: the superblock's free counts, which ext4
    # keeps in memory, are corrected without a word
    if rc and fixed is not None and "FIXED" in out:
        fixed.append(" ".join(ln for ln in out.splitlines() if "FIXED" in ln)[:300])
    if not files:
        return None
    outdir = tempfile.mkdtemp(prefix="tcdump.")
    try:
        cmds = "".join(f"dump /kept/{n} {outdir}/{n}\n" for n, _ in files)
        p = subprocess.run(["debugfs", "-f", "-", chk], input=cmds, capture_output=True,
                           text=True, timeout=300)
        for n, size in files:
            want = content(n, size)
            try:
                with open(os.path.join(outdir, n), "rb") as f:
                    got = f.read()
            except FileNotFoundError:
                return f"fsynced file {n} missing ({p.stderr[-500:]})"
            if got != want:
                return f"fsynced file {n}: {len(got)} bytes, differs from the " \
                       f"{len(want)} written"
        return None
    finally:
        for n in os.listdir(outdir):
            os.unlink(os.path.join(outdir, n))
        os.rmdir(outdir)


class Checker(threading.Thread):
    """Checks the states put on its queue, on its own RAM disk."""

    def __init__(self, dev, files, todo, results, fixed):
        super().__init__(daemon=True)
        self.dev, self.files, self.todo, self.results = dev, files, todo, results
        self.fixed = fixed

    def run(self):
        with open(self.dev, "r+b", buffering=0) as f:
            while True:
                job = self.todo.get()
                if job is None:
                    return
                point, n, image = job
                os.pwrite(f.fileno(), image, 0)
                os.fsync(f.fileno())
                want = [(name, size) for name, size, c in self.files if c < n]
                fixed = []
                why = check_state(self.dev, want, fixed)
                if fixed:
                    self.fixed.append((point, fixed[0]))
                self.results.append((point, len(want), why))


class BlockOracle:
    """The origin's states judged sector by sector against the cached
    device's own log and the times of its bios (tests/vm/powercut.py)."""

    def __init__(self, uplog, bios, base):
        tclib.flushbufs(uplog)
        with logwrites.LogWrites.open(uplog) as log:
            start = log.mark_index("mkfs")
            self.hist = powercut.History(log, start, base, bios)
            self.summary = log.summary()
        assert not self.hist.unmatched, \
            f"upper log entries without a traced bio: {self.hist.unmatched[:10]}"
        assert not self.hist.unlogged, \
            f"traced writes the upper log does not have: {self.hist.unlogged[:10]}"
        self.chk = self.hist.checker(base)
        self.verdicts = {}      # point -> latest cut allowed, or None
        self.illegal = []       # [(point, why)]
        self.first = None

    def judge(self, point, img, entries):
        sectors = set()
        for e in entries:
            if e.is_write or e.flags & logwrites.DISCARD:
                sectors.update(range(e.sector, e.sector + e.nr_sectors))
        self.chk.update(img, sectors)
        self.verdicts[point] = self.chk.legal()
        if self.verdicts[point] is None:
            self.illegal.append((point, self.chk.explain()))

    def verdict(self, point):
        t = self.verdicts[point]
        return "illegal at the block level" if t is None else \
            f"legal at the block level (a cut at {t:.6f})"


def replay_oracle(stack, lw_log, files, stop_at_first_bad, uplog=None, bios=None):
    """Replays the origin's log; returns (states, bad states [(point,
    files due, why)], first bad, points between flushes, block oracle or
    None, states the boot-time check repaired by itself [(point, its
    words)])."""
    tclib.flushbufs(lw_log)
    results = []
    todo = queue.Queue(maxsize=WORKERS)
    fixed = []
    workers = [Checker(stack.ram(ORIGIN_MIB * MiB), files, todo, results, fixed)
               for _ in range(WORKERS)]
    for w in workers:
        w.start()
    img = bytearray(ORIGIN_MIB * MiB)
    entries = []
    blocks = None
    try:
        with logwrites.LogWrites.open(lw_log) as log:
            entries = log.entries
            start = log.mark_index("mkfs")
            epoch_at = {int(t[3:]): i for i, t in log.marks() if t.startswith("ep-")}
            points, n_other = checkpoints(log, start)
            tclib.log(f"log: {log.summary()}; {len(points)} points "
                      f"({n_other} every-Nth writes)")
            log.replay(img, end=start)
            if uplog:
                blocks = BlockOracle(uplog, bios, bytes(img))
                tclib.log(f"upper log: {blocks.summary}; {len(bios)} bios traced")
            done = start
            for k, p in enumerate(points):
                log.replay(img, start=done + 1, end=p)
                if blocks:
                    blocks.judge(p, img, entries[done + 1:p + 1])
                done = p
                # files fsynced in epochs every one of which is on the origin
                n = max((ep for ep, i in epoch_at.items() if i <= p), default=0)
                if k % FSCK_EVERY == 0 or k == len(points) - 1:
                    todo.put((p, n, bytes(img)))
                if k % 50 == 49:
                    bad = sum(1 for r in results if r[2])
                    tclib.kmsg(f"oracle: {k + 1} of {len(points)} states, {bad} damaged")
                if stop_at_first_bad and (any(r[2] for r in results) or
                                          (blocks and blocks.illegal)):
                    break
    finally:
        for w in workers:
            todo.put(None)
        for w in workers:
            w.join(timeout=600)
    assert not any(w.is_alive() for w in workers), "a state check is stuck"
    results.sort()
    bad = [r for r in results if r[2]]

    def near(p):
        return "; ".join(f"{e.index} {logwrites.flag_str(e.flags)} "
                         f"{e.mark if e.mark is not None else e.offset // 4096}"
                         f"{'+' + str(e.length // 4096) if e.is_write else ''}"
                         for e in entries[max(0, p - 15):p + 1])
    first = None
    if bad:
        p = bad[0][0]
        first = (f"log entry {p} ({bad[0][1]} files due): {bad[0][2]}\n"
                 f"the entries before it (index, flags, block+blocks): {near(p)}")
        if blocks:
            first += "\nthe damaged states: " + "; ".join(
                f"{r[0]} {blocks.verdict(r[0])}" for r in bad)
    if blocks and blocks.illegal:
        p, why = blocks.illegal[0]
        blocks.first = (f"log entry {p}: {why}\n"
                        f"the entries before it: {near(p)}")
    judged = f" of {len(blocks.verdicts)} judged" if blocks else ""
    tclib.kmsg(f"oracle: {len(results)} states checked{judged}, {len(bad)} damaged, "
               f"{n_other} between flushes"
               + (f", {len(blocks.illegal)} illegal at the block level" if blocks else ""))
    fixed.sort()
    return len(results), bad, first, n_other, blocks, fixed


def build(stack, ordered):
    """tiercache over log-writes over the origin, and log-writes over
    tiercache (the upper log: what the cached device received)."""
    tclib.run(["modprobe", "dm-log-writes"])
    raw = stack.ram(ORIGIN_MIB * MiB)
    logdev = stack.ram(LOG_MIB * MiB)
    n = tclib.size_sectors(raw)
    lw = stack.dm(stack._name("lw"), f"0 {n} log-writes {raw} {logdev}")
    keys = dict(KEYS, ordered=1) if ordered else dict(KEYS)
    tc = stack.tiercache(lw.path, stack.ram(CACHE_MIB * MiB), keys=keys)
    uplog = stack.ram(LOG_MIB * MiB)
    up = stack.dm(stack._name("lwup"), f"0 {n} log-writes {tc.path} {uplog}")
    # ext4 must not change a page the cached device is still writing (the
    # log copied it when the write came): stable pages, read at mount
    rdev = os.stat(up.path).st_rdev
    with open(f"/sys/dev/block/{os.major(rdev)}:{os.minor(rdev)}/queue/stable_writes",
              "w") as f:
        f.write("1")
    # no lazy initialisation: nothing writes behind the workload's back
    tclib.run(["mkfs.ext4", "-q", "-F", "-b", "4096", "-J", "size=4",
               "-E", "lazy_itable_init=0,lazy_journal_init=0", up.path], timeout=300)
    tc.flush()
    lw.message("mark", "mkfs")
    up.message("mark", "mkfs")
    # the bios ext4 sent, as dm-log-writes logged them (tiercache's dm
    # core splits its bios, and the completion of a split one names only
    # its last part)
    trace = powercut.BioTrace(up.path)
    trace.start()
    stack._defer(trace.close)
    return tc, lw, logdev, raw, up, uplog, trace


def keep_evidence(logdev, uplog, trace):
    """The two logs and the trace, for a look on the host: results/*/oracle-*/."""
    res = os.environ.get("TC_RESULTS")
    if not res:
        return None
    out = os.path.join(res, f"oracle-{time.strftime('%H%M%S')}")
    os.makedirs(out, exist_ok=True)
    for name, dev in (("lower.log", logdev), ("upper.log", uplog)):
        with logwrites.LogWrites.open(dev) as log:
            end = log.end
        with open(dev, "rb") as f, open(os.path.join(out, name), "wb") as g:
            g.write(f.read(end))
    with open(os.path.join(out, "trace.txt"), "w") as f:
        f.write(trace.text)
    return out


def test_ordered_origin_is_always_a_power_cut_state(stack):
    """The promise, judged sector by sector; then ext4 (every Nth state): the
    boot-time check repairs by itself whatever it finds (ext4 alone, with
    no cache, leaves states whose i_blocks that check corrects at legal
    cuts of this workload: tests/vm/control_99_ext4_alone.py,
    docs/experiments.md), and fsynced files are there once their epochs
    are."""
    tc, lw, logdev, raw, up, uplog, trace = build(stack, ordered=True)
    files = run_workload(stack, tc, lw, up, ordered=True)
    bios = trace.stop()
    st = tc.status()
    assert st["epoch_current"] > NFILES, \
        f"only {st['epoch_current']} epochs for {NFILES} fsyncs: {st['raw']}"
    states, bad, first, n_other, blocks, fixed = replay_oracle(
        stack, logdev, files, False, uplog, bios)
    tclib.log(f"ordered: {states} origin states replayed, {len(bad)} bad, "
              f"{len(fixed)} repaired by e2fsck -fp, "
              f"{len(blocks.illegal)} illegal at the block level")
    if fixed:
        tclib.log(f"repaired by e2fsck -fp at legal cuts (ext4's own): the first, "
                  f"log entry {fixed[0][0]}: {fixed[0][1]}")
    assert n_other >= MIN_OTHER_POINTS, f"only {n_other} points between flushes"
    if blocks.illegal or bad:
        tclib.log(f"evidence kept in {keep_evidence(logdev, uplog, trace)}")
    assert not blocks.illegal, \
        f"{len(blocks.illegal)} of {len(blocks.verdicts)} origin states are not a power-cut state " \
        f"of the cached device at the block level; the first: {blocks.first}" \
        + (f"\ne2fsck: {len(bad)} bad, the first: {first}" if bad else "")
    assert not bad, f"{len(bad)} of {states} origin states are not a power-cut " \
                    f"state; the first: {first}"
    # every file was due at the end, and the origin alone is the device
    rc, out = e2fsck(raw, "-fn")
    assert rc == 0, out[-1500:]
    up.remove()
    tc.remove()
    lin = stack.linear(lw.path)
    assert check_state(lin.path, [(n, s) for n, s, _ in files]) is None


def test_default_policy_leaves_a_damaged_origin(stack):
    tc, lw, logdev, _, up, uplog, trace = build(stack, ordered=False)
    files = run_workload(stack, tc, lw, up, ordered=False)
    bios = trace.stop()
    assert tc.status()["epoch_current"] == 0
    states, bad, first, _, blocks, _ = replay_oracle(stack, logdev, files, True,
                                                     uplog, bios)
    assert blocks.illegal, f"the default policy passed {len(blocks.verdicts)} origin states at " \
        "the block level: this oracle cannot tell the policies apart"
    tclib.log(f"default policy: {len(blocks.illegal)} of {len(blocks.verdicts)} states illegal at "
              f"the block level, the first: {blocks.first[:300]}; "
              f"{len(bad)} damaged per e2fsck")


class StressRounds(threading.Thread):
    """fsstress in short rounds, each in a directory removed after it (the
    file system never fills), until stopped; errors are the point."""

    def __init__(self, mnt):
        super().__init__(daemon=True)
        self.mnt = mnt
        self.stop = threading.Event()
        self.proc = None

    def run(self):
        k = 0
        while not self.stop.is_set():
            d = os.path.join(self.mnt, f"stress{k}")
            # a session of its own: its workers are killed with it
            self.proc = subprocess.Popen(
                [str(xfstests_dir() / "ltp" / "fsstress"), "-d", d, "-n", "200",
                 "-p", "2", "-s", str(SEED + k)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True)
            self.proc.wait()
            subprocess.run(["rm", "-rf", d], capture_output=True, timeout=300)
            k += 1

    def finish(self):
        self.stop.set()
        if self.proc:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.join(timeout=300)
        assert not self.is_alive(), "fsstress or its clean-up is stuck in the kernel"


class KeptWriter(threading.Thread):
    """Write-once files (at most MAX_KEPT), each fsynced with its directory,
    until stopped or until a write fails: [(name, size, epoch_current after
    the fsync)]."""

    MAX_KEPT = 150

    def __init__(self, mnt, tc):
        super().__init__(daemon=True)
        self.mnt, self.tc = mnt, tc
        self.stop = threading.Event()
        self.done = []
        self.error = None

    def run(self):
        rng = random.Random(SEED)
        d = os.path.join(self.mnt, "kept")
        i = 0
        try:
            while not self.stop.is_set():
                if i >= self.MAX_KEPT:
                    time.sleep(0.05)
                    continue
                name = f"f{i:03d}"
                size = rng.randrange(1, 64 * 1024)
                with open(os.path.join(d, name), "wb") as f:
                    f.write(content(name, size))
                    f.flush()
                    os.fsync(f.fileno())
                fsync_path(d)
                self.done.append((name, size, self.tc.status()["epoch_current"] or 0))
                i += 1
        except OSError as e:
            self.error = e


def test_ordered_cache_dies_origin_still_mounts(stack):
    """The cache device dies (its table swapped for `error`) in the middle
    of ext4 work with writeback running; the way out (the origin alone,
    linear): journal recovery, then e2fsck finds nothing wrong, and every
    file fsynced in an epoch written back before the death is there."""
    origin_ram = stack.ram(2 * ORIGIN_MIB * MiB)
    origin = stack.slow(backing=origin_ram, write_ms=20)
    cache_ram = stack.ram(CACHE_MIB * MiB)
    cl = stack.linear(cache_ram)
    tc = stack.tiercache(origin.path, cl.path, keys=dict(KEYS, ordered=1))
    tclib.run(["mkfs.ext4", "-q", "-F", "-b", "4096", "-J", "size=4",
               "-E", "lazy_itable_init=0,lazy_journal_init=0", tc.path], timeout=300)
    tc.flush()
    mnt = tempfile.mkdtemp(prefix="tcoracle.")
    tclib.run(["mount", "-t", "ext4", tc.path, mnt])
    stack._defer(unmount, mnt)
    os.mkdir(os.path.join(mnt, "kept"))
    fsync_path(mnt)
    fss = StressRounds(mnt)
    fss.start()
    w = KeptWriter(mnt, tc)
    w.start()
    try:
        deadline = time.monotonic() + 300
        while True:
            st = tc.status()
            if len(w.done) >= 12 and st["epoch_oldest"] >= 2 and st["dirty"] > 0:
                break
            assert w.error is None, f"a write failed before the death: {w.error!r}"
            assert time.monotonic() < deadline, f"no epoch written back: {st['raw']}"
            time.sleep(0.05)
        swap(cl, f"0 {tclib.size_sectors(cl.path)} error")
        killed = tc.status()
        time.sleep(5)               # the file system keeps going meanwhile
    finally:
        w.stop.set()
        fss.finish()
    w.join(timeout=120)
    assert not w.is_alive(), "the writer is stuck in the kernel"
    p = subprocess.run(["umount", mnt], capture_output=True, text=True, timeout=120)
    tclib.log(f"umount after the death: rc {p.returncode} {p.stderr.strip()}")
    if p.returncode:
        tclib.run(["umount", "-l", mnt], check=False)
    st = tc.status()
    assert st["cache_failed"], f"the failed state is not latched: {st['raw']}"
    n = st["epoch_oldest"]
    due = [(name, size) for name, size, c in w.done if c < n]
    tclib.log(f"died with {killed['dirty']} dirty, epochs {killed['epoch_oldest']}.."
              f"{killed['epoch_current']}; at the way out {st['dirty']} dirty, "
              f"epoch_oldest {n}; {len(w.done)} files fsynced, {len(due)} due; "
              f"writer: {w.error!r}")
    assert due, "no file was fsynced in an epoch written back: nothing to verify"
    # the way out: the origin alone.  Without lockfs: the device's page
    # cache holds writes that failed (ext4's), and the sync of a lockfs
    # suspend would fail with their error
    tclib.run(["dmsetup", "suspend", "--nolockfs", tc.name], timeout=120)
    tc.reload(f"0 {tclib.size_sectors(origin.path)} linear {origin.path} 0")
    why = check_state(tc.path, due)
    assert why is None, f"the origin alone after the cache died: {why}"
