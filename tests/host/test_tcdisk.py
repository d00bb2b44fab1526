#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Host test of tests/vm/tcdisk.py, the Python decoder of the on-disk format
that the VM and crash tests use: run by `make -C tests/host check`.

1. Against the module's C code: the fuzz seeds (images written by the C
   encoder, tests/host/mkseeds.c: valid ones, version 1, previous
   generation entries, a garbage entry area, spoiled fields, damaged
   gen and slot words, a misdirected metadata block, a superblock marked
   failed, one with an unknown flag bit, version 2, versions of blocks in
   several epochs across a wrap of the 16 epoch bits, the same under a
   version 2 superblock, clean entries with epoch bits) and seeded
   mutations of them (the epoch bits and the superblock's epoch among
   them) are decoded by both decode_img (tc_disk.c) and tcdisk; every
   superblock (flags and epoch included) and entry result (absolute
   epoch included) must agree.  tcdisk's encoder must write the C
   encoder's bytes.
2. Synthetic images: version 1 reads as generation 0, a garbage entry
   area reads as empty (foreign), an entry of the previous generation
   reads as empty, a corrupt entry of this generation does not (its gen
   or slot word damaged included), nor one of this generation in another
   slot's place (misplaced: a misdirected write); a superblock marked
   failed decodes, one with another flag bit does not.  Epochs: a version
   3 image with version chains, its epochs made absolute across the 16-bit
   wrap; epoch bits refused in version 2 and in clean entries; the
   superblock's epoch refused in versions 1 and 2; dirty_versions() and
   its duplicates (one block twice in one epoch).

    test_tcdisk.py BUILD_DIR     (holds mkseeds and decode_img)
"""

import random
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vm"))
import tcdisk  # noqa: E402

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"test_tcdisk: FAIL {what}", file=sys.stderr)


def py_lines(img):
    """What decode_img prints, computed with tcdisk."""
    sb = tcdisk.decode_sb(img[:512])
    if not sb.ok:
        return [f"sb {sb.state}"]
    out = [f"sb {sb.state} {sb.version} {sb.gen} {sb.commit_seq} {sb.nr_slots} {sb.nr_blocks} "
           f"{sb.flags} {sb.epoch}"]
    base = tcdisk.META_START * 512
    have = max(0, (len(img) - base) // tcdisk.ENTRY_BYTES)
    for s, e in tcdisk.entries(img[base:], sb):
        if s >= have:
            break
        if e.block is None:
            out.append(f"{s} {e.state} - - - -")
        else:
            epoch = "-" if e.epoch is None else e.epoch
            out.append(f"{s} {e.state} {e.block} {e.seq} {int(e.dirty)} {epoch}")
    nmb = tcdisk.meta_blocks(sb.nr_slots)
    for k in range(sb.sum_blocks):
        off = sb.sum_start * 512 + k * tcdisk.MBLOCK
        if off + tcdisk.MBLOCK > len(img):
            break
        state, bits = tcdisk.decode_sum(img[off:off + tcdisk.MBLOCK], k, sb.gen)
        marked = sorted(k * tcdisk.SUM_BITS + j for j in bits
                        if k * tcdisk.SUM_BITS + j < nmb)
        out.append(" ".join([f"sum {k} {state}"] + [str(mb) for mb in marked]))
    return out


def c_lines(build, path):
    p = subprocess.run([str(build / "decode_img"), str(path)], capture_output=True,
                       text=True, check=True)
    return p.stdout.splitlines()


def compare(build, tmp, name, img):
    path = tmp / "img"
    path.write_bytes(img)
    c, py = c_lines(build, path), py_lines(img)
    if c != py:
        diff = next((f"C '{a}' / tcdisk '{b}'" for a, b in zip(c, py) if a != b),
                    f"{len(c)} lines from C, {len(py)} from tcdisk")
        check(False, f"{name}: tcdisk and tc_disk.c disagree: {diff}")
    return c


def mutations(img, rng, n):
    """@n copies of @img with a few bytes changed: in the superblock (its
    epoch words more often), in the entries' identity words, in their
    epoch bits, anywhere in the entry area; some with the checksum
    recomputed, so that the checks after it run."""
    base = tcdisk.META_START * 512
    for k in range(n):
        m = bytearray(img)
        where = rng.randrange(5)
        if where == 0:
            off = rng.randrange(512) if rng.randrange(3) else rng.randrange(196, 208)
            m[off] ^= 1 << rng.randrange(8)
            if rng.randrange(2) and off not in range(12, 16):
                m[12:16] = tcdisk.crc32c(bytes(m[:12]) + bytes(4) + bytes(m[16:512])) \
                    .to_bytes(4, "little")
        elif len(m) > base + 32:
            slot = rng.randrange((len(m) - base) // 32)
            e = base + slot * 32
            if where == 1:
                off = e + rng.choice([16, 17, 28, 29, 30, 31])
            elif where == 4:
                off = e + rng.choice([22, 23])      # the epoch bits
            else:
                off = e + rng.randrange(32)
            m[off] ^= 1 << rng.randrange(8)
            if where in (3, 4) and off - e not in range(24, 28):
                raw = bytes(m[e:e + 32])
                m[e + 24:e + 28] = tcdisk.crc32c(raw[:24] + bytes(4) + raw[28:]) \
                    .to_bytes(4, "little")
        yield f"mutation {k} ({where})", bytes(m)


def test_against_c(build):
    with tempfile.TemporaryDirectory(prefix="tcdisk-") as d:
        tmp = Path(d)
        seeds = tmp / "seeds"
        seeds.mkdir()
        subprocess.run([str(build / "mkseeds"), str(seeds)], check=True)
        names = sorted(p.name for p in seeds.iterdir())
        check({"v1", "old-gen", "garbage", "mixed", "bad-entries", "damaged-ids",
               "misdirected", "failed", "unknown-flag", "v2", "epochs", "epochs-v2",
               "epoch-clean"} <= set(names), names)
        rng = random.Random(20240611)
        states, sums = set(), set()
        for name in names:
            img = (seeds / name).read_bytes()
            lines = compare(build, tmp, name, img)
            states.update(ln.split()[1] for ln in lines)
            sums.update(ln.split()[2] for ln in lines if ln.startswith("sum "))
            for what, m in mutations(img, rng, 40):
                lines = compare(build, tmp, f"{name} {what}", m)
                states.update(ln.split()[1] for ln in lines)
                sums.update(ln.split()[2] for ln in lines if ln.startswith("sum "))
        # every result of both decoders was compared at least once
        want = {"valid", "bad_csum", "bad_version", "bad_fields", "empty", "foreign",
                "clean", "dirty", "uncommitted", "bad_slot", "bad_flags", "bad_block"}

        check(want <= states, f"results never compared: {sorted(want - states)}")
        check({"valid", "bad"} <= sums, f"summary results compared: {sorted(sums)}")

        # the summary (version 4): the dirty entries' blocks marked, in the
        # seeds; one left out in summary-spoilt; no summary in version 2
        c = compare(build, tmp, "epochs", (seeds / "epochs").read_bytes())
        check(c[-1] == "sum 0 valid 0 1", f"epochs seed summary: {c[-1]}")
        c = compare(build, tmp, "summary-spoilt", (seeds / "summary-spoilt").read_bytes())
        check(c[-1] == "sum 0 valid 0", f"summary-spoilt seed summary: {c[-1]}")
        c = compare(build, tmp, "v2", (seeds / "v2").read_bytes())
        check(not any(ln.startswith("sum ") for ln in c), "a version 2 image has a summary")

        # tcdisk's encoder writes what the C encoder wrote
        img = (seeds / "mixed").read_bytes()
        sb = tcdisk.decode_sb(img)
        check(tcdisk.encode_sb(sb.nr_slots, sb.block_sectors, sb.commit_seq,
                               sb.origin_sectors, sb.gen, b"TIERCACHE-t") == img[:512],
              "encode_sb differs from tc_sb_encode")
        off = tcdisk.entry_offset(7)
        check(tcdisk.encode_entry(7, 10, True, 7, sb.gen) == img[off:off + 32],
              "encode_entry differs from tc_de_encode")
        # the superblock flags: TC_SB_FAILED decodes, an unknown bit does not,
        # in both decoders (compared above); the mark is encoded alike
        failed = (seeds / "failed").read_bytes()
        c = compare(build, tmp, "failed", failed)
        check(c[0].startswith("sb valid ") and c[0].endswith(f" {tcdisk.SB_FAILED} 0"),
              f"failed seed: C says {c[0]!r}")
        check(c[1:] == compare(build, tmp, "mixed", img)[1:], "failed seed: entries differ")
        fsb = tcdisk.decode_sb(failed)
        check(fsb.ok and fsb.failed and not sb.failed, f"failed seed: {fsb}")
        check(tcdisk.encode_sb(sb.nr_slots, sb.block_sectors, sb.commit_seq,
                               sb.origin_sectors, sb.gen, b"TIERCACHE-t",
                               flags=tcdisk.SB_FAILED) == failed[:512],
              "encode_sb with TC_SB_FAILED differs from tc_sb_encode")
        c = compare(build, tmp, "unknown-flag", (seeds / "unknown-flag").read_bytes())
        check(c == ["sb bad_fields"], f"unknown flag: C says {c}")
        v1 = (seeds / "v1").read_bytes()
        sb1 = tcdisk.decode_sb(v1)
        check(tcdisk.encode_sb(sb1.nr_slots, 8, 7, 16384, 0, b"TIERCACHE-t",
                               version=1) == v1[:512], "a version 1 superblock differs")
        v2 = (seeds / "v2").read_bytes()
        sb2 = tcdisk.decode_sb(v2)
        check(tcdisk.encode_sb(sb2.nr_slots, 8, 7, 16384, sb.gen, b"TIERCACHE-t",
                               version=2) == v2[:512], "a version 2 superblock differs")
        check(sb2.ok and sb2.sum_blocks == 0 and sb.sum_blocks == 1
              and sb2.data_start == tcdisk.data_start(sb2.nr_slots, 8, 3),
              f"a version 2 cache has no summary: {sb2}")

        # epochs: the superblock's epoch, the entries' epoch bits, in both
        # encoders; the absolute epochs in both decoders (compared above)
        ep = (seeds / "epochs").read_bytes()
        esb = tcdisk.decode_sb(ep)
        check(esb.ok and esb.version == 4 and esb.epoch == 0x1FFFE, f"epochs seed: {esb}")
        check(tcdisk.encode_sb(esb.nr_slots, 8, 7, 16384, esb.gen, b"TIERCACHE-e",
                               epoch=0x1FFFE) == ep[:512],
              "encode_sb with an epoch differs from tc_sb_encode")
        for slot, block, dirty, seq, epoch in ((0, 11, True, 5, 0x1FFFE),
                                               (3, 11, True, 7, 0x20001),
                                               (5, 12, True, 7, 0x2FFFD),
                                               (131, 15, False, 7, 0x20000)):
            off = tcdisk.entry_offset(slot)
            check(tcdisk.encode_entry(slot, block, dirty, seq, esb.gen, epoch)
                  == ep[off:off + 32], f"encode_entry with epoch {epoch:#x} differs")
        c = compare(build, tmp, "epochs", ep)
        want = {"0": "131070", "1": "131071", "2": "131072", "3": "131073",
                "4": "131071", "5": "196605", "130": "131073", "6": "-", "131": "-"}
        got = {ln.split()[0]: ln.split()[-1] for ln in c[1:]
               if "empty" not in ln and not ln.startswith("sum ")}
        check(got == want, f"absolute epochs from C: {got}")
        c = compare(build, tmp, "epochs-v2", (seeds / "epochs-v2").read_bytes())
        check([ln.split()[1] for ln in c[1:] if "empty" not in ln] ==
              ["bad_flags", "bad_flags", "dirty", "bad_flags", "bad_flags", "bad_flags",
               "clean", "bad_flags", "clean"], f"epochs under version 2: {c}")


def image(gen=0x600dcafe, version=tcdisk.VERSION, nr_slots=300, commit_seq=9,
          entries=(), fill=None):
    """A superblock and entry area: @entries (slot, block, dirty, seq, gen),
    the other entries' bytes from @fill (default zero)."""
    sb = tcdisk.encode_sb(nr_slots, 8, commit_seq, 1 << 20, gen, version=version)
    area = bytearray(fill if fill is not None else bytes(tcdisk.meta_blocks(nr_slots) * 4096))
    for slot, block, dirty, seq, egen in entries:
        area[slot * 32:slot * 32 + 32] = tcdisk.encode_entry(slot, block, dirty, seq, egen)
    return sb + bytes(tcdisk.META_START * 512 - 512) + bytes(area)


def decode(img):
    sb = tcdisk.decode_sb(img[:512])
    base = tcdisk.META_START * 512
    return sb, dict(tcdisk.entries(img[base:], sb))


def counts(es):
    c = {}
    for e in es.values():
        c[e.state] = c.get(e.state, 0) + 1
    return c


def test_synthetic():
    g = 0x600dcafe
    # version 1: generation 0, its entries (gen word zero) are ours
    sb, es = decode(image(gen=0, version=1, entries=[(3, 40, True, 5, 0), (4, 41, False, 9, 0),
                                                     (5, 42, True, 10, 0)]))
    check(sb.ok and sb.version == 1 and sb.gen == 0, f"v1 superblock: {sb}")
    check(es[3] == tcdisk.Entry(tcdisk.DIRTY, 40, 5, True, 0), f"v1 dirty entry: {es[3]}")
    check(es[4].state == tcdisk.CLEAN and es[5].state == tcdisk.UNCOMMITTED, "v1 entries")
    check(counts(es)[tcdisk.EMPTY] == 297, "v1 empty slots")
    # version 1 with a generation word: a bad field; unknown versions
    check(tcdisk.decode_sb(tcdisk.encode_sb(300, 8, 9, 1 << 20, 5, version=1)).state
          == tcdisk.SB_BAD_FIELDS, "v1 with a generation")
    for v in (0, 5):
        check(tcdisk.decode_sb(tcdisk.encode_sb(300, 8, 9, 1 << 20, g, version=v)).state
              == tcdisk.SB_BAD_VERSION, f"version {v}")
    check(tcdisk.decode_sb(bytes(512)).state == tcdisk.SB_BLANK, "blank")
    # flags: TC_SB_FAILED, in version 2 and in version 1; nothing else
    for v, gen in ((tcdisk.VERSION, g), (tcdisk.VERSION_V1, 0)):
        sb = tcdisk.decode_sb(tcdisk.encode_sb(300, 8, 9, 1 << 20, gen, version=v,
                                               flags=tcdisk.SB_FAILED))
        check(sb.ok and sb.failed and sb.flags == tcdisk.SB_FAILED, f"failed, v{v}: {sb}")
    check(not tcdisk.decode_sb(tcdisk.encode_sb(300, 8, 9, 1 << 20, g)).failed, "not failed")
    for f in (2, 3, 1 << 31):
        check(tcdisk.decode_sb(tcdisk.encode_sb(300, 8, 9, 1 << 20, g, flags=f)).state
              == tcdisk.SB_BAD_FIELDS, f"flags {f:#x}")

    # a garbage entry area (a fresh format over a used device): all foreign
    rng = random.Random(11)
    junk = rng.randbytes(tcdisk.meta_blocks(300) * 4096)
    sb, es = decode(image(fill=junk))
    check(sb.ok and sb.gen == g, f"v2 superblock: {sb}")
    check(counts(es) == {tcdisk.FOREIGN: 300}, f"garbage area: {counts(es)}")
    # ... with two entries of this generation among the garbage
    sb, es = decode(image(fill=junk, entries=[(7, 70, True, 9, g), (8, 71, False, 1, g)]))
    check(counts(es) == {tcdisk.FOREIGN: 298, tcdisk.DIRTY: 1, tcdisk.CLEAN: 1},
          f"garbage and entries: {counts(es)}")

    # the previous generation's committed dirty entry, and a misplaced one
    sb, es = decode(image(entries=[(3, 40, True, 5, g - 1), (4, 41, True, 5, g)]))
    check(es[3] == tcdisk.Entry(tcdisk.FOREIGN, None, None, None), f"old gen: {es[3]}")
    check(es[4].state == tcdisk.DIRTY, f"this gen: {es[4]}")
    img = bytearray(image(entries=[(4, 41, True, 5, g), (3, 40, True, 5, g - 1)]))
    base = tcdisk.META_START * 512
    img[base + 5 * 32:base + 6 * 32] = img[base + 4 * 32:base + 5 * 32]
    img[base + 6 * 32:base + 7 * 32] = img[base + 3 * 32:base + 4 * 32]
    sb, es = decode(bytes(img))
    check(es[5].state == tcdisk.BAD_SLOT, f"misplaced entry: {es[5]}")
    check(es[6].state == tcdisk.FOREIGN, f"misplaced old gen entry: {es[6]}")
    check(tcdisk.BAD_SLOT in tcdisk.CORRUPT, "misplaced is corrupt")

    # a metadata block of this generation in another block's place
    ents = [(s, 1000 + s, s % 2 == 1, 5, g) for s in range(128, 256) if s % 3]
    img = bytearray(image(entries=ents))
    img[base:base + 4096] = img[base + 4096:base + 8192]
    sb, es = decode(bytes(img))
    check(counts({s: es[s] for s in range(128)}) == {tcdisk.BAD_SLOT: len(ents),
                                                   tcdisk.EMPTY: 128 - len(ents)},
          f"misdirected block: {counts({s: es[s] for s in range(128)})}")

    # a corrupt entry of this generation is still corrupt: any field, its
    # gen or slot word alone too, every bit
    img = bytearray(image(entries=[(4, 41, True, 5, g)]))
    img[base + 4 * 32] ^= 1
    sb, es = decode(bytes(img))
    check(es[4].state == tcdisk.BAD_CSUM, f"corrupt entry: {es[4]}")
    good = tcdisk.encode_entry(4, 41, True, 5, g)
    for bit in range(256):
        raw = bytearray(good)
        raw[bit // 8] ^= 1 << bit % 8
        e = tcdisk.decode_entry(raw, 4, g, 1 << 17, 9)
        check(e.state == tcdisk.BAD_CSUM, f"bit {bit} flipped: {e}")
    # ... but not damaged in both: foreign (not detected)
    raw = bytearray(good)
    raw[16] ^= 1
    raw[28] ^= 1
    check(tcdisk.decode_entry(raw, 4, g, 1 << 17, 9).state == tcdisk.FOREIGN,
          "gen and slot damaged")
    # an older generation's entry is never taken for a damaged one of ours
    for k in range(2000):
        old = rng.getrandbits(32)
        new = rng.getrandbits(32) if k % 2 else (old + 1) & 0xFFFFFFFF
        if new == old:
            continue
        raw = tcdisk.encode_entry(k, rng.getrandbits(40), True, 5, old)
        st = tcdisk.decode_entry(raw, k, new, 1 << 40, 9).state
        check(st == tcdisk.FOREIGN, f"gen {old:#x} under {new:#x}: {st}")
    sb, es = decode(image(entries=[(4, (1 << 20) // 8, True, 5, g)]))
    check(es[4].state == tcdisk.BAD_BLOCK and es[4].dirty, f"block beyond: {es[4]}")
    test_synthetic_epochs()


def test_synthetic_epochs():
    g = 0x600dcafe
    # disk_epoch: the first epoch from the superblock's on with those bits
    for sbe, e, want in ((0, 0, 0), (0, 0xFFFF, 0xFFFF), (0xFFFE, 0, 0x10000),
                         (0xFFFE, 0xFFFD, 0x1FFFD), (0x10001, 0, 0x20000),
                         ((1 << 64) - 1, 0, 0), ((1 << 64) - 1, 0xFFFF, (1 << 64) - 1)):
        check(tcdisk.disk_epoch(sbe, e) == want, f"disk_epoch({sbe:#x}, {e:#x})")

    # a version 3 image: the superblock's epoch, versions of one block
    base = 0xFFFF0
    sbraw = tcdisk.encode_sb(300, 8, 9, 1 << 20, g, epoch=base)
    sb = tcdisk.decode_sb(sbraw)
    check(sb.ok and sb.version == 4 and sb.epoch == base, f"v4 superblock: {sb}")
    area = bytearray(tcdisk.meta_blocks(300) * 4096)
    vers = [(1, 50, base), (2, 50, base + 0x10), (3, 50, base + 0x12), (4, 51, base + 0x10),
            (5, 52, base + 0xFFFF), (6, 52, base + 0x12), (7, 50, base + 0x12)]
    for slot, block, epoch in vers:
        area[slot * 32:slot * 32 + 32] = tcdisk.encode_entry(slot, block, True, 5, g, epoch)
    area[8 * 32:9 * 32] = tcdisk.encode_entry(8, 50, False, 5, g, base + 3)
    es = dict(tcdisk.entries(bytes(area), sb))
    check([es[s].epoch for s, _, _ in vers] == [e for _, _, e in vers],
          f"absolute epochs: {[es[s].epoch for s, _, _ in vers]}")
    check(es[8] == tcdisk.Entry(tcdisk.CLEAN, 50, 5, False, None), f"clean: {es[8]}")
    chains, dups = tcdisk.dirty_versions(es.items())
    check(chains[50] == [(base, 1), (base + 0x10, 2), (base + 0x12, 3), (base + 0x12, 7)],
          f"chain of block 50: {chains[50]}")
    check(chains[52] == [(base + 0x12, 6), (base + 0xFFFF, 5)], f"chain of 52: {chains[52]}")
    check(dups == [(50, base + 0x12, [3, 7])], f"duplicates: {dups}")
    # under a version 2 superblock: epoch bits are invalid flags
    sb2 = tcdisk.decode_sb(tcdisk.encode_sb(300, 8, 9, 1 << 20, g, version=2))
    check(sb2.ok and sb2.epoch == 0, f"v2 superblock: {sb2}")
    es2 = dict(tcdisk.entries(bytes(area), sb2))
    check(es2[1].state == tcdisk.BAD_FLAGS and es2[8].state == tcdisk.CLEAN,
          f"v2: {es2[1]}, {es2[8]}")
    raw = tcdisk.encode_entry(1, 50, True, 5, g, 0)
    check(tcdisk.decode_entry(raw, 1, g, 100, 9, 2) == tcdisk.Entry(tcdisk.DIRTY, 50, 5, True, 0),
          "a v2 entry")
    chains, dups = tcdisk.dirty_versions([(1, tcdisk.decode_entry(raw, 1, g, 100, 9, 2)),
                                          (2, tcdisk.decode_entry(
                                              tcdisk.encode_entry(2, 50, True, 5, g), 2, g,
                                              100, 9, 2))])
    check(dups == [(50, 0, [1, 2])], f"v2 duplicate: {dups}")
    # a clean entry with epoch bits (checksum fixed): invalid flags
    raw = bytearray(tcdisk.encode_entry(1, 50, False, 5, g))
    raw[22] = 1
    raw[24:28] = tcdisk.crc32c(bytes(raw[:24]) + bytes(4) + bytes(raw[28:])).to_bytes(4, "little")
    check(tcdisk.decode_entry(raw, 1, g, 100, 9).state == tcdisk.BAD_FLAGS, "clean with epoch")
    # the superblock's epoch in version 1 or 2, and the pad: bad fields
    for v, gen in ((2, g), (1, 0)):
        check(tcdisk.decode_sb(tcdisk.encode_sb(300, 8, 9, 1 << 20, gen, version=v, epoch=1))
              .state == tcdisk.SB_BAD_FIELDS, f"epoch in version {v}")
    bad = bytearray(sbraw)
    bad[196] = 1
    bad[12:16] = tcdisk.crc32c(bytes(bad[:12]) + bytes(4) + bytes(bad[16:])).to_bytes(4, "little")
    check(tcdisk.decode_sb(bytes(bad)).state == tcdisk.SB_BAD_FIELDS, "pad")


def main():
    build = Path(sys.argv[1] if len(sys.argv) > 1 else "build").resolve()
    test_synthetic()
    test_against_c(build)
    if failures:
        print(f"test_tcdisk: {len(failures)} failure(s)", file=sys.stderr)
        return 1
    print("test_tcdisk: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
