// SPDX-License-Identifier: GPL-2.0
/* Host tests of the on-disk format code (dm-tiercache/tc_disk.c). */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tc_disk.h"

static int failures;

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
	CHECK(tc_disk_layout(1048576, 8, &l) == 0);
	CHECK(l.meta_start == 8);
	CHECK(l.data_start == 8 + l.meta_blocks * 8);
	CHECK(l.meta_blocks == (l.nr_slots + 127) / 128);
	CHECK(l.data_start + l.nr_slots * 8 <= 1048576);
	CHECK(l.data_start + (l.nr_slots + 1) * 8 +
	      ((l.nr_slots % 128) ? 0 : 8) > 1048576);
	CHECK(l.nr_slots > 130000 && l.nr_slots < 131072);
	/* data_start is block aligned for big blocks */
	CHECK(tc_disk_layout(1048576, 1024, &l) == 0);
	CHECK(l.data_start == 1024 && l.nr_slots == 1023);
	/* every size: the layout fits and one more slot does not */
	for (dev = 17; dev < 5000; dev += 7) {
		if (tc_disk_layout(dev, 8, &l)) {
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

static void sample_sb(struct tc_sb_info *i)
{
	memset(i, 0, sizeof(*i));
	tc_disk_layout(1 << 20, 8, &i->layout);
	i->commit_seq = 42;
	i->origin_sectors = 1 << 21;
	strcpy(i->uuid, "TIERCACHE-test");
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

	/* a newer version with a valid checksum */
	tc_sb_encode(&sb, &in);
	sb.version = cpu_to_le32(2);
	sb.csum = 0;
	sb.csum = cpu_to_le32(tc_disk_crc(&sb, sizeof(sb)));
	CHECK(tc_sb_decode(&sb, &out) == TC_SB_BAD_VERSION);

	/* impossible geometry with a valid checksum */
	tc_sb_encode(&sb, &in);
	sb.data_start = cpu_to_le64(le64_to_cpu(sb.data_start) + 8);
	sb.csum = 0;
	sb.csum = cpu_to_le32(tc_disk_crc(&sb, sizeof(sb)));
	CHECK(tc_sb_decode(&sb, &out) == TC_SB_BAD_FIELDS);
}

static void test_entries(void)
{
	struct tc_disk_entry d;
	struct tc_de_info i;
	unsigned char *raw = (unsigned char *)&d;
	size_t k;

	tc_de_encode_empty(&d);
	CHECK(tc_de_decode(&d, 5, 100, 10, &i) == TC_DE_EMPTY);

	tc_de_encode(&d, 5, 77, true, 10);
	CHECK(tc_de_decode(&d, 5, 100, 10, &i) == TC_DE_DIRTY_OK);
	CHECK(i.block == 77 && i.seq == 10 && i.dirty);
	CHECK(tc_de_decode(&d, 6, 100, 10, &i) == TC_DE_BAD_SLOT);
	CHECK(tc_de_decode(&d, 5, 77, 10, &i) == TC_DE_BAD_BLOCK);
	CHECK(tc_de_decode(&d, 5, 100, 9, &i) == TC_DE_UNCOMMITTED);

	tc_de_encode(&d, 5, 77, false, 3);
	CHECK(tc_de_decode(&d, 5, 100, 10, &i) == TC_DE_CLEAN);
	CHECK(!i.dirty);

	for (k = 0; k < sizeof(d); k++) {
		tc_de_encode(&d, 5, 77, true, 10);
		raw[k] ^= 0x01;
		CHECK(tc_de_decode(&d, 5, 100, 10, &i) == TC_DE_BAD_CSUM);
	}

	/* dirty without valid, unknown bits, reserved: checksummed but wrong */
	tc_de_encode(&d, 5, 77, true, 10);
	d.flags = cpu_to_le32(TC_DE_DIRTY);
	d.csum = 0;
	d.csum = cpu_to_le32(tc_disk_crc(&d, sizeof(d)));
	CHECK(tc_de_decode(&d, 5, 100, 10, &i) == TC_DE_BAD_FLAGS);
	tc_de_encode(&d, 5, 77, true, 10);
	d.reserved = cpu_to_le32(1);
	d.csum = 0;
	d.csum = cpu_to_le32(tc_disk_crc(&d, sizeof(d)));
	CHECK(tc_de_decode(&d, 5, 100, 10, &i) == TC_DE_BAD_FLAGS);
}

int main(void)
{
	test_sizes();
	test_crc();
	test_layout();
	test_sb();
	test_entries();
	if (failures) {
		fprintf(stderr, "test_disk: %d failure(s)\n", failures);
		return 1;
	}
	printf("test_disk: all checks passed\n");
	return 0;
}
