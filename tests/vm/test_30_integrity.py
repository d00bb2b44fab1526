# SPDX-License-Identifier: GPL-2.0
"""Data integrity against a model, in every mode, then on the origin after
flush + remove; fio crc32c verification through the cache and again on the
origin."""

import zlib

import pytest

import tclib
from tclib import MiB

pytestmark = [pytest.mark.module, pytest.mark.usefixtures("tc_module")]


# background writeback off unless asked for, so dirty data is read back
NO_BG = {"high_watermark": 100, "low_watermark": 90}


@pytest.mark.parametrize("mode,block,cache_mib,keys", [
    ("writeback", 8, 32, NO_BG),      # cache holds the working set
    ("writeback", 128, 32, NO_BG),    # 64 KiB blocks: many partial-block requests
    ("writeback", 8, 1, {}),          # 256 slots: eviction, write-around, background writeback
    ("writethrough", 8, 16, {}),
    ("passthrough", 8, 16, {}),
], ids=["wb-4k", "wb-64k", "wb-4k-tinycache", "wt-4k", "pt-4k"])
def test_model_integrity(stack, mode, block, cache_mib, keys):
    seed = zlib.crc32(f"{mode}-{block}-{cache_mib}".encode()) & 0xffff
    s = stack.setup(origin_mib=64, cache_mib=cache_mib, block=block, mode=mode,
                    write_ms=1, seed=seed, keys=keys)
    tc, m = s.tc, s.model
    with tclib.Workload(tc.path, m, seed=seed + 1, block_bytes=block * 512) as wl:
        wl.run(220)
        print("phase 1:", wl.summary())
        st = tc.status()
        print(st["raw"])
        assert st["mode"] == mode
        if mode == "writeback" and keys:
            assert st["dirty"] > 0, f"writeback mode left nothing dirty: {st['raw']}"
        elif mode == "writeback":
            assert st["write_bypass"] > 0 and st["wb_blocks"] > 0, \
                f"tiny cache: expected write-around and background writeback: {st['raw']}"
        else:
            assert st["dirty"] == 0, f"{mode} created dirty blocks: {st['raw']}"
        if mode == "passthrough":
            assert st["used"] == 0, f"passthrough populated the cache: {st['raw']}"
        assert st["used"] <= st["total"] and st["dirty"] <= st["used"]
        m.verify_device(tc.path, what=f"{mode}: read back through the cache")
        m.verify_buffered(tc.path, what=f"{mode}: buffered read back through the cache")
        # second phase on top of a populated cache (hits, rewrites)
        wl.run(120, read_frac=0.35)
        print("phase 2:", wl.summary())
    m.verify_device(tc.path, what=f"{mode}: read back after phase 2")
    st = tc.flush()
    print("after flush:", st["raw"])
    m.verify_device(tc.path, what=f"{mode}: read back after flush")
    tc.remove()
    m.verify_device(s.origin.path, what=f"{mode}: origin after flush and remove")


def test_sequential_streams_integrity(stack):
    """Long sequential aligned and unaligned streams (readahead, large bios)."""
    s = stack.setup(origin_mib=64, cache_mib=16, block=16, write_ms=1, seed=21)
    tc, m = s.tc, s.model
    with tclib.Workload(tc.path, m, seed=22, block_bytes=8192) as wl:
        wl.run(150, read_frac=0.3, seq_frac=1.0, unaligned_frac=0.4)
    m.verify_device(tc.path)
    m.verify_buffered(tc.path, nreads=32)
    tc.flush()
    tc.remove()
    m.verify_device(s.origin.path, what="origin after flush and remove")


FIO_COMMON = ["--ioengine=libaio", "--direct=1", "--iodepth=8", "--verify=crc32c",
              "--randseed=4242", "--verify_fatal=1"]


@pytest.mark.parametrize("variant,blocks", [
    ("4k", ["--bs=4k"]),
    ("mixed", ["--bssplit=512/10:4k/35:16k/20:64k/15:256k/12:1m/8"]),
])
def test_fio_verify(stack, variant, blocks):
    s = stack.setup(origin_mib=96, cache_mib=32, block=8, write_ms=1)
    tc = s.tc
    job = [f"--name=tc-{variant}", "--rw=randwrite", "--size=64M"] + blocks + FIO_COMMON
    tclib.fio(job + [f"--filename={tc.path}"])
    st = tc.status()
    print(st["raw"])
    assert st["write_hits"] + st["write_misses"] > 0
    # verify again through the cache, without writing
    tclib.fio(job + [f"--filename={tc.path}", "--verify_only"])
    tc.flush()
    tc.remove()
    tclib.fio(job + [f"--filename={s.origin.path}", "--verify_only"])
