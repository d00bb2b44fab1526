/* SPDX-License-Identifier: GPL-2.0 */
/*
 * dm-tiercache: the dirty order, the dirty slots in ascending origin order.
 *
 * Two parts, u32 slot numbers only (the blocks are in the slot words):
 *   sorted  the dirty slots of the last merge, sorted by block
 *   tail    slots dirtied since, unsorted, in a fixed buffer (and a second
 *           buffer of the same size that a merge takes it over into)
 * A slot is in the order (QUEUED in its slot word) exactly once, from the
 * moment it is first marked dirty to the first merge that finds it clean.
 * The walk sees the sorted part only: new dirty slots are found by the
 * writeback after the next merge, which the owner runs at the start of each
 * pass and whenever tc_dorder_want_merge() says the tail is half full.
 *
 * Memory: 4 B per slot in the sorted part, whose buffer grows and shrinks
 * at merges between the number of dirty slots and about twice that (at
 * most 4 B per cache slot), plus the two tail buffers: 8 B per tail entry,
 * the tail holding slots / 256 entries, at least 1024 and at most 2^20
 * (8 MiB for any cache above 256 Mi slots), and the merge's sort keys, 8 B
 * per tail entry, kept so that a merge allocates only to grow the sorted
 * part.
 *
 * A full tail: tc_dorder_mark_dirty() fails with -ENOSPC and changes
 * nothing; the caller kicks the owner to merge, and may wait for that
 * merge (tc_dorder_full() tells when to try again) or keep the block
 * clean.  Merging in the I/O path is never needed.
 *
 * Concurrency:
 *   - tc_dorder_mark_dirty(): any context but hard interrupts; by the
 *     holder of the block's lock.  A slot already QUEUED only gets DIRTY
 *     (one cmpxchg); putting a slot in the tail takes the tail spinlock for
 *     a few instructions, the only lock of the dirty order.
 *   - clearing DIRTY (writeback done, removal) needs nothing but the slot
 *     word: the slot stays QUEUED and the next merge drops it.
 *   - tc_dorder_merge() and tc_dorder_next(): the owner only, one at a
 *     time (the writeback engine); the merge may sleep if @gfp allows.
 *   - a slot dropped by a merge after tc_slot_retire(), and no longer in
 *     writeback, is handed to @release, from the merge's context; until
 *     then it must not be reused (its block is the merge's sort key).
 */
#ifndef DM_TIERCACHE_DORDER_H
#define DM_TIERCACHE_DORDER_H

#ifdef __KERNEL__
#include <linux/spinlock.h>
#endif

#include "tc_slots.h"

struct tc_dorder {
	struct tc_slots *sl;
	/* the owner's */
	u32 *sorted;
	u64 nr_sorted;
	u64 cap_sorted;
	u32 *pending;		/* the tail a failed merge took over */
	u64 *keys;		/* a merge's sort keys, tail_cap of them */
	u32 nr_pending;
	u64 nr_dropped;		/* slots merges have dropped, ever */
	void (*release)(void *ctx, u32 slot);
	void *ctx;
	/* the tail */
	spinlock_t lock;
	u32 *tail;
	u32 nr_tail;
	u32 tail_cap;
};

int tc_dorder_create(struct tc_dorder *d, struct tc_slots *sl,
		     void (*release)(void *ctx, u32 slot), void *ctx);
void tc_dorder_destroy(struct tc_dorder *d);
u32 tc_dorder_tail_cap(u32 nr_slots);

int tc_dorder_mark_dirty(struct tc_dorder *d, u32 slot);
bool tc_dorder_want_merge(struct tc_dorder *d);
bool tc_dorder_full(struct tc_dorder *d);
int tc_dorder_merge(struct tc_dorder *d, gfp_t gfp);
int tc_dorder_load(struct tc_dorder *d, u32 slot);
void tc_dorder_load_end(struct tc_dorder *d);
u32 tc_dorder_next(struct tc_dorder *d, u64 from, u64 to, u64 *block);
u32 tc_dorder_next_tagged(struct tc_dorder *d, u64 from, u64 to,
			  const u8 *tags, u8 tag, u64 *block);
u64 tc_dorder_nr_sorted(struct tc_dorder *d);
u32 tc_dorder_at(struct tc_dorder *d, u64 i);

#endif /* DM_TIERCACHE_DORDER_H */
