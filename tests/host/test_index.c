// SPDX-License-Identifier: GPL-2.0
/*
 * Tests of the compact index of the next core: the slot words
 * (tc_slots.c), the map (tc_hmap.c) and the dirty order (tc_dorder.c),
 * against simple models, and lookups racing changes in threads.
 *
 *   ./test_index [seed]
 */
#include <stdio.h>
#include <stdarg.h>
#include <time.h>

#include "tc_slots.h"
#include "tc_hmap.h"
#include "tc_dorder.h"

unsigned int tc_host_fail_allocs;
__thread struct tc_host_sort tc_host_sort;
void (*tc_host_race_hook)(void);

/* Now and then, a lookup lets the writers run between two buckets. */
static void race_hook(void)
{
	static __thread unsigned int n;

	if (++n % 32 == 0)
		sched_yield();
}

static u64 rng_state;

static u64 rnd(void)
{
	/* splitmix64 */
	u64 z = (rng_state += 0x9E3779B97F4A7C15ULL);

	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
	return z ^ (z >> 31);
}

static u64 rnd_below(u64 n)
{
	return n ? rnd() % n : 0;
}

static void fail(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fprintf(stderr, "FAIL: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	exit(1);
}

#define ARRAY_SIZE(a)	(sizeof(a) / sizeof((a)[0]))
#define CHECK(cond, ...) do { if (!(cond)) fail(__VA_ARGS__); } while (0)

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* ---- slot words ---- */

static void test_slots(void)
{
	struct tc_slots sl;
	u64 *blocks;
	u32 n = 1000, s, i;

	CHECK(!tc_slots_create(&sl, n), "slots create");
	blocks = calloc(n, sizeof(*blocks));
	for (s = 0; s < n; s++) {
		blocks[s] = rnd() & TC_SLOT_MAX_BLOCK;
		if (s % 7 == 0)
			blocks[s] = TC_SLOT_MAX_BLOCK - s;
		tc_slot_set_block(&sl, s, blocks[s]);
	}
	/* flags of neighbours (eight to a word) never touch the block */
	for (i = 0; i < 100000; i++) {
		s = rnd_below(n);
		switch (rnd_below(4)) {
		case 0:
			tc_slot_set(&sl, s, rnd_below(TC_SF_NR));
			break;
		case 1:
			tc_slot_clear(&sl, s, rnd_below(TC_SF_NR));
			break;
		case 2:
			tc_slot_update(&sl, s, rnd_below(256), rnd_below(256));
			break;
		default:
			tc_slot_test_and_set(&sl, s, rnd_below(TC_SF_NR));
		}
	}
	for (s = 0; s < n; s++)
		CHECK(tc_slot_block(&sl, s) == blocks[s], "block of slot %u", s);
	/* one slot's flags leave its neighbours' alone */
	memset(sl.flags, 0, DIV_ROUND_UP(n, TC_SF_PER_LONG) * sizeof(long));
	tc_slot_update(&sl, 9, 0, 0xff);
	CHECK(tc_slot_flags(&sl, 8) == 0 && tc_slot_flags(&sl, 10) == 0 &&
	      tc_slot_flags(&sl, 9) == 0xff, "neighbour flags");
	CHECK(tc_slot_retire(&sl, 9), "retire of a queued slot in writeback");
	CHECK(tc_slot_flags(&sl, 9) == (BIT(TC_SF_QUEUED) | BIT(TC_SF_WB)),
	      "retire keeps QUEUED and WB");
	/* of the owners left, the last to let go frees the slot */
	CHECK(!tc_slot_let_go(&sl, 9, BIT(TC_SF_WB)), "WB is not the last");
	CHECK(tc_slot_let_go(&sl, 9, BIT(TC_SF_QUEUED)) &&
	      tc_slot_flags(&sl, 9) == 0, "QUEUED is the last");
	CHECK(!tc_slot_let_go(&sl, 9, BIT(TC_SF_QUEUED)),
	      "nothing to let go of frees nothing");
	tc_slot_set(&sl, 9, TC_SF_DIRTY);
	tc_slot_set(&sl, 9, TC_SF_VALID);
	CHECK(!tc_slot_retire(&sl, 9) && tc_slot_flags(&sl, 9) == 0,
	      "retire of an unqueued slot");
	tc_slot_update(&sl, 9, 0, BIT(TC_SF_VALID) | BIT(TC_SF_WB));
	CHECK(tc_slot_retire(&sl, 9) && tc_slot_let_go(&sl, 9, BIT(TC_SF_WB)),
	      "retire of a slot in writeback: freed when WB lets go");
	CHECK(tc_slot_test_and_set(&sl, 3, TC_SF_WB) == false &&
	      tc_slot_test_and_set(&sl, 3, TC_SF_WB) == true &&
	      tc_slot_test_and_clear(&sl, 3, TC_SF_WB) == true &&
	      !tc_slot_test(&sl, 3, TC_SF_WB), "test and set/clear");
	free(blocks);
	tc_slots_destroy(&sl);
	printf("slots: ok\n");
}

/* ---- sizes up to 2^32 - 1 slots, computed, not allocated ---- */

static void test_geometry(void)
{
	static const u32 sizes[] = { 0, 1, 2, 16, 63, 64, 65, 1000, 4096,
				     1000000, 16777216, 0x7fffffff,
				     0x80000000u, U32_MAX - 1, U32_MAX };
	struct tc_hmap_geometry g;
	u64 nb, bins[16] = { 0 };
	unsigned int i;

	for (i = 0; i < ARRAY_SIZE(sizes); i++) {
		u32 n = sizes[i];

		tc_hmap_geometry(n, &g);
		CHECK(g.nr_buckets % TC_HMAP_REGION == 0, "whole regions");
		CHECK(g.nr_buckets > n, "an empty bucket for %u", n);
		CHECK(g.nr_buckets * 5 >= (u64)n * 6, "load <= 5/6 for %u", n);
		CHECK(g.nr_buckets - TC_HMAP_REGION < (u64)n * 6 / 5 + 1,
		      "no more than a region over 1.2 for %u", n);
		CHECK(g.nr_regions * TC_HMAP_REGION == g.nr_buckets, "regions");
		CHECK(tc_dorder_tail_cap(n) >= 1024 &&
		      tc_dorder_tail_cap(n) <= (1u << 20), "tail cap");
	}
	tc_hmap_geometry(U32_MAX, &g);
	CHECK(g.nr_buckets == 5153960768ULL, "buckets of 2^32-1 slots: %llu",
	      (unsigned long long)g.nr_buckets);
	CHECK(g.nr_regions == 80530637ULL, "regions of 2^32-1 slots");
	CHECK(g.bytes == 5153960768ULL * 4 + 80530637ULL * 4, "map bytes");
	CHECK(tc_slots_bytes(U32_MAX) == 4294967295ULL * 5 + 536870912ULL * 8,
	      "slot bytes of 2^32-1 slots");
	CHECK(tc_dorder_tail_cap(U32_MAX) == (1u << 20), "largest tail");
	/* the home of any 40-bit block is in the table, spread evenly */
	nb = g.nr_buckets;
	CHECK(tc_hmap_home_of(nb, 0) < nb, "home of 0");
	CHECK(tc_hmap_home_of(nb, TC_SLOT_MAX_BLOCK) < nb, "home of max");
	CHECK(tc_hmap_home_of(nb, U64_MAX) < nb, "home of U64_MAX");
	for (i = 0; i < 1600000; i++) {
		u64 h = tc_hmap_home_of(nb, i % 2 ? rnd() & TC_SLOT_MAX_BLOCK :
					     i);

		CHECK(h < nb, "home in table");
		bins[h * 16 / nb]++;
	}
	for (i = 0; i < 16; i++)
		CHECK(bins[i] > 95000 && bins[i] < 105000,
		      "home spread: bin %u has %llu", i,
		      (unsigned long long)bins[i]);
	/* sizes that overflow are refused, not wrapped */
	CHECK(!tc_bigalloc(SIZE_MAX / 2, 4, GFP_KERNEL), "overflowing alloc");
	printf("geometry (2^32-1 slots: %llu buckets, %.4f B/slot map, %.4f B/slot words): ok\n",
	       (unsigned long long)g.nr_buckets, (double)g.bytes / U32_MAX,
	       (double)tc_slots_bytes(U32_MAX) / U32_MAX);
}

/* ---- the map against a model ---- */

/*
 * The model: the blocks are keys[0 .. nkeys), each with its versions,
 * newest first; a slot is free or holds one version of one key.
 */
struct model {
	struct tc_slots sl;
	struct tc_hmap m;
	u32 nslots;
	u64 *keys;
	u32 nkeys;
	u32 **chain;		/* per key: slots, newest first */
	u32 *chain_len;
	u32 *key_of;		/* per slot: key index, or U32_MAX if free */
	u32 *free_slots;
	u32 nfree;
	u32 nmapped;
	u64 ops;
};

static void model_init(struct model *md, u32 nslots, u64 *keys, u32 nkeys)
{
	u32 i;

	memset(md, 0, sizeof(*md));
	CHECK(!tc_slots_create(&md->sl, nslots), "slots");
	CHECK(!tc_hmap_create(&md->m, &md->sl), "map");
	md->nslots = nslots;
	md->keys = keys;
	md->nkeys = nkeys;
	md->chain = calloc(nkeys, sizeof(*md->chain));
	md->chain_len = calloc(nkeys, sizeof(*md->chain_len));
	md->key_of = malloc(nslots * sizeof(u32));
	md->free_slots = malloc(nslots * sizeof(u32));
	for (i = 0; i < nslots; i++) {
		md->key_of[i] = U32_MAX;
		md->free_slots[i] = nslots - 1 - i;
	}
	md->nfree = nslots;
}

static void model_exit(struct model *md)
{
	u32 i;

	for (i = 0; i < md->nkeys; i++)
		free(md->chain[i]);
	free(md->chain);
	free(md->chain_len);
	free(md->key_of);
	free(md->free_slots);
	tc_hmap_destroy(&md->m);
	tc_slots_destroy(&md->sl);
}

static void model_insert(struct model *md, u32 k)
{
	u32 pick = rnd_below(md->nfree), s = md->free_slots[pick], *c;

	md->free_slots[pick] = md->free_slots[--md->nfree];
	tc_slot_set_block(&md->sl, s, md->keys[k]);
	CHECK(!tc_hmap_insert(&md->m, s), "insert");
	c = realloc(md->chain[k], (md->chain_len[k] + 1) * sizeof(u32));
	memmove(c + 1, c, md->chain_len[k] * sizeof(u32));
	c[0] = s;
	md->chain[k] = c;
	md->chain_len[k]++;
	md->key_of[s] = k;
	md->nmapped++;
}

static void model_delete(struct model *md, u32 s)
{
	u32 k = md->key_of[s], i;

	CHECK(tc_hmap_delete(&md->m, s), "delete of mapped slot %u", s);
	for (i = 0; md->chain[k][i] != s; i++)
		;
	memmove(md->chain[k] + i, md->chain[k] + i + 1,
		(md->chain_len[k] - i - 1) * sizeof(u32));
	md->chain_len[k]--;
	md->key_of[s] = U32_MAX;
	md->free_slots[md->nfree++] = s;
	md->nmapped--;
	/* scribble over the freed slot's block, as a reuse would */
	tc_slot_set_block(&md->sl, s, rnd() & TC_SLOT_MAX_BLOCK);
}

static void model_lookup(struct model *md, u32 k)
{
	u64 b = md->keys[k];
	u32 s = tc_hmap_lookup(&md->m, b), i;

	for (i = 0; i < md->chain_len[k]; i++) {
		CHECK(s == md->chain[k][i],
		      "lookup of %llu: version %u is slot %u, map says %u (op %llu)",
		      (unsigned long long)b, i, md->chain[k][i], s,
		      (unsigned long long)md->ops);
		s = tc_hmap_lookup_next(&md->m, b, s);
	}
	CHECK(s == TC_SLOT_NONE, "lookup of %llu: %u versions, map has more",
	      (unsigned long long)b, md->chain_len[k]);
}

/*
 * The whole table: each mapped slot once, every bucket from an entry's home
 * to the entry full (what linear probing needs), versions newest first.
 * Returns the number of entries that wrapped past the end of the table.
 */
static u64 model_check_table(struct model *md)
{
	struct tc_hmap *m = &md->m;
	u64 pos, p, home, wrapped = 0, n = 0;
	u8 *seen = calloc(md->nslots, 1);
	u32 s;

	for (pos = 0; pos < m->nr_buckets; pos++) {
		s = m->bucket[pos];
		if (s == TC_SLOT_NONE)
			continue;
		CHECK(s < md->nslots && md->key_of[s] != U32_MAX,
		      "bucket %llu holds unmapped slot %u",
		      (unsigned long long)pos, s);
		CHECK(!seen[s], "slot %u mapped twice", s);
		seen[s] = 1;
		n++;
		home = tc_hmap_home(m, tc_slot_block(&md->sl, s));
		wrapped += pos < home;
		for (p = home; p != pos; p = (p + 1) % m->nr_buckets)
			CHECK(m->bucket[p] != TC_SLOT_NONE,
			      "hole at %llu between home %llu and slot %u at %llu",
			      (unsigned long long)p, (unsigned long long)home,
			      s, (unsigned long long)pos);
	}
	CHECK(n == md->nmapped, "%llu entries, %u mapped",
	      (unsigned long long)n, md->nmapped);
	for (s = 0; s < md->nkeys; s++)
		if (md->chain_len[s])
			model_lookup(md, s);
	free(seen);
	return wrapped;
}

/*
 * @ops random operations; @fill_bias in percent: how often an insert is
 * tried rather than a delete (high: the table stays full).
 */
static u64 model_run(struct model *md, u64 ops, unsigned int fill_bias,
		     u64 check_every)
{
	u64 wrapped = 0, i;
	double t0 = now_s();
	u32 s, k;

	for (i = 0; i < ops; i++, md->ops++) {
		unsigned int what = rnd_below(100);

		k = rnd_below(md->nkeys);
		if (what < 40) {
			model_lookup(md, k);
		} else if (what < 40 + fill_bias * 60 / 100) {
			if (md->nfree)
				model_insert(md, k);
		} else if (md->nmapped) {
			do {
				s = rnd_below(md->nslots);
			} while (md->key_of[s] == U32_MAX);
			model_delete(md, s);
		}
		if (what == 99 && md->nfree) {
			/* a slot that is not mapped is not found */
			s = md->free_slots[rnd_below(md->nfree)];
			CHECK(!tc_hmap_delete(&md->m, s),
			      "delete of unmapped slot");
		}
		if (check_every && i % check_every == 0)
			wrapped += model_check_table(md);
	}
	wrapped += model_check_table(md);
	if (md->nslots > 1000)
		printf("  %u slots, %u keys: %llu operations, %.1f s\n",
		       md->nslots, md->nkeys, (unsigned long long)ops,
		       now_s() - t0);
	return wrapped;
}

static u64 *random_keys(u32 n)
{
	u64 *k = malloc(n * sizeof(*k));
	u32 i, j;

	for (i = 0; i < n; i++) {
again:
		k[i] = rnd() & TC_SLOT_MAX_BLOCK;
		for (j = 0; j < i && n <= 4096; j++)
			if (k[j] == k[i])
				goto again;
	}
	return k;
}

/* @n keys whose home is in the @nr_regions regions from region @r0. */
static u64 *colliding_keys(u64 nr_buckets, u64 r0, u64 nr_regions, u32 n)
{
	u64 *k = malloc(n * sizeof(*k)), lo = r0 * TC_HMAP_REGION;
	u64 span = nr_regions * TC_HMAP_REGION;
	u32 i = 0;

	while (i < n) {
		u64 b = rnd() & TC_SLOT_MAX_BLOCK;
		u64 h = tc_hmap_home_of(nr_buckets, b);

		if ((h + nr_buckets - lo) % nr_buckets < span)
			k[i++] = b;
	}
	return k;
}

/*
 * One model case: @nslots slots over @keys (freed here), @ops operations.
 * Adds the operations to *@total; the table's free count in *@nfree if
 * asked.  Returns model_run()'s count of wrapped entries.
 */
static u64 model_case(u32 nslots, u64 *keys, u32 nkeys, u64 ops,
		      unsigned int fill_bias, u64 arg, u64 *total, u32 *nfree)
{
	struct model md;
	u64 wrapped;

	model_init(&md, nslots, keys, nkeys);
	wrapped = model_run(&md, ops, fill_bias, arg);
	*total += md.ops;
	if (nfree)
		*nfree = md.nfree;
	model_exit(&md);
	free(keys);
	return wrapped;
}

static void test_map_model(void)
{
	static const u32 small[] = { 1, 2, 3, 5, 17, 51, 52, 64, 100, 203 };
	struct tc_hmap_geometry g;
	u64 *keys, wrapped, total = 0;
	unsigned int i;
	u32 nfree;

	/* small tables: every size of region count, wrap-around all the time */
	for (i = 0; i < ARRAY_SIZE(small); i++) {
		keys = random_keys(small[i] * 2);
		model_case(small[i], keys, small[i] * 2, 100000, 70, 97, &total,
			   NULL);
	}
	/* 4096 slots, unique keys mostly, filled to 0.8 and churned there */
	keys = random_keys(8192);
	model_case(4096, keys, 8192, 1500000, 75, 50000, &total, &nfree);
	CHECK(nfree < 64, "the table filled (%u free)", nfree);
	/* version chains: few keys, many versions each */
	keys = random_keys(300);
	model_case(4096, keys, 300, 600000, 60, 50000, &total, NULL);
	/*
	 * Adversarial: every key's home in the last two regions, so one long
	 * cluster runs over the table's end and on from bucket 0.
	 */
	tc_hmap_geometry(4096, &g);
	keys = colliding_keys(g.nr_buckets, g.nr_regions - 2, 2, 3000);
	wrapped = model_case(4096, keys, 3000, 200000, 75, 20000, &total,
			     NULL);
	CHECK(wrapped > 0, "no entry wrapped past the table end");
	/* the same, many versions of few colliding keys */
	keys = colliding_keys(g.nr_buckets, 0, 1, 500);
	model_case(4096, keys, 500, 200000, 75, 20000, &total, NULL);
	/* a larger table, sequential blocks (the common case) */
	keys = malloc(200000 * sizeof(*keys));
	for (i = 0; i < 200000; i++)
		keys[i] = 1000000 + i;
	model_case(100000, keys, 200000, 2000000, 70, 0, &total, NULL);
	printf("map model: %llu operations: ok\n", (unsigned long long)total);
}

/* ---- the dirty order against a model ---- */

enum { W_NONE, W_TAIL, W_PENDING, W_SORTED };

struct dmodel {
	struct tc_slots sl;
	struct tc_dorder d;
	u32 n;
	u8 *valid, *dirty, *where, *retired;
	u32 *free_slots, nfree;
	u32 tail, pend;
	u32 released;
	u64 *blocks_used;	/* block -> in use, small universe */
	u64 *uidx;		/* per slot: its block's index */
	u64 universe;
};

static void dm_release(void *ctx, u32 s)
{
	struct dmodel *dm = ctx;

	CHECK(dm->retired[s] && !dm->valid[s] && dm->where[s] != W_NONE,
	      "release of slot %u that is not retired and queued", s);
	dm->retired[s] = 0;
	dm->free_slots[dm->nfree++] = s;
	dm->released++;
}

static void dm_init(struct dmodel *dm, u32 n)
{
	u32 i;

	memset(dm, 0, sizeof(*dm));
	dm->n = n;
	CHECK(!tc_slots_create(&dm->sl, n), "slots");
	CHECK(!tc_dorder_create(&dm->d, &dm->sl, dm_release, dm), "dorder");
	dm->valid = calloc(n, 1);
	dm->dirty = calloc(n, 1);
	dm->where = calloc(n, 1);
	dm->retired = calloc(n, 1);
	dm->free_slots = malloc(n * sizeof(u32));
	for (i = 0; i < n; i++)
		dm->free_slots[dm->nfree++] = i;
	dm->universe = (u64)n * 4;
	dm->blocks_used = calloc(DIV_ROUND_UP(dm->universe, 64), 8);
	dm->uidx = calloc(n, sizeof(u64));
}

static void dm_exit(struct dmodel *dm)
{
	tc_dorder_destroy(&dm->d);
	tc_slots_destroy(&dm->sl);
	free(dm->valid);
	free(dm->dirty);
	free(dm->where);
	free(dm->retired);
	free(dm->free_slots);
	free(dm->blocks_used);
	free(dm->uidx);
}

/* blocks are unique among valid slots, so a walk is a list of blocks */
static u64 dm_block(u64 i)
{
	return i * 977 + (i >> 3);
}

static void dm_fill(struct dmodel *dm)
{
	u32 pick, s;
	u64 i;

	if (!dm->nfree)
		return;
	pick = rnd_below(dm->nfree);
	s = dm->free_slots[pick];
	do {
		i = rnd_below(dm->universe);
	} while (dm->blocks_used[i / 64] & (1ULL << (i % 64)));
	dm->blocks_used[i / 64] |= 1ULL << (i % 64);
	CHECK(!(tc_slot_flags(&dm->sl, s) & BIT(TC_SF_QUEUED)),
	      "a free slot is queued");
	dm->free_slots[pick] = dm->free_slots[--dm->nfree];
	tc_slot_set_block(&dm->sl, s, dm_block(i));
	dm->uidx[s] = i;
	tc_slot_set(&dm->sl, s, TC_SF_VALID);
	dm->valid[s] = 1;
}

static u32 dm_pick_valid(struct dmodel *dm)
{
	u32 s, tries;

	for (tries = 0; tries < 100; tries++) {
		s = rnd_below(dm->n);
		if (dm->valid[s])
			return s;
	}
	return U32_MAX;
}

static void dm_mark_dirty(struct dmodel *dm, u32 s)
{
	bool full = tc_dorder_full(&dm->d);
	int r = tc_dorder_mark_dirty(&dm->d, s);

	CHECK(full == (dm->tail == dm->d.tail_cap), "tc_dorder_full() %d with %u of %u",
	      full, dm->tail, dm->d.tail_cap);
	if (dm->where[s] != W_NONE) {
		CHECK(!r, "mark dirty of a queued slot failed");
		dm->dirty[s] = 1;
	} else if (dm->tail == dm->d.tail_cap) {
		CHECK(r == -ENOSPC, "full tail: %d", r);
		CHECK(!tc_slot_test(&dm->sl, s, TC_SF_DIRTY),
		      "full tail left the slot dirty");
	} else {
		CHECK(!r, "mark dirty failed: %d", r);
		dm->dirty[s] = 1;
		dm->where[s] = W_TAIL;
		dm->tail++;
	}
}

static void dm_retire(struct dmodel *dm, u32 s)
{
	u64 i = dm->uidx[s];
	bool queued = tc_slot_retire(&dm->sl, s);

	CHECK(queued == (dm->where[s] != W_NONE), "retire: queued %d", queued);
	dm->valid[s] = 0;
	dm->dirty[s] = 0;
	dm->blocks_used[i / 64] &= ~(1ULL << (i % 64));
	if (queued)
		dm->retired[s] = 1;
	else
		dm->free_slots[dm->nfree++] = s;
}

/* Slots retired and clean in @a or in @b (a merge of them releases them). */
static u32 dm_expect_released(struct dmodel *dm, u8 a, u8 b)
{
	u32 s, n = 0;

	for (s = 0; s < dm->n; s++)
		if ((dm->where[s] == a || dm->where[s] == b) && !dm->dirty[s])
			n += dm->retired[s];
	return n;
}

/* One merge stage that succeeded, from @src (the tail or the pending). */
static void dm_stage_done(struct dmodel *dm, u8 src)
{
	u32 s;

	for (s = 0; s < dm->n; s++) {
		if (dm->where[s] != W_SORTED && dm->where[s] != src)
			continue;
		dm->where[s] = dm->dirty[s] ? W_SORTED : W_NONE;
	}
	if (src == W_TAIL)
		dm->tail = 0;
	dm->pend = 0;
}

/* A failed stage took the tail over as the pending part. */
static void dm_take_tail(struct dmodel *dm)
{
	u32 s;

	for (s = 0; s < dm->n; s++)
		if (dm->where[s] == W_TAIL)
			dm->where[s] = W_PENDING;
	dm->pend = dm->tail;
	dm->tail = 0;
}

/*
 * A failed stage: it dropped the clean slots of the sorted part and of
 * the pending part before it failed to grow; the dirty ones stay pending.
 */
static void dm_stage_failed(struct dmodel *dm)
{
	u32 s;

	dm->pend = 0;
	for (s = 0; s < dm->n; s++) {
		if ((dm->where[s] == W_SORTED || dm->where[s] == W_PENDING) &&
		    !dm->dirty[s])
			dm->where[s] = W_NONE;
		dm->pend += dm->where[s] == W_PENDING;
	}
}

/*
 * A merge: the pending part (if a failed merge left one) and then the
 * tail, or the tail alone.  An allocation failure stops it at the stage
 * that failed: the model tells which by the tail the order still has.
 */
/* Slots in the order: sorted, pending or in the tail. */
static u32 dm_in_order(struct dmodel *dm)
{
	u32 s, n = 0;

	for (s = 0; s < dm->n; s++)
		n += dm->where[s] != W_NONE;
	return n;
}

static void dm_merge(struct dmodel *dm, bool nomem)
{
	bool two = dm->pend;
	u32 s, before = dm->released, expect, expect_tail;
	u32 in_order = dm_in_order(dm);
	u64 dropped = dm->d.nr_dropped;
	int r;

	/* before the merge: its releases clear the model's retired marks */
	expect = dm_expect_released(dm, W_SORTED, two ? W_PENDING : W_TAIL);
	expect_tail = dm_expect_released(dm, W_TAIL, W_TAIL);
	tc_host_fail_allocs = nomem;
	r = tc_dorder_merge(&dm->d, GFP_KERNEL);
	tc_host_fail_allocs = 0;
	if (r) {
		CHECK(nomem && r == -ENOMEM, "merge: %d", r);
		if (two && !dm->d.nr_tail && dm->tail) {
			/* the pending part went in, then the tail failed */
			dm_stage_done(dm, W_PENDING);
			expect += expect_tail;
			dm_take_tail(dm);
		} else if (!two) {
			dm_take_tail(dm);
		}
		dm_stage_failed(dm);
	} else {
		dm_stage_done(dm, two ? W_PENDING : W_TAIL);
		if (two) {
			expect += expect_tail;
			dm_stage_done(dm, W_TAIL);
		}
	}
	CHECK(dm->released - before == expect,
	      "merge released %u slots, expected %u",
	      dm->released - before, expect);
	/* what tc_index_merge() tells the writes parked for a slot by */
	CHECK(dm->d.nr_dropped - dropped == in_order - dm_in_order(dm),
	      "merge counted %llu slots dropped, the model %u",
	      (unsigned long long)(dm->d.nr_dropped - dropped),
	      in_order - dm_in_order(dm));
	CHECK(dm->d.nr_pending == dm->pend && dm->d.nr_tail == dm->tail,
	      "merge left %u pending, %u in the tail; the model %u, %u",
	      dm->d.nr_pending, dm->d.nr_tail, dm->pend, dm->tail);
	/* the merge may release slots: the model checks them in dm_release */
	for (s = 0; s < dm->n; s++)
		CHECK(!!(tc_slot_flags(&dm->sl, s) & BIT(TC_SF_QUEUED)) ==
		      (dm->where[s] != W_NONE), "QUEUED of slot %u", s);
}

/* The walk from @from to @to against the model. */
static void dm_walk(struct dmodel *dm, u64 from, u64 to)
{
	u64 best = U64_MAX, b = 0;
	u32 s, got;

	for (s = 0; s < dm->n; s++) {
		if (dm->where[s] != W_SORTED || !dm->dirty[s])
			continue;
		b = tc_slot_block(&dm->sl, s);
		if (b >= from && b <= to && b < best)
			best = b;
	}
	got = tc_dorder_next(&dm->d, from, to, &b);
	if (best == U64_MAX) {
		CHECK(got == TC_SLOT_NONE, "walk from %llu found %llu",
		      (unsigned long long)from, (unsigned long long)b);
		return;
	}
	CHECK(got != TC_SLOT_NONE && b == best &&
	      tc_slot_block(&dm->sl, got) == best,
	      "walk from %llu: %llu, expected %llu", (unsigned long long)from,
	      got == TC_SLOT_NONE ? 0ULL : (unsigned long long)b,
	      (unsigned long long)best);
}

/* A whole pass, as the writeback makes it, against the sorted model. */
static void dm_full_walk(struct dmodel *dm)
{
	u64 cursor = 0, b, n = 0, expect = 0;
	u32 s;

	for (s = 0; s < dm->n; s++)
		expect += dm->where[s] == W_SORTED && dm->dirty[s];
	while ((s = tc_dorder_next(&dm->d, cursor, U64_MAX, &b)) !=
	       TC_SLOT_NONE) {
		CHECK(b >= cursor, "walk went back");
		CHECK(dm->where[s] == W_SORTED && dm->dirty[s],
		      "walk found slot %u not dirty", s);
		cursor = b + 1;
		n++;
	}
	CHECK(n == expect, "pass found %llu of %llu", (unsigned long long)n,
	      (unsigned long long)expect);
}

static void test_dorder_model(void)
{
	struct dmodel dm;
	u64 i, ops = 0, merges = 0, enospc = 0, nomem = 0;
	u32 s;

	dm_init(&dm, 6000);
	for (i = 0; i < 1500000; i++) {
		unsigned int what = rnd_below(1000);

		if (what < 300) {
			dm_fill(&dm);
		} else if (what < 600) {
			s = dm_pick_valid(&dm);
			if (s != U32_MAX) {
				u32 t = dm.tail;

				dm_mark_dirty(&dm, s);
				enospc += t == dm.d.tail_cap &&
					  dm.where[s] == W_NONE;
			}
		} else if (what < 800) {
			s = dm_pick_valid(&dm);
			if (s != U32_MAX) {
				tc_slot_clear(&dm.sl, s, TC_SF_DIRTY);
				dm.dirty[s] = 0;
			}
		} else if (what < 950) {
			s = dm_pick_valid(&dm);
			if (s != U32_MAX)
				dm_retire(&dm, s);
		} else if (what < 990) {
			u64 from = rnd_below(dm_block(dm.universe));

			dm_walk(&dm, from, rnd_below(4) ? U64_MAX :
					   from + rnd_below(20000));
		} else if (what < 997 && !((i / 100000) % 2)) {
			/* every other 100000 operations, merges are rare */
			bool f = rnd_below(8) == 0;

			dm_merge(&dm, f);
			nomem += f;
			merges++;
		} else if (what >= 997) {
			dm_full_walk(&dm);
		}
		if ((i / 100000) % 2 && i % 20000 == 0) {
			dm_merge(&dm, false);
			merges++;
		}
		ops++;
	}
	dm_merge(&dm, false);
	dm_merge(&dm, false);
	dm_full_walk(&dm);
	CHECK(enospc > 0, "the tail never filled");
	printf("dirty order model: %llu operations, %llu merges (%llu with a failed allocation), %llu full-tail refusals: ok\n",
	       (unsigned long long)ops, (unsigned long long)merges,
	       (unsigned long long)nomem, (unsigned long long)enospc);
	dm_exit(&dm);
}

/* ---- threads ---- */

#define MT_WRITERS	2
#define MT_READERS	2

struct mt {
	struct tc_slots sl;
	struct tc_hmap m;
	u32 nslots;
	u32 *gen;		/* per slot: odd while mapped */
	u64 *keys;
	u32 nkeys;
	u64 *absent_keys;	/* never mapped */
	u32 nabsent;
	int stop;
	u64 reads, checked, misses, false_hits, writes;
};

struct mt_arg {
	struct mt *mt;
	unsigned int id;
	u64 seed;
};

static u64 mt_rnd(u64 *st)
{
	u64 z = (*st += 0x9E3779B97F4A7C15ULL);

	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
	return z ^ (z >> 31);
}

/*
 * A writer owns the slots id, id + MT_WRITERS, ...: it maps them to random
 * keys (versions of one key now and then) and unmaps them.  gen[s] is odd
 * from the end of an insert to the start of the delete: a reader that sees
 * the same odd value before and after its lookup knows the key was mapped
 * throughout.  A key mapped again lands at the end of its cluster, and the
 * deletions in front of it shift it back: keys move all the time.
 */
static void *mt_writer(void *p)
{
	struct mt_arg *a = p;
	struct mt *mt = a->mt;
	u64 n = 0;
	u32 s;

	while (!__atomic_load_n(&mt->stop, __ATOMIC_RELAXED)) {
		s = a->id + MT_WRITERS *
		    (mt_rnd(&a->seed) % (mt->nslots / MT_WRITERS));
		if (mt->gen[s] % 2) {
			__atomic_store_n(&mt->gen[s], mt->gen[s] + 1,
					 __ATOMIC_SEQ_CST);
			CHECK(tc_hmap_delete(&mt->m, s), "mt delete");
		} else {
			tc_slot_set_block(&mt->sl, s, mt->keys[
				mt_rnd(&a->seed) % mt->nkeys]);
			CHECK(!tc_hmap_insert(&mt->m, s), "mt insert");
			__atomic_store_n(&mt->gen[s], mt->gen[s] + 1,
					 __ATOMIC_SEQ_CST);
		}
		/* leave the readers some time to finish a lookup */
		if (++n % 8 == 0)
			sched_yield();
	}
	__atomic_fetch_add(&mt->writes, n, __ATOMIC_RELAXED);
	return NULL;
}

static void *mt_reader(void *p)
{
	struct mt_arg *a = p;
	struct mt *mt = a->mt;
	u64 n = 0, checked = 0, misses = 0, false_hits = 0;

	while (!__atomic_load_n(&mt->stop, __ATOMIC_RELAXED)) {
		u32 s = mt_rnd(&a->seed) % mt->nslots, found;
		u32 g = __atomic_load_n(&mt->gen[s], __ATOMIC_SEQ_CST);
		u64 b = tc_slot_block(&mt->sl, s);

		found = tc_hmap_lookup(&mt->m, b);
		if (g % 2 &&
		    __atomic_load_n(&mt->gen[s], __ATOMIC_SEQ_CST) == g) {
			checked++;
			misses += found == TC_SLOT_NONE;
		}
		b = mt->absent_keys[mt_rnd(&a->seed) % mt->nabsent];
		if (tc_hmap_lookup(&mt->m, b) != TC_SLOT_NONE)
			false_hits++;
		n += 2;
	}
	__atomic_fetch_add(&mt->reads, n, __ATOMIC_RELAXED);
	__atomic_fetch_add(&mt->checked, checked, __ATOMIC_RELAXED);
	__atomic_fetch_add(&mt->misses, misses, __ATOMIC_RELAXED);
	__atomic_fetch_add(&mt->false_hits, false_hits, __ATOMIC_RELAXED);
	return NULL;
}

/* Key @i of a set: every @every-th one from the colliding pool @pool. */
static u64 mt_key(u32 i, u32 every, const u64 *pool, u32 npool, u64 top)
{
	if (i % every == 0)
		return pool[i / every % npool];
	return (rnd() & (TC_SLOT_MAX_BLOCK >> 1)) | top;
}

/*
 * Readers look up keys mapped throughout their lookup (and keys never
 * mapped) while writers map and unmap keys.  Every @every-th key collides
 * with the others in the last region and the first ones: clusters that
 * wrap around the table's end.
 */
static void mt_run(u32 nslots, u32 nkeys, u32 every, double seconds)
{
	struct tc_hmap_geometry g;
	pthread_t th[MT_WRITERS + MT_READERS];
	struct mt_arg args[MT_WRITERS + MT_READERS];
	struct timespec ts = { (time_t)seconds,
			       (long)((seconds - (time_t)seconds) * 1e9) };
	u32 i, nc = nkeys / every + 1;
	struct mt mt;
	u64 *k;

	memset(&mt, 0, sizeof(mt));
	mt.nslots = nslots;
	CHECK(!tc_slots_create(&mt.sl, nslots), "slots");
	CHECK(!tc_hmap_create(&mt.m, &mt.sl), "map");
	tc_hmap_geometry(nslots, &g);
	k = colliding_keys(g.nr_buckets, g.nr_regions - 1,
			   min(g.nr_regions, 4), nc * 2);
	mt.gen = calloc(nslots, sizeof(u32));
	mt.nkeys = nkeys;
	mt.nabsent = 2000;
	mt.keys = malloc(mt.nkeys * sizeof(u64));
	mt.absent_keys = malloc(mt.nabsent * sizeof(u64));
	/* the two sets are disjoint: pools apart, top block bit apart */
	for (i = 0; i < mt.nkeys; i++)
		mt.keys[i] = mt_key(i, every, k, nc, 0);
	for (i = 0; i < mt.nabsent; i++)
		mt.absent_keys[i] = mt_key(i, every, k + nc, nc, 1ULL << 39);
	free(k);
	tc_host_race_hook = race_hook;
	for (i = 0; i < MT_WRITERS + MT_READERS; i++) {
		args[i].mt = &mt;
		args[i].id = i < MT_WRITERS ? i : i - MT_WRITERS;
		args[i].seed = rnd();
		pthread_create(&th[i], NULL, i < MT_WRITERS ? mt_writer :
			       mt_reader, &args[i]);
	}
	nanosleep(&ts, NULL);
	__atomic_store_n(&mt.stop, 1, __ATOMIC_RELAXED);
	for (i = 0; i < MT_WRITERS + MT_READERS; i++)
		pthread_join(th[i], NULL);
	tc_host_race_hook = NULL;
	for (i = 0; i < nslots; i++)
		CHECK(mt.gen[i] % 2 == 0 || tc_hmap_lookup(&mt.m,
			tc_slot_block(&mt.sl, i)) != TC_SLOT_NONE,
		      "key of slot %u lost", i);
	printf("map threads, %u slots, 1/%u colliding: %llu lookups (%llu of keys mapped throughout), %llu inserts/deletes: %llu misses of mapped keys, %llu hits of absent keys\n",
	       nslots, every, (unsigned long long)mt.reads,
	       (unsigned long long)mt.checked, (unsigned long long)mt.writes,
	       (unsigned long long)mt.misses,
	       (unsigned long long)mt.false_hits);
	CHECK(!mt.misses && !mt.false_hits, "lookups raced changes wrongly");
	CHECK(mt.writes > 1000 && mt.checked > 1000, "the threads ran");
	free(mt.gen);
	free(mt.keys);
	free(mt.absent_keys);
	tc_hmap_destroy(&mt.m);
	tc_slots_destroy(&mt.sl);
}

static void dt_release(void *ctx, u32 s);

/*
 * Loading: slots marked dirty in slot order (as the metadata is read), one
 * sort at the end; the walk then finds them in block order, and a merge
 * after it keeps them.
 */
static void test_dorder_load(void)
{
	const u32 n = 50000;
	struct tc_slots sl;
	struct tc_dorder d;
	u64 b, from = 0, prev = 0;
	u32 s, loaded = 0, found = 0;

	CHECK(!tc_slots_create(&sl, n), "slots");
	CHECK(!tc_dorder_create(&d, &sl, dt_release, NULL), "dorder");
	for (s = 0; s < n; s++) {
		/* distinct blocks, in no order: the slot in the low bits */
		tc_slot_set_block(&sl, s, ((u64)rnd_below(1U << 19) << 20) | s);
		tc_slot_set(&sl, s, TC_SF_VALID);
		if (rnd_below(3)) {
			CHECK(!tc_dorder_load(&d, s), "load of slot %u", s);
			loaded++;
		}
	}
	tc_dorder_load_end(&d);
	CHECK(tc_dorder_nr_sorted(&d) == loaded, "sorted %llu of %u",
	      (unsigned long long)tc_dorder_nr_sorted(&d), loaded);
	for (;;) {
		s = tc_dorder_next(&d, from, U64_MAX, &b);
		if (s == TC_SLOT_NONE)
			break;
		CHECK(!found || b >= prev, "walk went back: %llu after %llu",
		      (unsigned long long)b, (unsigned long long)prev);
		CHECK(tc_slot_flags(&sl, s) & BIT(TC_SF_QUEUED), "not queued");
		prev = b;
		found++;
		from = b + 1;
	}
	CHECK(found == loaded, "walk found %u of %u", found, loaded);
	CHECK(!tc_dorder_merge(&d, GFP_KERNEL) &&
	      tc_dorder_nr_sorted(&d) == loaded, "merge after a load");
	tc_dorder_destroy(&d);
	tc_slots_destroy(&sl);
	printf("dirty order load: %u of %u slots sorted once: ok\n", loaded, n);
}

static void test_map_threads(double seconds)
{
	/* a small table where every key collides: shifts all the time */
	mt_run(256, 200, 1, seconds / 2);
	/* a larger one, one key in 40 colliding */
	mt_run(8192, 8000, 40, seconds / 2);
}

/*
 * The dirty order with writers marking dirty and cleaning while the owner
 * merges and walks: at the end every dirty slot is in the order once.
 */
#define DT_SLOTS	20000
#define DT_THREADS	2

struct dt {
	struct tc_slots sl;
	struct tc_dorder d;
	int stop;
	u64 marks, refused;
};

static void dt_release(void *ctx, u32 s)
{
	(void)ctx;
	fail("release of slot %u: no slot is retired here", s);
}

static void *dt_writer(void *p)
{
	struct mt_arg *a = p;
	struct dt *dt = (struct dt *)a->mt;
	u64 marks = 0, refused = 0;

	while (!__atomic_load_n(&dt->stop, __ATOMIC_RELAXED)) {
		u32 s = a->id + DT_THREADS *
			(mt_rnd(&a->seed) % (DT_SLOTS / DT_THREADS));

		if (mt_rnd(&a->seed) % 3) {
			if (tc_dorder_mark_dirty(&dt->d, s))
				refused++;
			marks++;
		} else {
			tc_slot_clear(&dt->sl, s, TC_SF_DIRTY);
		}
	}
	__atomic_fetch_add(&dt->marks, marks, __ATOMIC_RELAXED);
	__atomic_fetch_add(&dt->refused, refused, __ATOMIC_RELAXED);
	return NULL;
}

static void test_dorder_threads(double seconds)
{
	pthread_t th[DT_THREADS];
	struct mt_arg args[DT_THREADS];
	struct timespec t0, t1;
	struct dt dt;
	u8 *seen = calloc(DT_SLOTS, 1);
	u64 merges = 0, cursor, b, n;
	u32 i, s;

	memset(&dt, 0, sizeof(dt));
	CHECK(!tc_slots_create(&dt.sl, DT_SLOTS), "slots");
	CHECK(!tc_dorder_create(&dt.d, &dt.sl, dt_release, NULL), "dorder");
	for (s = 0; s < DT_SLOTS; s++) {
		tc_slot_set_block(&dt.sl, s, (u64)(s * 7919) % DT_SLOTS);
		tc_slot_set(&dt.sl, s, TC_SF_VALID);
	}
	for (i = 0; i < DT_THREADS; i++) {
		args[i].mt = (struct mt *)&dt;
		args[i].id = i;
		args[i].seed = rnd();
		pthread_create(&th[i], NULL, dt_writer, &args[i]);
	}
	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		CHECK(!tc_dorder_merge(&dt.d, GFP_KERNEL), "merge");
		merges++;
		cursor = 0;
		while ((s = tc_dorder_next(&dt.d, cursor, U64_MAX, &b)) !=
		       TC_SLOT_NONE) {
			CHECK(b >= cursor, "walk went back");
			cursor = b + 1;
		}
		clock_gettime(CLOCK_MONOTONIC, &t1);
	} while (t1.tv_sec - t0.tv_sec + (t1.tv_nsec - t0.tv_nsec) / 1e9 <
		 seconds);
	__atomic_store_n(&dt.stop, 1, __ATOMIC_RELAXED);
	for (i = 0; i < DT_THREADS; i++)
		pthread_join(th[i], NULL);
	/* nothing runs now: one merge, and the order is the dirty set */
	CHECK(!tc_dorder_merge(&dt.d, GFP_KERNEL), "merge");
	CHECK(!dt.d.nr_tail && !dt.d.nr_pending, "tail left");
	for (i = 0; i < dt.d.nr_sorted; i++) {
		s = dt.d.sorted[i];
		CHECK(!seen[s], "slot %u twice in the order", s);
		seen[s] = 1;
		CHECK(i == 0 || tc_slot_block(&dt.sl, dt.d.sorted[i - 1]) <=
		      tc_slot_block(&dt.sl, s), "order not sorted at %u", i);
	}
	for (s = 0, n = 0; s < DT_SLOTS; s++) {
		unsigned int f = tc_slot_flags(&dt.sl, s);

		CHECK(!!(f & BIT(TC_SF_DIRTY)) == seen[s],
		      "slot %u dirty %d, in the order %d", s,
		      !!(f & BIT(TC_SF_DIRTY)), seen[s]);
		CHECK(!!(f & BIT(TC_SF_QUEUED)) == seen[s], "QUEUED of %u", s);
		n += seen[s];
	}
	printf("dirty order threads: %llu marks (%llu refused by a full tail), %llu merges, %llu dirty at the end: ok\n",
	       (unsigned long long)dt.marks, (unsigned long long)dt.refused,
	       (unsigned long long)merges, (unsigned long long)n);
	free(seen);
	tc_dorder_destroy(&dt.d);
	tc_slots_destroy(&dt.sl);
}

int main(int argc, char **argv)
{
	u64 seed = argc > 1 ? strtoull(argv[1], NULL, 0) : (u64)time(NULL);
	double secs = getenv("TC_MT_SECONDS") ?
		      atof(getenv("TC_MT_SECONDS")) : 3;

	printf("seed %llu\n", (unsigned long long)seed);
	rng_state = seed;
	test_slots();
	test_geometry();
	test_map_model();
	test_dorder_model();
	test_dorder_load();
	test_map_threads(secs);
	test_dorder_threads(secs / 2);
	printf("test_index: all passed\n");
	return 0;
}
