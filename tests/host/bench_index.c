// SPDX-License-Identifier: GPL-2.0
/*
 * Not a test: the cost of the compact index on the host, single-threaded,
 * at 1 Mi and 16 Mi slots (a full map: load 5/6), random 40-bit blocks.
 *
 *   ./bench_index [slots ...]
 */
#include <stdio.h>
#include <time.h>

#include "tc_slots.h"
#include "tc_hmap.h"
#include "tc_dorder.h"

unsigned int tc_host_fail_allocs;
__thread struct tc_host_sort tc_host_sort;
void (*tc_host_race_hook)(void);

static u64 rng_state = 42;

static u64 rnd(void)
{
	u64 z = (rng_state += 0x9E3779B97F4A7C15ULL);

	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
	return z ^ (z >> 31);
}

static double now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e9 + t.tv_nsec;
}

static void no_release(void *ctx, u32 s)
{
	(void)ctx;
	(void)s;
}

static void bench(u32 n)
{
	struct tc_hmap_geometry g;
	struct tc_slots sl;
	struct tc_hmap m;
	struct tc_dorder d;
	u32 *order = malloc((size_t)n * sizeof(u32)), i, s;
	u64 sink = 0;
	double t, ins, hit, miss, churn, mark, walk;
	u64 b, cursor, walked = 0;
	size_t dbytes;

	if (tc_slots_create(&sl, n) || tc_hmap_create(&m, &sl) ||
	    tc_dorder_create(&d, &sl, no_release, NULL)) {
		fprintf(stderr, "no memory for %u slots\n", n);
		exit(1);
	}
	tc_hmap_geometry(n, &g);
	for (i = 0; i < n; i++) {
		tc_slot_set_block(&sl, i, rnd() & TC_SLOT_MAX_BLOCK);
		order[i] = i;
	}
	for (i = n - 1; i > 0; i--) {
		u32 j = rnd() % (i + 1), x = order[i];

		order[i] = order[j];
		order[j] = x;
	}
	t = now_ns();
	for (i = 0; i < n; i++)
		tc_hmap_insert(&m, i);
	ins = (now_ns() - t) / n;
	t = now_ns();
	for (i = 0; i < n; i++)
		sink += tc_hmap_lookup(&m, tc_slot_block(&sl, order[i]));
	hit = (now_ns() - t) / n;
	t = now_ns();
	for (i = 0; i < n; i++)
		sink += tc_hmap_lookup(&m, rnd() & TC_SLOT_MAX_BLOCK);
	miss = (now_ns() - t) / n;
	/* a delete and an insert, the table staying full */
	t = now_ns();
	for (i = 0; i < n / 4; i++) {
		s = order[i];
		tc_hmap_delete(&m, s);
		tc_slot_set_block(&sl, s, rnd() & TC_SLOT_MAX_BLOCK);
		tc_hmap_insert(&m, s);
	}
	churn = (now_ns() - t) / (n / 4);
	/* every slot dirtied in random order, merging when the tail asks */
	t = now_ns();
	for (i = 0; i < n; i++) {
		if (tc_dorder_mark_dirty(&d, order[i])) {
			tc_dorder_merge(&d, GFP_KERNEL);
			tc_dorder_mark_dirty(&d, order[i]);
		} else if (tc_dorder_want_merge(&d)) {
			tc_dorder_merge(&d, GFP_KERNEL);
		}
	}
	tc_dorder_merge(&d, GFP_KERNEL);
	mark = (now_ns() - t) / n;
	t = now_ns();
	cursor = 0;
	while ((s = tc_dorder_next(&d, cursor, U64_MAX, &b)) !=
	       TC_SLOT_NONE) {
		cursor = b + 1;
		walked++;
	}
	walk = (now_ns() - t) / (walked ? walked : 1);
	dbytes = d.cap_sorted * 4 + 2 * (size_t)d.tail_cap * 4;
	printf("%u slots (%llu buckets, load %.3f):\n", n,
	       (unsigned long long)g.nr_buckets, (double)n / g.nr_buckets);
	printf("  insert %.0f ns, lookup hit %.0f ns, lookup miss %.0f ns, delete+insert %.0f ns\n",
	       ins, hit, miss, churn);
	printf("  dirty order: mark dirty %.0f ns (merges included), walk %.0f ns per dirty slot (%llu walked)\n",
	       mark, walk, (unsigned long long)walked);
	printf("  bytes per slot: slot words %.3f, map %.3f, dirty order at 100%% dirty %.3f: %.3f\n",
	       (double)tc_slots_bytes(n) / n, (double)g.bytes / n,
	       (double)dbytes / n,
	       (double)(tc_slots_bytes(n) + g.bytes + dbytes) / n);
	/* the lookups' results are used: the compiler keeps them */
	if (sink == 42)
		printf("(sink)\n");
	tc_dorder_destroy(&d);
	tc_hmap_destroy(&m);
	tc_slots_destroy(&sl);
	free(order);
}

int main(int argc, char **argv)
{
	int i;

	if (argc > 1) {
		for (i = 1; i < argc; i++)
			bench(strtoul(argv[i], NULL, 0));
		return 0;
	}
	bench(1U << 20);
	bench(1U << 24);
	return 0;
}
