// SPDX-License-Identifier: GPL-2.0
/*
 * Print what the module's decoder (dm-tiercache/tc_disk.c) makes of a cache
 * device image, one line per item, for test_tcdisk.py to compare with the
 * Python copy of the decoder (tests/vm/tcdisk.py):
 *
 *   sb STATE VERSION GEN COMMIT_SEQ NR_SLOTS NR_BLOCKS FLAGS EPOCH
 *   SLOT STATE BLOCK SEQ DIRTY EPOCH
 *   sum K STATE MARKED...
 *
 * BLOCK SEQ DIRTY EPOCH are "-" where not decoded; EPOCH is the absolute
 * epoch of a dirty version (tc_disk_epoch of the superblock's epoch and
 * the entry's bits), "-" for a clean entry.
 * STATE is the tcdisk.py name of the tc_sb_result / tc_de_result /
 * tc_sum_result.  The entries follow only if the superblock decodes, for
 * the slots the image holds; then, for a version 4 cache, each summary
 * block the image holds whole, with the numbers of the metadata blocks
 * (below the cache's count) a load reads by it.
 *
 *   decode_img FILE
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tc_disk.h"

static const char *sb_name(enum tc_sb_result r)
{
	switch (r) {
	case TC_SB_OK:
		return "valid";
	case TC_SB_BLANK:
		return "blank";
	case TC_SB_BAD_CSUM:
		return "bad_csum";
	case TC_SB_BAD_VERSION:
		return "bad_version";
	case TC_SB_BAD_FIELDS:
		return "bad_fields";
	}
	return "?";
}

static const char *de_name(enum tc_de_result r)
{
	switch (r) {
	case TC_DE_EMPTY:
		return "empty";
	case TC_DE_FOREIGN:
		return "foreign";
	case TC_DE_CLEAN:
		return "clean";
	case TC_DE_DIRTY_OK:
		return "dirty";
	case TC_DE_UNCOMMITTED:
		return "uncommitted";
	case TC_DE_BAD_CSUM:
		return "bad_csum";
	case TC_DE_BAD_SLOT:
		return "bad_slot";
	case TC_DE_BAD_FLAGS:
		return "bad_flags";
	case TC_DE_BAD_BLOCK:
		return "bad_block";
	}
	return "?";
}

static const char *sum_name(enum tc_sum_result r)
{
	switch (r) {
	case TC_SUM_OK:
		return "valid";
	case TC_SUM_BAD:
		return "bad";
	}
	return "?";
}

/* The summary blocks of a version 4 image, as a load reads them. */
static void print_summary(const unsigned char *img, size_t len,
			  const struct tc_sb_info *i)
{
	const struct tc_layout *l = &i->layout;
	struct tc_disk_sum sum;
	u64 k, j, mb;

	for (k = 0; k < l->sum_blocks; k++) {
		size_t off = (l->sum_start + k * TC_MBLOCK_SECTORS) * 512;
		enum tc_sum_result r;

		if (off + sizeof(sum) > len)
			break;
		memcpy(&sum, img + off, sizeof(sum));
		r = tc_sum_decode(&sum, k, i->gen);
		printf("sum %llu %s", (unsigned long long)k, sum_name(r));
		for (j = 0; j < TC_SUM_BITS; j++) {
			mb = k * TC_SUM_BITS + j;
			if (mb < l->meta_blocks &&
			    (r == TC_SUM_BAD ||
			     (r == TC_SUM_OK && tc_sum_test(&sum, j))))
				printf(" %llu", (unsigned long long)mb);
		}
		printf("\n");
	}
}

static unsigned char *read_file(const char *path, size_t *len)
{
	unsigned char *buf = NULL;
	size_t cap = 0, n;
	FILE *f = fopen(path, "rb");

	if (!f)
		return NULL;
	*len = 0;
	do {
		if (*len == cap) {
			unsigned char *p;

			cap = cap ? cap * 2 : 1 << 16;
			p = realloc(buf, cap);
			if (!p) {
				free(buf);
				fclose(f);
				return NULL;
			}
			buf = p;
		}
		n = fread(buf + *len, 1, cap - *len, f);
		*len += n;
	} while (n);
	fclose(f);
	return buf;
}

int main(int argc, char **argv)
{
	const size_t meta_off = (size_t)TC_META_START * 512;
	struct tc_disk_sb sb;
	struct tc_sb_info i;
	enum tc_sb_result res;
	unsigned char *img;
	size_t len;
	u64 nr_blocks, s;

	img = argc == 2 ? read_file(argv[1], &len) : NULL;
	if (!img) {
		fprintf(stderr, "usage: decode_img FILE (readable)\n");
		return 2;
	}
	memset(&sb, 0, sizeof(sb));
	memcpy(&sb, img, len < sizeof(sb) ? len : sizeof(sb));
	res = tc_sb_decode(&sb, &i);
	if (res != TC_SB_OK) {
		printf("sb %s\n", sb_name(res));
		free(img);
		return 0;
	}
	nr_blocks = i.origin_sectors / i.layout.block_sectors;
	printf("sb %s %u %u %llu %llu %llu %u %llu\n", sb_name(res), i.version,
	       i.gen, (unsigned long long)i.commit_seq,
	       (unsigned long long)i.layout.nr_slots,
	       (unsigned long long)nr_blocks, i.flags,
	       (unsigned long long)i.epoch);
	for (s = 0; s < i.layout.nr_slots; s++) {
		size_t off = meta_off + s * sizeof(struct tc_disk_entry);
		struct tc_disk_entry d;
		struct tc_de_info e;
		enum tc_de_result r;

		if (off + sizeof(d) > len)
			break;
		memcpy(&d, img + off, sizeof(d));
		r = tc_de_decode(&d, s, nr_blocks, i.commit_seq, i.gen,
				 i.version, &e);
		if (r == TC_DE_CLEAN || r == TC_DE_DIRTY_OK ||
		    r == TC_DE_UNCOMMITTED || r == TC_DE_BAD_BLOCK) {
			printf("%llu %s %llu %llu %d ", (unsigned long long)s,
			       de_name(r), (unsigned long long)e.block,
			       (unsigned long long)e.seq, e.dirty);
			if (e.dirty)
				printf("%llu\n", (unsigned long long)
				       tc_disk_epoch(i.epoch, e.epoch));
			else
				printf("-\n");
		} else {
			printf("%llu %s - - - -\n", (unsigned long long)s,
			       de_name(r));
		}
	}
	print_summary(img, len, &i);
	free(img);
	return 0;
}
