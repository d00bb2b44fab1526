/* SPDX-License-Identifier: GPL-2.0 */
/*
 * dm-tiercache: the on-disk format of the cache device.
 *
 * One definition for the module and the userspace tools (check, dump,
 * offline writeback), which build tc_disk.c on the host.  Everything on
 * disk is little-endian.
 *
 * Layout, in 512-byte sectors:
 *
 *   0                      superblock (struct tc_disk_sb, one sector used)
 *   TC_META_START          entries: one struct tc_disk_entry per slot,
 *                          TC_ENTRIES_PER_MBLOCK to a 4 KiB metadata block
 *   sum_start              version 4: the summary, sum_blocks 4 KiB blocks
 *                          (struct tc_disk_sum), right after the entries
 *   data_start             slot 0, slot 1, ... (block_sectors each)
 *
 * data_start is the end of the entries (version 4: of the summary) rounded
 * up to the block size.
 *
 * Crash consistency rests on three rules kept by the module:
 * - an entry says "dirty block B" only once the slot holds data of B, and
 *   the data is made durable (cache device flush) before entries are
 *   written;
 * - a commit writes the changed metadata blocks, flushes, then writes the
 *   superblock with the new commit_seq (FUA); entries carry the commit_seq
 *   that wrote them, and an entry newer than the superblock belongs to a
 *   commit that did not finish and is ignored;
 * - a slot that is dirty on disk is not reused before a commit has
 *   recorded it clean.
 * Clean entries are recorded but not loaded: after a restart the cache
 * holds the committed dirty blocks.
 *
 * Format generation (version 2).  A format writes the superblock only: it
 * does not clear the entry area, which holds whatever the device held
 * before (entries of an earlier format, a file system, anything).  The
 * superblock carries a 32-bit generation, and every entry the module
 * writes carries the generation of its superblock.  An entry is *ours*
 * only if its gen equals the superblock's and its slot field equals its
 * own index; an all-zero entry is empty, and any other entry is *foreign*
 * (TC_DE_FOREIGN) and reads as empty too, with two exceptions below (a
 * damaged identity word, a misplaced entry).  Only our entries are checked
 * further (checksum, flags, block, sequence): leftover bytes do not make a
 * load fail, while a corrupt entry of this generation still does.
 *
 * Why leftovers cannot pass for ours:
 * - bytes that tiercache did not write match in gen (32 bits) and slot
 *   (32 bits) with probability 2^-64 per entry if they look random (2^-32
 *   for a full 2^32-slot area, per load), and the generation is not a
 *   value other data can follow: the first format of a device takes a
 *   random one.  Such an entry would then fail its checksum and the
 *   load; to be loaded as a dirty block it must pass the CRC-32C too
 *   (2^-96 per entry in all) and the flags check;
 * - entries of earlier formats: a format over a valid superblock takes
 *   the next generation (skipping 0), so their gens are all older; they
 *   come back only after 2^32 formats of one device;
 * - entries of a cache whose superblock was wiped or torn: the new random
 *   generation equals theirs with probability 2^-32 per such format.
 * Generation 0 is never chosen: it is the generation of version 1 caches.
 *
 * The exceptions.  Damage to the gen or slot word of one of our entries
 * would make it foreign and drop its block silently, and a metadata block
 * of this generation written in another block's place would read as free
 * slots.  So a non-zero entry that is not ours is tested further, with its
 * CRC-32C:
 * - it holds as stored: a well-formed entry.  Of another generation, it
 *   is foreign (an earlier format's, in its place or not); of this
 *   generation, its slot word names another slot: TC_DE_BAD_SLOT (a
 *   misdirected write, of a 4 KiB block or of a sector);
 * - it holds with the superblock's gen and the own index put in, and one
 *   of the two words already matched: one of ours damaged in the other
 *   word only (any bits of it): TC_DE_BAD_CSUM, as before version 2;
 * - else foreign.
 * The CRC-32C detects every error within 32 consecutive bits, so no entry
 * passes it under two values of one word: a genuine entry of an earlier
 * generation passes as stored and never with this gen put in, so it is
 * never refused (one that has rotted too is refused if the rot makes its
 * gen word ours, or with probability 2^-32 if rot and new gen cancel in
 * the CRC).  Leftover bytes that look random are refused with probability
 * 2^-64 per entry (2^-32 for a full 2^32-slot area): they must match the
 * gen or the slot word (2^-32) and pass the CRC-32C (2^-32), as stored if
 * the gen matched, or with the other word put in.  Entries of an old
 * cache moved by a new layout of the device (a partition start changed)
 * are misplaced only if the new random generation is theirs (2^-32 per
 * such format).  Not detected: one of ours damaged in both words, or in
 * one and another field (it reads as foreign), and a misdirected block of
 * empty (all-zero) entries.
 *
 * Version 1 (no generation: the superblock's gen was reserved and zero,
 * the entry's gen word was reserved and zero, and a format zeroed the
 * entry area) decodes as generation 0, under the same rule.
 *
 * Epochs (version 3).  An epoch is the set of writes the cached device
 * received between two REQ_PREFLUSH.  Each committed dirty entry records
 * the epoch of its dirty version: the low 16 bits in bits 16..31 of its
 * flags (TC_DE_EPOCH_MASK; 0 in a clean entry).  The superblock's epoch is
 * a lower bound of the epochs of its committed dirty entries (the module
 * writes the oldest epoch live when the commit began), and an entry is
 * never older than that: tc_disk_epoch() gives its absolute epoch, from
 * the superblock's epoch up to 2^16 - 1 past it.  One origin block may be
 * dirty in several slots, one version per epoch (copy on write under the
 * ordered writeback policy): the version of the newest epoch is the
 * block's data, older ones are written back first.  Two committed dirty
 * entries of one block with the same absolute epoch are corruption, as
 * two dirty entries of one block are in versions 1 and 2.
 *
 * A version 1 or 2 cache decodes as superblock epoch 0 with every entry of
 * epoch 0 (epoch bits in one of its entries are invalid flags), and
 * becomes version 3 at its first commit, keeping its generation.
 *
 * The summary (version 4).  One bit per metadata block: "may hold a dirty
 * entry", so that a load reads the summary and then only the marked
 * blocks, in time proportional to what is dirty rather than to the cache
 * size.  It sits between the entries and the data, so only a format
 * makes a cache of version 4 (tc_disk_layout()); a version 3 cache keeps
 * its layout and the full scan.  Summary block k covers metadata blocks
 * [k * TC_SUM_BITS, (k + 1) * TC_SUM_BITS), bit j of the block in byte
 * j / 8, bit j % 8.  The rule the module keeps:
 *   every metadata block holding one of our entries with the DIRTY flag
 *   (committed or not) has its bit set in a summary block of this
 *   generation that was durable before that entry was written.
 * So a bit is set, and its summary block written with REQ_FUA, before the
 * commit that first writes a dirty entry into its metadata block writes
 * that block; and it is cleared only once the metadata block's last
 * complete write left no dirty entry in it.  A format writes every
 * summary block, all clear, in its new generation, before its superblock
 * (at most 1029 blocks, 4 MiB, for 2^32 slots).  So a summary block
 * decodes (tc_sum_decode()) as its bits only if it is of this generation
 * and index with a right checksum; anything else (torn, damaged, zeroed,
 * misplaced, of another format) reads as "bad": every bit of its range
 * set, and the load reads those blocks (a damaged summary costs reads,
 * never data).
 */
#ifndef DM_TIERCACHE_DISK_H
#define DM_TIERCACHE_DISK_H

#ifdef __KERNEL__
#include <linux/types.h>
#include <asm/byteorder.h>
#else
#include <stdint.h>
#include <stddef.h>
#include <stdbool.h>
#include <endian.h>
typedef uint8_t u8;
typedef uint16_t u16;
typedef uint32_t u32;
typedef uint64_t u64;
typedef uint8_t __u8;
typedef uint32_t __le32;
typedef uint64_t __le64;
#define cpu_to_le32(x)	htole32(x)
#define cpu_to_le64(x)	htole64(x)
#define le32_to_cpu(x)	le32toh(x)
#define le64_to_cpu(x)	le64toh(x)
#endif

#define TC_DISK_MAGIC		"TIERCACH"
#define TC_DISK_VERSION		4	/* written by a format: v3 + summary */
#define TC_DISK_VERSION_V3	3	/* still read and written: no summary */
#define TC_DISK_VERSION_V2	2	/* still read: no epochs (all 0) */
#define TC_DISK_VERSION_V1	1	/* still read, as generation 0 */

#define TC_SB_SECTORS		8		/* reserved for the superblock */
#define TC_META_START		TC_SB_SECTORS
#define TC_MBLOCK_BYTES		4096
#define TC_MBLOCK_SECTORS	(TC_MBLOCK_BYTES >> 9)
#define TC_UUID_BYTES		128
#define TC_MAX_SLOTS		0xffffffffULL	/* slot numbers are 32-bit */
/*
 * commit_seq and epoch are counters a load goes on from: a superblock with
 * either at 2^63 or above is refused, so that neither can wrap (at one
 * commit a microsecond, 2^63 takes 292,000 years).
 */
#define TC_SB_COUNTER_LIMIT	(1ULL << 63)

struct tc_disk_sb {
	__u8 magic[8];			/* TC_DISK_MAGIC, no NUL */
	__le32 version;
	__le32 csum;			/* crc32c of the sector, csum = 0 */
	__le64 commit_seq;		/* last complete commit */
	__le32 block_sectors;
	__le32 flags;			/* TC_SB_*: no other bit may be set */
	__le64 nr_slots;
	__le64 meta_start;		/* sector of the first entry */
	__le64 data_start;		/* sector of slot 0 */
	__le64 origin_sectors;		/* length of the cached origin */
	__u8 uuid[TC_UUID_BYTES];	/* dm uuid of the device, NUL padded */
	__le32 gen;			/* format generation (v1: reserved, 0) */
	__le32 pad;			/* 0: aligns epoch */
	__le64 epoch;			/* dirty epochs >= it (v1, v2: 0) */
	__u8 reserved[304];
};

/*
 * Superblock flags.  TC_SB_FAILED: the module saw the cache device fail
 * (docs/tiercache.rst, "Failure handling") and wrote this mark, if it
 * still could.  The writes acknowledged since went around the cache, so
 * the origin may hold newer data than the dirty blocks recorded here: the
 * module refuses to load such a cache (format it; 'tiercache writeback
 * --force' writes its dirty blocks back offline if the administrator
 * knows better).  Modules that predate the flag refuse it as an
 * impossible field, which is what it asks for.
 */
#define TC_SB_FAILED		1u
#define TC_SB_KNOWN_FLAGS	TC_SB_FAILED

/* entry flags */
#define TC_DE_VALID		1u	/* the slot holds a block */
#define TC_DE_DIRTY		2u	/* ... newer than the origin */
/* v3: the low 16 bits of a dirty version's epoch (0 in a clean entry) */
#define TC_DE_EPOCH_SHIFT	16
#define TC_DE_EPOCH_MASK	0xffff0000u

struct tc_disk_entry {
	__le64 block;			/* origin block */
	__le64 seq;			/* commit that wrote the entry */
	__le32 slot;			/* own slot number */
	__le32 flags;			/* TC_DE_* */
	__le32 csum;			/* crc32c of the entry, csum = 0 */
	__le32 gen;			/* format generation (v1: reserved, 0) */
};

#define TC_ENTRIES_PER_MBLOCK	(TC_MBLOCK_BYTES / sizeof(struct tc_disk_entry))

/* A summary block (version 4): one bit per metadata block. */
#define TC_SUM_HDR_BYTES	16
#define TC_SUM_BYTES		(TC_MBLOCK_BYTES - TC_SUM_HDR_BYTES)
#define TC_SUM_BITS		(TC_SUM_BYTES * 8)	/* metadata blocks */

struct tc_disk_sum {
	__le32 gen;			/* format generation */
	__le32 index;			/* own number in the summary */
	__le32 csum;			/* crc32c of the block, csum = 0 */
	__le32 reserved;		/* 0 */
	__u8 bits[TC_SUM_BYTES];
};

enum tc_sum_result {
	TC_SUM_OK,		/* this generation's: its bits */
	TC_SUM_BAD,		/* anything else: read as all set */
};

struct tc_layout {
	u32 block_sectors;
	u64 nr_slots;
	u64 meta_start;
	u64 meta_blocks;		/* 4 KiB metadata blocks */
	u64 sum_start;			/* version 4; else 0 */
	u64 sum_blocks;			/* 4 KiB summary blocks; 0: none */
	u64 data_start;
};

/* What a superblock holds, decoded. */
struct tc_sb_info {
	struct tc_layout layout;
	u64 commit_seq;
	u64 origin_sectors;
	u32 version;			/* as read; tc_sb_encode: the layout's */
	u32 gen;			/* format generation */
	u32 flags;			/* TC_SB_* */
	u64 epoch;			/* dirty epochs >= it (v1, v2: 0) */
	char uuid[TC_UUID_BYTES + 1];
};

enum tc_sb_result {
	TC_SB_OK,
	TC_SB_BLANK,		/* no magic: never formatted */
	TC_SB_BAD_CSUM,		/* magic, but torn or corrupt */
	TC_SB_BAD_VERSION,	/* a format this code does not know */
	TC_SB_BAD_FIELDS,	/* checksum fine, values impossible */
};

enum tc_de_result {
	TC_DE_EMPTY,		/* all zero: a free slot */
	TC_DE_FOREIGN,		/* another generation's, or leftover bytes */
	TC_DE_CLEAN,
	TC_DE_DIRTY_OK,		/* a committed dirty block */
	TC_DE_UNCOMMITTED,	/* written by a commit that did not end */
	TC_DE_BAD_CSUM,		/* of ours: any field, or gen or slot alone */
	TC_DE_BAD_SLOT,		/* this generation's, another slot's (moved) */
	TC_DE_BAD_FLAGS,
	TC_DE_BAD_BLOCK,	/* beyond the origin */
};

struct tc_de_info {
	u64 block;
	u64 seq;
	bool dirty;
	u16 epoch;			/* low bits (tc_disk_epoch); clean: 0 */
};

/*
 * The absolute epoch of an entry whose epoch bits are @e, under a
 * superblock of epoch @sb_epoch: entries are never older than the
 * superblock's epoch, so @e is the first epoch from @sb_epoch on with
 * those low 16 bits.
 */
static inline u64 tc_disk_epoch(u64 sb_epoch, u16 e)
{
	return sb_epoch + (u16)(e - (u16)sb_epoch);
}

u32 tc_disk_crc(const void *p, size_t len);

int tc_disk_layout(u64 cache_sectors, u32 block_sectors, struct tc_layout *l);
int tc_disk_layout_v(u64 cache_sectors, u32 block_sectors, u32 version,
		     struct tc_layout *l);
u32 tc_disk_layout_version(const struct tc_layout *l);
u64 tc_disk_meta_blocks(u64 nr_slots);
u64 tc_disk_sum_blocks(u64 meta_blocks);

void tc_sb_encode(struct tc_disk_sb *sb, const struct tc_sb_info *i);
enum tc_sb_result tc_sb_decode(const struct tc_disk_sb *sb,
			       struct tc_sb_info *i);
const char *tc_sb_result_str(enum tc_sb_result r);

void tc_de_encode(struct tc_disk_entry *d, u64 slot, u64 block, bool dirty,
		  u64 seq, u32 gen, u16 epoch);
void tc_de_encode_empty(struct tc_disk_entry *d);
enum tc_de_result tc_de_decode(const struct tc_disk_entry *d, u64 slot,
			       u64 nr_blocks, u64 commit_seq, u32 gen,
			       u32 version, struct tc_de_info *i);
bool tc_de_free(enum tc_de_result r);
const char *tc_de_result_str(enum tc_de_result r);

void tc_sum_seal(struct tc_disk_sum *s, u32 index, u32 gen);
enum tc_sum_result tc_sum_decode(const struct tc_disk_sum *s, u32 index,
				 u32 gen);
const char *tc_sum_result_str(enum tc_sum_result r);

static inline bool tc_sum_test(const struct tc_disk_sum *s, u32 j)
{
	return s->bits[j / 8] >> (j % 8) & 1;
}

static inline void tc_sum_set(struct tc_disk_sum *s, u32 j)
{
	s->bits[j / 8] |= 1u << (j % 8);
}

#endif /* DM_TIERCACHE_DISK_H */
