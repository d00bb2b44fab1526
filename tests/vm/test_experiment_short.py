# SPDX-License-Identifier: GPL-2.0
"""A short flush-linearisation experiment (scripts/flushbench.py) in the VM.

Small sizes and a short delay: 4 MiB of 4 KiB random writes over 16 MiB of a
16 MiB slow disk, on both slow-disk models.  Every system must produce
numbers, the slow disk must match the cached device after each flush, and
tiercache (bridging on) must send the slow disk no more write requests than
any peer.
"""

import json
import subprocess
from pathlib import Path

import pytest

import tclib

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "scripts" / "flushbench.py"
SYSTEMS = ["bare", "tiercache-b0", "tiercache-b64", "dm-writecache", "dm-cache", "bcache"]
PEERS = ["dm-writecache", "dm-cache", "bcache"]
MODELS = ["delay", "hdd"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tclib.ensure_module()
    out = tmp_path_factory.mktemp("experiment")
    cmd = ["/usr/bin/python3", str(BENCH), "run", "--out", str(out), "--tag", "short",
           "--models", ",".join(MODELS), "--cases", "short:16:32:4:16",
           "--delay-ms", "20", "--hdd-nsec", "1000000", "--hdd-mbps", "0",
           "--bare-runtime", "2", "--bcache-writeback-delay", "0", "--progress", "10",
           "--flush-timeout", "120", "--fio-timeout", "240"]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=900)
    print(p.stdout)
    path = out / "short.json"
    assert path.exists(), f"no results written (exit {p.returncode}):\n{p.stdout[-3000:]}"
    data = json.loads(path.read_text())
    return {"rc": p.returncode, "log": p.stdout, "out": out, "data": data,
            "rows": {(r["model"], r["system"]): r for r in data["records"]}}


@pytest.fixture(autouse=True)
def module_loaded(tc_module):
    """The experiment needs dm-tiercache (fails, never skips, without it)."""


def test_run_completed(results):
    assert results["rc"] == 0, results["log"][-4000:]
    assert "finished" in results["data"]["meta"]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("system", SYSTEMS)
def test_every_system_has_numbers(results, model, system):
    r = results["rows"].get((model, system))
    assert r is not None, f"no result for {system} on {model}"
    assert r["error"] is None, r["error"]
    assert r["fio_iops"] > 0 and r["fio_ios"] > 0
    if system == "bare":
        assert r["origin_writes_fio"] > 0
        return
    assert r["fio_ios"] >= 1000     # 4 MiB in 4 KiB writes (1022 on bcache)
    assert r["flush_seconds"] is not None and r["flush_seconds"] > 0
    assert r["origin_writes"] > 0 and r["avg_write_kb"] >= 4
    # everything written reached the slow disk, and only once per block at most
    assert r["origin_sectors"] >= r["fio_bytes"] // 512
    assert r["check"] == "ok", r["check"]


@pytest.mark.parametrize("model", MODELS)
def test_tiercache_fewest_origin_requests(results, model):
    rows = results["rows"]
    tc = rows[(model, "tiercache-b64")]
    for peer in PEERS:
        p = rows[(model, peer)]
        assert tc["origin_writes"] <= p["origin_writes"], \
            f"{model}: tiercache-b64 {tc['origin_writes']} origin writes > {peer} {p['origin_writes']}"
    # without bridging it still merges every origin-adjacent run
    assert rows[(model, "tiercache-b0")]["origin_writes"] <= rows[(model, "dm-writecache")]["origin_writes"]
    assert tc["tc_error"] == "0" and int(tc["tc_wb_requests"]) > 0


def test_report(results):
    p = subprocess.run(["/usr/bin/python3", str(BENCH), "report", str(results["out"]), "--no-chart"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    for s in SYSTEMS:
        assert s in p.stdout
    for f in ("results.json", "results.csv", "tables.txt", "tables.md"):
        assert (results["out"] / f).stat().st_size > 0
    header = (results["out"] / "results.csv").read_text().splitlines()[0]
    assert header.startswith("model,case,system,")
