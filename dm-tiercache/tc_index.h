/* SPDX-License-Identifier: GPL-2.0 */
/*
 * dm-tiercache: the index of the cache, from origin block to slot.
 *
 * Built from the compact core: the slot words (tc_slots.h, 6 B per slot),
 * the open-addressed map (tc_hmap.h, 4.9 B per slot) and the dirty order
 * (tc_dorder.h, 4 B per dirty slot), plus a bitmap of allocated slots.
 * No device-wide lock is taken on the I/O path: lookups are lockless, a
 * block's state changes only under that block's lock (tc_lock.c) or as an
 * atomic update of its slot word, and the free-slot bitmap has a spinlock
 * of its own, taken when a slot is allocated or freed.
 *
 * The writeback engine owns the dirty order: it merges it (tc_index_merge())
 * and walks it (tc_next_dirty()); writers only append to it.
 */
#ifndef DM_TIERCACHE_INDEX_H
#define DM_TIERCACHE_INDEX_H

#include <linux/spinlock.h>
#include <linux/atomic.h>

#include "tc_slots.h"
#include "tc_hmap.h"
#include "tc_dorder.h"
#include "tc_epoch.h"

struct tc_cache;

struct tc_index {
	struct tc_slots sl;
	struct tc_hmap map;
	struct tc_dorder dorder;
	struct tc_epochs ep;		/* tc_epoch.h */
	spinlock_t alloc_lock;		/* used_map, nr_free, hints */
	unsigned long *used_map;	/* bit per slot: allocated */
	u32 nr_free;
	u32 free_hint;
	u32 clock_hand;
	atomic_t nr_dirty;
	bool cleaned;			/* a slot left the dirty state */
	bool starved;			/* no slot while cleaned ones wait */
	unsigned long merged;		/* jiffies at the end of the last merge */
	bool ready;			/* the structures exist */
};

int tc_index_init(struct tc_cache *c);
void tc_index_exit(struct tc_cache *c);
size_t tc_index_bytes(u32 nr);

/* lookups and state: TC_SLOT_NONE when the block is not cached */
u32 tc_lookup(struct tc_cache *c, u64 block);
bool tc_slot_dirty(struct tc_cache *c, u32 slot);
bool tc_is_dirty(struct tc_cache *c, u64 block);
void tc_touch(struct tc_cache *c, u32 slot);
bool tc_slot_in_wb(struct tc_cache *c, u32 slot);
u64 tc_slot_origin(struct tc_cache *c, u32 slot);
u32 tc_nr_used(struct tc_cache *c);
u32 tc_nr_dirty(struct tc_cache *c);

/* slots waiting for a commit, by the metadata (under its lock) */
void tc_slot_park(struct tc_cache *c, u32 slot);
bool tc_slot_unpark(struct tc_cache *c, u32 slot);

/* changes, by the holder of the block's lock */
int tc_alloc_slot(struct tc_cache *c, u64 block, u32 *slot);
bool tc_alloc_slot_at(struct tc_cache *c, u32 slot);
void tc_free_slot(struct tc_cache *c, u32 slot);
int tc_insert(struct tc_cache *c, u32 slot, u64 block, bool dirty);
void tc_remove(struct tc_cache *c, u32 slot);
void tc_remove_chain(struct tc_cache *c, u64 block);
u32 tc_chain_in_wb(struct tc_cache *c, u64 block);
bool tc_epoch_needs_cow(struct tc_cache *c, u32 slot);
int tc_mark_dirty(struct tc_cache *c, u32 slot);
bool tc_index_tail_full(struct tc_cache *c);
int tc_index_load(struct tc_cache *c, u32 slot, u64 block, u64 epoch);
int tc_index_load_end(struct tc_cache *c);

/* writeback (the engine) */
int tc_index_merge(struct tc_cache *c, gfp_t gfp, bool *fed);
bool tc_index_want_merge(struct tc_cache *c);
u32 tc_next_dirty(struct tc_cache *c, u64 from, u64 to, u64 *block);
u32 tc_next_dirty_in(struct tc_cache *c, u64 epoch, u64 from, u64 to,
		     u64 *block);
u32 tc_lookup_version(struct tc_cache *c, u64 block, u64 epoch);
void tc_index_owe_dirty(struct tc_cache *c);
bool tc_wb_take(struct tc_cache *c, u32 slot, bool *owed);
void tc_wb_untake(struct tc_cache *c, u32 slot, bool owed);
void tc_wb_pay(struct tc_cache *c, u32 slot, u32 gen);
void tc_wb_written(struct tc_cache *c, u32 slot);
void tc_wb_let_go(struct tc_cache *c, u32 slot);
bool tc_wb_owed(struct tc_cache *c, u64 block);

#endif /* DM_TIERCACHE_INDEX_H */
