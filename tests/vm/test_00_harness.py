# SPDX-License-Identifier: GPL-2.0
"""Self-tests of the harness against in-kernel targets (no dm-tiercache).

They prove the plumbing the tiercache tests rely on: the pattern model
and its verification, fio verify/verify_only, the /sys/block stat oracle
on dm-delay, null_blk discard, dm-flakey write errors, the status parser,
the end of a run at a thread stuck in the kernel.
"""

import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tclib
from tclib import KiB, MiB


DOC_EXAMPLE = ("0 65536 tiercache writeback 8 8192/131072 0 0 0 0 8192 0 idle 8192 "
               "32 65536 1024 256.00 0 32 0 1 0 5 0 0")


def test_status_parser_doc_example():
    st = tclib.parse_status(DOC_EXAMPLE)
    assert st["len"] == 65536
    assert st["mode"] == "writeback" and st["block_size"] == 8
    assert (st["used"], st["total"], st["dirty"]) == (8192, 131072, 0)
    assert st["write_misses"] == 8192 and st["flush_state"] == "idle"
    assert (st["wb_blocks"], st["wb_requests"], st["wb_sectors"]) == (8192, 32, 65536)
    assert st["avg_write_kb"] == 1024 and st["merge_ratio"] == 256.0
    assert (st["inflight_max"], st["error"], st["flushes"], st["cleaner"]) == (32, 0, 1, 0)
    assert (st["meta_commits"], st["meta_error"], st["cache_failed"]) == (5, 0, 0)
    assert (st["epoch_oldest"], st["epoch_current"]) == (None, None)
    assert st["extra"] == []


def test_status_parser_cache_failed():
    """Field 23: the failed state; None from a module that prints 22."""
    assert tclib.parse_status(DOC_EXAMPLE[:-2] + " -5")["cache_failed"] == -5
    st = tclib.parse_status(DOC_EXAMPLE.rsplit(" ", 1)[0])
    assert st["cache_failed"] is None and st["meta_error"] == 0
    st = tclib.parse_status(DOC_EXAMPLE + " 7 9 x")
    assert st["cache_failed"] == 0 and st["extra"] == ["x"]


def test_status_parser_epochs():
    """Fields 24-25: the oldest epoch with dirty blocks and the current
    one, both or neither; None from a module that prints 23."""
    st = tclib.parse_status(DOC_EXAMPLE + " 17 19")
    assert (st["epoch_oldest"], st["epoch_current"]) == (17, 19)
    assert st["cache_failed"] == 0 and st["extra"] == []
    st = tclib.parse_status(DOC_EXAMPLE[:-2] + " -5 19 19")
    assert (st["cache_failed"], st["epoch_oldest"], st["epoch_current"]) == (-5, 19, 19)
    st = tclib.parse_status(DOC_EXAMPLE + " 0 18446744073709551615 future")
    assert st["epoch_current"] == 2 ** 64 - 1 and st["extra"] == ["future"]
    st = tclib.parse_status(DOC_EXAMPLE)
    assert (st["epoch_oldest"], st["epoch_current"]) == (None, None)
    st = tclib.parse_status(DOC_EXAMPLE.rsplit(" ", 1)[0])
    assert (st["cache_failed"], st["epoch_oldest"]) == (None, None)


@pytest.mark.parametrize("line", [
    DOC_EXAMPLE.rsplit(" ", 2)[0],                       # a required field short
    DOC_EXAMPLE.replace("writeback", "writebehind"),     # bad mode
    DOC_EXAMPLE.replace("256.00", "256"),                # merge ratio decimals
    DOC_EXAMPLE.replace(" idle ", " busy "),             # bad flush state
    DOC_EXAMPLE.replace("8192/131072", "8192"),          # used/total
    DOC_EXAMPLE[:-4] + " 5 0",                           # meta_error not an errno
    DOC_EXAMPLE[:-2] + " 5",                             # cache_failed not an errno
    DOC_EXAMPLE + " 17",                                 # epoch_oldest alone
    DOC_EXAMPLE + " 20 19",                              # oldest after current
    DOC_EXAMPLE + " -1 19",                              # not unsigned
    DOC_EXAMPLE + " 17 1.0",                             # not a number
], ids=["short", "mode", "ratio", "state", "used", "meta_error", "cache_failed",
        "epoch_alone", "epoch_order", "epoch_sign", "epoch_number"])
def test_status_parser_rejects(line):
    with pytest.raises(tclib.StatusError):
        tclib.parse_status(line)


def test_model_detects_corruption(stack):
    dev = stack.ram(4 * MiB)
    m = tclib.seeded_origin(dev, seed=3)
    m.verify_device(dev)
    tclib.write_direct(dev, 1 * MiB + 4096, b"\xa5" * 512)
    with pytest.raises(AssertionError, match=r"offset 1052672 .*sector 2056"):
        m.verify_device(dev)


def test_seeded_pattern_is_the_generators():
    """A model's pattern, made once per (size, seed), is what the seeded
    generator gives, its generator then goes on where it would have, and a
    model's changes do not reach the next model of the same seed."""
    rng = random.Random(21)
    want = rng.randbytes(MiB)
    want_next = rng.random()
    for _ in range(2):
        m = tclib.Model(MiB, seed=21)
        assert bytes(m.data) == want
        assert m.rng.random() == want_next
        m.data[:4096] = b"\x00" * 4096


def test_model_workload_on_linear(stack):
    """The seeded workload (all request kinds) verifies through dm-linear."""
    origin = stack.ram(32 * MiB)
    m = tclib.seeded_origin(origin, seed=11)
    lin = stack.linear(origin)
    with tclib.Workload(lin.path, m, seed=12) as wl:
        wl.run(150)
        print(wl.summary())
    kinds = {k for k, *_ in wl.log}
    assert kinds == {"read-direct", "write-direct", "read-buffered", "write-buffered"}
    m.verify_device(lin.path)
    m.verify_buffered(lin.path)
    lin.remove()
    m.verify_device(origin, what="origin after removing dm-linear")


def test_fio_verify_only_on_linear(stack):
    origin = stack.ram(32 * MiB)
    lin = stack.linear(origin)
    job = ["--name=h", "--ioengine=libaio", "--direct=1", "--iodepth=8",
           "--rw=randwrite", "--bs=4k", "--size=8M", "--verify=crc32c"]
    tclib.fio(job + [f"--filename={lin.path}"])
    lin.remove()
    tclib.fio(job + [f"--filename={origin}", "--verify_only"])
    tclib.write_direct(origin, 4 * MiB, b"\x00" * 4096)
    p = tclib.fio(job + [f"--filename={origin}", "--verify_only"], check=False)
    assert p.returncode != 0 and "verify" in p.stdout + p.stderr


def test_dm_delay_stat_oracle(stack):
    """dm-delay counts one write per bio; empty flushes are not writes."""
    slow = stack.slow(16 * MiB, read_ms=0, write_ms=5)
    before = slow.stat()
    tclib.write_direct(slow.path, 0, b"\x11" * MiB)
    fd = os.open(slow.path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    tclib.write_direct(slow.path, 2 * MiB, b"\x22" * 4096)
    d = tclib.stat_delta(slow.stat(), before)
    assert (d["writes"], d["write_sectors"]) == (2, 2048 + 8), d


def test_nullb_discard_zeroes(stack):
    nb = stack.nullb(16)
    assert int(tclib.sysfs_queue(nb, "discard_max_bytes")) > 0
    tclib.write_direct(nb, 0, b"\x5a" * MiB)
    before = tclib.block_stat(nb)
    tclib.discard(nb, 0, 256 * KiB)
    d = tclib.stat_delta_when(nb, before, lambda d: d["discard_sectors"] >= 512)
    assert d["discards"] >= 1 and d["discard_sectors"] == 512, d
    assert tclib.read_direct(nb, 0, 256 * KiB) == b"\0" * (256 * KiB)
    assert tclib.read_direct(nb, 256 * KiB, 4096) == b"\x5a" * 4096


def test_flakey_error_writes(stack):
    """The origin-failure fixture: flakey with error_writes fails writes only."""
    ram = stack.ram(8 * MiB)
    dev = stack.dm("tc-flakey", stack.flakey_table(ram))
    tclib.write_direct(dev.path, 0, b"\x33" * 4096)
    dev.suspend()
    dev.reload(stack.flakey_table(ram, up=0, down=3600, features=["error_writes"]))
    with pytest.raises(OSError):
        tclib.write_direct(dev.path, 4096, b"\x44" * 4096)
    assert tclib.read_direct(dev.path, 0, 4096) == b"\x33" * 4096
    dev.suspend()
    dev.reload(stack.flakey_table(ram))
    tclib.write_direct(dev.path, 4096, b"\x44" * 4096)


def test_bad_table_reporting_on_linear(stack):
    """Kernel log capture for a refused table (used by test_20_badtable)."""
    ram = stack.ram(8 * MiB)
    cur = tclib.KmsgCursor("linear-bad")
    p = tclib.run(["dmsetup", "create", "tc-bad", "--table",
                   f"0 16 linear {ram} 8x"], check=False)
    assert p.returncode != 0
    msgs = [ln for ln in cur.lines() if "device-mapper: table:" in ln]
    assert any("linear: Invalid device sector" in ln for ln in msgs), cur.lines()
    assert "tc-bad" not in tclib.dm_names()


# A run of two tests (conftest.py as a plugin): the first leaves a direct
# read of a suspended device in state D, the second must not run.
STUCK_TESTS = """
import os, subprocess, time
from pathlib import Path
import tclib

def test_leaves_a_reader_stuck():
    p = subprocess.Popen(["dd", "if=" + os.environ["TC_STUCK_DEV"], "of=/dev/null",
                          "bs=4096", "count=1", "iflag=direct"])
    Path(os.environ["TC_STUCK_PID"]).write_text(str(p.pid))
    end = time.monotonic() + 60
    while p.pid not in tclib.blocked_tasks():
        assert p.poll() is None and time.monotonic() < end, "dd did not block"
        time.sleep(0.2)

def test_after_the_stuck_one():
    Path(os.environ["TC_STUCK_RAN"]).write_text("ran")
"""

SLOW_TESTS = """
import time

def test_sleeps():
    time.sleep(120)

def test_after_the_slow_one():
    pass
"""


def inner_pytest(tmp_path, source, plugin=None, **env):
    """Run the tests of @source under conftest.py (as a plugin) in a pytest
    of their own, with @env added: the CompletedProcess.  @plugin: the
    source of one more plugin, loaded after conftest.py."""
    (tmp_path / "test_inner.py").write_text(source)
    more = []
    if plugin:
        (tmp_path / "innerplugin.py").write_text(plugin)
        more = ["-p", "innerplugin"]
    path = f"{Path(tclib.__file__).parent}:{tmp_path}"
    env = dict(os.environ, PYTHONPATH=path, **env)
    # the outer run's skip list and results dir (its stop file) are not
    # the inner run's
    env.pop("TC_SKIP_IDS_FILE", None)
    env.pop("TC_RESULTS", None)
    # the inner run's clean slate must leave the outer test's devices alone
    env["TC_KEEP_DM"] = " ".join(tclib.dm_names())
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", *more, "-q",
                        "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                        str(tmp_path / "test_inner.py")],
                       env=env, cwd=tmp_path, capture_output=True, text=True,
                       timeout=600)
    print(p.stdout + p.stderr)
    return p


def test_a_test_over_its_time_limit_fails_and_the_run_goes_on(tmp_path):
    """TC_TEST_TIMEOUT: a test past it fails, the next one runs."""
    t0 = time.monotonic()
    p = inner_pytest(tmp_path, SLOW_TESTS, TC_TEST_TIMEOUT="3", TC_HANG_SYSRQ="0")
    out = p.stdout + p.stderr
    assert "still running after TC_TEST_TIMEOUT=3s" in out
    assert "1 failed, 1 passed" in out
    assert time.monotonic() - t0 < 100, "the sleeping test was not cut short"


# a report hook that outlasts the test's time limit
SLOW_REPORT = """
import time

def pytest_runtest_logreport(report):
    if report.when == "call" and report.nodeid.endswith("test_quick"):
        time.sleep(5)
"""


def test_a_time_limit_never_fires_in_a_report_hook(tmp_path):
    """TC_TEST_TIMEOUT past its deadline between phases (in a report hook)
    neither breaks pytest (INTERNALERROR) nor keeps the test's teardown
    from running."""
    src = "def test_quick():\n    pass\n\ndef test_next():\n    pass\n"
    p = inner_pytest(tmp_path, src, plugin=SLOW_REPORT, TC_TEST_TIMEOUT="3",
                     TC_HANG_SYSRQ="0")
    out = p.stdout + p.stderr
    assert "INTERNALERROR" not in out
    assert "2 passed" in out and "error" not in out


def test_blocked_tasks_sees_a_read_of_a_suspended_device(stack):
    """tclib.stuck_tasks(): a direct read of a suspended dm device is in
    state D until the resume, then it is not."""
    lin = stack.linear(stack.ram(4 * MiB))
    lin.suspend()
    try:
        p = subprocess.Popen(["dd", f"if={lin.path}", "of=/dev/null", "bs=4096",
                              "count=1", "iflag=direct"])
        end = time.monotonic() + 60
        while p.pid not in tclib.blocked_tasks():
            assert p.poll() is None and time.monotonic() < end, "dd did not block"
            time.sleep(0.2)
        assert tclib.stuck_tasks(patience=3).get(p.pid) == "dd"
    finally:
        lin.resume()
    assert p.wait(timeout=60) == 0
    assert p.pid not in tclib.stuck_tasks(patience=3)


def test_a_thread_stuck_in_the_kernel_ends_the_run(stack, tmp_path):
    """conftest.py's hang check: a test that leaves a thread in state D
    fails, and no test runs after it (each would wait out its commands'
    timeouts on the stuck device, until the run's limit)."""
    lin = stack.linear(stack.ram(4 * MiB))
    lin.suspend()
    try:
        p = inner_pytest(tmp_path, STUCK_TESTS, TC_STUCK_DEV=lin.path,
                         TC_STUCK_PID=str(tmp_path / "pid"),
                         TC_STUCK_RAN=str(tmp_path / "ran"), TC_STUCK_PATIENCE="3",
                         TC_HANG_SYSRQ="0")  # no stack traces in this run's log
    finally:
        lin.resume()
    out = p.stdout + p.stderr
    pid = int((tmp_path / "pid").read_text())
    # udev's worker probing the new device may be stuck beside dd
    m = re.search(r"threads stuck in the kernel after "
                  r"test_inner.py::test_leaves_a_reader_stuck: (\{.*?\}); "
                  r"the run ends here", out)
    assert m and f"{pid}: 'dd'" in m.group(1)
    assert p.returncode != 0
    assert not (tmp_path / "ran").exists(), "a test ran after the stuck one"
