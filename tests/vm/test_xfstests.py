# SPDX-License-Identifier: GPL-2.0
"""A curated list of xfstests' generic tests on ext4, on plain RAM disks (brd)
and on tiercache devices over the same RAM disks: a test that fails on
tiercache but not on the RAM disk is a defect of the cache.

Run by `make test-xfstests` (tests/xfstests/run.sh), which sets
TC_XFSTESTS=1; `make test` does not collect this file (conftest.py).

Layout (brd, 4 disks of TC_XFS_DISK_MIB, default 768 MiB):
  ram0 TEST_DEV origin, ram1 SCRATCH_DEV origin, ram2 LOGWRITES_DEV,
  ram3 sliced into the two caches (TC_XFS_CACHE_MIB each, default 64 MiB:
  smaller than what the tests write, so blocks are evicted and writes go
  around a full cache), watermarks 10/2 (background writeback busy).
Environment: TC_XFSTESTS_LIST (tests, default LIST below),
TC_XFSTESTS_TIMEOUT (seconds per test, default 900), XFSTESTS_DIR.
Writes xfstests-table.md (test, brd, tiercache) and the per-test logs into
$TC_RESULTS (the run's results directory).
"""

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

import tclib
from tclib import MiB
from test_85_fsx import xfstests_dir

pytestmark = [pytest.mark.module, pytest.mark.usefixtures("tc_module")]

# IO, direct IO, AIO, discard, fallocate, mmap, log-writes; all pass on ext4
# over a plain disk and take seconds each on real hardware.
LIST = """
generic/013 generic/014 generic/069 generic/075 generic/091 generic/112
generic/263 generic/465 generic/466 generic/609 generic/615
generic/113 generic/114 generic/198 generic/207 generic/210 generic/240
generic/366 generic/391 generic/427 generic/451 generic/538 generic/586
generic/251 generic/260 generic/288 generic/537
generic/008 generic/009 generic/092 generic/213 generic/214 generic/255
generic/316 generic/568 generic/679
generic/029 generic/030
generic/455 generic/482
""".split()
TESTS = os.environ.get("TC_XFSTESTS_LIST", "").split() or LIST
# "udevadm wait" with a deadline (tests/xfstests/bin/udevadm)
UDEVADM_DIR = Path(__file__).resolve().parents[1] / "xfstests" / "bin"
PER_TEST = int(os.environ.get("TC_XFSTESTS_TIMEOUT", "900"))
DISK_MIB = int(os.environ.get("TC_XFS_DISK_MIB", "768"))
CACHE_MIB = int(os.environ.get("TC_XFS_CACHE_MIB", "64"))
RES = Path(os.environ.get("TC_RESULTS", tclib.WORKDIR))

RESULTS = {}      # config -> {test: (result, seconds)}
DETAILS = {}      # config -> {test: failure text}


def disks(stack):
    stack.RD_NR = 4
    stack.RD_SIZE_KIB = DISK_MIB * 1024
    return [stack.ram(DISK_MIB * MiB) for _ in range(4)]


def xfstests_copy():
    """A writable copy of the build (the guest's / is read-only)."""
    dst = Path(tclib.WORKDIR) / "xfstests"
    if not (dst / "check").exists():
        shutil.copytree(xfstests_dir(), dst, symlinks=True)
    return dst


def snapshot_processes(what):
    """Into the kernel log: the processes a slow test is made of (state,
    kernel wait channel, command), so that a timeout says where it was."""
    p = subprocess.run(["ps", "-eo", "pid,stat,etimes,wchan:24,args", "--sort=pid"],
                       capture_output=True, text=True)
    # user processes (kernel threads show as [name]) and any in D state
    keep = [ln for ln in p.stdout.splitlines()[1:]
            if not re.search(r"\s\[[^]]+\]$", ln) or re.search(r"^\s*\d+ D", ln)]
    keep = [ln for ln in keep if not re.search(r"pytest|ps -eo|systemd|udevd|agetty", ln)]
    for ln in keep[:60]:
        tclib.kmsg(f"xfstests {what}: {ln[:200]}")


def run_watched(cmd, env, cwd, limit, what, every=300):
    """subprocess.run(cmd) with its output captured and a deadline, and a
    snapshot of its processes every @every seconds in the kernel log."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env, cwd=cwd, stdin=subprocess.DEVNULL) as proc:
        t0 = time.monotonic()
        while True:
            try:
                out, err = proc.communicate(timeout=every)
                return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
            except subprocess.TimeoutExpired:
                if time.monotonic() - t0 > limit:
                    proc.kill()
                    proc.communicate()
                    raise
                snapshot_processes(f"{what} at {time.monotonic() - t0:.0f}s")


def run_list(config, test_dev, scratch_dev, logw_dev, tcs=()):
    x = xfstests_copy()
    base = RES / f"xfstests-{config}"
    base.mkdir(parents=True, exist_ok=True)
    tdir = Path(tclib.WORKDIR) / "xfs-test"
    smnt = Path(tclib.WORKDIR) / "xfs-scratch"
    tdir.mkdir(exist_ok=True)
    smnt.mkdir(exist_ok=True)
    tclib.run(["mkfs.ext4", "-q", "-F", test_dev], timeout=600)
    env = dict(tclib.ENV, FSTYP="ext4", TEST_DEV=test_dev, TEST_DIR=str(tdir),
               SCRATCH_DEV=scratch_dev, SCRATCH_MNT=str(smnt),
               LOGWRITES_DEV=logw_dev, RESULT_BASE=str(base),
               PATH=f"{UDEVADM_DIR}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    res, det = RESULTS.setdefault(config, {}), DETAILS.setdefault(config, {})
    for t in TESTS:
        t0 = time.monotonic()
        try:
            p = run_watched(["timeout", "-k", "30", str(PER_TEST), "./check", t],
                            env, str(x), PER_TEST + 120, t)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{config} {t}: ./check did not end {PER_TEST + 120}s after "
                        "its start (stuck in the kernel?)", pytrace=False)
        dt = time.monotonic() - t0
        out = p.stdout + p.stderr
        (base / f"{t.replace('/', '-')}.check.log").write_text(out)
        if p.returncode == 124:
            r = "TIMEOUT"
        elif re.search(rf"^Failures:.*\b{re.escape(t)}\b", out, re.M):
            r = "FAIL"
        elif re.search(rf"^Not run:.*\b{re.escape(t)}\b", out, re.M):
            r = "notrun"
        elif re.search(r"^Passed all 1 tests", out, re.M):
            r = "pass"
        else:
            r = f"ERROR(rc {p.returncode})"
        if r not in ("pass", "notrun"):
            bad = base / f"{t}.out.bad"
            full = base / f"{t}.full"
            txt = out[-2000:]
            if bad.exists():
                txt += f"\n--- {t}.out.bad (head)\n" + bad.read_text(errors="replace")[:3000]
            if full.exists():
                txt += f"\n--- {t}.full (tail)\n" + full.read_text(errors="replace")[-2000:]
            det[t] = txt
        elif r == "notrun":
            m = re.search(rf"^{re.escape(t)}\s+\[not run\]\s*(.*)$", out, re.M)
            det[t] = m.group(1) if m else ""
        states = ""
        for tc in tcs:
            st = tc.status()
            states += f" [{tc.name}: used {st['used']}/{st['total']} dirty {st['dirty']}" \
                      f" bypass {st['write_bypass']} wb {st['wb_blocks']} err {st['error']}]"
            assert st["error"] == 0 and st["meta_error"] == 0, \
                f"{t}: tiercache latched an error: {st['raw']}"
        tclib.log(f"xfstests {config} {t}: {r} ({dt:.0f}s){states}")
        res[t] = (r, dt)
        # the test device must still be mountable for the next test

    return res


def test_xfstests_brd(stack):
    r = disks(stack)
    res = run_list("brd", r[0], r[1], r[2])
    passed = [t for t, (v, _) in res.items() if v == "pass"]
    assert len(passed) >= len(TESTS) // 2, \
        f"only {len(passed)} of {len(TESTS)} tests passed on brd: the set-up is broken: {res}"


def test_xfstests_tiercache(stack):
    r = disks(stack)
    keys = {"high_watermark": 10, "low_watermark": 2}
    c0 = stack.linear(r[3], length=CACHE_MIB * MiB // 512).path
    c1 = stack.dm(stack._name("ram"),
                  f"0 {CACHE_MIB * MiB // 512} linear {r[3]} {CACHE_MIB * MiB // 512}").path
    t = stack.tiercache(r[0], c0, 8, None, keys)
    s = stack.tiercache(r[1], c1, 8, None, keys)
    run_list("tiercache", t.path, s.path, r[2], tcs=(t, s))
    for tc in (t, s):
        st = tc.status()
        tclib.log(f"{tc.name} at the end: {st['raw']}")
    # the conditions the comparison is about did happen (over the whole
    # list: a subset may not fill a cache)
    sts = [tc.status() for tc in (t, s)]
    if TESTS is LIST:
        assert any(st["write_bypass"] > 0 for st in sts), "no write went around a cache"
        assert all(st["wb_blocks"] > 0 for st in sts), "no writeback on a cache"
    t.flush()
    s.flush()


def test_xfstests_compare():
    b, c = RESULTS.get("brd"), RESULTS.get("tiercache")
    assert b and c, "a configuration did not run"
    lines = ["| test | brd | tiercache |", "|------|-----|-----------|"]
    defects = []
    for t in TESTS:
        rb, tb = b.get(t, ("missing", 0))
        rc, tt = c.get(t, ("missing", 0))
        mark = ""
        if rc != "pass" and rc != "notrun" and rb in ("pass", "notrun"):
            mark = " **defect**"
            defects.append(t)
        lines.append(f"| {t} | {rb} ({tb:.0f}s) | {rc} ({tt:.0f}s){mark} |")
    notes = []
    for cfg in ("brd", "tiercache"):
        for t, txt in DETAILS.get(cfg, {}).items():
            if RESULTS[cfg][t][0] == "notrun":
                notes.append(f"- {cfg} {t} not run: {txt.strip()}")
    table = "\n".join(lines) + "\n\n" + "\n".join(notes) + "\n"
    out = ["# xfstests generic on ext4: brd vs tiercache\n", table]
    for t in defects:
        out.append(f"\n## {t} on tiercache\n```\n{DETAILS['tiercache'].get(t, '')}\n```\n")
    (RES / "xfstests-table.md").write_text("".join(out))
    print(table)
    assert not defects, "fail on tiercache, not on brd: " + ", ".join(defects) + \
        "\n" + "\n".join(DETAILS["tiercache"].get(t, "")[-3000:] for t in defects)
