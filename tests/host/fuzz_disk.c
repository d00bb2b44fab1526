// SPDX-License-Identifier: GPL-2.0
/*
 * libFuzzer target for the on-disk format decoder (dm-tiercache/tc_disk.c).
 *
 * The input is a cache device image: the superblock in sector 0, the
 * entries from sector TC_META_START.  The superblock is decoded, then
 * every entry the input holds, with the superblock's origin size, commit
 * sequence, generation, version and epoch (or, if it does not decode,
 * values taken from its raw fields, so that the entry decoder is
 * exercised either way), and once more with the entry's own generation
 * word (so that the checks past the generation test run on most inputs,
 * not only on those where the fuzzer matched the superblock's
 * generation).  Last,
 * tc_disk_layout runs on a device size and block size taken from the
 * input.  Besides memory and UB errors (ASan, UBSan), the properties the
 * module and the tool rely on are checked, and a violation aborts:
 *
 * - a superblock that decodes has a consistent layout and no flag but the
 *   defined ones, and encoding what was decoded gives a superblock that
 *   decodes to the same values, as the current version (a version 1
 *   superblock has generation 0, versions 1 and 2 have epoch 0);
 * - an entry that decodes as clean, dirty or uncommitted is exactly what
 *   tc_de_encode writes for its fields, its epoch included (nothing else
 *   is accepted), and the result agrees with the fields (dirty flag, block
 *   below the origin, sequence against the commit, no epoch in a clean
 *   entry nor in versions 1 and 2); its absolute epoch (tc_disk_epoch) has
 *   its epoch bits and is less than 2^16 past the superblock's epoch;
 * - versions 1 and 2 decode every entry alike, and version 3 as they do
 *   but for one with epoch bits that version 3 accepts: invalid flags in
 *   versions 1 and 2;
 * - an all-zero entry is empty and nothing else is; a non-zero entry whose
 *   generation or slot word differs from the generation and slot it is
 *   decoded for is foreign, a checksum mismatch or misplaced, and which
 *   one agrees with the decoder's verdicts on the entry decoded for its
 *   own slot and generation and on the entry with the two words put
 *   back: misplaced exactly when it is of this generation and passes its
 *   checksum as stored, a checksum mismatch exactly when it does not but
 *   passes it with the one differing word put back, foreign otherwise;
 *   under generation 0 (version 1, whose format zeroed the area) never
 *   foreign: misplaced if its slot word differs, invalid flags otherwise;
 * - a layout fits the device and is block aligned, and (for device sizes
 *   below 2^54 sectors) one more slot would not fit.
 *
 * Build and run: make -C tests/host fuzz (FUZZ_SECONDS=60).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tc_disk.h"

#define FUZZ_ASSERT(cond) do {						\
	if (!(cond)) {							\
		fprintf(stderr, "fuzz_disk: property violated at %s:%d: %s\n", \
			__FILE__, __LINE__, #cond);			\
		abort();						\
	}								\
} while (0)

static u64 get_le64(const uint8_t *p)
{
	u64 v;

	memcpy(&v, p, sizeof(v));
	return le64toh(v);
}

static u32 get_le32(const uint8_t *p)
{
	u32 v;

	memcpy(&v, p, sizeof(v));
	return le32toh(v);
}

static void check_layout(const struct tc_layout *l)
{
	u64 end;

	FUZZ_ASSERT(l->block_sectors >= 8 && l->block_sectors <= 2048);
	FUZZ_ASSERT(!(l->block_sectors & (l->block_sectors - 1)));
	FUZZ_ASSERT(l->nr_slots >= 1);
	FUZZ_ASSERT(l->meta_start == TC_META_START);
	FUZZ_ASSERT(l->meta_blocks == tc_disk_meta_blocks(l->nr_slots));
	FUZZ_ASSERT(l->meta_blocks * TC_ENTRIES_PER_MBLOCK >= l->nr_slots);
	FUZZ_ASSERT(l->data_start % l->block_sectors == 0);
	end = l->meta_start + l->meta_blocks * TC_MBLOCK_SECTORS;
	if (l->sum_blocks) {
		FUZZ_ASSERT(l->sum_start == end);
		FUZZ_ASSERT(l->sum_blocks == tc_disk_sum_blocks(l->meta_blocks));
		end += l->sum_blocks * TC_MBLOCK_SECTORS;
	} else {
		FUZZ_ASSERT(!l->sum_start);
	}
	FUZZ_ASSERT(l->data_start >= end);
	FUZZ_ASSERT(l->data_start < end + l->block_sectors);
}

static void fuzz_sb(const struct tc_disk_sb *sb, struct tc_sb_info *out,
		    enum tc_sb_result *res)
{
	struct tc_sb_info i, j;
	struct tc_disk_sb again;

	*res = tc_sb_decode(sb, &i);
	FUZZ_ASSERT(*res <= TC_SB_BAD_FIELDS);
	FUZZ_ASSERT(tc_sb_result_str(*res) != NULL);
	if (*res != TC_SB_OK)
		return;
	check_layout(&i.layout);
	FUZZ_ASSERT(i.layout.nr_slots <= (1ULL << 32));
	FUZZ_ASSERT(i.origin_sectors > 0);
	FUZZ_ASSERT(memchr(i.uuid, 0, sizeof(i.uuid)) != NULL);
	FUZZ_ASSERT(i.version == TC_DISK_VERSION ||
		    i.version == TC_DISK_VERSION_V3 ||
		    i.version == TC_DISK_VERSION_V2 ||
		    i.version == TC_DISK_VERSION_V1);
	FUZZ_ASSERT(i.version != TC_DISK_VERSION_V1 || i.gen == 0);
	FUZZ_ASSERT(i.version >= TC_DISK_VERSION_V3 || i.epoch == 0);
	FUZZ_ASSERT(!i.layout.sum_blocks == (i.version < TC_DISK_VERSION));
	FUZZ_ASSERT(!(i.flags & ~TC_SB_KNOWN_FLAGS));

	tc_sb_encode(&again, &i);
	FUZZ_ASSERT(tc_sb_decode(&again, &j) == TC_SB_OK);
	FUZZ_ASSERT(j.version == tc_disk_layout_version(&i.layout));
	FUZZ_ASSERT(j.version >= TC_DISK_VERSION_V3 && j.gen == i.gen);
	FUZZ_ASSERT(j.epoch == i.epoch);
	FUZZ_ASSERT(j.flags == i.flags);
	FUZZ_ASSERT(j.commit_seq == i.commit_seq);
	FUZZ_ASSERT(j.origin_sectors == i.origin_sectors);
	FUZZ_ASSERT(!memcmp(&j.layout, &i.layout, sizeof(i.layout)));
	FUZZ_ASSERT(!strcmp(j.uuid, i.uuid));
	*out = i;
}

/*
 * The verdict on a non-zero entry that is not ours, from the decoder's
 * verdicts on entries that are: @d decoded for its own slot and generation
 * (does it pass its checksum as stored?), and @d with @slot and @gen put
 * back (does it pass it so?).
 */
static enum tc_de_result other_expected(const struct tc_disk_entry *d,
					u64 slot, u32 gen)
{
	const u32 dslot = le32toh(d->slot), dgen = le32toh(d->gen);
	struct tc_disk_entry fixed = *d;
	struct tc_de_info i;

	/* generation 0 (version 1) zeroed its area: nothing is foreign */
	if (!gen)
		return dslot != (u32)slot ? TC_DE_BAD_SLOT : TC_DE_BAD_FLAGS;
	if (tc_de_decode(d, dslot, ~0ULL, ~0ULL, dgen, TC_DISK_VERSION, &i) !=
	    TC_DE_BAD_CSUM)
		return dgen == gen ? TC_DE_BAD_SLOT : TC_DE_FOREIGN;
	if (dslot != (u32)slot && dgen != gen)
		return TC_DE_FOREIGN;
	fixed.slot = htole32((u32)slot);
	fixed.gen = htole32(gen);
	/* (all zero, it is empty: its checksum word 0 is not its CRC) */
	switch (tc_de_decode(&fixed, slot, ~0ULL, ~0ULL, gen, TC_DISK_VERSION,
			     &i)) {
	case TC_DE_BAD_CSUM:
	case TC_DE_EMPTY:
		return TC_DE_FOREIGN;
	default:
		return TC_DE_BAD_CSUM;
	}
}

static bool fields_decoded(enum tc_de_result r)
{
	return r == TC_DE_CLEAN || r == TC_DE_DIRTY_OK ||
	       r == TC_DE_UNCOMMITTED || r == TC_DE_BAD_BLOCK;
}

/* Versions 1 and 2 against version 3: only the epoch bits differ. */
static void fuzz_versions(const struct tc_disk_entry *d, u64 slot,
			  u64 nr_blocks, u64 commit_seq, u32 gen)
{
	struct tc_de_info i1, i2, i3;
	enum tc_de_result r1, r2, r3;

	memset(&i1, 0, sizeof(i1));
	memset(&i2, 0, sizeof(i2));
	memset(&i3, 0, sizeof(i3));
	r1 = tc_de_decode(d, slot, nr_blocks, commit_seq, gen,
			  TC_DISK_VERSION_V1, &i1);
	r2 = tc_de_decode(d, slot, nr_blocks, commit_seq, gen,
			  TC_DISK_VERSION_V2, &i2);
	r3 = tc_de_decode(d, slot, nr_blocks, commit_seq, gen,
			  TC_DISK_VERSION, &i3);
	FUZZ_ASSERT(r1 == r2);
	if (fields_decoded(r3) && i3.epoch) {
		FUZZ_ASSERT(i3.dirty);
		FUZZ_ASSERT(r2 == TC_DE_BAD_FLAGS);
		return;
	}
	FUZZ_ASSERT(r2 == r3);
	if (fields_decoded(r3))
		FUZZ_ASSERT(i2.block == i3.block && i2.seq == i3.seq &&
			    i2.dirty == i3.dirty && i2.epoch == 0);
}

static void fuzz_entry(const struct tc_disk_entry *d, u64 slot,
		       u64 nr_blocks, u64 commit_seq, u32 gen, u32 version,
		       u64 sb_epoch)
{
	static const struct tc_disk_entry zero;
	struct tc_disk_entry again;
	struct tc_de_info i;
	enum tc_de_result r;
	bool is_zero = !memcmp(d, &zero, sizeof(zero));
	bool ours = le32toh(d->gen) == gen && le32toh(d->slot) == (u32)slot;
	u64 abs;

	memset(&i, 0, sizeof(i));
	r = tc_de_decode(d, slot, nr_blocks, commit_seq, gen, version, &i);
	FUZZ_ASSERT(r <= TC_DE_BAD_BLOCK);
	FUZZ_ASSERT(tc_de_result_str(r) != NULL);
	FUZZ_ASSERT((r == TC_DE_EMPTY) == is_zero);
	FUZZ_ASSERT(r != TC_DE_FOREIGN || !ours);
	FUZZ_ASSERT(r != TC_DE_BAD_SLOT || !ours);
	FUZZ_ASSERT(tc_de_free(r) == (r == TC_DE_EMPTY || r == TC_DE_FOREIGN));
	if (!is_zero && !ours)
		FUZZ_ASSERT(r == other_expected(d, slot, gen));
	switch (r) {
	case TC_DE_CLEAN:
	case TC_DE_DIRTY_OK:
	case TC_DE_UNCOMMITTED:
		FUZZ_ASSERT(i.block < nr_blocks);
		FUZZ_ASSERT((r == TC_DE_UNCOMMITTED) == (i.seq > commit_seq));
		FUZZ_ASSERT(r != TC_DE_DIRTY_OK || i.dirty);
		FUZZ_ASSERT(r != TC_DE_CLEAN || !i.dirty);
		FUZZ_ASSERT(i.dirty || !i.epoch);
		FUZZ_ASSERT(version > TC_DISK_VERSION_V2 || !i.epoch);
		/* only the encoder's own output is accepted */
		tc_de_encode(&again, slot, i.block, i.dirty, i.seq, gen,
			     i.epoch);
		FUZZ_ASSERT(!memcmp(&again, d, sizeof(again)));
		abs = tc_disk_epoch(sb_epoch, i.epoch);
		FUZZ_ASSERT((u16)abs == i.epoch);
		FUZZ_ASSERT(abs - sb_epoch <= 0xffff);
		break;
	case TC_DE_BAD_BLOCK:
		FUZZ_ASSERT(i.block >= nr_blocks);
		FUZZ_ASSERT(version > TC_DISK_VERSION_V2 || !i.epoch);
		break;
	default:
		break;
	}
	fuzz_versions(d, slot, nr_blocks, commit_seq, gen);
}

/* The 4 KiB blocks of metadata of @n slots in the layout of @version. */
static u64 meta_area_blocks(u64 n, u32 version)
{
	u64 mb = tc_disk_meta_blocks(n);

	return mb + (version >= TC_DISK_VERSION ? tc_disk_sum_blocks(mb) : 0);
}

static void fuzz_layout_v(u64 cache_sectors, u32 block_sectors, u32 version)
{
	struct tc_layout l;
	unsigned __int128 next_end;

	if (tc_disk_layout_v(cache_sectors, block_sectors, version, &l))
		return;
	FUZZ_ASSERT(l.block_sectors == block_sectors);
	FUZZ_ASSERT(tc_disk_layout_version(&l) ==
		    (version >= TC_DISK_VERSION ? TC_DISK_VERSION :
						  TC_DISK_VERSION_V3));
	check_layout(&l);
	FUZZ_ASSERT((unsigned __int128)l.data_start +
		    (unsigned __int128)l.nr_slots * block_sectors <=
		    cache_sectors);
	/*
	 * One more slot does not fit: its metadata and data pass the end.
	 * Only for sizes a block device can have (under 2^63 bytes): from
	 * 2^55 sectors up, the first guess of tc_disk_layout,
	 * (cache_sectors - 8) * 512, wraps and the layout is valid but small.
	 */
	if (cache_sectors >= (1ULL << 54))
		return;
	/* slot numbers are 32-bit: the layout stops at TC_MAX_SLOTS */
	FUZZ_ASSERT(l.nr_slots <= TC_MAX_SLOTS);
	if (l.nr_slots == TC_MAX_SLOTS)
		return;
	next_end = TC_META_START +
		   (unsigned __int128)meta_area_blocks(l.nr_slots + 1, version) *
		   TC_MBLOCK_SECTORS;
	next_end = (next_end + block_sectors - 1) / block_sectors *
		   block_sectors;
	FUZZ_ASSERT(next_end + (unsigned __int128)(l.nr_slots + 1) *
		    block_sectors > cache_sectors);
}

static void fuzz_layout(u64 cache_sectors, u32 block_sectors)
{
	struct tc_layout l3, l4;

	fuzz_layout_v(cache_sectors, block_sectors, TC_DISK_VERSION);
	fuzz_layout_v(cache_sectors, block_sectors, TC_DISK_VERSION_V3);
	/* the summary never gives more slots */
	if (!tc_disk_layout(cache_sectors, block_sectors, &l4) &&
	    !tc_disk_layout_v(cache_sectors, block_sectors, TC_DISK_VERSION_V3,
			      &l3))
		FUZZ_ASSERT(l4.nr_slots <= l3.nr_slots);
}

/*
 * A summary block: only one of this generation and index with a right
 * checksum is valid, and then sealing it again changes nothing.
 */
static void fuzz_sum(const uint8_t *data, size_t size, u32 gen)
{
	struct tc_disk_sum s, again;
	u32 index;

	if (size < sizeof(s))
		return;
	memcpy(&s, data + size - sizeof(s), sizeof(s));
	index = le32toh(s.index);
	if (tc_sum_decode(&s, index, le32toh(s.gen)) == TC_SUM_OK) {
		again = s;
		tc_sum_seal(&again, index, le32toh(s.gen));
		FUZZ_ASSERT(!memcmp(&again, &s, sizeof(s)));
		FUZZ_ASSERT(tc_sum_decode(&s, index + 1, le32toh(s.gen)) ==
			    TC_SUM_BAD);
	}
	if (le32toh(s.gen) != gen)
		FUZZ_ASSERT(tc_sum_decode(&s, index, gen) == TC_SUM_BAD);
	FUZZ_ASSERT(tc_sum_result_str(tc_sum_decode(&s, index, gen)) != NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const size_t meta_off = (size_t)TC_META_START * 512;
	struct tc_disk_sb sb;
	struct tc_sb_info info;
	enum tc_sb_result res;
	u64 nr_blocks, commit_seq, nr_slots, slot, epoch;
	u32 gen, version;

	/* the superblock sector, zero padded like the end of a short device */
	memset(&sb, 0, sizeof(sb));
	memcpy(&sb, data, size < sizeof(sb) ? size : sizeof(sb));
	fuzz_sb(&sb, &info, &res);

	if (res == TC_SB_OK) {
		nr_blocks = info.origin_sectors / info.layout.block_sectors;
		commit_seq = info.commit_seq;
		gen = info.gen;
		version = info.version;
		epoch = info.epoch;
		nr_slots = info.layout.nr_slots;
	} else {
		/* the raw fields, whatever they hold */
		u32 bs = get_le32((const uint8_t *)&sb.block_sectors);

		nr_blocks = get_le64((const uint8_t *)&sb.origin_sectors);
		if (bs)
			nr_blocks /= bs;
		commit_seq = get_le64((const uint8_t *)&sb.commit_seq);
		gen = get_le32((const uint8_t *)&sb.gen);
		version = get_le32((const uint8_t *)&sb.version);
		epoch = get_le64((const uint8_t *)&sb.epoch);
		nr_slots = get_le64((const uint8_t *)&sb.nr_slots);
	}

	/* every entry the input holds, up to the superblock's slot count */
	for (slot = 0; slot < nr_slots; slot++) {
		size_t off = meta_off + slot * sizeof(struct tc_disk_entry);
		struct tc_disk_entry d;

		if (off + sizeof(d) > size || off < meta_off)
			break;
		memcpy(&d, data + off, sizeof(d));
		fuzz_entry(&d, slot, nr_blocks, commit_seq, gen, version,
			   epoch);
		fuzz_entry(&d, slot, nr_blocks, commit_seq, le32toh(d.gen),
			   version, epoch);
	}

	/* the input's last 4 KiB as a summary block */
	fuzz_sum(data, size, gen);

	/* the layout, on a device size and block size from the input */
	if (size >= sizeof(sb)) {
		fuzz_layout(get_le64((const uint8_t *)&sb.data_start),
			    get_le32((const uint8_t *)&sb.block_sectors));
		fuzz_layout(get_le64((const uint8_t *)&sb.nr_slots),
			    8u << (get_le32((const uint8_t *)&sb.flags) % 9));
	}
	return 0;
}
