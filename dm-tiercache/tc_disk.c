// SPDX-License-Identifier: GPL-2.0
/*
 * dm-tiercache: encoding and checking of the on-disk format (tc_disk.h).
 *
 * Pure functions over buffers: the module, the host unit tests, the
 * fuzzer and the userspace tool build this same file.
 */
#ifdef __KERNEL__
#include <linux/crc32c.h>
#include <linux/stddef.h>
#include <linux/string.h>
#else
#include <stddef.h>
#include <string.h>
#endif

#include "tc_disk.h"

/* The on-disk layout, the same for every compiler that builds this file */
_Static_assert(sizeof(struct tc_disk_sb) == 512, "superblock: one sector");
_Static_assert(offsetof(struct tc_disk_sb, gen) == 192, "v2 field moved");
_Static_assert(offsetof(struct tc_disk_sb, epoch) == 200, "v3 field moved");
_Static_assert(sizeof(struct tc_disk_entry) == 32, "entry: 32 bytes");
_Static_assert(sizeof(struct tc_disk_sum) == TC_MBLOCK_BYTES, "summary block");
_Static_assert(offsetof(struct tc_disk_sum, bits) == TC_SUM_HDR_BYTES,
	       "summary header");

/* CRC-32C (Castagnoli) state update, no initial value or final XOR */
#ifdef __KERNEL__
static u32 tc_crc_update(u32 crc, const void *p, size_t len)
{
	return crc32c(crc, p, len);
}
#else
/* reflected polynomial 0x82f63b78, bitwise */
static u32 tc_crc_update(u32 crc, const void *p, size_t len)
{
	const u8 *b = p;
	int k;

	while (len--) {
		crc ^= *b++;
		for (k = 0; k < 8; k++)
			crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1)));
	}
	return crc;
}
#endif

u32 tc_disk_crc(const void *p, size_t len)
{
	return ~tc_crc_update(~0u, p, len);
}

u64 tc_disk_meta_blocks(u64 nr_slots)
{
	return (nr_slots + TC_ENTRIES_PER_MBLOCK - 1) / TC_ENTRIES_PER_MBLOCK;
}

u64 tc_disk_sum_blocks(u64 meta_blocks)
{
	return (meta_blocks + TC_SUM_BITS - 1) / TC_SUM_BITS;
}

/* Where the summary starts and ends, and slot 0 (version 4: a summary). */
static void tc_disk_areas(u64 nr_slots, u32 block_sectors, u32 version,
			  struct tc_layout *l)
{
	u64 end;

	l->block_sectors = block_sectors;
	l->nr_slots = nr_slots;
	l->meta_start = TC_META_START;
	l->meta_blocks = tc_disk_meta_blocks(nr_slots);
	end = TC_META_START + l->meta_blocks * TC_MBLOCK_SECTORS;
	l->sum_start = 0;
	l->sum_blocks = 0;
	if (version >= TC_DISK_VERSION) {
		l->sum_start = end;
		l->sum_blocks = tc_disk_sum_blocks(l->meta_blocks);
		end += l->sum_blocks * TC_MBLOCK_SECTORS;
	}
	l->data_start = (end + block_sectors - 1) / block_sectors *
			block_sectors;
}

static u64 tc_data_start(u64 nr_slots, u32 block_sectors, u32 version)
{
	struct tc_layout l;

	tc_disk_areas(nr_slots, block_sectors, version, &l);
	return l.data_start;
}

static bool tc_block_size_ok(u32 block_sectors)
{
	return block_sectors >= 8 && block_sectors <= 2048 &&
	       !(block_sectors & (block_sectors - 1));
}

/*
 * The most slots a device of @cache_sectors holds with its metadata, in the
 * layout of format @version (1 to 3: no summary; 4: a summary).  Returns 0,
 * or -1 if not even one slot fits.
 */
int tc_disk_layout_v(u64 cache_sectors, u32 block_sectors, u32 version,
		     struct tc_layout *l)
{
	u64 n;

	if (!tc_block_size_ok(block_sectors) ||
	    cache_sectors <= TC_META_START + TC_MBLOCK_SECTORS)
		return -1;
	/* a first guess counting a 32-byte entry per slot, then step down */
	n = (cache_sectors - TC_META_START) * 512 /
	    ((u64)block_sectors * 512 + sizeof(struct tc_disk_entry));
	if (n > TC_MAX_SLOTS)
		n = TC_MAX_SLOTS;	/* slot numbers are 32-bit on disk */
	while (n && tc_data_start(n, block_sectors, version) +
		    n * block_sectors > cache_sectors)
		n--;
	if (!n)
		return -1;
	tc_disk_areas(n, block_sectors, version, l);
	return 0;
}

/* The layout a format writes (the current version's). */
int tc_disk_layout(u64 cache_sectors, u32 block_sectors, struct tc_layout *l)
{
	return tc_disk_layout_v(cache_sectors, block_sectors, TC_DISK_VERSION,
				l);
}

/*
 * The version a superblock of layout @l is written in: 4 with a summary,
 * else 3 (a version 1 or 2 cache is upgraded in place to 3).
 */
u32 tc_disk_layout_version(const struct tc_layout *l)
{
	return l->sum_blocks ? TC_DISK_VERSION : TC_DISK_VERSION_V3;
}

void tc_sb_encode(struct tc_disk_sb *sb, const struct tc_sb_info *i)
{
	size_t n = strnlen(i->uuid, TC_UUID_BYTES);

	memset(sb, 0, sizeof(*sb));
	memcpy(sb->magic, TC_DISK_MAGIC, sizeof(sb->magic));
	sb->version = cpu_to_le32(tc_disk_layout_version(&i->layout));
	sb->commit_seq = cpu_to_le64(i->commit_seq);
	sb->block_sectors = cpu_to_le32(i->layout.block_sectors);
	sb->nr_slots = cpu_to_le64(i->layout.nr_slots);
	sb->meta_start = cpu_to_le64(i->layout.meta_start);
	sb->data_start = cpu_to_le64(i->layout.data_start);
	sb->origin_sectors = cpu_to_le64(i->origin_sectors);
	memcpy(sb->uuid, i->uuid, n);
	sb->gen = cpu_to_le32(i->gen);
	sb->epoch = cpu_to_le64(i->epoch);
	sb->flags = cpu_to_le32(i->flags);
	sb->csum = cpu_to_le32(tc_disk_crc(sb, sizeof(*sb)));
}

static bool tc_sb_fields_ok(const struct tc_disk_sb *sb,
			    const struct tc_sb_info *i)
{
	const struct tc_layout *l = &i->layout;
	size_t k;

	if ((i->flags & ~TC_SB_KNOWN_FLAGS) ||
	    !tc_block_size_ok(l->block_sectors))
		return false;
	if (!l->nr_slots || l->nr_slots > TC_MAX_SLOTS ||
	    l->meta_start != TC_META_START || !i->origin_sectors)
		return false;
	if (l->data_start != tc_data_start(l->nr_slots, l->block_sectors,
					   i->version))
		return false;
	for (k = 0; k < sizeof(sb->reserved); k++)
		if (sb->reserved[k])
			return false;
	if (sb->pad)
		return false;
	if (i->commit_seq >= TC_SB_COUNTER_LIMIT ||
	    i->epoch >= TC_SB_COUNTER_LIMIT)
		return false;
	/* versions 1 and 2: the epoch was reserved; version 1: the gen too */
	if (i->version <= TC_DISK_VERSION_V2 && i->epoch)
		return false;
	return i->version != TC_DISK_VERSION_V1 || !i->gen;
}

enum tc_sb_result tc_sb_decode(const struct tc_disk_sb *sb,
			       struct tc_sb_info *i)
{
	struct tc_disk_sb tmp;
	u32 version;

	if (memcmp(sb->magic, TC_DISK_MAGIC, sizeof(sb->magic)))
		return TC_SB_BLANK;
	tmp = *sb;
	tmp.csum = 0;
	if (tc_disk_crc(&tmp, sizeof(tmp)) != le32_to_cpu(sb->csum))
		return TC_SB_BAD_CSUM;
	version = le32_to_cpu(sb->version);
	if (version < TC_DISK_VERSION_V1 || version > TC_DISK_VERSION)
		return TC_SB_BAD_VERSION;
	memset(i, 0, sizeof(*i));
	i->version = version;
	i->gen = le32_to_cpu(sb->gen);
	i->epoch = le64_to_cpu(sb->epoch);
	i->flags = le32_to_cpu(sb->flags);
	i->commit_seq = le64_to_cpu(sb->commit_seq);
	i->origin_sectors = le64_to_cpu(sb->origin_sectors);
	i->layout.block_sectors = le32_to_cpu(sb->block_sectors);
	i->layout.nr_slots = le64_to_cpu(sb->nr_slots);
	i->layout.meta_start = le64_to_cpu(sb->meta_start);
	i->layout.data_start = le64_to_cpu(sb->data_start);
	memcpy(i->uuid, sb->uuid, TC_UUID_BYTES);
	i->uuid[TC_UUID_BYTES] = 0;
	if (!tc_sb_fields_ok(sb, i))
		return TC_SB_BAD_FIELDS;
	tc_disk_areas(i->layout.nr_slots, i->layout.block_sectors, version,
		      &i->layout);
	return TC_SB_OK;
}

const char *tc_sb_result_str(enum tc_sb_result r)
{
	switch (r) {
	case TC_SB_OK:
		return "valid";
	case TC_SB_BLANK:
		return "no tiercache superblock (never formatted)";
	case TC_SB_BAD_CSUM:
		return "superblock checksum mismatch (torn or corrupt)";
	case TC_SB_BAD_VERSION:
		return "unknown format version";
	case TC_SB_BAD_FIELDS:
		return "superblock fields out of range";
	}
	return "unknown";
}

/*
 * Encode the entry of @slot: @block, clean or @dirty (a version of epoch
 * @epoch, its low 16 bits; ignored for a clean entry), written by commit
 * @seq under format generation @gen.
 */
void tc_de_encode(struct tc_disk_entry *d, u64 slot, u64 block, bool dirty,
		  u64 seq, u32 gen, u16 epoch)
{
	u32 flags = TC_DE_VALID;

	if (dirty)
		flags |= TC_DE_DIRTY | (u32)epoch << TC_DE_EPOCH_SHIFT;
	memset(d, 0, sizeof(*d));
	d->block = cpu_to_le64(block);
	d->seq = cpu_to_le64(seq);
	d->slot = cpu_to_le32((u32)slot);
	d->flags = cpu_to_le32(flags);
	d->gen = cpu_to_le32(gen);
	d->csum = cpu_to_le32(tc_disk_crc(d, sizeof(*d)));
}

void tc_de_encode_empty(struct tc_disk_entry *d)
{
	memset(d, 0, sizeof(*d));
}

static bool tc_de_is_zero(const struct tc_disk_entry *d)
{
	static const struct tc_disk_entry zero;

	return !memcmp(d, &zero, sizeof(*d));
}

/* The CRC-32C of @d with its checksum zero and @slot and @gen put in. */
static u32 tc_de_crc(const struct tc_disk_entry *d, __le32 slot, __le32 gen)
{
	struct tc_disk_entry tmp = *d;

	tmp.slot = slot;
	tmp.gen = gen;
	tmp.csum = 0;
	return tc_disk_crc(&tmp, sizeof(tmp));
}

/*
 * A non-zero entry of @slot that is not ours under generation @gen (its
 * gen or slot word differs): foreign, unless it is an entry of this
 * generation that was damaged or written in the wrong place (tc_disk.h).
 */
static enum tc_de_result tc_de_decode_other(const struct tc_disk_entry *d,
					    u32 slot, u32 gen)
{
	const __le32 own_slot = cpu_to_le32(slot), own_gen = cpu_to_le32(gen);
	const u32 csum = le32_to_cpu(d->csum);

	/*
	 * Generation 0 is version 1's, whose format zeroed the entry area:
	 * nothing in it can be foreign, a non-zero entry not ours is damaged.
	 */
	if (!gen)
		return d->slot != own_slot ? TC_DE_BAD_SLOT : TC_DE_BAD_FLAGS;
	/* well formed as it stands: an older generation's, or misplaced */
	if (tc_de_crc(d, d->slot, d->gen) == csum)
		return d->gen == own_gen ? TC_DE_BAD_SLOT : TC_DE_FOREIGN;
	/* one word of ours damaged: the checksum holds with it put back */
	if ((d->slot == own_slot || d->gen == own_gen) &&
	    tc_de_crc(d, own_slot, own_gen) == csum)
		return TC_DE_BAD_CSUM;
	return TC_DE_FOREIGN;
}

/*
 * Decode the entry of @slot under a superblock of generation @gen and
 * format version @version.  Only an entry of that generation naming its
 * own slot is checked further: any other non-zero entry is foreign (left
 * by an earlier format, or bytes the device held before), a free slot
 * like an all-zero one, unless it is one of ours with its gen or slot
 * word damaged (a checksum mismatch) or one of this generation for
 * another slot (misplaced).  Epoch bits are valid in a dirty entry of
 * version 3 only; @i->epoch gets them (tc_disk_epoch makes them absolute).
 */
enum tc_de_result tc_de_decode(const struct tc_disk_entry *d, u64 slot,
			       u64 nr_blocks, u64 commit_seq, u32 gen,
			       u32 version, struct tc_de_info *i)
{
	u32 flags, epoch;

	if (tc_de_is_zero(d))
		return TC_DE_EMPTY;
	if (le32_to_cpu(d->gen) != gen || le32_to_cpu(d->slot) != (u32)slot)
		return tc_de_decode_other(d, (u32)slot, gen);
	if (tc_de_crc(d, d->slot, d->gen) != le32_to_cpu(d->csum))
		return TC_DE_BAD_CSUM;
	flags = le32_to_cpu(d->flags) & ~TC_DE_EPOCH_MASK;
	epoch = le32_to_cpu(d->flags) >> TC_DE_EPOCH_SHIFT;
	if (!(flags & TC_DE_VALID) || (flags & ~(TC_DE_VALID | TC_DE_DIRTY)))
		return TC_DE_BAD_FLAGS;
	/* an epoch belongs to a dirty version, and versions 1, 2 had none */
	if (epoch && (!(flags & TC_DE_DIRTY) || version <= TC_DISK_VERSION_V2))
		return TC_DE_BAD_FLAGS;
	i->block = le64_to_cpu(d->block);
	i->seq = le64_to_cpu(d->seq);
	i->dirty = flags & TC_DE_DIRTY;
	i->epoch = (u16)epoch;
	if (i->block >= nr_blocks)
		return TC_DE_BAD_BLOCK;
	if (i->seq > commit_seq)
		return TC_DE_UNCOMMITTED;
	return i->dirty ? TC_DE_DIRTY_OK : TC_DE_CLEAN;
}

/* Does the slot of an entry decoded as @r hold nothing? */
bool tc_de_free(enum tc_de_result r)
{
	return r == TC_DE_EMPTY || r == TC_DE_FOREIGN;
}

const char *tc_de_result_str(enum tc_de_result r)
{
	switch (r) {
	case TC_DE_EMPTY:
		return "empty";
	case TC_DE_FOREIGN:
		return "foreign (another format generation's, or leftover bytes: empty)";
	case TC_DE_CLEAN:
		return "clean";
	case TC_DE_DIRTY_OK:
		return "dirty";
	case TC_DE_UNCOMMITTED:
		return "uncommitted (newer than the superblock: ignored)";
	case TC_DE_BAD_CSUM:
		return "checksum mismatch";
	case TC_DE_BAD_SLOT:
		return "slot number does not match its position (misdirected write)";
	case TC_DE_BAD_FLAGS:
		return "invalid flags";
	case TC_DE_BAD_BLOCK:
		return "origin block beyond the origin";
	}
	return "unknown";
}

/* ---- the summary (version 4) ---- */

/* The CRC-32C of @s with its checksum zero and @index and @gen put in. */
static u32 tc_sum_crc(const struct tc_disk_sum *s, __le32 index, __le32 gen)
{
	struct tc_disk_sum_hdr {
		__le32 gen, index, csum, reserved;
	} h = { gen, index, 0, s->reserved };

	return ~tc_crc_update(tc_crc_update(~0u, &h, sizeof(h)), s->bits,
			      sizeof(s->bits));
}

/* Give summary block @s, whose bits are set, its identity and checksum. */
void tc_sum_seal(struct tc_disk_sum *s, u32 index, u32 gen)
{
	s->gen = cpu_to_le32(gen);
	s->index = cpu_to_le32(index);
	s->reserved = 0;
	s->csum = cpu_to_le32(tc_sum_crc(s, s->index, s->gen));
}

/*
 * What summary block number @index says under format generation @gen
 * (tc_disk.h, "The summary"): its bits only if it is of this generation
 * and index, with a right checksum and reserved word; anything else
 * (torn, damaged, misplaced, zeroed, another format's) reads as all set.
 */
enum tc_sum_result tc_sum_decode(const struct tc_disk_sum *s, u32 index,
				 u32 gen)
{
	if (s->gen != cpu_to_le32(gen) || s->index != cpu_to_le32(index) ||
	    s->reserved || tc_sum_crc(s, s->index, s->gen) != le32_to_cpu(s->csum))
		return TC_SUM_BAD;
	return TC_SUM_OK;
}

const char *tc_sum_result_str(enum tc_sum_result r)
{
	switch (r) {
	case TC_SUM_OK:
		return "valid";
	case TC_SUM_BAD:
		return "torn, damaged or not of this format (read as all set)";
	}
	return "unknown";
}
