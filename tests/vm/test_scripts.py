# SPDX-License-Identifier: GPL-2.0
"""scripts/stack.sh, the table builders of the experiment, inside the VM.

Every stack (slow disk model x cache device x cache system) is built, used
and torn down, leaving nothing behind; bad parameters, wrong sizes and busy
devices are refused with a clear message and no side effect; a failure in
the middle of a build removes what was built.
"""

import csv
import glob
import os
import platform
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STACK = REPO / "scripts" / "stack.sh"
STATE = "/run/tiercache-stack-pytest"
ENV = dict(os.environ, TC_STACK_STATE=STATE, LC_ALL="C")
NAME = "fbt"
MiB = 1 << 20


def opencas_build():
    """A build of Open CAS for this kernel by scripts/opencas.sh (OPENCAS_DIR,
    or the newest one in its cache directory), or None."""
    d = os.environ.get("OPENCAS_DIR")
    if d:
        return d
    done = sorted(glob.glob(f"/var/cache/tiercache-peers/*-{platform.release()}/ok"),
                  key=os.path.getmtime)
    return os.path.dirname(done[-1]) if done else None


def opencas_stats(info):
    """casadm --stats of a stack's cache as {column: value} (CSV: a header
    line and a value line)."""
    out = sh(f"{info['CASADM']} --stats --cache-id {info['OPENCAS_CACHE_ID']} --output-format csv")
    rows = list(csv.reader([ln for ln in out.splitlines() if ln.strip()]))
    return dict(zip(rows[-2], rows[-1]))


def need_opencas():
    d = opencas_build()
    if not d:
        pytest.skip("Open CAS not built for this kernel (scripts/opencas.sh build, or set OPENCAS_DIR)")
    ENV["OPENCAS_DIR"] = d
    return d


def stack(*args, check=True, timeout=180):
    p = subprocess.run([str(STACK)] + [str(a) for a in args], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, env=ENV, timeout=timeout)
    if check and p.returncode != 0:
        pytest.fail(f"stack.sh {' '.join(map(str, args))} failed ({p.returncode}):\n"
                    f"{p.stderr}", pytrace=False)
    return p


def info_of(out):
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def sh(cmd, check=True):
    return subprocess.run(cmd, shell=True, check=check, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True).stdout


def snapshot():
    """Everything a stack could leave behind."""
    out = sh("dmsetup ls 2>/dev/null", check=False)
    dm = [] if "No devices found" in out else sorted(ln.split()[0] for ln in out.splitlines() if ln.strip())
    nullb = sorted(p.name for p in Path("/sys/kernel/config/nullb").glob("*")
                   if p.is_dir()) if Path("/sys/kernel/config/nullb").exists() else []
    return {
        "dm": dm,
        "loops": sh("losetup -n -O NAME,BACK-FILE 2>/dev/null", check=False).split("\n"),
        "nullb": nullb,
        "brd": Path("/sys/module/brd").exists(),
        "bcache": sorted(p.name for p in Path("/sys/block").glob("bcache*")),
        "files": sorted(str(p) for p in Path("/dev/shm").glob("tcstack-*")),
        # stacks (the hidden lock file and RAM disk claims may stay)
        "state": sorted(p.name for p in Path(STATE).glob("[!.]*")) if Path(STATE).exists() else [],
    }


def same_as(before):
    after = snapshot()
    assert after == before, f"left behind: before {before}\nafter {after}"


@pytest.fixture
def unchanged():
    """For a command that must be refused before it builds anything: the
    same snapshot before and after, without clean's two `remove --all`
    (each a second under emulation)."""
    before = snapshot()
    yield before
    same_as(before)


@pytest.fixture
def clean():
    """Snapshot before; after the test: no stack left, nothing changed."""
    stack("remove", "--all", check=False)
    before = snapshot()
    yield before
    stack("remove", "--all", check=False)
    same_as(before)


def read_write_check(dev, nbytes=MiB):
    """Write a pattern through dev with O_DIRECT and read it back."""
    import mmap
    data = os.urandom(nbytes)
    buf = mmap.mmap(-1, nbytes)
    buf.write(data)
    fd = os.open(dev, os.O_RDWR | os.O_DIRECT)
    try:
        assert os.pwritev(fd, [buf], 0) == nbytes
        back = mmap.mmap(-1, nbytes)
        assert os.preadv(fd, [back], 0) == nbytes
        assert back[:] == data, f"read back differs on {dev}"
    finally:
        os.close(fd)


def blk_sectors(dev):
    return int(sh(f"blockdev --getsz {dev}"))


# slow disk model args, cache args, systems
SLOW = {
    "delay-ram": ["--slow", "delay", "--slow-backing", "ram", "--write-delay-ms", "5"],
    "delay-file": ["--slow", "delay", "--slow-backing", "file", "--write-delay-ms", "5"],
    "hdd": ["--slow", "hdd", "--hdd-nsec", "200000", "--hdd-depth", "2", "--hdd-mbps", "0"],
}
# Each system, slow disk model and cache kind at least once, each system
# with one model (8 stacks, about 3 minutes under emulation); the whole
# cross product with TC_SCRIPTS_ALL=1 (14; TC_GUEST_ENV=TC_SCRIPTS_ALL passes
# it from the host to tests/run.sh's guest).  The slow disk and the cache
# device are built the same whichever system goes on top.
ALL_COMBOS = [
    ("none", "delay-ram", "ram"), ("none", "delay-file", "ram"), ("none", "hdd", "ram"),
    ("tiercache", "delay-ram", "ram"), ("tiercache", "hdd", "ssd"), ("tiercache", "delay-file", "ssd"),
    ("bcache", "delay-ram", "ram"), ("bcache", "hdd", "ssd"),
    ("dm-cache", "delay-ram", "ram"), ("dm-cache", "hdd", "ssd"),
    ("dm-writecache", "delay-ram", "ram"), ("dm-writecache", "hdd", "ssd"),
    ("opencas", "delay-ram", "ram"), ("opencas", "hdd", "ssd"),
]
COMBOS = ALL_COMBOS if os.environ.get("TC_SCRIPTS_ALL") == "1" else [
    ("none", "delay-file", "ram"), ("none", "hdd", "ram"),
    ("tiercache", "delay-ram", "ram"), ("tiercache", "delay-file", "ssd"),
    ("bcache", "hdd", "ssd"), ("dm-cache", "delay-ram", "ram"),
    ("dm-writecache", "hdd", "ssd"), ("opencas", "delay-ram", "ram"),
]


@pytest.mark.parametrize("system,slow,cache", COMBOS,
                         ids=[f"{s}-{m}-{c}" for s, m, c in COMBOS])
def test_build_use_teardown(request, clean, system, slow, cache):
    if system == "tiercache":
        request.getfixturevalue("tc_module")
    if system == "opencas":
        need_opencas()
    # Open CAS wants at least 64 MiB of cache (its metadata)
    csize = 64 if system == "opencas" else 32
    args = ["create", NAME, "--system", system, "--slow-size", "24M",
            "--cache", cache, "--cache-size", f"{csize}M"] + SLOW[slow]
    info = info_of(stack(*args).stdout)
    top, slow_dev = info["TOP_DEV"], info["SLOW_DEV"]
    assert Path(top).is_block_device() and Path(slow_dev).is_block_device()
    assert blk_sectors(slow_dev) == 24 * 2048
    if system == "bcache":
        # the bcache superblock takes the start of the slow disk
        assert 23 * 2048 < blk_sectors(top) < 24 * 2048
        assert Path(f"/sys/block/{info['BCACHE_DEV']}/bcache/state").read_text().strip() != "no cache"
        assert "[writeback]" in Path(f"/sys/block/{info['BCACHE_DEV']}/bcache/cache_mode").read_text()
    else:
        assert blk_sectors(top) == 24 * 2048
    if system in ("tiercache", "dm-cache", "dm-writecache"):
        target = {"tiercache": "tiercache", "dm-cache": "cache", "dm-writecache": "writecache"}
        assert sh(f"dmsetup table {NAME}").split()[2] == target[system]
        assert blk_sectors(info["CACHE_DEV"]) == 32 * 2048
    if system == "opencas":
        # the seed's set-up: write-back, 4 KiB cache lines, the slow disk
        # as the core behind the exported /dev/casN-1
        cid = info["OPENCAS_CACHE_ID"]
        assert top == f"/dev/cas{cid}-1"
        lst = sh(f"{info['CASADM']} --list-caches --output-format csv")
        rows = list(csv.DictReader(lst.splitlines()))
        cache_row = next(r for r in rows if r["type"] == "cache" and r["id"] == cid)
        assert cache_row["write policy"] == "wb", lst
        # the by-id link casadm was given is the slow disk (same device
        # number: /dev/mapper nodes are not symlinks without udev)
        assert os.stat(f"/dev/disk/by-id/tcstack-{NAME}-core").st_rdev == os.stat(slow_dev).st_rdev
        assert opencas_stats(info)["Cache line size [KiB]"] == "4"
    if slow.startswith("delay"):
        assert sh(f"dmsetup table {NAME}-slow").split()[2] == "delay"
    else:
        cfg = Path(f"/sys/kernel/config/nullb/{NAME}-slow")
        assert (cfg / "completion_nsec").read_text().strip() == "200000"
        assert (cfg / "memory_backed").read_text().strip() == "1"
        assert "[mq-deadline]" in Path(f"/sys/block/{info['SLOW_KNAME']}/queue/scheduler").read_text()
    read_write_check(top)
    if system == "opencas":
        # write-back: the data sits dirty in the cache, none on the slow disk
        st = opencas_stats(info)
        assert int(float(st["Dirty [4KiB Blocks]"])) == 256, st
    assert NAME in stack("list").stdout
    # same parameters again: the existing stack is reported, nothing built
    again = stack(*args)
    assert "already exists" in again.stderr and info_of(again.stdout)["TOP_DEV"] == top
    stack("remove", NAME)
    assert not Path(f"{STATE}/{NAME}").exists()
    # removing twice is fine
    assert "nothing to remove" in stack("remove", NAME).stderr


def test_other_parameters_refused(clean):
    stack("create", NAME, "--system", "none", "--slow-size", "8M", "--write-delay-ms", "1")
    p = stack("create", NAME, "--system", "none", "--slow-size", "16M", "--write-delay-ms", "1",
              check=False)
    assert p.returncode != 0 and "already exists with other parameters" in p.stderr
    assert blk_sectors(f"/dev/mapper/{NAME}-slow") == 8 * 2048   # untouched
    stack("remove", NAME)


BAD = [
    (["--slow-size", "abc"], r"invalid size 'abc'"),
    (["--slow-size", "1500K"], r"whole MiB"),
    (["--slow-size", "0"], r"at least 1 MiB"),
    (["--cache-size", "2048G"], r"larger than 1 TiB"),
    (["--cache-size", "2T"], r"invalid size '2T'"),
    (["--slow-size", "100G"], r"do not fit in memory"),
    (["--system", "flashcache"], r"unknown system 'flashcache'"),
    (["--slow", "tape"], r"unknown slow disk model 'tape'"),
    (["--slow-backing", "nfs"], r"unknown slow disk backing"),
    (["--cache", "nvram"], r"unknown cache kind"),
    (["--block-kb", "3"], r"tiercache \(power of two from 4 to 1024\)"),
    (["--system", "dm-cache", "--block-kb", "16"], r"multiple of 32 KiB"),
    (["--system", "dm-writecache", "--block-kb", "8"], r"dm-writecache \(1, 2 or 4\)"),
    (["--system", "bcache", "--cache-size", "8M"], r"bcache needs at least 16 MiB"),
    (["--mode", "writearound"], r"invalid mode 'writearound' for tiercache"),
    (["--system", "dm-writecache", "--mode", "writeback"], r"does not apply to dm-writecache"),
    (["--system", "none", "--opt", "a=1"], r"--opt does not apply"),
    (["--bcache-writeback-delay", "1"], r"applies to bcache only"),
    (["--system", "opencas", "--block-kb", "12"], r"opencas \(cache line 4, 8, 16, 32 or 64\)"),
    (["--system", "opencas", "--cache-size", "32M"], r"Open CAS needs at least 64 MiB"),
    (["--system", "opencas", "--mode", "wb"], r"invalid mode 'wb' for opencas"),
    (["--hdd-depth", "0"], r"queue depth .* from 1 to 4096"),
    (["--hdd-sched", "cfq"], r"unknown I/O scheduler 'cfq'"),
    (["--write-delay-ms", "-5"], r"invalid write delay"),
    (["--opt", "bridge_gap_kb"], r"expected key=value"),
    (["--slow-dev", "/dev/nonexistent"], r"not a block device"),
    (["--cache-dev", "/dev/null"], r"not a block device"),
    (["--cache", "ssd", "--file-dir", "/nonexistent"], r"not a directory"),
    (["--frobnicate", "1"], r"unknown option '--frobnicate'"),
    (["--slow-size"], r"needs a value"),
]


@pytest.mark.parametrize("args,msg", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_parameters(unchanged, args, msg):
    p = stack("create", NAME, *args, check=False)
    assert p.returncode != 0
    assert re.search(msg, p.stderr), p.stderr
    assert p.stderr.startswith("stack.sh: error: "), p.stderr
    assert p.stdout == ""


@pytest.mark.parametrize("cmd", [["create", "1abc"], ["create", "a-b"], ["remove"],
                                 ["create"], ["frob"]])
def test_bad_commands(unchanged, cmd):
    p = stack(*cmd, check=False)
    assert p.returncode != 0 and "error:" in p.stderr


def test_help():
    p = stack("help")
    for word in ("create", "remove", "--system", "--slow", "--hdd-nsec", "--cache"):
        assert word in p.stdout


@pytest.fixture
def loopdev():
    """A 16 MiB loop device over a file, removed afterwards."""
    sh("modprobe loop")
    f = "/dev/shm/fbt-test-loop.img"
    sh(f"truncate -s 16M {f}")
    dev = sh(f"losetup --find --show {f}").strip()
    yield dev
    sh(f"dmsetup remove {NAME}x 2>/dev/null || true", check=False)
    sh(f"losetup -d {dev}", check=False)
    os.unlink(f)


def test_existing_device_sizes_and_use(clean, loopdev):
    p = stack("create", NAME, "--system", "none", "--slow-dev", loopdev, "--slow-size", "32M",
              check=False)
    assert p.returncode != 0 and "larger than" in p.stderr, p.stderr
    p = stack("create", NAME, "--slow-dev", loopdev, "--cache-dev", loopdev, check=False)
    assert p.returncode != 0 and "same device" in p.stderr, p.stderr
    # a device held by another device-mapper device is in use
    sh(f"dmsetup create {NAME}x --table '0 8 linear {loopdev} 0'")
    p = stack("create", NAME, "--system", "none", "--slow-dev", loopdev, check=False)
    assert p.returncode != 0 and "slow device in use" in p.stderr and "held by dm-" in p.stderr, p.stderr
    sh(f"dmsetup remove {NAME}x")
    # free again: the existing device is used as the slow disk, and kept
    info = info_of(stack("create", NAME, "--system", "none", "--slow-dev", loopdev).stdout)
    assert info["TOP_DEV"] == loopdev and info["SLOW_MODEL"] == "device"
    stack("remove", NAME)
    assert Path(loopdev).is_block_device()


def test_name_taken_by_foreign_device(clean):
    sh(f"dmsetup create {NAME} --table '0 8 zero'")
    try:
        p = stack("create", NAME, "--system", "none", check=False)
        assert p.returncode != 0 and "not built by stack.sh" in p.stderr, p.stderr
        assert sh(f"dmsetup table {NAME}").split()[2] == "zero"
    finally:
        sh(f"dmsetup remove {NAME}")


def test_brd_held_elsewhere(clean):
    """RAM disks of the wrong size that another user holds: refused, clearly."""
    if Path("/sys/module/brd").exists():
        sh("rmmod brd")
    sh("modprobe brd rd_nr=1 rd_size=4096")
    sh(f"dmsetup create {NAME}x --table '0 8 linear /dev/ram0 0'")
    try:
        p = stack("create", NAME, "--system", "none", "--slow-size", "16M", check=False)
        assert p.returncode != 0, p.stderr
        assert "cannot be reloaded" in p.stderr and "ram0 is held by dm-" in p.stderr, p.stderr
    finally:
        sh(f"dmsetup remove {NAME}x")
        sh("rmmod brd")


@pytest.mark.parametrize("system,opt", [("dm-writecache", "bogus_key=1"),
                                        ("dm-cache", "bogus_key=1"),
                                        ("tiercache", "flush_depth=0")])
def test_kernel_refusal_rolls_back(request, clean, system, opt):
    """The cache target refuses its table: everything built before goes."""
    if system == "tiercache":
        request.getfixturevalue("tc_module")
    p = stack("create", NAME, "--system", system, "--slow-size", "16M", "--cache-size", "32M",
              "--write-delay-ms", "1", "--opt", opt, check=False)
    assert p.returncode != 0
    assert f"dmsetup create {NAME} failed" in p.stderr and "removing what was built" in p.stderr, p.stderr
    # the `clean` fixture checks that nothing is left


def test_interrupted_create_is_cleaned_up(clean):
    """A stack whose create never finished is removed before a new create."""
    stack("create", NAME, "--system", "none", "--slow-size", "8M", "--write-delay-ms", "1")
    os.unlink(f"{STATE}/{NAME}/complete")      # as if killed half way
    p = stack("create", NAME, "--system", "none", "--slow-size", "8M", "--write-delay-ms", "1")
    assert "incomplete" in p.stderr
    assert info_of(p.stdout)["TOP_DEV"] == f"/dev/mapper/{NAME}-slow"
    stack("remove", NAME)


@pytest.mark.parametrize("slow", ["delay-ram", "hdd"])
def test_slow_fill_and_dm_ioctls(request, clean, slow):
    """--slow-fill 1 writes zeros over the slow disk before the cache is
    built (reported as SLOW_FILLED=1); the experiment's ioctls
    (scripts/dmioctl.py) send target messages, refuse a bad one with the
    target's errno, and the event wait returns the same status text as
    dmsetup."""
    import errno
    import sys
    request.getfixturevalue("tc_module")
    sys.path.insert(0, str(REPO / "scripts"))
    import dmioctl

    info = info_of(stack("create", NAME, "--system", "tiercache", "--slow-size", "24M",
                         "--cache", "ram", "--cache-size", "32M", "--slow-fill", "1",
                         *SLOW[slow]).stdout)
    assert info.get("SLOW_FILLED") == "1"
    with open(info["SLOW_DEV"], "rb") as f:
        f.seek(23 * MiB)
        assert f.read(MiB) == bytes(MiB)
    name = info["DM_NAME"]
    # udev's probe promoted blocks at create: commit their entries now, or
    # the commit timer may count a commit (field 21) between the event
    # below and the dmsetup status it is compared with
    fd = os.open(f"/dev/mapper/{name}", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    dmioctl.message(name, "stats reset")
    with pytest.raises(OSError) as ei:
        dmioctl.message(name, "no such message")
    assert ei.value.errno == errno.EINVAL
    ev = dmioctl.event_nr(name)
    assert ev == int(sh(f"dmsetup info -c --noheadings -o events {name}").strip())
    dmioctl.message(name, "flush")          # nothing dirty: ends at once, one event
    new_ev, text = dmioctl.wait(name, ev)
    assert new_ev > ev
    assert text.split() == sh(f"dmsetup status {name}").split()[3:]
    stack("remove", NAME)


def test_opencas_build_refusals(tmp_path):
    """scripts/opencas.sh says plainly why it cannot build Open CAS (the
    experiment prints that line and goes on without it), and builds
    nothing into its cache then."""
    tool = REPO / "scripts" / "opencas.sh"
    env = dict(ENV, OPENCAS_CACHE=str(tmp_path / "cache"))

    def build(*args, **extra):
        return subprocess.run([str(tool), "build", *args], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=120,
                              env=dict(env, **extra))
    p = build(OPENCAS_SRC="/nonexistent/open-cas.tar.xz")
    assert p.returncode != 0 and p.stdout == ""
    assert p.stderr.strip().splitlines()[-1] == \
        "opencas.sh: error: OPENCAS_SRC=/nonexistent/open-cas.tar.xz: no such file", p.stderr
    p = build("0.0.0-none")
    assert p.returncode != 0 and "no kernel headers for 0.0.0-none" in p.stderr, p.stderr
    # a tarball that is not an Open CAS source tree
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "README").write_text("not open cas\n")
    bogus = tmp_path / "open-cas-linux-0.tar.xz"
    subprocess.run(["tar", "-cJf", str(bogus), "-C", str(tmp_path), "x"], check=True)
    p = build(OPENCAS_SRC=str(bogus))
    assert p.returncode != 0 and p.stdout == ""
    assert f"{bogus} has no configure script" in p.stderr, p.stderr
    assert not list((tmp_path / "cache").glob("*/ok"))
