# SPDX-License-Identifier: GPL-2.0
"""pytest fixtures for the in-VM tests (run by tests/vm/inside.sh)."""

import os
import signal
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kernlog  # noqa: E402
import tclib  # noqa: E402


# xfstests' generic list takes an hour under emulation: `make test-xfstests`
# (tests/xfstests/run.sh, TC_XFSTESTS=1) only
if os.environ.get("TC_XFSTESTS") != "1":
    collect_ignore_glob = ["test_xfstests.py"]

# a hung test asks the kernel for its blocked tasks (TC_HANG_SYSRQ=0: not,
# for test_00_harness's runs of a hang on purpose: no stack in the log)
HANG_SYSRQ = os.environ.get("TC_HANG_SYSRQ", "1") == "1"


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "module: needs dm-tiercache.ko (tests use the tc_module fixture, "
        "which fails, never skips, when the module is missing)")
    if os.geteuid() != 0:
        raise pytest.UsageError("the in-VM tests must run as root inside the test VM")


def pytest_collection_modifyitems(config, items):
    """TC_SKIP_IDS_FILE: a file of test ids (one per line) not to run.  The
    debug lane's ledger (tests/debug/run.sh, TC_DEBUG_RESUME=1) names the
    tests that already passed on the same module and kernel with a clean
    debug report, so a list that takes longer than one sitting is run in
    parts."""
    path = os.environ.get("TC_SKIP_IDS_FILE")
    if not path:
        return
    done = {ln.strip() for ln in Path(path).read_text().splitlines() if ln.strip()}
    keep = [it for it in items if it.nodeid not in done]
    if len(keep) < len(items):
        config.hook.pytest_deselected(items=[it for it in items if it.nodeid in done])
        items[:] = keep


@pytest.fixture(autouse=True)
def kernel_log_guard(request):
    """Per test: clean dm slate before; kernel log scan and hang check after.

    A test that makes the kernel print an oops, BUG, WARNING, hung task or
    Call Trace fails, with the lines in the message.

    A test that leaves a thread in state D for TC_STUCK_PATIENCE seconds
    (default 30; its IO or dm ioctl never completes) fails and ends the
    run, with the kernel's list of blocked tasks (sysrq w) in its log:
    every later test would meet the same stuck device and each of its
    commands would wait out its own timeout, until the run's limit.
    """
    left = [n for n in tclib.dm_names() if n not in tclib.KEEP]
    if left:
        tclib.log(f"removing dm devices left behind by an earlier test: {left}")
        for n in left:
            tclib.run(["dmsetup", "remove", "--force", n], check=False)
    cur = tclib.KmsgCursor(f"START {request.node.nodeid}")
    yield
    tclib.kmsg(f"END {request.node.nodeid}")
    problems = []
    bad = kernlog.bad_lines(cur.lines())
    if bad:
        problems.append("kernel log during this test:\n" + "\n".join(bad[:60]))
    stuck = tclib.stuck_tasks(float(os.environ.get("TC_STUCK_PATIENCE", "30")))
    if stuck:
        if HANG_SYSRQ:
            tclib.sysrq("w")
        why = f"threads stuck in the kernel after {request.node.nodeid}: {stuck}"
        tclib.kmsg(f"{why}; the run ends here (blocked tasks above)")
        request.session.shouldstop = why
        problems.append(why + "; the run ends here (sysrq w: blocked tasks in the "
                        "kernel log)")
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


@pytest.fixture
def stack():
    s = tclib.Stack()
    yield s
    errors = s.close()
    left = [n for n in tclib.dm_names() if n not in tclib.KEEP]
    if errors or left:
        pytest.fail(f"teardown problems: {errors}; dm devices left: {left}",
                    pytrace=False)


@pytest.fixture(scope="module")
def module_stack():
    """A Stack shared by the tests of one file (devices kept between tests)."""
    s = tclib.Stack(prefix="tcm", keep=True)
    yield s
    errors = s.close()
    if errors:
        pytest.fail(f"module teardown problems: {errors}", pytrace=False)


@pytest.fixture
def tc_module():
    """dm-tiercache loaded.  Missing or unloadable module: the test FAILS."""
    tclib.ensure_module()
    yield



TEST_TIMEOUT = float(os.environ.get("TC_TEST_TIMEOUT", "0") or 0)
TEARDOWN_GRACE = 60


def _timed_phase(item, when):
    """TC_TEST_TIMEOUT=N (seconds, 0 or unset: none): a test whose setup,
    call and teardown take longer fails, with the kernel's blocked tasks
    and every CPU's stack (sysrq w, l) in its log, and the run goes on.
    The timer runs only inside a phase, where pytest turns the failure
    into the phase's report; between phases (report hooks) it is off.  A
    call that starts past the deadline fails at once; a teardown always
    runs, with at least TEARDOWN_GRACE seconds (its fixtures must undo
    what the test built, or the next test's setup fails).  A test blocked
    in a process of its own that waits interruptibly (a command, a sleep,
    a poll) is caught; one whose own thread is stuck in the kernel is not
    (the hang check after it, and inside.sh's PYTEST_TIMEOUT, are the last
    resort)."""
    if TEST_TIMEOUT <= 0:
        yield
        return
    if when == "setup":
        item.tc_deadline = time.monotonic() + TEST_TIMEOUT
    deadline = getattr(item, "tc_deadline", time.monotonic() + TEST_TIMEOUT)

    def expired(signum=None, frame=None):
        signal.setitimer(signal.ITIMER_REAL, 0)
        tclib.kmsg(f"{item.nodeid} still running after "
                   f"TC_TEST_TIMEOUT={TEST_TIMEOUT:g}s")
        for key in ("w", "l") if HANG_SYSRQ else ():
            tclib.sysrq(key)
        pytest.fail(f"still running after TC_TEST_TIMEOUT={TEST_TIMEOUT:g}s "
                    "(sysrq w and l in the kernel log)", pytrace=False)

    left = deadline - time.monotonic()
    if when == "teardown":
        left = max(left, min(TEST_TIMEOUT, TEARDOWN_GRACE))
    elif left <= 0:
        expired()
    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, left)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    yield from _timed_phase(item, "setup")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield from _timed_phase(item, "call")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    stop_file_check(item, nextitem)
    yield from _timed_phase(item, "teardown")


def pytest_runtest_logreport(report):
    """A failure's reason in the kernel log at once (results/*/dmesg-live.txt
    shows it while the run goes on; pytest prints it only at the end)."""
    if report.failed:
        for line in report.longreprtext.splitlines()[-12:]:
            tclib.kmsg(f"FAILED {report.nodeid} ({report.when}): {line[:400]}")


def stop_file_check(item, nextitem):
    """A file named `stop` in the results dir (created from the host) ends
    the run after the test in progress, as if it were the last one: what
    inside.sh does after pytest (the module unload, the debug kernel's
    kmemleak scan) still runs."""
    res = os.environ.get("TC_RESULTS")
    if nextitem is not None and res and os.path.exists(os.path.join(res, "stop")):
        item.session.shouldstop = "stop file in the results dir"
        tclib.kmsg(f"stop file: ending the run after {item.nodeid}")
