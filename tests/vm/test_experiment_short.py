# SPDX-License-Identifier: GPL-2.0
"""A short flush-linearisation experiment (scripts/flushbench.py) in the VM.

Small sizes and a short delay: 4 MiB of 4 KiB random writes over 16 MiB of a
16 MiB slow disk, no fio cap, on the dm-delay model (TC_SHORT_MODELS=delay,hdd,
passed with TC_GUEST_ENV, adds the HDD model: `make experiment` runs both, and
test_scripts.py builds the HDD stacks).  Every system must
produce numbers, the slow disk must match the cached device after each
flush, and tiercache (bridging on) must send the slow disk no more write
requests than any peer.  Open CAS takes part when scripts/opencas.sh has
built it for this kernel (its tests skip otherwise).  Then the seed's fio
cap: a system that cannot take its data in time is reported with what it
wrote.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest

import tclib
from test_scripts import opencas_build

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "scripts" / "flushbench.py"
SYSTEMS = ["bare", "tiercache-b0", "tiercache-b64", "dm-writecache", "dm-cache", "bcache", "opencas"]
PEERS = ["dm-writecache", "dm-cache", "bcache", "opencas"]
MODELS = os.environ.get("TC_SHORT_MODELS", "delay").split(",")
OPENCAS = opencas_build()


def run_bench(out, *args):
    cmd = ["/usr/bin/python3", str(BENCH), "run", "--out", str(out), *args]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=900)
    print(p.stdout)
    return p


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tclib.ensure_module()
    out = tmp_path_factory.mktemp("experiment")
    systems = "bare,tiercache,dm-writecache,dm-cache,bcache" + (",opencas" if OPENCAS else "")
    cmd = ["--tag", "short", "--systems", systems, "--tc-bridges", "0,64", "--fio-runtime", "0",
           "--models", ",".join(MODELS), "--cases", "short:16:64:4:16",
           "--delay-ms", "5", "--hdd-nsec", "1000000", "--hdd-mbps", "0",
           "--bare-runtime", "2", "--bcache-writeback-delay", "0", "--progress", "10",
           "--flush-timeout", "120", "--fio-timeout", "240"]
    if OPENCAS:
        cmd += ["--opencas-dir", OPENCAS]
    p = run_bench(out, *cmd)
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
    if system == "opencas" and not OPENCAS:
        pytest.skip("Open CAS not built for this kernel (scripts/opencas.sh build)")
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
    # no cap: all of it was written
    assert r["fio_cap_s"] is None and r["absorbed_pct"] >= 99.9


@pytest.mark.parametrize("model", MODELS)
def test_tiercache_fewest_origin_requests(results, model):
    rows = results["rows"]
    tc = rows[(model, "tiercache-b64")]
    for peer in PEERS:
        if peer == "opencas" and not OPENCAS:
            continue
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
        assert s in p.stdout or (s == "opencas" and not OPENCAS)
    for f in ("results.json", "results.csv", "tables.txt", "tables.md"):
        assert (results["out"] / f).stat().st_size > 0
    header = (results["out"] / "results.csv").read_text().splitlines()[0]
    assert header.startswith("model,case,system,")


def test_fio_cap_reports_what_was_written(tmp_path):
    """The seed's recipe caps fio (--fio-runtime, not time-based): dm-cache
    on a 200 ms disk writes only part of 4 MiB in 2 s, and the record and
    the table say how much."""
    tclib.ensure_module()
    p = run_bench(tmp_path, "--tag", "cap", "--systems", "dm-cache", "--models", "delay",
                  "--cases", "cap:16:64:4:16", "--delay-ms", "200", "--fio-runtime", "2",
                  "--flush-timeout", "120", "--fio-timeout", "120", "--progress", "10")
    assert p.returncode == 0, p.stdout[-3000:]
    r = json.loads((tmp_path / "cap.json").read_text())["records"][0]
    assert r["error"] is None and r["check"] == "ok"
    assert r["fio_cap_s"] == 2 and r["intended_mib"] == 4
    assert r["fio_seconds"] <= 3.5
    assert 0 < r["absorbed_pct"] < 90, r
    assert r["absorbed_mib"] == round(r["fio_bytes"] / (1 << 20), 2)
    # the flush covered what was written: the slow disk got at least that
    assert r["origin_sectors"] >= r["fio_bytes"] // 512
    assert f"dm-cache wrote only {r['absorbed_mib']:g} of 4 MiB" in p.stdout
    assert "step 1/1 steps" in p.stdout and "ETA" in p.stdout
