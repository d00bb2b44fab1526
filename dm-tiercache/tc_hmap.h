/* SPDX-License-Identifier: GPL-2.0 */
/*
 * dm-tiercache: the map from origin block to slot.
 *
 * Open addressing with linear probing over an array of u32 slot numbers
 * (empty: TC_SLOT_NONE).  The keys are not stored: a bucket's key is the
 * block in the slot word of the slot it holds.  The table has at least
 * 1.2 buckets per slot, rounded up to a whole region, so the load factor
 * is at most 5/6 (4 B per bucket: 4.8 B per slot, 4.9 B with the region
 * words; a miss probes about 19 buckets, little more than a cache line,
 * on a full cache).  Deletion shifts the entries after the hole
 * backwards (no tombstones).
 *
 * One origin block may be in several slots (a version chain): the newest
 * comes first in probe order.  tc_hmap_insert() puts the new slot in front
 * of the chain; tc_hmap_lookup() returns the newest, tc_hmap_lookup_next()
 * the version after a given one.
 *
 * Concurrency.  The buckets are cut into regions of 64; each region has a
 * u32 that is both its lock and its sequence count (odd: locked).
 *   - insert and delete lock every region from the key's home bucket to
 *     the first empty bucket after it (the only buckets they read or
 *     write), always in ascending region order, so two of them never
 *     deadlock; they run with local interrupts off.  A change that moves
 *     entries (a backward shift, or a version chain moving on) advances the
 *     sequence of each region it locked; an insert into an empty bucket
 *     does not disturb readers and leaves the sequences as they were.
 *   - lookups take no lock: they add up the sequences of the regions they
 *     enter (waiting while one is locked), and retry if the sum differs at
 *     the end, so a shift that moved an entry behind them is noticed.
 *   - the caller keeps the rules of tc_slots.h: a slot's block does not
 *     change while the slot is in the map, and changes to the versions of
 *     one block are made by the holder of that block's lock (so a lookup
 *     under the lock sees a stable chain; one without it is a hint).
 */
#ifndef DM_TIERCACHE_HMAP_H
#define DM_TIERCACHE_HMAP_H

#ifdef __KERNEL__
#include <linux/math64.h>
#endif

#include "tc_slots.h"

#define TC_HMAP_REGION_SHIFT	6
#define TC_HMAP_REGION		(1U << TC_HMAP_REGION_SHIFT)

struct tc_hmap {
	struct tc_slots *sl;
	u32 *bucket;		/* slot numbers, TC_SLOT_NONE: empty */
	u32 *region;		/* lock and sequence of each region */
	u64 nr_buckets;
	u64 nr_regions;
};

struct tc_hmap_geometry {
	u64 nr_buckets;
	u64 nr_regions;
	size_t bytes;		/* buckets and regions */
};

void tc_hmap_geometry(u32 nr_slots, struct tc_hmap_geometry *g);
int tc_hmap_create(struct tc_hmap *m, struct tc_slots *sl);
void tc_hmap_destroy(struct tc_hmap *m);

u32 tc_hmap_lookup(struct tc_hmap *m, u64 block);
u32 tc_hmap_lookup_next(struct tc_hmap *m, u64 block, u32 after);
int tc_hmap_insert(struct tc_hmap *m, u32 slot);
bool tc_hmap_delete(struct tc_hmap *m, u32 slot);

/* The home bucket of @block in a table of @nr_buckets. */
static inline u64 tc_hmap_home_of(u64 nr_buckets, u64 block)
{
	return mul_u64_u64_shr(block * 0x9E3779B97F4A7C15ULL, nr_buckets, 64);
}

static inline u64 tc_hmap_home(const struct tc_hmap *m, u64 block)
{
	return tc_hmap_home_of(m->nr_buckets, block);
}

#endif /* DM_TIERCACHE_HMAP_H */
