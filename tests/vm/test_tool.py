# SPDX-License-Identifier: GPL-2.0
"""The `tiercache` command against the real module (runs in the test VM).

Golden outputs: the command line cases of userspace/tests/golden/ (help,
bad options), and here the messages a script relies on (unknown device,
device in use, dirty remove), each with its exit status.  The devices are
loop devices on files in /dev/shm.

The binary is userspace/target/release/tiercache, built on the host
(`make -C userspace`) before the VM boots.
"""

import contextlib
import hashlib
import json
import os
import re
import shlex
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOL = Path(os.environ.get("TIERCACHE_TOOL", REPO / "userspace/target/release/tiercache"))
GOLDEN = REPO / "userspace/tests/golden"
SHM = Path("/dev/shm")
KiB = 1024
MiB = 1024 * 1024

ENV = dict(os.environ, LC_ALL="C", LVM_SUPPRESS_FD_WARNINGS="1")
ENV.pop("TIERCACHE_CONFIG", None)


def log(msg):
    print(f"[test_tool] {msg}", flush=True)


def sh(cmd, check=True, timeout=120, input=None):
    """Run a helper command (string or list); return CompletedProcess."""
    if isinstance(cmd, str):
        cmd = shlex.split(cmd)
    cmd = [str(c) for c in cmd]
    log("$ " + shlex.join(cmd))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env=ENV, input=input)
    if check and p.returncode != 0:
        raise AssertionError(f"{shlex.join(cmd)} failed (rc={p.returncode})\n"
                             f"stdout: {p.stdout}\nstderr: {p.stderr}")
    return p


def tool(*args, rc=0, config=None, timeout=300):
    """Run the tool; assert its exit status unless rc is None."""
    if not TOOL.exists():
        pytest.fail(f"{TOOL} does not exist: build it on the host with "
                    f"'make -C userspace' before booting the VM", pytrace=False)
    cmd = [str(TOOL)]
    if config:
        cmd.append(f"--config={config}")
    cmd += [str(a) for a in args]
    log("$ " + shlex.join(cmd))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV)
    for name, text in (("stdout", p.stdout), ("stderr", p.stderr)):
        for line in text.splitlines():
            log(f"  {name}: {line}")
    if rc is not None and p.returncode != rc:
        raise AssertionError(f"{shlex.join(cmd)}: exit {p.returncode}, expected {rc}\n"
                             f"stdout: {p.stdout}\nstderr: {p.stderr}")
    return p


def devno(path):
    st = os.stat(path)
    return f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"


def dm_exists(name):
    return sh(["dmsetup", "info", name], check=False).returncode == 0


def dm_table(name):
    return sh(["dmsetup", "table", name]).stdout.strip()


def dm_status_fields(name):
    return sh(["dmsetup", "status", name]).stdout.split()[3:]


def settle():
    """Let udev finish probing (it reads new and just-written devices)."""
    sh(["udevadm", "settle", "-t", "10"], check=False)


def status_json(name, config=None):
    v = json.loads(tool("status", "--json", name, config=config).stdout)
    assert len(v) == 1 and v[0]["name"] == name
    return v[0]


def write_pattern(path, size, seed, offset=0):
    """O_DIRECT-free, fsync'ed write of seeded data; returns the bytes."""
    data = hashlib.shake_256(f"tiercache-{seed}".encode()).digest(size)
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, offset)
        os.fsync(fd)
    finally:
        os.close(fd)
    return data


def read_back(path, size, offset=0):
    sh(["blockdev", "--flushbufs", path])
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, size, offset)
    finally:
        os.close(fd)


class Res:
    """Loop devices, dm devices and mounts, torn down in reverse order."""

    def __init__(self):
        self.es = contextlib.ExitStack()
        self.n = 0

    def close(self):
        self.es.close()

    def loop(self, size):
        self.n += 1
        f = SHM / f"tct-{os.getpid()}-{self.n}.img"
        with open(f, "wb") as fh:
            fh.truncate(size)
        self.es.callback(f.unlink)
        dev = sh(["losetup", "-f", "--show", f]).stdout.strip()
        self.es.callback(sh, ["losetup", "-d", dev], False)
        return dev

    def dm(self, name, table):
        sh(["dmsetup", "create", name, "--table", table])
        self.es.callback(self._dm_remove, name)
        return f"/dev/mapper/{name}"

    @staticmethod
    def _dm_remove(name):
        if dm_exists(name):
            sh(["dmsetup", "remove", "--retry", name], check=False)

    def cached(self, name, origin, cache, *opts):
        """`tiercache create`, removed (dirty data dropped) at the end."""
        p = tool("create", name, origin, cache, *opts)
        self.es.callback(self._tc_remove, name)
        return p

    @staticmethod
    def _tc_remove(name):
        if dm_exists(name):
            tool("remove", "--no-flush", "--force", name, rc=None)
        if dm_exists(name):
            sh(["dmsetup", "remove", "--retry", name], check=False)

    def mount(self, dev, mkfs=True):
        self.n += 1
        mnt = SHM / f"tct-mnt-{os.getpid()}-{self.n}"
        mnt.mkdir()
        self.es.callback(mnt.rmdir)
        if mkfs:
            # no lazy inode-table or journal init: ext4lazyinit would keep writing
            # after sync, so "dirty after flush" would race with it
            sh(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", dev])
        sh(["mount", dev, mnt])
        self.es.callback(self.umount, mnt)
        return mnt

    @staticmethod
    def umount(mnt):
        if os.path.ismount(mnt):
            sh(["umount", mnt], check=False)


@pytest.fixture
def res():
    r = Res()
    yield r
    r.close()


# --------------------------------------------------------------- golden CLI

def golden_cases():
    out = []
    for line in (GOLDEN / "cases.txt").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, args = line.split("|", 1)
        out.append((name.strip(), args.split()))
    return out


def test_golden_command_line():
    """--help of every subcommand and bad options: the golden files."""
    bad = []
    for name, args in golden_cases():
        p = tool(*args, rc=None)
        got = f"{p.stdout}[stderr]\n{p.stderr}[exit {p.returncode}]\n"
        want = (GOLDEN / f"{name}.out").read_text()
        if got != want:
            bad.append(f"--- {name}: tiercache {' '.join(args)}\nwant:\n{want}\ngot:\n{got}")
    assert not bad, "\n".join(bad)


# --------------------------------------------------------------- devices

NOSUCH_ERR = ("tiercache: tct_nosuch: no such device\n"
              "tiercache: hint: 'tiercache list' shows the cached devices\n")


@pytest.mark.usefixtures("tc_module")
@pytest.mark.parametrize("args", [
    ["status", "tct_nosuch"],
    ["flush", "tct_nosuch"],
    ["flush", "--wait", "tct_nosuch"],
    ["remove", "tct_nosuch"],
    ["set", "tct_nosuch", "flush_depth", "8"],
    ["detach", "tct_nosuch"],
])
def test_unknown_device(args):
    p = tool(*args, rc=3)
    assert p.stdout == ""
    assert p.stderr == NOSUCH_ERR


@pytest.mark.usefixtures("tc_module")
def test_not_a_tiercache_device(res):
    lo = res.loop(4 * MiB)
    res.dm("tct_lin", f"0 8192 linear {lo} 0")
    p = tool("status", "tct_lin", rc=3)
    assert p.stderr == ("tiercache: tct_lin: not a tiercache device (table type linear)\n"
                        "tiercache: hint: 'tiercache list' shows the cached devices\n")
    # list ignores it
    assert "tct_lin" not in tool("list").stdout


@pytest.mark.usefixtures("tc_module")
def test_create_status_flush_remove(res):
    origin, cache = res.loop(64 * MiB), res.loop(16 * MiB)
    p = res.cached("tct1", origin, cache, "--bridge-gap-kb", "64",
                   "--high-watermark", "100", "--low-watermark", "0")
    node = "/dev/mapper/tct1"
    assert p.stdout == (f"tct1: created {node} ({devno(node)}), origin {origin}, cache {cache}\n"
                        f"tct1: cache {cache} formatted\n")
    assert p.stderr == ""
    assert os.path.realpath("/dev/tiercache/tct1") == os.path.realpath(node)
    table = dm_table("tct1")
    assert table.startswith(f"0 131072 tiercache {devno(origin)} {devno(cache)} 8 "), table
    assert "bridge_gap_kb 64" in table and "high_watermark 100" in table

    data = write_pattern(node, 4 * MiB, seed=1)
    settle()
    st = status_json("tct1")
    assert st["dirty_bytes"] == 4 * MiB, st
    # of the slots left beside the metadata (4063 of a 16 MiB cache)
    assert st["dirty_percent"] == round(100.0 * 1024 / st["status"]["total_blocks"], 2), st
    # the slots' bytes: the 16 MiB device less its metadata (132 KiB here)
    assert st["cache_bytes"] == st["status"]["total_blocks"] * 4096
    assert 16 * MiB - 256 * 1024 <= st["cache_bytes"] < 16 * MiB, st
    # The typed decoding agrees with the raw line, field by field.
    raw = dm_status_fields("tct1")
    s = st["status"]
    assert raw[0] == s["mode"] and int(raw[1]) == s["block_size"]
    assert raw[2] == f"{s['used_blocks']}/{s['total_blocks']}"
    names = ["dirty_blocks", "read_hits", "read_misses", "write_hits", "write_misses",
             "write_bypass"]
    # counters may move between the two reads only through our own IO: none
    assert [int(x) for x in raw[3:9]] == [s[k] for k in names]
    assert raw[9] == s["flush_state"] and int(raw[17]) == s["error"]
    assert int(raw[18]) == s["flushes"] and raw[19] == ("1" if s["cleaner"] else "0")

    text = tool("status", "tct1").stdout
    pct = 100.0 * 1024 / s["total_blocks"]
    assert f"  dirty:      4 MiB (1024 blocks, {pct:.1f}% of the cache)\n" in text, text
    assert "  error:      none\n" in text
    # the cache column: the slots' bytes (16 MiB less the metadata)
    assert re.search(r"^tct1 +cached +writeback +64 MiB +1[56](\.\d+)? MiB .* 4 MiB +idle ",
                     tool("list").stdout, re.M)

    # Dirty data is never dropped without --force.
    p = tool("remove", "--no-flush", "tct1", rc=5)
    assert p.stderr == (
        "tiercache: tct1: refusing to remove: the cache holds 4 MiB of dirty data "
        "(1024 blocks) not yet on the origin\n"
        "tiercache: hint: run 'tiercache flush --wait tct1' (or drop the --no-flush), "
        "or pass --force to remove it anyway (the dirty data stays on the cache device, "
        "not on the origin)\n")
    info = sh(["dmsetup", "info", "-c", "--noheadings", "-o", "attr", "tct1"]).stdout
    assert "s" not in info.strip()[:3].replace("-", ""), f"left suspended: {info}"

    p = tool("flush", "--wait", "--progress", "lines", "tct1")
    assert re.match(r"tct1: flushed 4 MiB in \d+(\.\d+)?[smh].* \(1024 blocks in \d+ origin writes, "
                    r"average \d+ KiB, merge ratio [\d.]+, \d+ bridged\)\n$", p.stdout), p.stdout
    assert p.stderr.startswith("tct1: flush ")
    st = status_json("tct1")
    assert st["dirty_bytes"] == 0 and st["status"]["flushes"] == 1

    p = tool("remove", "tct1")
    assert p.stdout == "tct1: removed\n"
    assert not dm_exists("tct1")
    assert not os.path.lexists("/dev/tiercache/tct1")
    assert not os.path.exists(node)
    assert read_back(origin, 4 * MiB) == data


@pytest.mark.usefixtures("tc_module")
def test_remove_flushes_by_default_and_force_drops(res):
    origin, cache = res.loop(32 * MiB), res.loop(8 * MiB)
    res.cached("tct2", origin, cache, "--high-watermark", "100", "--low-watermark", "0")
    data = write_pattern("/dev/mapper/tct2", 2 * MiB, seed=2)
    p = tool("remove", "tct2")
    assert p.stdout.startswith("tct2: flushed 2 MiB in ")
    assert p.stdout.endswith("tct2: removed\n")
    assert read_back(origin, 2 * MiB) == data

    res.cached("tct2", origin, cache, "--high-watermark", "100", "--low-watermark", "0")
    write_pattern("/dev/mapper/tct2", 1 * MiB, seed=3)
    p = tool("remove", "--no-flush", "--force", "tct2")
    # the dirty data stays in the cache's metadata, not on the origin
    assert ("tiercache: warning: tct2: removed with 1 MiB of dirty data "
            "not on the origin") in p.stderr
    assert read_back(origin, 2 * MiB) == data, "dropped data reached the origin"


@pytest.mark.usefixtures("tc_module")
def test_devices_in_use(res):
    origin, cache = res.loop(32 * MiB), res.loop(8 * MiB)

    # origin mounted
    mnt = res.mount(origin)
    p = tool("create", "tct3", origin, cache, rc=4)
    assert p.stderr.startswith(f"tiercache: origin {origin} ({origin}) is in use: mounted on {mnt}\n"), p.stderr
    assert "tiercache: hint: unmount it" in p.stderr
    assert not dm_exists("tct3")
    Res.umount(mnt)

    # cache held by another device-mapper device
    res.dm("tct_hold", f"0 1024 linear {cache} 0")
    p = tool("create", "tct3", origin, cache, rc=4)
    m = re.match(rf"tiercache: cache {cache} \({cache}\) is in use: held by dm-\d+ \(tct_hold\)\n", p.stderr)
    assert m, p.stderr
    assert not dm_exists("tct3")

    # name taken
    p = tool("create", "tct_hold", origin, res.loop(8 * MiB), rc=4)
    assert p.stderr == ("tiercache: tct_hold: a device-mapper device of that name already exists\n"
                        "tiercache: hint: choose another name, or remove the existing device first\n")

    # same device twice, cache too small
    p = tool("create", "tct3", origin, origin, rc=2)
    assert p.stderr == f"tiercache: the cache may not be the origin ({origin})\n"
    small = res.loop(1 * MiB)
    p = tool("create", "tct3", origin, small, "--block-size", "128K", rc=2)
    assert p.stderr == (f"tiercache: cache {small} holds 7 blocks of 128 KiB beside its metadata, "
                        "at least 16 are needed\n"
                        "tiercache: hint: use a larger cache device or a smaller --block-size\n")
    p = tool("create", "tct3", "/dev/shm/nonexistent", cache, rc=3)
    assert p.stderr.startswith("tiercache: origin: /dev/shm/nonexistent: No such file or directory\n")

    # a mounted cached device cannot be removed
    fresh = res.loop(8 * MiB)
    res.cached("tct3", origin, fresh)
    mnt = res.mount("/dev/mapper/tct3")
    p = tool("remove", "tct3", rc=4)
    assert p.stderr == ("tiercache: tct3: device is in use (open count 1)\n"
                        "tiercache: hint: unmount /dev/mapper/tct3 and stop its users first\n")
    assert dm_exists("tct3")
    Res.umount(mnt)
    tool("remove", "tct3")


@pytest.mark.usefixtures("tc_module")
def test_set_live_values_and_mode(res):
    origin, cache = res.loop(32 * MiB), res.loop(8 * MiB)
    res.cached("tct4", origin, cache, "--high-watermark", "100", "--low-watermark", "0")
    assert tool("set", "tct4", "flush_depth", "16").stdout == "tct4: flush_depth = 16\n"
    assert "flush_depth 16" in dm_table("tct4")
    p = tool("set", "tct4", "flush_depth", "0", rc=2)
    assert p.stderr == "tiercache: invalid value 0 for flush_depth: writeback requests in flight, 1 to 4096\n"
    p = tool("set", "tct4", "low_watermark", "101", rc=2)
    assert p.stderr == ("tiercache: invalid value 101 for low_watermark: "
                        "dirty percent that stops it, 0 to high_watermark\n")
    p = tool("set", "tct4", "colour", "blue", rc=2)
    assert p.stderr.startswith("tiercache: unknown key 'colour'")

    write_pattern("/dev/mapper/tct4", 1 * MiB, seed=4)
    assert status_json("tct4")["dirty_bytes"] == 1 * MiB
    p = tool("set", "tct4", "mode", "passthrough", rc=5)
    assert p.stderr == ("tiercache: tct4: cannot switch to passthrough with 1 MiB of dirty data\n"
                        "tiercache: hint: run 'tiercache flush --wait tct4' first\n")
    tool("set", "tct4", "mode", "writethrough")
    st = status_json("tct4")
    assert st["status"]["mode"] == "writethrough"
    assert st["dirty_bytes"] == 1 * MiB, "a table reload keeps the dirty blocks"
    assert "writethrough" in dm_table("tct4")
    tool("flush", "--wait", "--quiet", "tct4")
    tool("set", "tct4", "mode", "passthrough")
    assert status_json("tct4")["status"]["mode"] == "passthrough"
    tool("set", "tct4", "cleaner", "on")
    assert status_json("tct4")["status"]["cleaner"] is True
    tool("remove", "tct4")


@pytest.mark.usefixtures("tc_module")
def test_flush_error_exit_6_then_retry(res):
    """A failing origin: flush --wait exits 6 naming the errno; the data
    stays dirty; after the origin is repaired the next flush succeeds."""
    lo = res.loop(32 * MiB)
    sectors = 32 * MiB // 512
    origin = res.dm("tct_o", f"0 {sectors} linear {lo} 0")
    res.cached("tct5", origin, res.loop(8 * MiB), "--high-watermark", "100",
               "--low-watermark", "0")
    data = write_pattern("/dev/mapper/tct5", 2 * MiB, seed=5)

    sh(["dmsetup", "load", "tct_o", "--table", f"0 {sectors} error"])
    sh(["dmsetup", "suspend", "--noflush", "tct_o"])
    sh(["dmsetup", "resume", "tct_o"])
    p = tool("flush", "--wait", "--quiet", "tct5", rc=6)
    assert p.stderr.startswith(
        "tiercache: tct5: flush failed: writeback error EIO (Input/output error); 2 MiB still dirty\n"
        "tiercache: hint: check the origin device (/dev/dm-"), p.stderr
    st = status_json("tct5")
    assert st["status"]["error"] == -5 and st["dirty_bytes"] == 2 * MiB
    assert "error:      EIO (Input/output error)" in tool("status", "tct5").stdout
    # remove refuses to lose it, also when its flush fails
    tool("remove", "tct5", rc=6)

    sh(["dmsetup", "load", "tct_o", "--table", f"0 {sectors} linear {lo} 0"])
    sh(["dmsetup", "suspend", "--noflush", "tct_o"])
    sh(["dmsetup", "resume", "tct_o"])
    tool("flush", "--wait", "--quiet", "tct5")
    st = status_json("tct5")
    assert st["status"]["error"] == 0 and st["dirty_bytes"] == 0
    tool("remove", "tct5")
    assert read_back(lo, 2 * MiB) == data


@pytest.mark.usefixtures("tc_module")
def test_flush_progress_rate_eta_and_timeout(res):
    """On a slow origin: --timeout exits 7 and leaves the flush running;
    progress lines show dirty data left, a rate and an ETA."""
    lo = res.loop(32 * MiB)
    sectors = 32 * MiB // 512
    origin = res.dm("tct_slow", f"0 {sectors} delay {lo} 0 0 {lo} 0 250")
    # one 64 KiB write in flight at a time: 4 MiB take 64 x 250 ms = 16 s
    res.cached("tct6", origin, res.loop(16 * MiB), "--high-watermark", "100",
               "--low-watermark", "0", "--flush-depth", "1", "--max-flush-kb", "64")
    data = write_pattern("/dev/mapper/tct6", 4 * MiB, seed=6)

    t0 = time.monotonic()
    p = tool("flush", "--wait", "--quiet", "--timeout", "1", "tct6", rc=7)
    assert time.monotonic() - t0 < 10
    assert re.match(r"tiercache: tct6: flush not finished after 1s; [\d.]+ MiB still dirty\n"
                    r"tiercache: hint: the flush goes on in the kernel; follow it with "
                    r"'tiercache status tct6'\n$", p.stderr), p.stderr
    # On a terminal: a bar redrawn in place.
    p = sh(["script", "-qec", f"{TOOL} flush --wait --timeout 3 tct6", "/dev/null"], check=False)
    assert p.returncode == 7, p.stdout
    # (text mode turns the bar's carriage returns into newlines)
    frames = [f for f in re.split(r"[\r\n]", p.stdout) if f.strip()]
    bars = [f for f in frames if re.search(r"tct6: \[[#-]{24}\] +[\d.]+%  [\d.]+ (KiB|MiB) left  ", f)]
    assert len(bars) >= 3, repr(p.stdout[:2000])
    assert "\x1b[K" in p.stdout, "the bar is not redrawn in place"
    assert any(re.search(r"(KiB|MiB)/s  ETA \d", b) for b in bars), repr(p.stdout[:2000])
    assert "flush not finished after 3s" in p.stdout
    p = tool("flush", "--wait", "--progress", "lines", "tct6", timeout=120)
    lines = p.stderr.splitlines()
    assert len(lines) >= 2, p.stderr
    for ln in lines:
        assert re.match(r"tct6: flush [\d.]+% done, [\d.]+ (B|KiB|MiB) left, (--|[\d.]+ (B|KiB|MiB))/s, "
                        r"ETA (--|\d+s|\d+m\d\ds)$", ln), ln
    assert re.search(r"[\d.]+ (KiB|MiB)/s, ETA \d", p.stderr), "no rate/ETA shown: " + p.stderr
    assert p.stdout.startswith("tct6: flushed ")
    tool("remove", "tct6")
    assert read_back(lo, 4 * MiB) == data


@pytest.mark.usefixtures("tc_module")
def test_flush_without_wait_returns_at_once(res):
    res.cached("tct7", res.loop(16 * MiB), res.loop(8 * MiB))
    p = tool("flush", "tct7")
    assert p.stdout == "tct7: flush started\n"
    tool("flush", "--wait", "--quiet", "tct7")
    tool("remove", "tct7")


def write_direct(path, data, offset):
    """O_DIRECT write, no fsync (the caller decides what a flush means)."""
    import mmap
    buf = mmap.mmap(-1, len(data))
    buf[:] = data
    fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
    try:
        assert os.pwrite(fd, memoryview(buf), offset) == len(data)
    finally:
        os.close(fd)
        buf.close()


def swap_table(name, table):
    sh(["dmsetup", "suspend", name])
    sh(["dmsetup", "load", name, "--table", table])
    sh(["dmsetup", "resume", name])


def fsync_file(path, data):
    """Write and fsync a file; returns the error, or None."""
    try:
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return None
    except OSError as e:
        return e


@pytest.mark.usefixtures("tc_module")
def test_abandon_with_ext4_mounted_ordered(res):
    """The way out while the file system is still mounted, with dirty
    pages in its page cache (issue 12): an ordered cache device dies under
    ext4; `detach --abandon --yes` must swap in the origin without a hang
    and without a file system freeze, whose sync would fail (on a failed
    ordered cache the writes of those pages fail) and so refuse the
    suspend.  The superblock of the dead device cannot be marked: the
    command says so and fails, after the swap.  Then ext4 unmounts, the
    origin alone is repaired by e2fsck and holds the file written back
    before the death."""
    origin, cloop = res.loop(64 * MiB), res.loop(16 * MiB)
    n = int(sh(["blockdev", "--getsz", cloop]).stdout)
    cname = f"tct12c-{os.getpid()}"
    cache = res.dm(cname, f"0 {n} linear {cloop} 0")
    res.cached("tct12", origin, cache, "--ordered", "1",
               "--high-watermark", "100", "--low-watermark", "0")
    dev = "/dev/mapper/tct12"
    mnt = res.mount(dev)
    early = hashlib.shake_256(b"tct12-early").digest(256 * KiB)
    assert fsync_file(mnt / "early", early) is None
    tool("flush", "--wait", "tct12")
    assert fsync_file(mnt / "late", hashlib.shake_256(b"tct12-late").digest(MiB)) is None
    assert status_json("tct12")["status"]["dirty_blocks"] > 0
    swap_table(cname, f"0 {n} error")
    err = fsync_file(mnt / "after", hashlib.shake_256(b"tct12-after").digest(MiB))
    log(f"fsync after the death: {err!r}")
    deadline = time.monotonic() + 60
    while not status_json("tct12")["status"]["cache_failed"]:
        assert time.monotonic() < deadline, "the failed state did not latch"
        fsync_file(mnt / "again", b"x" * 4096)
        time.sleep(0.5)
    # dirty pages, not synced: a freeze would have to write them
    (mnt / "pending").write_bytes(hashlib.shake_256(b"tct12-pending").digest(MiB))
    p = tool("detach", "--abandon", "--yes", "tct12", rc=None, timeout=240)
    assert dm_table("tct12").split()[2] == "linear", \
        f"detach --abandon with ext4 mounted did not swap in the origin: exit " \
        f"{p.returncode}: {p.stderr.strip()}; table {dm_table('tct12')}"
    assert p.returncode == 0 or "NOT marked failed" in p.stdout + p.stderr, \
        f"exit {p.returncode}: {p.stdout} {p.stderr}"
    sh(["umount", str(mnt)], timeout=120)
    # the device is now the origin alone (linear)
    p = sh(["e2fsck", "-fy", dev], check=False, timeout=300)
    assert p.returncode < 4, f"e2fsck could not repair the origin: {p.returncode}\n{p.stdout}"
    mnt2 = res.mount(dev, mkfs=False)
    assert (mnt2 / "early").read_bytes() == early, "the file written back before the death"


@pytest.mark.usefixtures("tc_module")
def test_failed_cache_status_and_abandon(res):
    """The cache device (a dm-linear over a loop device) dies under a
    device holding 1 MiB dirty: `status` shows FAILED and the way out;
    `detach --abandon` is refused before the failure, then (with --yes)
    swaps in the linear mapping of the origin without a flush, saying
    how many dirty blocks are lost, and marks the cache device's
    superblock; `check` and `create` then refuse that device (exit 15)
    until `create --format`."""
    origin, cloop = res.loop(32 * MiB), res.loop(8 * MiB)
    n = int(sh(["blockdev", "--getsz", cloop]).stdout)
    cache = res.dm(f"tct9c-{os.getpid()}", f"0 {n} linear {cloop} 0")
    cname = Path(cache).name
    res.cached("tct9", origin, cache, "--high-watermark", "100", "--low-watermark", "0")
    dev = "/dev/mapper/tct9"
    data = hashlib.shake_256(b"tct9-dirty").digest(MiB)
    write_direct(dev, data, 0)
    assert status_json("tct9")["status"]["dirty_blocks"] == 256
    p = tool("detach", "--abandon", "--yes", "tct9", rc=5)
    assert "has not failed" in p.stderr, p.stderr

    sh(["dmsetup", "suspend", cname])
    sh(["dmsetup", "load", cname, "--table", f"0 {n} error"])
    sh(["dmsetup", "resume", cname])
    later = hashlib.shake_256(b"tct9-later").digest(256 * KiB)
    write_direct(dev, later, 4 * MiB)           # fails in the cache: latches
    st = status_json("tct9")
    assert st["status"]["cache_failed"] == -5, st
    p = tool("status", "tct9")
    assert "FAILED" in p.stdout and "--abandon" in p.stdout, p.stdout

    # healed before the way out, so that the mark can be written
    sh(["dmsetup", "suspend", cname])
    sh(["dmsetup", "load", cname, "--table", f"0 {n} linear {cloop} 0"])
    sh(["dmsetup", "resume", cname])
    p = tool("detach", "--abandon", "--yes", "tct9")
    assert "FAILED" in p.stdout and "256 dirty blocks" in p.stdout, p.stdout
    assert dm_table("tct9").split()[2] == "linear", dm_table("tct9")
    assert read_back(dev, MiB) == bytes(MiB), "abandoned dirty data reached the origin"
    assert read_back(dev, 256 * KiB, 4 * MiB) == later, "a write around the failed cache is lost"
    tool("remove", "tct9")
    tool("check", cache, rc=15)
    p = tool("create", "tct9", origin, cache, rc=15)
    res.cached("tct9", origin, cache, "--format")
    assert status_json("tct9")["status"]["cache_failed"] == 0
    assert read_back(dev, 256 * KiB, 4 * MiB) == later
