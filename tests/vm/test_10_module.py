# SPDX-License-Identifier: GPL-2.0
"""Module, table line, status fields, counters and messages
(docs/tiercache.rst: Constructor, Status, Messages)."""

import time

import pytest

import tclib
from tclib import MiB, devno, size_sectors

pytestmark = [pytest.mark.module, pytest.mark.usefixtures("tc_module")]

ZERO_FIELDS = ["read_hits", "read_misses", "write_hits", "write_misses",
               "write_bypass", "wb_blocks", "wb_requests", "wb_sectors",
               "avg_write_kb", "bridged_blocks", "inflight_max"]


def test_module_load_unload(stack):
    if tclib.module_loaded():
        tclib.unload_module()
    assert not tclib.module_loaded()
    tclib.ensure_module()
    targets = tclib.run(["dmsetup", "targets"]).stdout
    assert any(ln.split()[0] == "tiercache" for ln in targets.splitlines()), targets
    s = stack.setup(origin_mib=16, cache_mib=4)
    p = tclib.run(["rmmod", tclib.MODNAME], check=False)
    assert p.returncode != 0, "rmmod succeeded while a tiercache device exists"
    s.tc.remove()
    tclib.unload_module()
    assert not tclib.module_loaded()
    tclib.ensure_module()


@pytest.mark.parametrize("mode", [None, "writeback", "writethrough", "passthrough"])
def test_status_fresh_device(stack, mode):
    """A new device: documented fields, nothing written, nothing dirty.  udev
    probes a new disk as soon as it exists, so read counters must only
    match the reads the dm device itself completed."""
    origin = stack.slow(32 * MiB)
    cache = stack.ram(8 * MiB)
    tc = stack.tiercache(origin.path, cache, 8, mode)
    dev_reads = tclib.settle(tc.path)["reads"]
    st = tc.status()
    assert st["start"] == 0 and st["len"] == size_sectors(origin.path)
    assert st["mode"] == (mode or "writeback")
    assert st["block_size"] == 8
    assert st["total"] == tclib.tc_slots(size_sectors(cache), 8), st["raw"]
    assert st["dirty"] == 0, st["raw"]
    assert st["read_hits"] + st["read_misses"] == dev_reads, \
        f"read hits + misses != {dev_reads} reads completed by the device: {st['raw']}"
    # a read miss fills one slot, or a promotion run: up to 256 (TC_RUN_MAX)
    assert st["used"] <= 256 * st["read_misses"], st["raw"]
    if mode == "passthrough":
        assert st["used"] == 0 and st["read_hits"] == 0, st["raw"]
    for k in ZERO_FIELDS[2:]:
        assert st[k] == 0, f"{k} = {st[k]} on a fresh device: {st['raw']}"
    assert st["merge_ratio"] == 0.0 and st["raw"].split()[3 + 14] == "0.00"
    assert st["flush_state"] == "idle"
    assert (st["error"], st["flushes"], st["cleaner"]) == (0, 0, 0), st["raw"]


@pytest.mark.parametrize("mode", ["writeback", "writethrough", "passthrough"])
def test_one_bio_one_count(stack, mode):
    """Each 4 KiB bio is counted once: read_hits/read_misses, write_hits/
    write_misses (write_bypass in addition for passthrough writes)."""
    s = stack.setup(origin_mib=16, cache_mib=4, mode=mode, seed=3)
    tc, m = s.tc, s.model
    with tclib.Workload(tc.path, m, seed=4) as wl:
        for i, b in enumerate([2100, 2100, 2200, 2200, 2300]):
            st0 = tc.status()
            d0 = tc.stat()
            if i in (0, 1, 4):
                wl.read_check(b * 4096, 4096, direct=True)
                st = _wait_idle_promotion(tc)
                n = st["read_hits"] + st["read_misses"] - st0["read_hits"] - st0["read_misses"]
                assert n == 1, f"one 4 KiB read counted {n} times: {st0['raw']} -> {st['raw']}"
                assert tc.stat()["reads"] - d0["reads"] == 1
            else:
                wl.write_direct(b * 4096, 4096)
                st = tc.status()
                n = st["write_hits"] + st["write_misses"] - st0["write_hits"] - st0["write_misses"]
                assert n == 1, f"one 4 KiB write counted {n} times: {st0['raw']} -> {st['raw']}"
                nb = st["write_bypass"] - st0["write_bypass"]
                if mode != "writethrough":   # a writethrough miss may or may not count
                    assert nb == (1 if mode == "passthrough" else 0), \
                        f"write_bypass +{nb} for one {mode} write: {st0['raw']} -> {st['raw']}"
    m.verify_device(tc.path)


def _wait_idle_promotion(tc, timeout=5):
    """Status once used/read counters stop moving (async promotion)."""
    deadline = time.monotonic() + timeout
    prev = tc.status()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        st = tc.status()
        if st["used"] == prev["used"]:
            return st
        prev = st
    return prev


@pytest.mark.parametrize("block,cache_mib,feat", [
    (8, 8, []),
    (8, 8, ["writethrough"]),
    (8, 8, ["writeback", "bridge_gap_kb", "64"]),
    (8, 8, ["flush_depth", "1"]),
    (64, 8, ["passthrough", "flush_depth", "16", "max_flush_kb", "512",
             "high_watermark", "80", "low_watermark", "5", "flush_on_suspend", "1"]),
    (2048, 32, ["writeback", "bridge_gap_kb", "0", "max_flush_kb", "16384"]),
    (8, 8, ["low_watermark", "0", "high_watermark", "100", "bridge_gap_kb", "4"]),
], ids=lambda v: str(v).replace(" ", ""))
def test_table_reemits_given_line(stack, block, cache_mib, feat):
    """dmsetup table re-emits the line (devices as major:minor); keys only
    if given.  Key order is not specified, so key/value pairs compare as a set."""
    origin = stack.slow(64 * MiB)
    cache = stack.ram(cache_mib * MiB)
    n = size_sectors(origin.path)
    # "format" makes a new cache and is not re-emitted
    line = f"0 {n} tiercache {origin.path} {cache} {block} {len(feat) + 1} format {' '.join(feat)}".strip()
    tc = stack.dm("tc-table", line, cls=tclib.TierCache)
    got = tc.table_line().split()
    want = f"0 {n} tiercache {devno(origin.path)} {devno(cache)} {block} {len(feat)}".split()
    assert got[:7] == want, f"table {' '.join(got)!r}, given {line!r}"
    words = got[7:]
    assert len(words) == len(feat), f"table {' '.join(got)!r}, given {line!r}"
    mode = [w for w in feat if w in tclib.MODES]
    if mode:
        assert words[0] == mode[0], f"mode word: table {' '.join(got)!r}"
        words, rest = words[1:], [w for w in feat if w not in tclib.MODES]
    else:
        rest = feat
    pairs = lambda ws: sorted(zip(ws[0::2], ws[1::2]))
    assert pairs(words) == pairs(rest), f"table {' '.join(got)!r}, given {line!r}"
    # reloading the re-emitted line gives the same table
    tc.reload(" ".join(got))
    assert tc.table_line().split() == got


def _wait_used(tc, n, timeout=10):
    deadline = time.monotonic() + timeout
    while True:
        st = tc.status()
        if st["used"] >= n or time.monotonic() > deadline:
            return st
        time.sleep(0.05)


def test_counters_and_stats_reset(stack):
    s = stack.setup(origin_mib=32, cache_mib=8, seed=5)
    tc, m = s.tc, s.model
    B = 4096
    # the counters are the device's: udev's probe of the new device must be
    # over (on the debug kernel its reads paused longer than setup's 0.3 s
    # and 73 of them were counted as this test's hits)
    tclib.settle(tc.path, quiet_s=2.0)

    def st_delta(before):
        after = tc.status()
        return after, {k: after[k] - before[k] for k in
                       ("read_hits", "read_misses", "write_hits", "write_misses",
                        "write_bypass", "used", "dirty")}

    with tclib.Workload(tc.path, m, seed=6) as wl:
        # whole-block read miss: counted, then promoted
        st0 = tc.status()
        wl.read_check(3010 * B, B, direct=True)
        st, d = st_delta(st0)
        assert d["read_misses"] == 1 and d["read_hits"] == 0, st["raw"]
        st = _wait_used(tc, st0["used"] + 1)
        assert st["used"] == st0["used"] + 1, f"whole-block read miss not promoted: {st['raw']}"
        # the same block again: a hit
        st0 = st
        wl.read_check(3010 * B, B, direct=True)
        st, d = st_delta(st0)
        assert d["read_hits"] == 1 and d["read_misses"] == 0, st["raw"]
        # whole-block write miss: lands in the cache, dirty, origin untouched
        o0 = s.origin.stat()
        st0 = st
        wl.write_direct(3020 * B, B)
        st, d = st_delta(st0)
        assert d["write_misses"] == 1 and d["write_hits"] == 0, st["raw"]
        assert d["dirty"] == 1 and d["used"] == 1, st["raw"]
        # rewrite it: a hit, still one dirty block
        st0 = st
        wl.write_direct(3020 * B, B)
        st, d = st_delta(st0)
        assert d["write_hits"] == 1 and d["write_misses"] == 0 and d["dirty"] == 0, st["raw"]
        assert tclib.stat_delta(s.origin.stat(), o0)["writes"] == 0, \
            "writeback-mode writes with free slots reached the origin"
        # partial-block write miss: goes around the cache
        st0 = st
        wl.write_direct(3030 * B + 1024, 512)
        st, d = st_delta(st0)
        assert d["write_bypass"] == 1, f"partial-block write miss: {st['raw']}"
        assert d["dirty"] == 0 and d["used"] == 0, st["raw"]
        # partial-block write to the cached clean block: a hit, now dirty
        st0 = st
        wl.write_direct(3010 * B + 512, 1024)
        st, d = st_delta(st0)
        assert d["write_hits"] == 1 and d["dirty"] == 1 and d["write_bypass"] == 0, st["raw"]
    m.verify_device(tc.path)

    before = tc.status()
    tc.message("stats", "reset")
    st = tc.status()
    for k in ["read_hits", "read_misses", "write_hits", "write_misses", "write_bypass",
              "wb_blocks", "wb_requests", "wb_sectors", "avg_write_kb",
              "bridged_blocks", "inflight_max"]:
        assert st[k] == 0, f"{k} not reset: {st['raw']}"
    assert st["merge_ratio"] == 0.0
    for k in ("mode", "block_size", "used", "total", "dirty", "flushes", "error", "cleaner"):
        assert st[k] == before[k], f"stats reset changed {k}: {before['raw']} -> {st['raw']}"
    tc.flush()
    m.verify_device(tc.path)


def test_set_messages(stack):
    s = stack.setup(origin_mib=32, cache_mib=8, keys={"bridge_gap_kb": 8})
    tc = s.tc
    for k, v in [("flush_depth", 64), ("max_flush_kb", 256), ("bridge_gap_kb", 16),
                 ("high_watermark", 70), ("low_watermark", 20), ("flush_on_suspend", 1)]:
        tc.message("set", k, v)
        words = tc.table_line().split()
        assert k in words and words[words.index(k) + 1] == str(v), \
            f"after set {k} {v}: table {' '.join(words)}"
    table = tc.table_line()
    for bad in [("set", "flush_depth", "0"), ("set", "flush_depth", "4097"),
                ("set", "flush_depth", "8x"), ("set", "high_watermark", "101"),
                ("set", "low_watermark", "80"),          # above high_watermark 70
                ("set", "max_flush_kb", "2"),            # below the block size
                ("set", "bridge_gap_kb", "512"),         # above max_flush_kb 256
                ("set", "flush_on_suspend", "2"), ("set", "nosuchkey", "1"),
                ("set", "flush_depth"), ("set",), ("bogus",), ("cleaner", "maybe"),
                ("cleaner",), ("stats",), ("stats", "bogus"), ("flush", "now")]:
        p = tc.message(*bad, check=False)
        assert p.returncode != 0, f"message {' '.join(bad)!r} accepted"
    assert tc.table_line() == table, "a refused message changed the table"
    st = tc.status()
    assert st["flush_state"] == "idle" and st["error"] == 0


def test_cleaner(stack):
    s = stack.setup(origin_mib=32, cache_mib=8, seed=9, write_ms=1)
    tc, m = s.tc, s.model
    with tclib.Workload(tc.path, m, seed=10) as wl:
        for i in range(100):
            wl.write_direct(i * 3 * 4096, 4096)
        assert tc.status()["dirty"] == 100
        tc.message("cleaner", "on")
        st = tc.status()
        assert st["cleaner"] == 1, st["raw"]
        deadline = time.monotonic() + 60
        while st["dirty"] and time.monotonic() < deadline:
            time.sleep(0.1)
            st = tc.status()
        assert st["dirty"] == 0, f"cleaner did not drain: {st['raw']}"
        # writes no longer create dirty blocks; the origin has the data
        for i in range(50):
            wl.write_direct(8 * MiB + i * 4096, 4096)
        wl.run(40, read_frac=0.3)
        st = tc.status()
        assert st["dirty"] == 0, f"write with cleaner on created dirty blocks: {st['raw']}"
        m.verify_device(s.origin.path, what="origin with cleaner on")
        m.verify_device(tc.path)
        tc.message("cleaner", "off")
        assert tc.status()["cleaner"] == 0
        wl.write_direct(16 * MiB, 4096)
        assert tc.status()["dirty"] == 1
    tc.flush()
    tc.remove()
    m.verify_device(s.origin.path)
