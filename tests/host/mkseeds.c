// SPDX-License-Identifier: GPL-2.0
/*
 * Seed corpus for fuzz_disk: cache device images written with the module's
 * encoder (dm-tiercache/tc_disk.c), cut after the entry area (the slot data
 * does not matter to the decoder).  Most are valid; a few carry a wrong
 * value under a valid checksum (an unknown version, impossible fields,
 * entries with a wrong slot, flags or generation, blocks beyond the
 * origin), which random mutation alone rarely produces.  Also: a version 1
 * image (generation 0), entries of the previous generation among the
 * current ones, an entry area full of garbage around valid entries,
 * entries damaged in their generation or slot word (no checksum fixed),
 * a metadata block written in another block's place, a superblock marked
 * failed and one with a flag bit the decoder does not know.  Epochs
 * (version 3): versions of one block in several epochs around a 16-bit
 * wrap of the epoch bits, the same entries under a version 2 superblock
 * (where epoch bits are invalid), a version 2 image, and clean entries
 * with epoch bits.
 *
 *   mkseeds DIR
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tc_disk_test.h"

struct seed_entry {
	u64 slot, block;
	bool dirty;
	u64 seq;
	u64 epoch;		/* of a dirty version (its low bits written) */
};

/* What to spoil in a seed, keeping valid checksums. */
enum spoil {
	SPOIL_NONE,
	SPOIL_SB_VERSION,	/* an unknown version */
	SPOIL_SB_FIELDS,	/* data_start off by a block */
	SPOIL_ENTRIES,		/* wrong slot, bad flags, other generation */
	SPOIL_V1,		/* version 1: generation 0 */
	SPOIL_OLD_GEN,		/* every other entry of the previous gen */
	SPOIL_GARBAGE,		/* random bytes in the free entries */
	SPOIL_IDS,		/* a bit of gen, of slot, of both flipped */
	SPOIL_MISDIRECT,	/* metadata block 1 written over block 0 */
	SPOIL_FAILED,		/* marked failed (valid: TC_SB_FAILED) */
	SPOIL_SB_FLAG,		/* a flag bit not defined */
	SPOIL_V2,		/* version 2: no epochs */
	SPOIL_SUMMARY,		/* a dirty entry's block unmarked */
	SPOIL_EPOCH_CLEAN,	/* epoch bits in the clean entries */
};

/* Random bytes in every all-zero entry (xorshift64, fixed seed). */
static void fill_garbage(struct tc_disk_entry *de, u64 nr)
{
	static const struct tc_disk_entry zero;
	u64 x = 0x2545f4914f6cdd1dull, k;
	size_t b;

	for (k = 0; k < nr; k++) {
		unsigned char *p = (unsigned char *)&de[k];

		if (memcmp(&de[k], &zero, sizeof(zero)))
			continue;
		for (b = 0; b < sizeof(zero); b++) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			p[b] = (unsigned char)x;
		}
	}
}

/*
 * Version 4: the summary marks the metadata blocks of the dirty entries
 * (SPOIL_SUMMARY: all but the first metadata block's left out).
 */
static void seal_summary(unsigned char *img, const struct tc_sb_info *i,
			 const struct seed_entry *e, int n, enum spoil spoil)
{
	const struct tc_layout *l = &i->layout;
	struct tc_disk_sum *sum;
	int k;
	u64 mb;

	if (!l->sum_blocks)
		return;
	sum = (struct tc_disk_sum *)(img + l->sum_start * 512);
	for (k = 0; k < n; k++) {
		if (!e[k].dirty || (spoil == SPOIL_SUMMARY &&
				    e[k].slot >= TC_ENTRIES_PER_MBLOCK))
			continue;
		mb = e[k].slot / TC_ENTRIES_PER_MBLOCK;
		tc_sum_set(&sum[mb / TC_SUM_BITS], mb % TC_SUM_BITS);
	}
	for (mb = 0; mb < l->sum_blocks; mb++)
		tc_sum_seal(&sum[mb], mb, i->gen);
}

static int write_seed(const char *dir, const char *name, u64 cache_sectors,
		      u32 block_sectors, u64 origin_sectors, u64 commit_seq,
		      u32 gen, u64 epoch, const char *uuid,
		      const struct seed_entry *e, int n, enum spoil spoil)
{
	struct tc_disk_sb *sb;
	struct tc_disk_entry *de;
	struct tc_sb_info i;
	unsigned char *img;
	size_t len;
	char path[4096];
	FILE *f;
	int k;

	memset(&i, 0, sizeof(i));
	/* versions 1 and 2 had version 3's layout (no summary) */
	if (tc_disk_layout_v(cache_sectors, block_sectors,
			     spoil == SPOIL_V1 || spoil == SPOIL_V2 ?
			     TC_DISK_VERSION_V3 : TC_DISK_VERSION, &i.layout)) {
		fprintf(stderr, "mkseeds: %s: no layout\n", name);
		return -1;
	}
	i.commit_seq = commit_seq;
	i.origin_sectors = origin_sectors;
	i.gen = spoil == SPOIL_V1 ? 0 : gen;
	i.epoch = spoil == SPOIL_V1 || spoil == SPOIL_V2 ? 0 : epoch;
	i.flags = spoil == SPOIL_FAILED ? TC_SB_FAILED : 0;
	snprintf(i.uuid, sizeof(i.uuid), "%s", uuid);
	len = (i.layout.meta_start + i.layout.meta_blocks * TC_MBLOCK_SECTORS +
	       i.layout.sum_blocks * TC_MBLOCK_SECTORS) * 512;
	img = calloc(1, len);
	if (!img)
		return -1;
	sb = (struct tc_disk_sb *)img;
	de = (struct tc_disk_entry *)(img + i.layout.meta_start * 512);
	tc_sb_encode(sb, &i);
	for (k = 0; k < n; k++)
		tc_de_encode(&de[e[k].slot], e[k].slot, e[k].block, e[k].dirty,
			     e[k].seq, spoil == SPOIL_OLD_GEN && k % 2 ?
			     i.gen - 1 : i.gen, (u16)e[k].epoch);
	seal_summary(img, &i, e, n, spoil);
	switch (spoil) {
	case SPOIL_NONE:
		break;
	case SPOIL_SB_VERSION:
		sb->version = cpu_to_le32(TC_DISK_VERSION + 1);
		sb_resum(sb);
		break;
	case SPOIL_SB_FIELDS:
		sb->data_start = cpu_to_le64(i.layout.data_start +
					     block_sectors);
		sb_resum(sb);
		break;
	case SPOIL_ENTRIES:
		if (n < 3)
			break;
		de[e[0].slot].slot = cpu_to_le32(e[0].slot + 1);
		de_resum(&de[e[0].slot]);
		de[e[1].slot].flags = cpu_to_le32(TC_DE_DIRTY);
		de_resum(&de[e[1].slot]);
		de[e[2].slot].gen = cpu_to_le32(i.gen + 1);
		de_resum(&de[e[2].slot]);
		break;
	case SPOIL_V1:
		sb->version = cpu_to_le32(TC_DISK_VERSION_V1);
		sb_resum(sb);
		break;
	case SPOIL_OLD_GEN:
		break;
	case SPOIL_GARBAGE:
		fill_garbage(de, i.layout.meta_blocks * TC_ENTRIES_PER_MBLOCK);
		break;
	case SPOIL_IDS:
		if (n < 3)
			break;
		de[e[0].slot].gen ^= cpu_to_le32(1u << 20);
		de[e[1].slot].slot ^= cpu_to_le32(1u << 7);
		de[e[2].slot].gen ^= cpu_to_le32(1);
		de[e[2].slot].slot ^= cpu_to_le32(1);
		break;
	case SPOIL_MISDIRECT:
		if (i.layout.meta_blocks < 2)
			break;
		memcpy(de, de + TC_ENTRIES_PER_MBLOCK, TC_MBLOCK_BYTES);
		break;
	case SPOIL_FAILED:
		break;
	case SPOIL_SB_FLAG:
		sb->flags = cpu_to_le32(TC_SB_KNOWN_FLAGS + 1);
		sb_resum(sb);
		break;
	case SPOIL_V2:
		sb->version = cpu_to_le32(TC_DISK_VERSION_V2);
		sb_resum(sb);
		break;
	case SPOIL_SUMMARY:
		break;
	case SPOIL_EPOCH_CLEAN:
		for (k = 0; k < n; k++) {
			if (e[k].dirty)
				continue;
			de[e[k].slot].flags |=
				cpu_to_le32((u32)(u16)(e[k].epoch | 1) <<
					    TC_DE_EPOCH_SHIFT);
			de_resum(&de[e[k].slot]);
		}
		break;
	}
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "wb");
	if (!f || fwrite(img, 1, len, f) != len || fclose(f)) {
		perror(path);
		free(img);
		return -1;
	}
	free(img);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct seed_entry mixed[] = {
		{ 0, 11, true, 5, 0 }, { 1, 12, true, 6, 0 },
		{ 7, 10, true, 7, 0 }, { 8, 40, true, 7, 0 },
		{ 9, 41, false, 7, 0 }, { 10, 500, true, 8, 0 },
	};
	static const struct seed_entry two_blocks[] = {
		{ 0, 1, true, 2, 0 }, { 127, 2, false, 2, 0 },
		{ 128, 3, true, 3, 0 }, { 200, 4, true, 9, 0 },
	};
	static const struct seed_entry big[] = {
		{ 0, 0, true, 1, 0 }, { 2, 7, false, 1, 0 },
	};
	/*
	 * Superblock epoch 0x1fffe: block 11 in four epochs across the wrap
	 * of the low 16 bits, block 12 in two (one of them 0xffff past the
	 * superblock's), clean entries, an uncommitted version.
	 */
	static const struct seed_entry epochs[] = {
		{ 0, 11, true, 5, 0x1fffe }, { 1, 11, true, 6, 0x1ffff },
		{ 2, 11, true, 7, 0x20000 }, { 3, 11, true, 7, 0x20001 },
		{ 4, 12, true, 6, 0x1ffff }, { 5, 12, true, 7, 0x2fffd },
		{ 6, 13, false, 7, 0 }, { 130, 14, true, 8, 0x20001 },
		{ 131, 15, false, 7, 0x20000 },
	};
	const char *dir = argc > 1 ? argv[1] : ".";
	int r = 0;

#define N(a) (int)(sizeof(a) / sizeof((a)[0]))
	r |= write_seed(dir, "empty", 1024, 8, 8192, 1, 0x11111111, 0,
			"TIERCACHE-a", NULL, 0, SPOIL_NONE);
	r |= write_seed(dir, "mixed", 1024, 8, 16384, 7, 0x8badf00d, 0,
			"TIERCACHE-t", mixed, N(mixed), SPOIL_NONE);
	r |= write_seed(dir, "two-mblocks", 2200, 8, 1 << 20, 3, 1, 0, "",
			two_blocks, N(two_blocks), SPOIL_NONE);
	r |= write_seed(dir, "big-blocks", 16384, 2048, 1 << 22, 1, 0xffffffff, 0,
			"TIERCACHE-big", big, N(big), SPOIL_NONE);
	/* origin of 8 blocks: the entries of blocks 10 and up are beyond it */
	r |= write_seed(dir, "block16", 4096, 16, 128, 12, 0x7e57, 0,
			"TIERCACHE-x", mixed, 4, SPOIL_NONE);
	r |= write_seed(dir, "bad-version", 1024, 8, 16384, 7, 0x8badf00d, 0,
			"TIERCACHE-t", mixed, N(mixed), SPOIL_SB_VERSION);
	r |= write_seed(dir, "bad-fields", 1024, 8, 16384, 7, 0x8badf00d, 0,
			"TIERCACHE-t", mixed, N(mixed), SPOIL_SB_FIELDS);
	r |= write_seed(dir, "bad-entries", 1024, 8, 16384, 7, 0x8badf00d, 0,
			"TIERCACHE-t", mixed, N(mixed), SPOIL_ENTRIES);
	r |= write_seed(dir, "v1", 1024, 8, 16384, 7, 0, 0, "TIERCACHE-t",
			mixed, N(mixed), SPOIL_V1);
	r |= write_seed(dir, "old-gen", 1024, 8, 16384, 7, 0x8badf00d, 0,
			"TIERCACHE-t", mixed, N(mixed), SPOIL_OLD_GEN);
	r |= write_seed(dir, "garbage", 2200, 8, 1 << 20, 3, 0x600d, 0, "",
			two_blocks, N(two_blocks), SPOIL_GARBAGE);
	r |= write_seed(dir, "damaged-ids", 1024, 8, 16384, 7, 0x8badf00d, 0,
			"TIERCACHE-t", mixed, N(mixed), SPOIL_IDS);
	r |= write_seed(dir, "misdirected", 2200, 8, 1 << 20, 3, 0x600d, 0, "",
			two_blocks, N(two_blocks), SPOIL_MISDIRECT);
	r |= write_seed(dir, "failed", 1024, 8, 16384, 7, 0x8badf00d, 0,
			"TIERCACHE-t", mixed, N(mixed), SPOIL_FAILED);
	r |= write_seed(dir, "unknown-flag", 1024, 8, 16384, 7, 0x8badf00d, 0,
			"TIERCACHE-t", mixed, N(mixed), SPOIL_SB_FLAG);
	r |= write_seed(dir, "v2", 1024, 8, 16384, 7, 0x8badf00d, 0,
			"TIERCACHE-t", mixed, N(mixed), SPOIL_V2);
	r |= write_seed(dir, "epochs", 2200, 8, 16384, 7, 0xe90c0001,
			0x1fffe, "TIERCACHE-e", epochs, N(epochs), SPOIL_NONE);
	r |= write_seed(dir, "epochs-v2", 2200, 8, 16384, 7, 0xe90c0001,
			0x1fffe, "TIERCACHE-e", epochs, N(epochs), SPOIL_V2);
	r |= write_seed(dir, "summary-spoilt", 2200, 8, 16384, 7, 0xe90c0001,
			0x1fffe, "TIERCACHE-e", epochs, N(epochs),
			SPOIL_SUMMARY);
	r |= write_seed(dir, "epoch-clean", 2200, 8, 16384, 7, 0xe90c0001,
			0x1fffe, "TIERCACHE-e", epochs, N(epochs),
			SPOIL_EPOCH_CLEAN);
	return r ? 1 : 0;
}
