// SPDX-License-Identifier: GPL-2.0
/* Host tests of the on-disk format code (dm-tiercache/tc_disk.c). */
#include <assert.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tc_disk_test.h"

static int failures;

#define V4	TC_DISK_VERSION		/* written by a format */
#define V3	TC_DISK_VERSION_V3
#define V2	TC_DISK_VERSION_V2
#define V1	TC_DISK_VERSION_V1

#define CHECK(cond) do {						\
	if (!(cond)) {							\
		fprintf(stderr, "%s:%d: CHECK failed: %s\n",		\
			__FILE__, __LINE__, #cond);			\
		failures++;						\
	}								\
} while (0)

static void test_sizes(void)
{
	CHECK(sizeof(struct tc_disk_sb) == 512);
	CHECK(sizeof(struct tc_disk_entry) == 32);
	CHECK(TC_ENTRIES_PER_MBLOCK == 128);
	/* versions 2 and 3 took the first reserved words: nothing else moved */
	CHECK(offsetof(struct tc_disk_sb, uuid) == 64);
	CHECK(offsetof(struct tc_disk_sb, gen) == 192);
	CHECK(offsetof(struct tc_disk_sb, pad) == 196);
	CHECK(offsetof(struct tc_disk_sb, epoch) == 200);
	CHECK(offsetof(struct tc_disk_sb, reserved) == 208);
	CHECK(offsetof(struct tc_disk_entry, flags) == 20);
	CHECK(offsetof(struct tc_disk_entry, csum) == 24);
	CHECK(offsetof(struct tc_disk_entry, gen) == 28);
	CHECK(V4 == 4 && V3 == 3 && V2 == 2 && V1 == 1);
	CHECK(sizeof(struct tc_disk_sum) == 4096);
	CHECK(offsetof(struct tc_disk_sum, bits) == TC_SUM_HDR_BYTES);
	CHECK(TC_SUM_BITS == 32640);
	CHECK(TC_DE_EPOCH_MASK == 0xffffu << TC_DE_EPOCH_SHIFT);
	CHECK(!(TC_DE_EPOCH_MASK & (TC_DE_VALID | TC_DE_DIRTY)));
}

static void test_crc(void)
{
	/* the CRC-32C check value */
	CHECK(tc_disk_crc("123456789", 9) == 0xe3069283u);
	CHECK(tc_disk_crc("", 0) == 0);
}

static void test_layout(void)
{
	struct tc_layout l;
	u64 dev;

	/* 512 MiB, 4 KiB blocks: 131072 slots would need 4 MiB of entries */
	CHECK(tc_disk_layout_v(1048576, 8, V3, &l) == 0);
	CHECK(l.meta_start == 8 && !l.sum_blocks && !l.sum_start);
	CHECK(l.data_start == 8 + l.meta_blocks * 8);
	CHECK(l.meta_blocks == (l.nr_slots + 127) / 128);
	CHECK(l.data_start + l.nr_slots * 8 <= 1048576);
	CHECK(l.data_start + (l.nr_slots + 1) * 8 +
	      ((l.nr_slots % 128) ? 0 : 8) > 1048576);
	CHECK(l.nr_slots > 130000 && l.nr_slots < 131072);
	/* data_start is block aligned for big blocks */
	CHECK(tc_disk_layout_v(1048576, 1024, V3, &l) == 0);
	CHECK(l.data_start == 1024 && l.nr_slots == 1023);
	/* every size: the layout fits and one more slot does not */
	for (dev = 17; dev < 5000; dev += 7) {
		if (tc_disk_layout_v(dev, 8, V3, &l)) {
			CHECK(dev < 8 + 8 + 8 + 1);
			continue;
		}
		CHECK(l.data_start + l.nr_slots * 8 <= dev);
		CHECK(l.data_start % 8 == 0);
	}
	CHECK(tc_disk_layout(16, 8, &l) == -1);
	CHECK(tc_disk_layout(1 << 20, 12, &l) == -1);	/* not a power of 2 */
	CHECK(tc_disk_layout(1 << 20, 4096, &l) == -1);	/* too big */
}

/*
 * Version 4: the summary right after the entries, one bit per metadata
 * block, data after it; never more slots than version 3 on one device.
 */
static void test_layout_v4(void)
{
	struct tc_layout l, l3;
	u64 dev;

	CHECK(tc_disk_layout(1048576, 8, &l) == 0);
	CHECK(tc_disk_layout_version(&l) == V4);
	CHECK(l.sum_start == 8 + l.meta_blocks * 8 && l.sum_blocks == 1);
	CHECK(l.data_start == l.sum_start + 8);
	CHECK(l.data_start + l.nr_slots * 8 <= 1048576);
	CHECK(tc_disk_layout_v(1048576, 8, V3, &l3) == 0);
	CHECK(tc_disk_layout_version(&l3) == V3);
	CHECK(l.nr_slots <= l3.nr_slots && l.nr_slots + 1 >= l3.nr_slots);
	/* big blocks: the summary fits in the block-size slack */
	CHECK(tc_disk_layout(1048576, 1024, &l) == 0);
	CHECK(l.data_start == 1024 && l.nr_slots == 1023);
	CHECK(l.sum_start == 8 + l.meta_blocks * 8 && l.sum_blocks == 1);
	for (dev = 17; dev < 5000; dev += 7) {
		if (tc_disk_layout(dev, 8, &l))
			continue;
		CHECK(l.sum_blocks == tc_disk_sum_blocks(l.meta_blocks));
		CHECK(l.sum_start + l.sum_blocks * 8 <= l.data_start);
		CHECK(l.data_start + l.nr_slots * 8 <= dev);
		CHECK(tc_disk_layout_v(dev, 8, V3, &l3) == 0);
		CHECK(l.nr_slots <= l3.nr_slots);
	}
	/* 2^32 slots of 4 KiB: 2^25 metadata blocks, 1029 summary blocks */
	CHECK(tc_disk_layout(1ull << 36, 8, &l) == 0);
	CHECK(l.nr_slots == TC_MAX_SLOTS && l.meta_blocks == 1ull << 25);
	CHECK(l.sum_blocks == 1029 && tc_disk_sum_blocks(32640) == 1 &&
	      tc_disk_sum_blocks(32641) == 2);
	/* versions 1 and 2 have version 3's layout */
	CHECK(tc_disk_layout_v(1048576, 8, V1, &l) == 0 && !l.sum_blocks);
	CHECK(tc_disk_layout_v(1048576, 8, V2, &l) == 0 && !l.sum_blocks);
}

static void sample_sb_v(struct tc_sb_info *i, u32 version)
{
	memset(i, 0, sizeof(*i));
	tc_disk_layout_v(1 << 20, 8, version, &i->layout);
	i->commit_seq = 42;
	i->origin_sectors = 1 << 21;
	i->gen = 0xc0ffee01;
	i->epoch = 0x123456789ull;
	strcpy(i->uuid, "TIERCACHE-test");
}

static void sample_sb(struct tc_sb_info *i)
{
	sample_sb_v(i, V4);
}

/* A small deterministic generator (xorshift64) for garbage bytes. */
static u64 rnd_state = 0x9e3779b97f4a7c15ull;

static u64 rnd64(void)
{
	rnd_state ^= rnd_state << 13;
	rnd_state ^= rnd_state >> 7;
	rnd_state ^= rnd_state << 17;
	return rnd_state;
}

/*
 * @field of @in (its epoch or commit_seq) round-trips up to
 * TC_SB_COUNTER_LIMIT - 1 (decoded into @out, whose same field is @got),
 * and from the limit on the superblock is refused.
 */
static void check_counter_limit(struct tc_sb_info *in, u64 *field,
				struct tc_sb_info *out, const u64 *got)
{
	const u64 vals[] = { TC_SB_COUNTER_LIMIT - 1, TC_SB_COUNTER_LIMIT, ~0ull };
	struct tc_disk_sb sb;
	size_t k;

	for (k = 0; k < sizeof(vals) / sizeof(vals[0]); k++) {
		*field = vals[k];
		tc_sb_encode(&sb, in);
		if (vals[k] < TC_SB_COUNTER_LIMIT)
			CHECK(tc_sb_decode(&sb, out) == TC_SB_OK &&
			      *got == vals[k]);
		else
			CHECK(tc_sb_decode(&sb, out) == TC_SB_BAD_FIELDS);
	}
}

static void test_sb(void)
{
	struct tc_sb_info in, out;
	struct tc_disk_sb sb;
	unsigned char *raw = (unsigned char *)&sb;
	size_t k;

	sample_sb(&in);
	tc_sb_encode(&sb, &in);
	CHECK(tc_sb_decode(&sb, &out) == TC_SB_OK);
	CHECK(le32_to_cpu(sb.version) == V4);
	CHECK(out.version == V4 && out.gen == 0xc0ffee01);
	CHECK(out.layout.sum_start == in.layout.sum_start);
	CHECK(out.layout.sum_blocks == in.layout.sum_blocks &&
	      out.layout.sum_blocks == 1);
	CHECK(out.epoch == 0x123456789ull);
	CHECK(le64_to_cpu(sb.epoch) == 0x123456789ull && !sb.pad);
	CHECK(out.commit_seq == 42 && out.origin_sectors == 1 << 21);
	CHECK(out.layout.nr_slots == in.layout.nr_slots);
	CHECK(out.layout.data_start == in.layout.data_start);
	CHECK(out.layout.meta_blocks == in.layout.meta_blocks);
	CHECK(!strcmp(out.uuid, "TIERCACHE-test"));

	/* any flipped byte is noticed */
	for (k = 0; k < sizeof(sb); k++) {
		enum tc_sb_result r;

		tc_sb_encode(&sb, &in);
		raw[k] ^= 0x5a;
		r = tc_sb_decode(&sb, &out);
		CHECK(r != TC_SB_OK);
		if (k < 8)
			CHECK(r == TC_SB_BLANK);
		else
			CHECK(r == TC_SB_BAD_CSUM);
	}
	memset(&sb, 0, sizeof(sb));
	CHECK(tc_sb_decode(&sb, &out) == TC_SB_BLANK);

	/* a newer version, and version 0, with a valid checksum */
	tc_sb_encode(&sb, &in);
	sb.version = cpu_to_le32(TC_DISK_VERSION + 1);
	sb_resum(&sb);
	CHECK(tc_sb_decode(&sb, &out) == TC_SB_BAD_VERSION);
	sb.version = 0;
	sb_resum(&sb);
	CHECK(tc_sb_decode(&sb, &out) == TC_SB_BAD_VERSION);

	/* impossible geometry with a valid checksum */
	tc_sb_encode(&sb, &in);
	sb.data_start = cpu_to_le64(le64_to_cpu(sb.data_start) + 8);
	sb_resum(&sb);
	CHECK(tc_sb_decode(&sb, &out) == TC_SB_BAD_FIELDS);

	/* the rest of the reserved area must stay zero, and the pad */
	tc_sb_encode(&sb, &in);
	sb.reserved[0] = 1;
	sb_resum(&sb);
	CHECK(tc_sb_decode(&sb, &out) == TC_SB_BAD_FIELDS);
	tc_sb_encode(&sb, &in);
	sb.reserved[sizeof(sb.reserved) - 1] = 0x80;
	sb_resum(&sb);
	CHECK(tc_sb_decode(&sb, &out) == TC_SB_BAD_FIELDS);
	tc_sb_encode(&sb, &in);
	sb.pad = cpu_to_le32(1);
	sb_resum(&sb);
	CHECK(tc_sb_decode(&sb, &out) == TC_SB_BAD_FIELDS);

	/* any epoch and commit up to the limit (no counter may wrap) */
	in.epoch = 0;
	tc_sb_encode(&sb, &in);
	CHECK(tc_sb_decode(&sb, &out) == TC_SB_OK && out.epoch == 0);
	check_counter_limit(&in, &in.epoch, &out, &out.epoch);
	in.epoch = 7;
	check_counter_limit(&in, &in.commit_seq, &out, &out.commit_seq);
	in.commit_seq = 42;

	/* flags: the defined one round-trips, any other bit is refused */
	tc_sb_encode(&sb, &in);
	CHECK(tc_sb_decode(&sb, &out) == TC_SB_OK && out.flags == 0);
	in.flags = TC_SB_FAILED;
	tc_sb_encode(&sb, &in);
	CHECK(le32_to_cpu(sb.flags) == TC_SB_FAILED);
	CHECK(tc_sb_decode(&sb, &out) == TC_SB_OK && out.flags == TC_SB_FAILED);
	for (k = 1; k < 32; k++) {
		tc_sb_encode(&sb, &in);
		sb.flags |= cpu_to_le32(1u << k);
		sb_resum(&sb);
		CHECK(tc_sb_decode(&sb, &out) == TC_SB_BAD_FIELDS);
	}
	in.flags = 0;

	/* generation 0 is valid in version 2 (an upgraded version 1 cache) */
	in.gen = 0;
	tc_sb_encode(&sb, &in);
	CHECK(tc_sb_decode(&sb, &out) == TC_SB_OK && out.gen == 0);
}

/*
 * A version 1 superblock: what the version 1 code wrote (the generation
 * word was reserved, zero) decodes as generation 0; a non-zero word there
 * is a bad field in version 1.
 */
static void test_sb_v1(void)
{
	struct tc_sb_info in, out;
	struct tc_disk_sb sb;

	sample_sb_v(&in, V3);
	in.gen = 0;
	in.epoch = 0;
	tc_sb_encode(&sb, &in);
	sb.version = cpu_to_le32(TC_DISK_VERSION_V1);
	sb_resum(&sb);
	CHECK(tc_sb_decode(&sb, &out) == TC_SB_OK);
	CHECK(out.version == 1 && out.gen == 0 && out.commit_seq == 42);
	CHECK(out.epoch == 0);
	CHECK(out.layout.nr_slots == in.layout.nr_slots);

	/* re-encoded: version 3, generation 0, epoch 0, the same fields */
	tc_sb_encode(&sb, &out);
	CHECK(le32_to_cpu(sb.version) == 3);
	CHECK(tc_sb_decode(&sb, &in) == TC_SB_OK);
	CHECK(in.version == 3 && in.gen == 0 && in.commit_seq == 42);
	CHECK(in.epoch == 0);

	tc_sb_encode(&sb, &out);
	sb.version = cpu_to_le32(TC_DISK_VERSION_V1);
	sb.gen = cpu_to_le32(5);
	sb_resum(&sb);
	CHECK(tc_sb_decode(&sb, &out) == TC_SB_BAD_FIELDS);

	/* the epoch word was reserved in version 1 too */
	in.gen = 0;
	in.epoch = 1;
	tc_sb_encode(&sb, &in);
	sb.version = cpu_to_le32(TC_DISK_VERSION_V1);
	sb_resum(&sb);
	CHECK(tc_sb_decode(&sb, &out) == TC_SB_BAD_FIELDS);
}

/*
 * A version 2 superblock (what the version 2 code wrote: the epoch words
 * reserved, zero) decodes with its generation and epoch 0, and is written
 * back as version 3 with the same fields; an epoch in it is a bad field.
 */
static void test_sb_v2(void)
{
	struct tc_sb_info in, out;
	struct tc_disk_sb sb;
	int k;

	sample_sb_v(&in, V3);
	in.epoch = 0;
	tc_sb_encode(&sb, &in);
	sb.version = cpu_to_le32(V2);
	sb_resum(&sb);
	CHECK(tc_sb_decode(&sb, &out) == TC_SB_OK);
	CHECK(out.version == 2 && out.gen == 0xc0ffee01 && out.epoch == 0);
	CHECK(out.commit_seq == 42 && !strcmp(out.uuid, "TIERCACHE-test"));
	tc_sb_encode(&sb, &out);
	CHECK(le32_to_cpu(sb.version) == 3);
	CHECK(tc_sb_decode(&sb, &in) == TC_SB_OK);
	CHECK(in.version == 3 && in.gen == 0xc0ffee01 && in.epoch == 0);

	/* any bit of the epoch word set in version 2: a bad field */
	for (k = 0; k < 64; k++) {
		in.epoch = 1ull << k;
		tc_sb_encode(&sb, &in);
		sb.version = cpu_to_le32(V2);
		sb_resum(&sb);
		CHECK(tc_sb_decode(&sb, &out) == TC_SB_BAD_FIELDS);
		/* the same in version 3, below the counter limit */
		tc_sb_encode(&sb, &in);
		if (in.epoch >= TC_SB_COUNTER_LIMIT)
			CHECK(tc_sb_decode(&sb, &out) == TC_SB_BAD_FIELDS);
		else
			CHECK(tc_sb_decode(&sb, &out) == TC_SB_OK &&
			      out.epoch == 1ull << k);
	}
}

static void test_entries(void)
{
	const u32 g = 0x1234abcd;
	struct tc_disk_entry d;
	struct tc_de_info i;
	unsigned char *raw = (unsigned char *)&d;
	size_t k;

	tc_de_encode_empty(&d);
	CHECK(tc_de_decode(&d, 5, 100, 10, g, V3, &i) == TC_DE_EMPTY);
	CHECK(tc_de_decode(&d, 5, 100, 10, 0, V3, &i) == TC_DE_EMPTY);
	CHECK(tc_de_free(TC_DE_EMPTY) && tc_de_free(TC_DE_FOREIGN));
	CHECK(!tc_de_free(TC_DE_CLEAN) && !tc_de_free(TC_DE_BAD_CSUM));

	tc_de_encode(&d, 5, 77, true, 10, g, 0);
	CHECK(le32_to_cpu(d.gen) == g);
	CHECK(tc_de_decode(&d, 5, 100, 10, g, V3, &i) == TC_DE_DIRTY_OK);
	CHECK(i.block == 77 && i.seq == 10 && i.dirty);
	CHECK(tc_de_decode(&d, 5, 77, 10, g, V3, &i) == TC_DE_BAD_BLOCK);
	CHECK(tc_de_decode(&d, 5, 100, 9, g, V3, &i) == TC_DE_UNCOMMITTED);

	tc_de_encode(&d, 5, 77, false, 3, g, 0);
	CHECK(tc_de_decode(&d, 5, 100, 10, g, V3, &i) == TC_DE_CLEAN);
	CHECK(!i.dirty);

	/*
	 * Every flipped bit is a checksum mismatch: in the slot or generation
	 * word too, where the entry is no longer of this slot or generation
	 * but passes its checksum with the word put back.
	 */
	for (k = 0; k < sizeof(d) * 8; k++) {
		tc_de_encode(&d, 5, 77, true, 10, g, 0);
		raw[k / 8] ^= 1u << (k % 8);
		CHECK(tc_de_decode(&d, 5, 100, 10, g, V3, &i) == TC_DE_BAD_CSUM);
	}

	/* dirty without valid, unknown bits: checksummed but wrong */
	tc_de_encode(&d, 5, 77, true, 10, g, 0);
	d.flags = cpu_to_le32(TC_DE_DIRTY);
	de_resum(&d);
	CHECK(tc_de_decode(&d, 5, 100, 10, g, V3, &i) == TC_DE_BAD_FLAGS);
	tc_de_encode(&d, 5, 77, true, 10, g, 0);
	d.flags = cpu_to_le32(TC_DE_VALID | 8);
	de_resum(&d);
	CHECK(tc_de_decode(&d, 5, 100, 10, g, V3, &i) == TC_DE_BAD_FLAGS);
}

/*
 * Version 3: a dirty entry carries the low 16 bits of its epoch in bits
 * 16..31 of its flags, every value round-trips, and the encoder writes
 * nothing else there; a clean entry carries none, whatever epoch it is
 * given.  Without epoch bits, an entry is what versions 1 and 2 wrote.
 */
static void test_epochs(void)
{
	const u32 g = 0x1234abcd;
	struct tc_disk_entry d, e;
	struct tc_de_info i;
	u32 k;

	for (k = 0; k <= 0xffff; k++) {
		tc_de_encode(&d, 9, 1234, true, 10, g, (u16)k);
		CHECK(le32_to_cpu(d.flags) ==
		      (TC_DE_VALID | TC_DE_DIRTY | k << TC_DE_EPOCH_SHIFT));
		memset(&i, 0xa5, sizeof(i));
		CHECK(tc_de_decode(&d, 9, 2000, 10, g, V3, &i) ==
		      TC_DE_DIRTY_OK);
		CHECK(i.block == 1234 && i.seq == 10 && i.dirty && i.epoch == k);
		CHECK(tc_de_decode(&d, 9, 2000, 9, g, V3, &i) ==
		      TC_DE_UNCOMMITTED && i.epoch == k);
		CHECK(tc_de_decode(&d, 9, 1234, 10, g, V3, &i) ==
		      TC_DE_BAD_BLOCK && i.epoch == k);
		/* clean: no epoch bits, whatever it is given */
		tc_de_encode(&e, 9, 1234, false, 10, g, (u16)k);
		CHECK(le32_to_cpu(e.flags) == TC_DE_VALID);
		memset(&i, 0xa5, sizeof(i));
		CHECK(tc_de_decode(&e, 9, 2000, 10, g, V3, &i) == TC_DE_CLEAN);
		CHECK(!i.dirty && i.epoch == 0);
	}
	/* epoch 0: byte for byte what version 2 wrote, read in any version */
	tc_de_encode(&d, 9, 1234, true, 10, g, 0);
	CHECK(le32_to_cpu(d.flags) == (TC_DE_VALID | TC_DE_DIRTY));
	CHECK(tc_de_decode(&d, 9, 2000, 10, g, V2, &i) == TC_DE_DIRTY_OK &&
	      i.epoch == 0);
	CHECK(tc_de_decode(&d, 9, 2000, 10, g, V3, &i) == TC_DE_DIRTY_OK &&
	      i.epoch == 0);
	/* every flipped epoch bit is noticed */
	for (k = TC_DE_EPOCH_SHIFT; k < 32; k++) {
		tc_de_encode(&d, 9, 1234, true, 10, g, 0x5a5a);
		d.flags ^= cpu_to_le32(1u << k);
		CHECK(tc_de_decode(&d, 9, 2000, 10, g, V3, &i) ==
		      TC_DE_BAD_CSUM);
	}
}

/*
 * Epoch bits where there can be none, with a valid checksum: in a clean
 * entry (any version), in a dirty entry of version 1 or 2: invalid flags.
 */
static void test_epochs_refused(void)
{
	const u32 g = 0x1234abcd;
	struct tc_disk_entry d;
	struct tc_de_info i;
	u32 k, bit;

	for (k = 0; k < 16; k++) {
		bit = 1u << (TC_DE_EPOCH_SHIFT + k);
		/* clean */
		tc_de_encode(&d, 9, 1234, false, 10, g, 0);
		d.flags |= cpu_to_le32(bit);
		de_resum(&d);
		CHECK(tc_de_decode(&d, 9, 2000, 10, g, V3, &i) ==
		      TC_DE_BAD_FLAGS);
		CHECK(tc_de_decode(&d, 9, 2000, 10, g, V2, &i) ==
		      TC_DE_BAD_FLAGS);
		/* ... uncommitted too */
		CHECK(tc_de_decode(&d, 9, 2000, 9, g, V3, &i) ==
		      TC_DE_BAD_FLAGS);
		/* dirty, version 2 and version 1 (generation 0) */
		tc_de_encode(&d, 9, 1234, true, 10, g, (u16)(1u << k));
		CHECK(tc_de_decode(&d, 9, 2000, 10, g, V3, &i) ==
		      TC_DE_DIRTY_OK);
		CHECK(tc_de_decode(&d, 9, 2000, 10, g, V2, &i) ==
		      TC_DE_BAD_FLAGS);
		CHECK(tc_de_decode(&d, 9, 2000, 9, g, V2, &i) ==
		      TC_DE_BAD_FLAGS);
		tc_de_encode(&d, 9, 1234, true, 10, 0, (u16)(1u << k));
		CHECK(tc_de_decode(&d, 9, 2000, 10, 0, V1, &i) ==
		      TC_DE_BAD_FLAGS);
		CHECK(tc_de_decode(&d, 9, 2000, 10, 0, V3, &i) ==
		      TC_DE_DIRTY_OK);
		/* dirty without valid stays invalid with an epoch */
		d.flags = cpu_to_le32(TC_DE_DIRTY | bit);
		de_resum(&d);
		CHECK(tc_de_decode(&d, 9, 2000, 10, 0, V3, &i) ==
		      TC_DE_BAD_FLAGS);
	}
	/* the other unknown flag bits stay invalid in version 3 */
	for (k = 2; k < TC_DE_EPOCH_SHIFT; k++) {
		tc_de_encode(&d, 9, 1234, true, 10, g, 3);
		d.flags |= cpu_to_le32(1u << k);
		de_resum(&d);
		CHECK(tc_de_decode(&d, 9, 2000, 10, g, V3, &i) ==
		      TC_DE_BAD_FLAGS);
	}
}

/*
 * tc_disk_epoch: an entry's absolute epoch is the first from the
 * superblock's epoch on with its low 16 bits, across the 16-bit wrap and
 * the 64-bit one.
 */
static void test_disk_epoch(void)
{
	static const u64 bases[] = {
		0, 1, 0xfffe, 0xffff, 0x10000, 0x1fff0, 0x123456789abcull,
		~0ull - 0x20000, ~0ull - 0xffff, ~0ull - 1, ~0ull,
	};
	const size_t nr_bases = sizeof(bases) / sizeof(*bases);
	size_t b;
	u32 k;

	CHECK(tc_disk_epoch(0, 0) == 0);
	CHECK(tc_disk_epoch(0, 5) == 5);
	CHECK(tc_disk_epoch(0, 0xffff) == 0xffff);
	CHECK(tc_disk_epoch(0xfffe, 0xffff) == 0xffff);
	CHECK(tc_disk_epoch(0xfffe, 0) == 0x10000);
	CHECK(tc_disk_epoch(0xfffe, 1) == 0x10001);
	CHECK(tc_disk_epoch(0xfffe, 0xfffd) == 0x1fffd);
	CHECK(tc_disk_epoch(0x10000, 0) == 0x10000);
	CHECK(tc_disk_epoch(0x10001, 0) == 0x20000);
	CHECK(tc_disk_epoch(0x3fff5, 0xfff7) == 0x3fff7);
	CHECK(tc_disk_epoch(0x3fff5, 0x0003) == 0x40003);
	CHECK(tc_disk_epoch(~0ull, 0xffff) == ~0ull);
	CHECK(tc_disk_epoch(~0ull, 0) == 0);	/* wraps as u64 does */
	for (b = 0; b < nr_bases; b++) {
		for (k = 0; k <= 0xffff; k++) {
			u64 e = tc_disk_epoch(bases[b], (u16)k);

			/* from the superblock's epoch on, with those bits */
			CHECK((u16)e == k);
			CHECK(e - bases[b] <= 0xffff);
			/* an epoch the entry was written in comes back */
			CHECK(tc_disk_epoch(bases[b], (u16)(bases[b] + k)) ==
			      bases[b] + k);
		}
	}
}

/*
 * Entries of other generations: foreign, whatever else they say (a valid
 * dirty entry of the previous generation included), and written again
 * with this generation they are ours.  An entry of this generation for
 * another slot is misplaced.
 */
static void test_foreign(void)
{
	const u32 g = 0x1234abcd;
	struct tc_disk_entry d;
	struct tc_de_info i;

	/* the previous generation's committed dirty entry */
	tc_de_encode(&d, 5, 77, true, 10, g - 1, 0);
	CHECK(tc_de_decode(&d, 5, 100, 10, g - 1, V3, &i) == TC_DE_DIRTY_OK);
	CHECK(tc_de_decode(&d, 5, 100, 10, g, V3, &i) == TC_DE_FOREIGN);
	/* version 1 (generation 0) zeroed its area: nothing there is foreign */
	CHECK(tc_de_decode(&d, 5, 100, 10, 0, V1, &i) == TC_DE_BAD_FLAGS);
	CHECK(tc_de_decode(&d, 6, 100, 10, 0, V1, &i) == TC_DE_BAD_SLOT);
	/* ... in another slot's place too */
	CHECK(tc_de_decode(&d, 6, 100, 10, g, V3, &i) == TC_DE_FOREIGN);
	/* of this generation, but another slot's (misplaced) */
	tc_de_encode(&d, 5, 77, true, 10, g, 0);
	CHECK(tc_de_decode(&d, 6, 100, 10, g, V3, &i) == TC_DE_BAD_SLOT);
	CHECK(tc_de_decode(&d, 5 + 128, 100, 10, g, V3, &i) == TC_DE_BAD_SLOT);
	CHECK(tc_de_decode(&d, 5, 100, 10, g + 1, V3, &i) == TC_DE_FOREIGN);
	CHECK(!tc_de_free(TC_DE_BAD_SLOT));
	CHECK(tc_de_decode(&d, 5 + (1ull << 32), 100, 10, g, V3, &i) ==
	      TC_DE_DIRTY_OK);	/* slot numbers are 32-bit on disk */
	/* foreign before anything else: a bad checksum or flags too */
	tc_de_encode(&d, 5, 77, true, 10, g - 1, 0);
	d.csum ^= cpu_to_le32(1);
	d.flags = cpu_to_le32(0xff);
	CHECK(tc_de_decode(&d, 5, 1, 10, g, V3, &i) == TC_DE_FOREIGN);
	/* rewritten for this generation */
	tc_de_encode(&d, 5, 77, true, 10, g, 0);
	CHECK(tc_de_decode(&d, 5, 100, 10, g, V3, &i) == TC_DE_DIRTY_OK);
	CHECK(tc_de_decode(&d, 5, 100, 10, g - 1, V3, &i) == TC_DE_FOREIGN);
}

/*
 * Version 1 entries (reserved word 0, no generation) are the entries of
 * generation 0, bit for bit.
 */
static void test_v1_entries(void)
{
	struct tc_disk_entry d, v1;
	struct tc_de_info i;

	memset(&v1, 0, sizeof(v1));
	v1.block = cpu_to_le64(77);
	v1.seq = cpu_to_le64(10);
	v1.slot = cpu_to_le32(5);
	v1.flags = cpu_to_le32(TC_DE_VALID | TC_DE_DIRTY);
	de_resum(&v1);
	tc_de_encode(&d, 5, 77, true, 10, 0, 0);
	CHECK(!memcmp(&d, &v1, sizeof(d)));
	CHECK(tc_de_decode(&v1, 5, 100, 10, 0, V1, &i) == TC_DE_DIRTY_OK);
	CHECK(i.block == 77 && i.seq == 10 && i.dirty && !i.epoch);
	CHECK(tc_de_decode(&v1, 5, 100, 10, 1, V1, &i) == TC_DE_FOREIGN);
	/* misplaced, as version 1 said */
	CHECK(tc_de_decode(&v1, 6, 100, 10, 0, V1, &i) == TC_DE_BAD_SLOT);
	/* a corrupt version 1 entry still fails the load */
	v1.block ^= cpu_to_le64(4);
	CHECK(tc_de_decode(&v1, 5, 100, 10, 0, V1, &i) == TC_DE_BAD_CSUM);
}

static void random_entry(struct tc_disk_entry *d, u64 *slot, u32 *gen)
{
	*slot = (u32)rnd64();
	*gen = (u32)rnd64();
	tc_de_encode(d, *slot, rnd64() >> 1, rnd64() & 1, rnd64() >> 1, *gen,
		     (u16)rnd64());
}

/*
 * Damage confined to the generation word or to the slot word of an entry
 * of this generation: a checksum mismatch, whatever the bits.  Damage to
 * both words: foreign (not detected).  An entry of an earlier generation
 * is never taken for one of ours with its generation word damaged: the
 * CRC-32C cannot hold under two values of one word.
 */
static void test_damaged_ids(void)
{
	struct tc_disk_entry d, e;
	struct tc_de_info i;
	unsigned int n, nr[TC_DE_BAD_BLOCK + 1] = { 0 };
	u64 s;
	u32 g, x;

	for (n = 0; n < 200000; n++) {
		random_entry(&d, &s, &g);
		x = (u32)rnd64() | 1;	/* not zero */
		e = d;
		e.gen ^= cpu_to_le32(x);
		CHECK(tc_de_decode(&e, s, ~0ull, ~0ull, g, V3, &i) ==
		      TC_DE_BAD_CSUM);
		e = d;
		e.slot ^= cpu_to_le32(x);
		CHECK(tc_de_decode(&e, s, ~0ull, ~0ull, g, V3, &i) ==
		      TC_DE_BAD_CSUM);
		e.gen ^= cpu_to_le32((u32)rnd64() | 1);
		nr[tc_de_decode(&e, s, ~0ull, ~0ull, g, V3, &i)]++;
		/* another generation's, under this one: in place or not */
		CHECK(tc_de_decode(&d, s, ~0ull, ~0ull, g ^ x, V3, &i) ==
		      TC_DE_FOREIGN);
		CHECK(tc_de_decode(&d, s, ~0ull, ~0ull, g + 1, V3, &i) ==
		      TC_DE_FOREIGN);
		CHECK(tc_de_decode(&d, (u32)(s + x), ~0ull, ~0ull, g ^ x, V3, &i) ==
		      TC_DE_FOREIGN);
	}
	CHECK(nr[TC_DE_FOREIGN] == 200000);
}

/*
 * A metadata block written in another block's place (entries of slots
 * 128 to 255 where slots 0 to 127 belong), and a sector in another
 * sector's place: every non-zero entry is misplaced under this generation,
 * foreign under a later one.
 */
static void test_misdirected(void)
{
	const u32 g = 0x0badbeef;
	struct tc_disk_entry blk[TC_ENTRIES_PER_MBLOCK];
	struct tc_de_info i;
	const size_t per_sector = 512 / sizeof(blk[0]);
	size_t k;

	for (k = 0; k < TC_ENTRIES_PER_MBLOCK; k++)
		if (k % 3)
			tc_de_encode(&blk[k], 128 + k, 1000 + k, k % 2, 5, g, 0);
		else
			tc_de_encode_empty(&blk[k]);
	for (k = 0; k < TC_ENTRIES_PER_MBLOCK; k++) {
		CHECK(tc_de_decode(&blk[k], 128 + k, ~0ull, 9, g, V3, &i) ==
		      (k % 3 ? (k % 2 ? TC_DE_DIRTY_OK : TC_DE_CLEAN) :
		       TC_DE_EMPTY));
		CHECK(tc_de_decode(&blk[k], k, ~0ull, 9, g, V3, &i) ==
		      (k % 3 ? TC_DE_BAD_SLOT : TC_DE_EMPTY));
		CHECK(tc_de_decode(&blk[k], k, ~0ull, 9, g + 1, V3, &i) ==
		      (k % 3 ? TC_DE_FOREIGN : TC_DE_EMPTY));
		/* the block's second sector written over its first */
		if (k >= per_sector && k < 2 * per_sector)
			CHECK(tc_de_decode(&blk[k], 128 + k - per_sector,
					   ~0ull, 9, g, V3, &i) ==
			      (k % 3 ? TC_DE_BAD_SLOT : TC_DE_EMPTY));
	}
}

static void garbage(struct tc_disk_entry *d)
{
	u64 w[4];
	size_t k;

	assert(sizeof(w) == sizeof(*d));
	for (k = 0; k < 4; k++)
		w[k] = rnd64();
	memcpy(d, w, sizeof(*d));
}

/*
 * An entry area full of garbage (a device used for something else
 * before): every entry reads as foreign, none as corrupt, under any
 * generation but the one the garbage happens to hold.  Then the same with
 * garbage that copies the slot numbers, or holds generation g (neither
 * passes the checksum with the other word put in), and garbage of
 * generation g with the slot numbers: ours, and corrupt.
 */
static void test_garbage(void)
{
	const u32 g = 0x5eed0001;
	struct tc_disk_entry d;
	struct tc_de_info i;
	unsigned int nr[TC_DE_BAD_BLOCK + 1] = { 0 };
	u64 s;

	for (s = 0; s < 1000000; s++) {
		garbage(&d);
		nr[tc_de_decode(&d, s, ~0ull, ~0ull, g, V3, &i)]++;
		d.slot = cpu_to_le32((u32)s);
		nr[tc_de_decode(&d, s, ~0ull, ~0ull, g, V3, &i)]++;
		garbage(&d);
		d.gen = cpu_to_le32(g);
		nr[tc_de_decode(&d, s, ~0ull, ~0ull, g, V3, &i)]++;
	}
	CHECK(nr[TC_DE_FOREIGN] == 3000000);

	memset(nr, 0, sizeof(nr));
	for (s = 0; s < 1000; s++) {
		garbage(&d);
		d.slot = cpu_to_le32((u32)s);
		d.gen = cpu_to_le32(g);
		nr[tc_de_decode(&d, s, ~0ull, ~0ull, g, V3, &i)]++;
	}
	CHECK(nr[TC_DE_BAD_CSUM] == 1000);
}

/* A version 3 superblock (no summary) stays version 3, and reads as one. */
static void test_sb_v3(void)
{
	struct tc_sb_info in, out;
	struct tc_disk_sb sb;

	sample_sb_v(&in, V3);
	tc_sb_encode(&sb, &in);
	CHECK(le32_to_cpu(sb.version) == V3);
	CHECK(tc_sb_decode(&sb, &out) == TC_SB_OK && out.version == V3);
	CHECK(!out.layout.sum_blocks && !out.layout.sum_start);
	CHECK(out.layout.data_start == in.layout.data_start);
	/* a version 3 layout under a version 4 superblock: data_start wrong */
	sb.version = cpu_to_le32(V4);
	sb_resum(&sb);
	CHECK(tc_sb_decode(&sb, &out) == TC_SB_BAD_FIELDS);
	/* and the other way round */
	sample_sb(&in);
	tc_sb_encode(&sb, &in);
	sb.version = cpu_to_le32(V3);
	sb_resum(&sb);
	CHECK(tc_sb_decode(&sb, &out) == TC_SB_BAD_FIELDS);
}

static void sum_sample(struct tc_disk_sum *s, u32 index, u32 gen)
{
	memset(s, 0, sizeof(*s));
	tc_sum_set(s, 0);
	tc_sum_set(s, 9);
	tc_sum_set(s, TC_SUM_BITS - 1);
	tc_sum_seal(s, index, gen);
}

/*
 * Summary blocks: ours read as their bits; anything else (torn, damaged,
 * zeroed, misplaced, another generation's, leftovers) as bad: all set.
 */
static void test_summary(void)
{
	const u32 g = 0x5eed0001;
	struct tc_disk_sum s;
	unsigned char *raw = (unsigned char *)&s;
	u32 j, n;
	size_t k;

	sum_sample(&s, 3, g);
	CHECK(tc_sum_decode(&s, 3, g) == TC_SUM_OK);
	for (j = 0, n = 0; j < TC_SUM_BITS; j++)
		n += tc_sum_test(&s, j);
	CHECK(n == 3 && tc_sum_test(&s, 9) && !tc_sum_test(&s, 8));
	CHECK(s.bits[1] == 2 && s.bits[TC_SUM_BYTES - 1] == 0x80);
	CHECK(le32_to_cpu(s.gen) == g && le32_to_cpu(s.index) == 3);
	/* misplaced (another index), another generation's: bad */
	CHECK(tc_sum_decode(&s, 4, g) == TC_SUM_BAD);
	CHECK(tc_sum_decode(&s, 3, g + 1) == TC_SUM_BAD);
	/* zeroed (a lost write): bad */
	memset(&s, 0, sizeof(s));
	CHECK(tc_sum_decode(&s, 0, g) == TC_SUM_BAD);
	CHECK(tc_sum_decode(&s, 7, g) == TC_SUM_BAD);
	/* all clear, sealed (what a format writes): valid */
	tc_sum_seal(&s, 7, g);
	CHECK(tc_sum_decode(&s, 7, g) == TC_SUM_OK);
	/* any flipped byte: bad */
	for (k = 0; k < sizeof(s); k += (k < 64 ? 1 : 61)) {
		sum_sample(&s, 3, g);
		raw[k] ^= 0x21;
		CHECK(tc_sum_decode(&s, 3, g) == TC_SUM_BAD);
	}
	/* the reserved word must be zero */
	sum_sample(&s, 3, g);
	s.reserved = cpu_to_le32(1);
	s.csum = 0;
	s.csum = cpu_to_le32(tc_disk_crc(&s, sizeof(s)));
	CHECK(tc_sum_decode(&s, 3, g) == TC_SUM_BAD);
	/* leftover bytes: bad */
	for (k = 0; k < sizeof(s); k += 8) {
		u64 v = rnd64();

		memcpy(raw + k, &v, 8);
	}
	CHECK(tc_sum_decode(&s, 3, g) == TC_SUM_BAD);
	CHECK(tc_sum_result_str(TC_SUM_BAD) != NULL);
}

int main(void)
{
	test_sizes();
	test_crc();
	test_layout();
	test_layout_v4();
	test_sb();
	test_sb_v1();
	test_sb_v2();
	test_sb_v3();
	test_entries();
	test_epochs();
	test_epochs_refused();
	test_disk_epoch();
	test_foreign();
	test_v1_entries();
	test_damaged_ids();
	test_misdirected();
	test_garbage();
	test_summary();
	if (failures) {
		fprintf(stderr, "test_disk: %d failure(s)\n", failures);
		return 1;
	}
	printf("test_disk: all checks passed\n");
	return 0;
}
