# SPDX-License-Identifier: GPL-2.0
"""LVM-style use of the `tiercache` command (runs in the test VM).

A real volume group on two loop devices holds a slow LV and a fast LV.
`tiercache attach` caches the slow one; a filesystem on the cached device
is written, flushed and, still mounted, detached; afterwards the origin LV
alone holds everything.  Boot activation from the configuration file never
exposes an origin without its cache.
"""

import hashlib
import json
import os
import re
from pathlib import Path

import pytest

from test_tool import Res, devno, dm_exists, dm_table, sh, status_json, tool

pytestmark = pytest.mark.usefixtures("tc_module")

VG = "tctvg"
SLOW = "tctslow"
FAST = "tctfast"
MiB = 1024 * 1024


def lvm(*args, check=True):
    return sh(["lvm", *args], check=check)


def lv_report(lv):
    """{'lv_tags':..., 'lv_skip_activation':..., 'lv_active':...} or None."""
    p = lvm("lvs", "--reportformat", "json", "-o",
            "lv_name,lv_tags,lv_skip_activation,lv_active,lv_kernel_major,lv_kernel_minor",
            f"{VG}/{lv}", check=False)
    if p.returncode != 0:
        return None
    rows = json.loads(p.stdout)["report"][0]["lv"]
    return rows[0] if rows else None


class VolumeGroup:
    def __init__(self, res, tmp):
        self.res = res
        self.conf = tmp / "tiercache.conf"
        self.pv_slow = res.loop(256 * MiB)
        self.pv_fast = res.loop(64 * MiB)
        res.es.callback(self.teardown)
        lvm("pvcreate", "-q", "-y", self.pv_slow, self.pv_fast)
        lvm("vgcreate", "-q", VG, self.pv_slow, self.pv_fast)
        lvm("lvcreate", "-q", "-y", "-W", "n", "-Z", "n", "-n", SLOW, "-L", "200M", VG, self.pv_slow)
        lvm("lvcreate", "-q", "-y", "-W", "n", "-Z", "n", "-n", FAST, "-L", "48M", VG, self.pv_fast)
        self.slow_path = f"/dev/{VG}/{SLOW}"

    def teardown(self):
        for name in (SLOW, "tctother"):
            if dm_exists(name):
                sh(["umount", "-l", f"/dev/mapper/{name}"], check=False)
                tool("remove", "--no-flush", "--force", name, rc=None, config=self.conf)
            if dm_exists(name):
                sh(["dmsetup", "remove", "--retry", name], check=False)
        lvm("vgchange", "-q", "-an", VG, check=False)
        lvm("vgremove", "-q", "-ff", "-y", VG, check=False)
        lvm("pvremove", "-q", "-ff", "-y", self.pv_slow, self.pv_fast, check=False)

    def attach(self, *extra, rc=0):
        return tool("attach", f"{VG}/{SLOW}", "--cache", f"{VG}/{FAST}", *extra,
                    rc=rc, config=self.conf)


@pytest.fixture
def vg():
    res = Res()
    tmp = Path("/dev/shm") / f"tct-lvm-{os.getpid()}"
    tmp.mkdir(exist_ok=True)
    try:
        yield VolumeGroup(res, tmp)
    finally:
        res.close()
        for f in tmp.iterdir():
            f.unlink()
        tmp.rmdir()


def write_files(mnt, seed, n=16):
    """Files of assorted sizes with seeded content; returns {name: sha256}."""
    sums = {}
    for i in range(n):
        size = (i * 37 % 11 + 1) * 61 * 1024 + i * 513
        data = hashlib.shake_256(f"{seed}-{i}".encode()).digest(size)
        name = f"f-{seed}-{i:02d}"
        with open(mnt / name, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        sums[name] = hashlib.sha256(data).hexdigest()
    os.sync()
    return sums


def verify_files(mnt, sums):
    Path("/proc/sys/vm/drop_caches").write_text("3\n")
    for name, want in sums.items():
        got = hashlib.sha256((mnt / name).read_bytes()).hexdigest()
        assert got == want, f"{mnt / name}: checksum mismatch"


def test_attach_flush_detach_while_mounted(vg):
    p = vg.attach()
    assert p.stdout == (f"{SLOW}: {VG}/{SLOW} cached on {VG}/{FAST}; "
                        f"use /dev/tiercache/{SLOW} (/dev/mapper/{SLOW})\n"
                        f"{SLOW}: cache {VG}/{FAST} formatted\n")
    node = f"/dev/mapper/{SLOW}"
    assert os.path.realpath(f"/dev/tiercache/{SLOW}") == os.path.realpath(node)
    origin_devno = devno(vg.slow_path)
    assert dm_table(SLOW).startswith(f"0 409600 tiercache {origin_devno} {devno(f'/dev/{VG}/{FAST}')} 8 ")
    for lv, tag in ((SLOW, "tiercache_origin"), (FAST, "tiercache_cache")):
        r = lv_report(lv)
        assert r["lv_tags"] == tag and r["lv_skip_activation"] == "skip activation", r
    assert re.search(rf"^{SLOW}\t{VG}/{SLOW}\t{VG}/{FAST}\tblock_size=4K$",
                     vg.conf.read_text(), re.M), vg.conf.read_text()

    mnt = vg.res.mount(f"/dev/tiercache/{SLOW}")
    sums = write_files(mnt, "a")
    assert status_json(SLOW)["dirty_bytes"] > 0
    p = tool("flush", "--wait", "--progress", "lines", SLOW)
    assert p.stdout.startswith(f"{SLOW}: flushed ")
    st = status_json(SLOW)
    assert st["dirty_bytes"] == 0 and st["status"]["error"] == 0
    sums.update(write_files(mnt, "b"))          # dirty again at detach time
    assert status_json(SLOW)["dirty_bytes"] > 0

    p = tool("detach", SLOW, config=vg.conf)
    assert p.stdout.endswith(
        f"{SLOW}: detached: /dev/mapper/{SLOW} now maps {VG}/{SLOW} directly; "
        f"cache LV {VG}/{FAST} kept\n"
        f"{SLOW}: when it is no longer in use, 'tiercache remove {SLOW}' drops the mapping\n"), p.stdout
    assert dm_table(SLOW) == f"0 409600 linear {origin_devno} 0"
    assert os.path.ismount(mnt), "the filesystem was unmounted"
    verify_files(mnt, sums)
    sums.update(write_files(mnt, "c", n=4))     # through the linear mapping
    assert re.search(rf"^{SLOW} +detached +linear ", tool("list").stdout, re.M)
    for lv in (SLOW, FAST):
        r = lv_report(lv)
        assert r["lv_tags"] == "" and r["lv_skip_activation"] == "", r
    assert SLOW not in vg.conf.read_text()

    Res.umount(mnt)
    assert tool("remove", SLOW).stdout == f"{SLOW}: removed\n"
    assert not dm_exists(SLOW)
    sh(["fsck.ext4", "-f", "-n", vg.slow_path])
    # The origin LV alone holds everything.
    mnt2 = vg.res.mount(vg.slow_path, mkfs=False)
    verify_files(mnt2, sums)
    Res.umount(mnt2)


def test_detach_uncache_removes_cache_lv(vg):
    vg.attach("--block-size", "64K", "--bridge-gap-kb", "256")
    assert dm_table(SLOW).endswith(" 128 2 bridge_gap_kb 256")
    data = hashlib.shake_256(b"uncache").digest(3 * MiB)
    with open(f"/dev/tiercache/{SLOW}", "r+b") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    p = tool("detach", "--uncache", SLOW, config=vg.conf)
    assert f"cache LV {VG}/{FAST} removed" in p.stdout
    assert lv_report(FAST) is None
    tool("remove", SLOW)
    with open(vg.slow_path, "rb") as f:
        assert f.read(3 * MiB) == data


def test_attach_refusals(vg):
    p = tool("attach", f"{VG}/nope", "--cache", f"{VG}/{FAST}", rc=3, config=vg.conf)
    assert p.stderr == (f"tiercache: logical volume {VG}/nope not found\n"
                        "tiercache: hint: check the name with 'lvs'; the form is VG/LV\n")
    p = tool("attach", f"{VG}/{SLOW}", "--cache", f"{VG}/{SLOW}", rc=2, config=vg.conf)
    assert p.stderr == f"tiercache: the cache may not be the origin ({VG}/{SLOW})\n"

    mnt = vg.res.mount(vg.slow_path)
    p = vg.attach(rc=4)
    assert p.stderr.startswith(f"tiercache: origin {VG}/{SLOW} (/dev/dm-"), p.stderr
    assert f"is in use: mounted on {mnt}\n" in p.stderr
    assert lv_report(SLOW)["lv_tags"] == "", "LVs changed by a refused attach"
    assert not vg.conf.exists()
    Res.umount(mnt)

    vg.attach()
    p = tool("attach", f"{VG}/{SLOW}", "--cache", f"{VG}/{FAST}", "--name", "tctother",
             rc=4, config=vg.conf)
    assert p.stderr == (f"tiercache: origin {VG}/{SLOW} is already part of a cached device\n"
                        "tiercache: hint: 'tiercache list' shows it; detach it first\n")
    with open(f"/dev/tiercache/{SLOW}", "r+b") as f:
        f.write(b"x" * 65536)
        f.flush()
        os.fsync(f.fileno())
    p = tool("remove", "--no-flush", SLOW, rc=5, config=vg.conf)
    assert "refusing to remove: the cache holds 64 KiB of dirty data (16 blocks)" in p.stderr


def test_boot_activation_never_exposes_origin_alone(vg):
    vg.attach("--flush-depth", "32")
    data = hashlib.shake_256(b"boot").digest(2 * MiB)
    with open(f"/dev/tiercache/{SLOW}", "r+b") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())

    # Shutdown: flush, remove, deactivate both LVs.
    tool("deactivate", "--all", "--quiet", config=vg.conf)
    assert not dm_exists(SLOW)
    assert lv_report(SLOW)["lv_active"] == "" and lv_report(FAST)["lv_active"] == ""

    # Boot: LVM autoactivation skips the pair ...
    lvm("vgchange", "-ay", VG)
    assert lv_report(SLOW)["lv_active"] == "", "origin exposed by vgchange -ay"
    assert lv_report(FAST)["lv_active"] == ""
    # ... and tiercache.service sets it up.
    p = tool("activate", "--all", config=vg.conf)
    assert p.stdout.startswith(f"{SLOW}: activated (")
    assert "flush_depth 32" in dm_table(SLOW)
    with open(f"/dev/tiercache/{SLOW}", "rb") as f:
        assert f.read(2 * MiB) == data
    assert tool("activate", "--all", config=vg.conf).stdout == f"{SLOW}: already active\n"

    # Cache LV gone: activation fails and the origin stays inactive.
    tool("deactivate", "--all", "--quiet", config=vg.conf)
    lvm("lvremove", "-q", "-y", f"{VG}/{FAST}")
    p = tool("activate", "--all", rc=3, config=vg.conf)
    assert f"logical volume {VG}/{FAST} not found" in p.stderr
    assert lv_report(SLOW)["lv_active"] == "", "origin exposed without its cache"
    assert not dm_exists(SLOW)
