# SPDX-License-Identifier: GPL-2.0
"""Concurrency: fio with verification while flushes, suspend/resume and
table reloads run; a reload keeps cached and dirty blocks; passthrough is
refused while dirty."""

import subprocess
import time

import pytest

import tclib
from tclib import MiB

pytestmark = [pytest.mark.module, pytest.mark.usefixtures("tc_module")]


def test_fio_with_flush_suspend_reload(stack):
    s = stack.setup(origin_mib=128, cache_mib=32, block=8, write_ms=2,
                    keys={"bridge_gap_kb": 16})
    tc = s.tc
    base_table = tc.table_line()
    job = ["--name=conc", "--ioengine=libaio", "--direct=1", "--iodepth=8",
           "--rw=randrw", "--rwmixread=40", "--bssplit=4k/70:16k/15:64k/10:256k/5",
           "--numjobs=4", "--size=24M", "--offset_increment=24M",
           "--verify_state_save=0",
           "--verify=crc32c", "--verify_fatal=1", "--randseed=777",
           "--group_reporting"]
    # paced (~25 s) so that the control operations overlap the IO.  Not with
    # --rate: that changes fio's read/write choices, and --verify_only below
    # must replay the same sequence.
    cmd = (["fio", "--eta=never", "--thinktime=60000", "--thinktime_blocks=8"]
           + job + [f"--filename={tc.path}"])
    tclib.log("$ " + " ".join(cmd) + " &")
    fio = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, env=tclib.ENV, cwd=tclib.WORKDIR)
    ops_during = 0
    cycles = 0
    try:
        time.sleep(1.0)
        while True:
            cycles += 1
            steps = [
                ("flush", lambda: (lambda ev: (tc.message("flush"),
                                               tc.wait_event(ev, timeout=180)))(tc.event_nr())),
                ("suspend/resume", lambda: (tc.suspend(), time.sleep(0.3), tc.resume())),
                ("reload same line", lambda: tc.reload(base_table)),
                ("reload flush_depth 16", lambda: tc.reload(base_table.replace(
                    " 2 bridge_gap_kb 16", " 4 bridge_gap_kb 16 flush_depth 16"))),
                ("set max_flush_kb 256", lambda: tc.message("set", "max_flush_kb", "256")),
                ("reload back", lambda: tc.reload(base_table)),
            ]
            for name, fn in steps:
                running = fio.poll() is None
                t0 = time.monotonic()
                fn()
                st = tc.status()
                tclib.log(f"cycle {cycles} {name} ({time.monotonic() - t0:.2f}s, fio "
                          f"{'running' if running else 'done'}): {st['raw']}")
                ops_during += running
                if name == "reload flush_depth 16":
                    w = tc.table_line().split()
                    assert "flush_depth" in w and w[w.index("flush_depth") + 1] == "16", w
                if name == "reload same line":
                    assert tc.table_line() == base_table
            if fio.poll() is not None or cycles >= 20:
                break
        out, _ = fio.communicate(timeout=900)
    finally:
        if fio.poll() is None:
            fio.kill()
            fio.wait(timeout=10)
    print(out)
    assert fio.returncode == 0, f"fio failed (rc {fio.returncode}):\n{out[-3000:]}"
    assert ops_during >= 6, f"only {ops_during} control operations overlapped fio"
    assert tc.table_line() == base_table
    tclib.fio(job + [f"--filename={tc.path}", "--verify_only"])
    tc.flush()
    tc.remove()
    tclib.fio(job + [f"--filename={s.origin.path}", "--verify_only"])


def test_reload_keeps_cached_and_dirty_blocks(stack):
    s = stack.setup(origin_mib=32, cache_mib=16, write_ms=1, seed=101)
    tc, m = s.tc, s.model
    with tclib.Workload(tc.path, m, seed=102) as wl:
        for b in range(0, 400, 2):
            wl.write_direct(b * 4096, 4096)
        for b in range(1, 400, 4):
            wl.read_check(b * 4096, 4096, direct=True)
    tclib.settle(tc.path)
    st0 = tc.status()
    assert st0["dirty"] == 200, st0["raw"]
    table = tc.table_line()
    tc.reload(table)
    tclib.settle(tc.path)
    st = tc.status()
    assert (st["dirty"], st["used"]) == (st0["dirty"], st0["used"]), \
        f"reload lost state: {st0['raw']} -> {st['raw']}"
    o0 = s.origin.stat()
    assert table.endswith(" 0"), table
    tc.reload(table[:-2] + " 1 writethrough")
    st = tc.status()
    assert st["mode"] == "writethrough" and st["dirty"] == 200, st["raw"]
    m.verify_device(tc.path)
    tc.flush()
    d = tclib.stat_delta(s.origin.stat(), o0)
    assert d["write_sectors"] == 200 * 8, d
    tc.remove()
    m.verify_device(s.origin.path)


def dm_state(name):
    out = tclib.run(["dmsetup", "info", name], quiet=True).stdout
    for ln in out.splitlines():
        if ln.startswith("State:"):
            return ln.split(":", 1)[1].strip()
    return "?"


def test_passthrough_refused_while_dirty(stack):
    """The refusal may come at `dmsetup reload` (constructor) or at
    `dmsetup resume`; either way the device must stay usable in its old
    mode with its dirty blocks, not be left suspended."""
    s = stack.setup(origin_mib=32, cache_mib=16, seed=111)
    tc, m = s.tc, s.model
    with tclib.Workload(tc.path, m, seed=112) as wl:
        for b in range(50):
            wl.write_direct(8 * MiB + b * 8192, 4096)
    table = tc.table_line()
    assert table.endswith(" 0"), table
    pt = table[:-2] + " 1 passthrough"
    p = tclib.run(["dmsetup", "reload", tc.name, "--table", pt], check=False)
    refused_at = "reload"
    if p.returncode == 0:
        refused_at = "resume"
        r = tclib.run(["dmsetup", "resume", tc.name], check=False)
        assert r.returncode != 0, "passthrough table went live while the cache holds dirty blocks"
    state = dm_state(tc.name)
    st = tc.status()
    if state != "ACTIVE":
        # recover so that the rest of the suite can run, then fail
        tclib.run(["dmsetup", "reload", tc.name, "--table", table], check=False)
        tclib.run(["dmsetup", "resume", tc.name], check=False)
        pytest.fail(f"passthrough refused at {refused_at}, but the device was left "
                    f"{state} (I/O to it would hang) with status: {st['raw']}")
    assert st["mode"] == "writeback" and st["dirty"] == 50, st["raw"]
    m.verify_device(tc.path)
    tc.flush()
    tc.reload(pt)
    st = tc.status()
    assert st["mode"] == "passthrough", st["raw"]
    with tclib.Workload(tc.path, m, seed=113) as wl:
        wl.run(60)
    m.verify_device(tc.path)
    tc.remove()
    m.verify_device(s.origin.path)
