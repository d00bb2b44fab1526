# SPDX-License-Identifier: GPL-2.0
"""Every invalid table line is refused, and the kernel log line
`device-mapper: table: <dev>: tiercache: <message>` names the argument
(docs/tiercache.rst, Constructor).  Boundary values that are valid are
accepted.  Data driven: one row per case."""

import re

import pytest

import tclib
from tclib import MiB

pytestmark = [pytest.mark.module, pytest.mark.usefixtures("tc_module")]

# {O} origin (64 MiB), {C} cache (16 MiB), {S} cache of 15 blocks of 4 KiB,
# {C8} cache of 8 MiB (8 blocks of 1 MiB), {L} origin length in sectors.
# (id, table after "0 <len> tiercache ", regex the table message must match,
#  length override or None)
BAD = [
    ("no-args",            "",                                   r"argument", None),
    ("origin-only",        "{O}",                                r"argument", None),
    ("no-block-size",      "{O} {C}",                            r"argument", None),
    ("no-nr-features",     "{O} {C} 8",                          r"argument|feature", None),
    ("nr-features-low",    "{O} {C} 8 0 writeback",              r"feature", None),
    ("nr-features-high",   "{O} {C} 8 2 writeback",              r"feature", None),
    ("extra-word",         "{O} {C} 8 1 writeback extra",        r"feature", None),
    ("extra-word-nofeat",  "{O} {C} 8 0 extra",                  r"feature", None),
    ("nr-features-junk",   "{O} {C} 8 1x writeback",             r"feature", None),
    ("nr-features-neg",    "{O} {C} 8 -1",                       r"feature", None),
    ("nr-features-alpha",  "{O} {C} 8 one writeback",            r"feature", None),
    ("bs-8x",              "{O} {C} 8x 0",                       r"block size", None),
    ("bs-alpha",           "{O} {C} abc 0",                      r"block size", None),
    ("bs-12",              "{O} {C} 12 0",                       r"block size", None),
    ("bs-4",               "{O} {C} 4 0",                        r"block size", None),
    ("bs-0",               "{O} {C} 0 0",                        r"block size", None),
    ("bs-4096",            "{O} {C} 4096 0",                     r"block size", None),
    ("bs-neg",             "{O} {C} -8 0",                       r"block size", None),
    ("cache-15-blocks",    "{O} {S} 8 0",                        r"cache", None),
    ("cache-15-blocks-v4", "{O} {S15} 8 0",                      r"cache", None),
    ("cache-4-blocks-1M",  "{O} {C8} 2048 0",                    r"cache", None),
    ("origin-is-cache",    "{O} {O} 8 0",                        r"origin|cache", None),
    ("origin-missing",     "/dev/tc-nonexistent {C} 8 0",        r"origin", None),
    ("cache-missing",      "{O} /dev/tc-nonexistent 8 0",        r"cache", None),
    ("longer-than-origin", "{O} {C} 8 0",                        r"origin|length|target", "+8"),
    ("unknown-mode",       "{O} {C} 8 1 writearound",            r"mode|feature|writearound", None),
    ("mode-twice",         "{O} {C} 8 2 writeback writethrough", r"mode", None),
    ("unknown-key",        "{O} {C} 8 2 foo 1",                  r"key|feature|foo", None),
    ("unknown-key-mode",   "{O} {C} 8 3 writeback foo 1",        r"key|feature|foo", None),
    ("key-no-value",       "{O} {C} 8 1 flush_depth",            r"flush_depth", None),
    ("key-no-value-mode",  "{O} {C} 8 2 writeback flush_depth",  r"flush_depth", None),
    ("flush_depth-0",      "{O} {C} 8 2 flush_depth 0",          r"flush_depth", None),
    ("flush_depth-4097",   "{O} {C} 8 2 flush_depth 4097",       r"flush_depth", None),
    ("flush_depth-8x",     "{O} {C} 8 2 flush_depth 8x",         r"flush_depth", None),
    ("flush_depth-neg",    "{O} {C} 8 2 flush_depth -1",         r"flush_depth", None),
    ("flush_depth-alpha",  "{O} {C} 8 2 flush_depth many",       r"flush_depth", None),
    ("max_flush_kb-0",     "{O} {C} 8 2 max_flush_kb 0",         r"max_flush_kb", None),
    ("max_flush_kb-2",     "{O} {C} 8 2 max_flush_kb 2",         r"max_flush_kb", None),
    ("max_flush_kb<block", "{O} {C} 64 2 max_flush_kb 16",       r"max_flush_kb", None),
    ("max_flush_kb<1M-block", "{O} {C} 2048 2 max_flush_kb 1000", r"max_flush_kb", None),
    ("max_flush_kb-16385", "{O} {C} 8 2 max_flush_kb 16385",     r"max_flush_kb", None),
    ("max_flush_kb-junk",  "{O} {C} 8 2 max_flush_kb 64k",       r"max_flush_kb", None),
    ("bridge>max_flush",   "{O} {C} 8 4 max_flush_kb 64 bridge_gap_kb 128", r"bridge_gap_kb", None),
    ("bridge-junk",        "{O} {C} 8 2 bridge_gap_kb 4x",       r"bridge_gap_kb", None),
    ("high-0",             "{O} {C} 8 2 high_watermark 0",       r"high_watermark", None),
    ("high-101",           "{O} {C} 8 2 high_watermark 101",     r"high_watermark", None),
    ("low-101",            "{O} {C} 8 2 low_watermark 101",      r"low_watermark", None),
    ("low>high",           "{O} {C} 8 4 high_watermark 20 low_watermark 30", r"low_watermark|high_watermark", None),
    ("low>default-high",   "{O} {C} 8 2 low_watermark 60",       r"low_watermark|high_watermark", None),
    ("high<default-low",   "{O} {C} 8 2 high_watermark 5",       r"low_watermark|high_watermark", None),
    ("flush_on_suspend-2", "{O} {C} 8 2 flush_on_suspend 2",     r"flush_on_suspend", None),
    ("flush_on_suspend-y", "{O} {C} 8 2 flush_on_suspend yes",   r"flush_on_suspend", None),
    ("format-twice",       "{O} {C} 8 2 format format",          r"format", None),
    ("commit_ms-0",        "{O} {C} 8 2 commit_ms 0",            r"commit_ms", None),
    ("commit_ms-600001",   "{O} {C} 8 2 commit_ms 600001",       r"commit_ms", None),
]

GOOD = [
    ("cache-16-blocks",    "{O} {S16} 8 0"),
    ("cache-16-blocks-1M", "{O} {C} 2048 0"),
    ("bs-8",               "{O} {C} 8 0"),
    ("bs-16",              "{O} {C} 16 0"),
    ("bs-1024",            "{O} {C} 1024 0"),
    ("flush_depth-1",      "{O} {C} 8 2 flush_depth 1"),
    ("flush_depth-4096",   "{O} {C} 8 2 flush_depth 4096"),
    ("max_flush_kb=block", "{O} {C} 64 2 max_flush_kb 32"),
    ("max_flush_kb-round", "{O} {C} 64 2 max_flush_kb 100"),
    ("max_flush_kb-16384", "{O} {C} 8 2 max_flush_kb 16384"),
    ("bridge=max_flush",   "{O} {C} 8 4 max_flush_kb 64 bridge_gap_kb 64"),
    ("watermarks-0-100",   "{O} {C} 8 4 low_watermark 0 high_watermark 100"),
    ("watermarks-equal",   "{O} {C} 8 4 low_watermark 30 high_watermark 30"),
    ("all-keys",           "{O} {C} 8 13 writethrough flush_depth 2 max_flush_kb 128 "
                           "bridge_gap_kb 8 high_watermark 60 low_watermark 40 flush_on_suspend 1"),
    ("shorter-than-origin", "{O} {C} 8 0"),
    ("commit_ms-1",        "{O} {C} 8 2 commit_ms 1"),
    ("commit_ms-600000",   "{O} {C} 8 2 commit_ms 600000"),
]


def with_format(args):
    """The GOOD lines create caches: add the 'format' feature argument."""
    w = args.split()
    return " ".join(w[:3] + [str(int(w[3]) + 1), "format"] + w[4:])


@pytest.fixture(scope="module")
def devs(module_stack):
    st = module_stack
    # sizes count the metadata: a 4 KiB superblock, then 4 KiB of entries
    # per 128 slots, a 4 KiB summary (format version 4), rounded up to the
    # block size; S15 holds 16 slots without the summary (version 3), 15
    # with it
    d = {"O": st.ram(64 * MiB), "C": st.ram(17 * MiB),
         "S": st.ram(17 * 4096), "S15": st.ram(18 * 4096), "S16": st.ram(19 * 4096),
         "C8": st.ram(8 * MiB)}
    d["L"] = tclib.size_sectors(d["O"])
    return d


def create(name, table, timeout=60):
    return tclib.run(["dmsetup", "create", name, "--table", table], check=False,
                     timeout=timeout)


@pytest.mark.parametrize("case,args,want,length", BAD, ids=[c[0] for c in BAD])
def test_bad_table_refused(devs, case, args, want, length):
    n = devs["L"] + (8 if length == "+8" else 0)
    table = f"0 {n} tiercache " + args.format(**devs)
    names_before = tclib.dm_names()
    cur = tclib.KmsgCursor(f"badtable {case}")
    p = create("tc-bad", table)
    klog = cur.lines()
    left = [x for x in tclib.dm_names() if x not in names_before]
    if p.returncode == 0:
        tclib.run(["dmsetup", "remove", "tc-bad"], check=False)
    assert p.returncode != 0, f"accepted: {table!r}"
    assert not left, f"dm device(s) left behind after a refused table: {left}"
    tlines = [ln for ln in klog if re.search(r"device-mapper: table: \S+: tiercache: ", ln)]
    tc_lines = [ln for ln in klog if "tiercache" in ln]
    assert tlines, (f"no 'device-mapper: table: ...: tiercache: <message>' line for "
                    f"{table!r}; kernel log:\n" + "\n".join(klog[-10:]))
    msg = tlines[-1].split(": tiercache: ", 1)[1]
    assert re.search(want, msg, re.I), (
        f"refusal of {table!r} does not name the argument (/{want}/): table message "
        f"{msg!r}; all tiercache lines:\n" + "\n".join(tc_lines))


@pytest.mark.parametrize("case,args", GOOD, ids=[c[0] for c in GOOD])
def test_boundary_table_accepted(devs, case, args):
    n = devs["L"] - (8 if case == "shorter-than-origin" else 0)
    table = f"0 {n} tiercache " + with_format(args).format(**devs)
    # Each case formats a blank cache device: 'format' is refused over a
    # superblock of another geometry (another block size, say), which the
    # previous case may have left.
    cache = args.split()[1].format(**devs)
    tclib.write_direct(cache, 0, bytes(4096))
    p = create("tc-good", table)
    assert p.returncode == 0, f"refused: {table!r}: {p.stderr.strip()}\n" + \
        "\n".join(tclib.dmesg_lines()[-5:])
    try:
        st = tclib.parse_status(tclib.run(["dmsetup", "status", "tc-good"]).stdout)
        assert st["len"] == n
    finally:
        tclib.run(["dmsetup", "remove", "--retry", "tc-good"])
