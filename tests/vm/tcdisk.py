# SPDX-License-Identifier: GPL-2.0
"""The cache device's on-disk format, decoded as the module decodes it.

dm-tiercache/tc_disk.h is the definition and tc_disk.c the decoder; this
is the one Python copy, for the tests that read a cache device themselves
(faults.py, test_80_persist.py, test_81_logwrites.py, tests/crash/phase.py).
Pure functions over bytes: callers read the device.  tests/host/
test_tcdisk.py checks it against the C decoder on images the C encoder
wrote, and on synthetic ones.

The superblock's flags: TC_SB_FAILED (written by the module when a
metadata commit failed, or by `tiercache detach --abandon` when an
administrator gave the cache up) is the only one defined; a
superblock with any other bit set does not decode (impossible fields).

Format version 2: the superblock and every entry carry a format
generation.  An entry is *ours* only if its gen is the superblock's and
its slot field its own index; an all-zero entry is EMPTY and any other
entry FOREIGN (an earlier format's, or bytes the device held before),
which is a free slot too, unless its checksum says it is one of ours
damaged in its gen or slot word alone (BAD_CSUM) or an entry of this
generation for another slot (BAD_SLOT: a misdirected write).  Only our
entries are checked further (checksum, flags, block, sequence).  Version 1
(no generation: the words were reserved and zero) reads as generation 0.

Format version 3: epochs.  A committed dirty entry carries the low 16 bits
of its version's epoch in bits 16..31 of its flags (none in a clean entry,
none at all in versions 1 and 2: invalid flags there); the superblock's
epoch is a lower bound of them, and disk_epoch() (tc_disk_epoch) makes
them absolute: Entry.epoch is the absolute epoch of a dirty version.  One
origin block may be dirty in several slots, one version per epoch (the
newest is the block's data); two dirty entries of one block with the same
epoch are corruption (dirty_versions()).  Versions 1 and 2 read as epoch 0.
"""

import struct
from collections import namedtuple

MAGIC = b"TIERCACH"
VERSION = 4                 # what a format writes: version 3 + a summary
VERSION_V3 = 3              # still read and written: no summary
VERSION_V2 = 2              # still read: no epochs (epoch 0)
VERSION_V1 = 1              # still read, as generation 0 (and epoch 0)
SB_BYTES = 512
META_START = 8              # sector of the first entry
MBLOCK = 4096               # bytes of a metadata block
ENTRY_BYTES = 32
ENTRIES_PER_MBLOCK = MBLOCK // ENTRY_BYTES
MAX_SLOTS = 0xFFFFFFFF
SB_COUNTER_LIMIT = 1 << 63          # commit_seq, epoch: below (TC_SB_COUNTER_LIMIT)

# magic, version, csum, commit_seq, block_sectors, flags, nr_slots,
# meta_start, data_start, origin_sectors, uuid, gen, pad, epoch, reserved
SB = struct.Struct("<8sIIQIIQQQQ128sIIQ304s")
ENTRY = struct.Struct("<QQIIII")        # block, seq, slot, flags, csum, gen
SB_CSUM_OFF, ENTRY_CSUM_OFF = 12, 24
DE_VALID, DE_DIRTY = 1, 2
DE_EPOCH_SHIFT, DE_EPOCH_MASK = 16, 0xFFFF0000   # v3: a dirty version's epoch
SB_FAILED = 1               # superblock flags (TC_SB_*)
SB_KNOWN_FLAGS = SB_FAILED
ZERO_ENTRY = bytes(ENTRY_BYTES)

# tc_sb_result
SB_OK, SB_BLANK, SB_BAD_CSUM, SB_BAD_VERSION, SB_BAD_FIELDS = (
    "valid", "blank", "bad_csum", "bad_version", "bad_fields")
# tc_de_result
(EMPTY, FOREIGN, CLEAN, DIRTY, UNCOMMITTED, BAD_CSUM, BAD_SLOT, BAD_FLAGS,
 BAD_BLOCK) = ("empty", "foreign", "clean", "dirty", "uncommitted", "bad_csum",
               "bad_slot", "bad_flags", "bad_block")
FREE = (EMPTY, FOREIGN)                 # slots that hold nothing
CORRUPT = (BAD_CSUM, BAD_SLOT, BAD_FLAGS, BAD_BLOCK)   # a load refuses these


def _crc32c_table():
    t = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
        t.append(c)
    return t


_CRC32C = _crc32c_table()


def crc32c(data):
    """CRC-32C (Castagnoli) as tc_disk_crc(): init ~0, reflected, final ~."""
    crc = 0xFFFFFFFF
    t = _CRC32C
    for b in data:
        crc = t[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283


def _csum(raw, off):
    """The CRC-32C of @raw with its 4-byte checksum field at @off zero."""
    return crc32c(raw[:off] + bytes(4) + raw[off + 4:])


def meta_blocks(nr_slots):
    return (nr_slots + ENTRIES_PER_MBLOCK - 1) // ENTRIES_PER_MBLOCK


SUM_BITS = (MBLOCK - 16) * 8    # metadata blocks per summary block (TC_SUM_BITS)


def sum_blocks(nr_slots, version=VERSION):
    """4 KiB summary blocks of the layout (version 4; else none)."""
    if version < VERSION:
        return 0
    return (meta_blocks(nr_slots) + SUM_BITS - 1) // SUM_BITS


def sum_start(nr_slots, version=VERSION):
    """Sector of the summary (version 4), right after the entries; 0: none."""
    if version < VERSION:
        return 0
    return META_START + meta_blocks(nr_slots) * (MBLOCK // 512)


def data_start(nr_slots, block_sectors, version=VERSION):
    end = META_START + (meta_blocks(nr_slots) + sum_blocks(nr_slots, version)) * (MBLOCK // 512)
    return (end + block_sectors - 1) // block_sectors * block_sectors


def layout(cache_sectors, block_sectors=8, version=VERSION):
    """(nr_slots, data_start) of a device of @cache_sectors in the layout of
    format @version (tc_disk_layout_v): the most slots that fit beside the
    metadata; (0, None) if none does."""
    n = min((cache_sectors - META_START) * 512 // (block_sectors * 512 + ENTRY_BYTES),
            MAX_SLOTS)
    while n > 0:
        ds = data_start(n, block_sectors, version)
        if ds + n * block_sectors <= cache_sectors:
            return n, ds
        n -= 1
    return 0, None


def entry_offset(slot):
    """Byte offset of @slot's entry on the device (a plain array)."""
    return META_START * 512 + slot * ENTRY_BYTES


class Superblock(namedtuple("Superblock", "state version commit_seq block_sectors flags "
                                          "nr_slots meta_start data_start origin_sectors "
                                          "uuid gen epoch")):
    """A decoded superblock.  The fields are what the sector holds even
    when it does not decode (state says whether it does)."""

    @property
    def ok(self):
        return self.state == SB_OK

    @property
    def failed(self):
        """Marked failed: the module does not load this cache again."""
        return bool(self.flags & SB_FAILED)

    @property
    def nr_blocks(self):
        """Whole origin blocks: an entry must name a block below this."""
        return self.origin_sectors // self.block_sectors if self.block_sectors else 0

    @property
    def sum_blocks(self):
        """4 KiB summary blocks (version 4), at sector sum_start."""
        return sum_blocks(self.nr_slots, self.version)

    @property
    def sum_start(self):
        return sum_start(self.nr_slots, self.version)

    @property
    def entries_bytes(self):
        """Bytes of the entry area (whole metadata blocks)."""
        return meta_blocks(self.nr_slots) * MBLOCK


def _sb_fields_ok(sb, pad, reserved):
    bs = sb.block_sectors
    return (not sb.flags & ~SB_KNOWN_FLAGS and 8 <= bs <= 2048 and not bs & (bs - 1)
            and 1 <= sb.nr_slots <= MAX_SLOTS and sb.meta_start == META_START
            and sb.origin_sectors
            and sb.data_start == data_start(sb.nr_slots, bs, sb.version)
            and not any(reserved) and not pad
            and sb.commit_seq < SB_COUNTER_LIMIT and sb.epoch < SB_COUNTER_LIMIT
            and (sb.version > VERSION_V2 or not sb.epoch)
            and (sb.version != VERSION_V1 or not sb.gen))


def decode_sb(raw):
    """Decode the first sector of a cache device (tc_sb_decode)."""
    raw = bytes(raw[:SB_BYTES]).ljust(SB_BYTES, b"\0")
    (magic, version, csum, commit_seq, block_sectors, flags, nr_slots, meta_start,
     dstart, origin_sectors, uuid, gen, pad, epoch, reserved) = SB.unpack(raw)
    sb = Superblock(None, version, commit_seq, block_sectors, flags, nr_slots,
                    meta_start, dstart, origin_sectors,
                    uuid.split(b"\0", 1)[0].decode(errors="replace"), gen, epoch)
    if magic != MAGIC:
        state = SB_BLANK
    elif _csum(raw, SB_CSUM_OFF) != csum:
        state = SB_BAD_CSUM
    elif version not in (VERSION, VERSION_V3, VERSION_V2, VERSION_V1):
        state = SB_BAD_VERSION
    elif not _sb_fields_ok(sb, pad, reserved):
        state = SB_BAD_FIELDS
    else:
        state = SB_OK
    return sb._replace(state=state)


def disk_epoch(sb_epoch, e):
    """The absolute epoch of epoch bits @e under a superblock of epoch
    @sb_epoch (tc_disk_epoch): the first from @sb_epoch on with those low
    16 bits (entries are never older than the superblock's epoch)."""
    return (sb_epoch + ((e - sb_epoch) & 0xFFFF)) & 0xFFFFFFFFFFFFFFFF


# block, seq and dirty are None where the decoder did not get that far;
# epoch is the absolute epoch of a dirty version (None if not dirty)
Entry = namedtuple("Entry", "state block seq dirty epoch", defaults=(None,))


def _decode_other(raw, slot, gen):
    """The state of a non-zero entry whose gen or slot word is not @gen or
    @slot: foreign, unless well formed and of this generation (misplaced),
    or well formed with one of the two words put back (damaged)."""
    _, _, eslot, _, csum, egen = ENTRY.unpack(raw)
    if gen == 0:    # version 1 zeroed the area: nothing is foreign
        return BAD_SLOT if eslot != slot else BAD_FLAGS
    if _csum(raw, ENTRY_CSUM_OFF) == csum:
        return BAD_SLOT if egen == gen else FOREIGN
    if eslot == slot or egen == gen:
        fixed = raw[:16] + struct.pack("<I", slot) + raw[20:28] + struct.pack("<I", gen)
        if _csum(fixed, ENTRY_CSUM_OFF) == csum:
            return BAD_CSUM
    return FOREIGN


def decode_entry(raw, slot, gen, nr_blocks, commit_seq, version=VERSION, sb_epoch=0):
    """Decode the entry of @slot under a superblock of generation @gen,
    format version @version and epoch @sb_epoch (tc_de_decode; the epoch
    made absolute with disk_epoch)."""
    raw = bytes(raw)
    if raw == ZERO_ENTRY:
        return Entry(EMPTY, None, None, None)
    block, seq, eslot, flags, csum, egen = ENTRY.unpack(raw)
    slot &= 0xFFFFFFFF
    if egen != gen or eslot != slot:
        return Entry(_decode_other(raw, slot, gen), None, None, None)
    if _csum(raw, ENTRY_CSUM_OFF) != csum:
        return Entry(BAD_CSUM, None, None, None)
    ebits = flags >> DE_EPOCH_SHIFT
    flags &= ~DE_EPOCH_MASK
    if not flags & DE_VALID or flags & ~(DE_VALID | DE_DIRTY):
        return Entry(BAD_FLAGS, None, None, None)
    dirty = bool(flags & DE_DIRTY)
    if ebits and (not dirty or version <= VERSION_V2):
        return Entry(BAD_FLAGS, None, None, None)
    if block >= nr_blocks:
        state = BAD_BLOCK
    elif seq > commit_seq:
        state = UNCOMMITTED
    else:
        state = DIRTY if dirty else CLEAN
    return Entry(state, block, seq, dirty, disk_epoch(sb_epoch, ebits) if dirty else None)


def entries(area, sb, nr_blocks=None):
    """(slot, Entry) for every slot of @sb, from @area: the bytes of the
    entry area (from sector META_START).  @nr_blocks: the origin's whole
    blocks (default: the superblock's)."""
    if nr_blocks is None:
        nr_blocks = sb.nr_blocks
    for s in range(sb.nr_slots):
        raw = area[s * ENTRY_BYTES:(s + 1) * ENTRY_BYTES]
        yield s, decode_entry(raw, s, sb.gen, nr_blocks, sb.commit_seq, sb.version, sb.epoch)


# ---------------------------------------------------------------- summary (v4)

SUM = struct.Struct("<IIII")            # gen, index, csum, reserved
SUM_CSUM_OFF = 8
# tc_sum_result
SUM_OK, SUM_BAD = "valid", "bad"


def decode_sum(raw, index, gen):
    """What summary block number @index says under generation @gen
    (tc_sum_decode): (state, set of the bit numbers set; all of them if
    bad: anything not of this generation and index with a right
    checksum)."""
    raw = bytes(raw[:MBLOCK]).ljust(MBLOCK, b"\0")
    egen, eindex, csum, reserved = SUM.unpack(raw[:16])
    if egen != gen or eindex != index or reserved or _csum(raw, SUM_CSUM_OFF) != csum:
        return SUM_BAD, set(range(SUM_BITS))
    bits = raw[16:]
    return SUM_OK, {j for j in range(SUM_BITS) if bits[j // 8] >> (j % 8) & 1}


def marked_blocks(img, sb):
    """The metadata blocks a load of the image @img (bytes from sector 0)
    reads: those its summary marks (version 4), else all of them."""
    nmb = meta_blocks(sb.nr_slots)
    if not sb.sum_blocks:
        return set(range(nmb))
    marked = set()
    for k in range(sb.sum_blocks):
        off = (sb.sum_start * 512) + k * MBLOCK
        _, bits = decode_sum(img[off:off + MBLOCK], k, sb.gen)
        marked |= {k * SUM_BITS + j for j in bits if k * SUM_BITS + j < nmb}
    return marked


def dirty_flagged(raw, slot, gen):
    """Is the entry @raw of @slot one of ours (generation @gen, its own slot,
    checksum right) with the DIRTY flag, committed or not?  The summary must
    mark its block."""
    raw = bytes(raw)
    _, _, eslot, flags, csum, egen = ENTRY.unpack(raw)
    return (bool(flags & DE_DIRTY) and egen == gen and eslot == slot & 0xFFFFFFFF
            and _csum(raw, ENTRY_CSUM_OFF) == csum)


def unmarked_dirty(img, sb):
    """[(slot, metadata block)] of the entries of ours with the DIRTY flag
    (committed or not) in metadata blocks that a load of the image @img
    does not read: the summary rule broken (empty without a summary)."""
    marked = marked_blocks(img, sb)
    base = META_START * 512
    bad = []
    for mb in range(meta_blocks(sb.nr_slots)):
        if mb in marked:
            continue
        for s in range(mb * ENTRIES_PER_MBLOCK,
                       min((mb + 1) * ENTRIES_PER_MBLOCK, sb.nr_slots)):
            off = base + s * ENTRY_BYTES
            if dirty_flagged(img[off:off + ENTRY_BYTES], s, sb.gen):
                bad.append((s, mb))
    return bad


def dirty_versions(slot_entries):
    """The committed dirty versions of each origin block, from (slot,
    Entry) pairs (entries()): ({block: [(epoch, slot), ...] oldest first,
    the last one the block's data}, [(block, epoch, [slots]), ...] the
    duplicates: dirty entries of one block and one epoch, which the module
    refuses, as it refuses two of one block in versions 1 and 2, where
    every epoch is 0)."""
    by = {}
    for s, e in slot_entries:
        if e.state == DIRTY:
            by.setdefault(e.block, []).append((e.epoch, s))
    dups = []
    for b, vs in by.items():
        vs.sort()
        for ep in sorted({ep for ep, _ in vs}):
            slots = [s for x, s in vs if x == ep]
            if len(slots) > 1:
                dups.append((b, ep, slots))
    return by, sorted(dups)


# ---------------------------------------------------------------- encoding (tests)

def encode_entry(slot, block, dirty, seq, gen, epoch=0):
    """An entry as tc_de_encode writes it (@epoch: of a dirty version, its
    low 16 bits written; ignored for a clean entry)."""
    flags = DE_VALID | (DE_DIRTY | (epoch & 0xFFFF) << DE_EPOCH_SHIFT if dirty else 0)
    raw = ENTRY.pack(block, seq, slot & 0xFFFFFFFF, flags, 0, gen)
    return raw[:ENTRY_CSUM_OFF] + struct.pack("<I", crc32c(raw)) + raw[ENTRY_CSUM_OFF + 4:]


def encode_sum(index, gen, bits):
    """Summary block number @index of generation @gen with the bit numbers
    @bits set, as tc_sum_seal writes it."""
    raw = bytearray(MBLOCK)
    for j in bits:
        raw[16 + j // 8] |= 1 << (j % 8)
    raw[:16] = SUM.pack(gen, index, 0, 0)
    raw[SUM_CSUM_OFF:SUM_CSUM_OFF + 4] = struct.pack("<I", crc32c(bytes(raw)))
    return bytes(raw)


def downgrade(img, version):
    """The image @img (bytes from sector 0 to the device's end) of a version
    4 cache, rewritten as a cache of @version (2 or 3) with the same
    entries, data and generation: the layout without a summary (the data
    moved down, the slots version 4 did not have left empty) and a
    superblock of that version (epoch 0 in version 2, which must then hold
    no dirty version above epoch 0).  What the modules of those versions
    made, for tests of their upgrade."""
    sb = decode_sb(img[:512])
    assert sb.ok and sb.version == VERSION and version in (VERSION_V2, VERSION_V3), sb
    assert version > VERSION_V2 or sb.epoch == 0, sb
    n, ds = layout(len(img) // 512, sb.block_sectors, version)
    assert n >= sb.nr_slots, (n, sb)
    size = sb.nr_slots * sb.block_sectors * 512
    out = bytearray(img)
    out[ds * 512:ds * 512 + size] = img[sb.data_start * 512:sb.data_start * 512 + size]
    for slot in range(sb.nr_slots, n):
        out[entry_offset(slot):entry_offset(slot) + ENTRY_BYTES] = ZERO_ENTRY
    out[:SB_BYTES] = encode_sb(n, sb.block_sectors, sb.commit_seq, sb.origin_sectors, sb.gen,
                               sb.uuid.encode(), version=version, flags=sb.flags,
                               epoch=sb.epoch if version > VERSION_V2 else 0)
    return bytes(out)


def encode_sb(nr_slots, block_sectors, commit_seq, origin_sectors, gen, uuid=b"",
              version=VERSION, flags=0, epoch=0):
    """A superblock as tc_sb_encode writes it (@version 3: a cache without a
    summary; 1 or 2: as the code of that version wrote it; @epoch must then
    be 0, and @gen 0 in version 1)."""
    raw = SB.pack(MAGIC, version, 0, commit_seq, block_sectors, flags, nr_slots, META_START,
                  data_start(nr_slots, block_sectors, version), origin_sectors,
                  uuid.ljust(128, b"\0"), gen, 0, epoch, bytes(304))
    return raw[:SB_CSUM_OFF] + struct.pack("<I", crc32c(raw)) + raw[SB_CSUM_OFF + 4:]
