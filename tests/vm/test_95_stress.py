# SPDX-License-Identifier: GPL-2.0
"""The model-checked stress test (tests/vm/stress.py): IO threads against a
model while a control thread flushes, tunes, reloads, suspends and opens
fault windows on the origin and the cache device.

`make test` runs a short seeded run; `make soak` runs it for an hour.
Environment (passed into the VM by tests/run.sh):
  TC_STRESS_SECONDS  IO phase length (default 45)
  TC_STRESS_SEED     seed (default 1; `random` for a new one, printed);
                     a comma-separated list runs one after the other
  TC_STRESS_THREADS  IO threads (default 4)
  TC_STRESS_ARGS     more stress.py arguments (e.g. "--block 8 --no-pin")
A failure prints the seed and the stress.py command line that replays it.
"""

import os
import queue
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import tclib

pytestmark = [pytest.mark.module, pytest.mark.usefixtures("tc_module")]

HERE = Path(__file__).resolve().parent


def test_stress(capsys):
    seconds = float(os.environ.get("TC_STRESS_SECONDS", "45"))
    seeds = os.environ.get("TC_STRESS_SEED", "1").split(",")
    threads = os.environ.get("TC_STRESS_THREADS", "4")
    failed = []
    for seed in seeds:
        err = run_one(capsys, seconds, seed.strip(), threads)
        if err:
            failed.append(err)
    assert not failed, "\n".join(failed)


def run_one(capsys, seconds, seed, threads):
    cmd = [sys.executable, "-u", str(HERE / "stress.py"), "--seconds", str(seconds),
           "--threads", threads,
           "--progress", str(60 if seconds > 300 else 30)]
    if seed != "random":
        cmd += ["--seed", seed]
    cmd += shlex.split(os.environ.get("TC_STRESS_ARGS", ""))
    # the driver's own watchdog ends it on a hang (--deadline, default 120 s);
    # this is the last resort for a driver that cannot even exit
    limit = seconds + 1500
    tclib.log("$ " + shlex.join(cmd))
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, env=tclib.ENV, cwd=tclib.WORKDIR)
    lines = queue.Queue()

    def reader():
        for ln in p.stdout:
            lines.put(ln)
        lines.put(None)

    threading.Thread(target=reader, daemon=True).start()
    out = []
    deadline = time.monotonic() + limit
    with capsys.disabled():             # progress and counts in pytest.log
        while True:
            try:
                ln = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                p.kill()
                pytest.fail("stress.py did not end (threads stuck in the kernel?); "
                            "its last lines:\n" + "".join(out[-60:]), pytrace=False)
                return None
            if ln is None:
                break
            out.append(ln)
            print(ln, end="", flush=True)
            if ln.startswith(("VERDICT", "STRESS FAIL")):
                # A hang leaves threads in D state: the driver exits but its
                # pipe stays open.  Do not wait out `limit` for EOF.
                deadline = min(deadline, time.monotonic() + 60)
    try:
        rc = p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        rc = None
    text = "".join(out)
    verdict = [ln for ln in out if ln.startswith(("VERDICT", "STRESS FAIL", "replay:"))]
    if rc == 0 and "VERDICT: PASS" in text:
        return None
    return f"stress.py rc {rc}:\n" + "".join(verdict or out[-40:])
