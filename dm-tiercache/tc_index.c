// SPDX-License-Identifier: GPL-2.0
/*
 * dm-tiercache: cache slots and the index from origin block to slot.
 *
 * The index is an xarray keyed by origin block whose values point into the
 * per-slot entry array; the TC_DIRTY mark makes it walk dirty blocks in
 * ascending origin order.  Lookups are lockless (RCU inside the xarray).
 * Changes to the entry of a block are made by the holder of that block's
 * lock (tc_lock.c), so an entry a holder looks up cannot change under it.
 *
 * Free slots are a bitmap.  A block goes to the slot after its origin
 * predecessor's, else to its home slot (block mod slots), else to any free
 * slot: origin neighbours then tend to be cache neighbours, and writeback
 * reads a whole request with few bios (merging never depends on it).  When
 * no slot is free a CLOCK hand reclaims a clean slot that has not been
 * referenced since its last pass.  Dirty slots and slots whose block is
 * locked are never reclaimed.
 */
#include <linux/slab.h>
#include <linux/vmalloc.h>

#include "tiercache.h"

/* How far one allocation may sweep before the write goes around. */
#define TC_CLOCK_MAX_STEPS	1024

int tc_index_init(struct tc_cache *c)
{
	xa_init(&c->index);
	/* no warning when a huge cache does not fit: the table is refused */
	c->entries = __vmalloc_array(c->nr_slots, sizeof(*c->entries),
				     GFP_KERNEL | __GFP_ZERO | __GFP_NOWARN);
	c->used_map = __vmalloc_array(BITS_TO_LONGS(c->nr_slots), sizeof(long),
				      GFP_KERNEL | __GFP_ZERO | __GFP_NOWARN);
	if (!c->entries || !c->used_map) {
		tc_index_exit(c);
		return -ENOMEM;
	}
	c->nr_free = c->nr_slots;
	c->free_hint = 0;
	c->clock_hand = 0;
	spin_lock_init(&c->alloc_lock);
	atomic_set(&c->nr_dirty, 0);
	atomic64_set(&c->write_seq, 0);
	return 0;
}

void tc_index_exit(struct tc_cache *c)
{
	xa_destroy(&c->index);
	vfree(c->used_map);
	vfree(c->entries);
	c->used_map = NULL;
	c->entries = NULL;
}

struct tc_entry *tc_lookup(struct tc_cache *c, u64 block)
{
	return xa_load(&c->index, block);
}

bool tc_is_dirty(struct tc_cache *c, u64 block)
{
	return xa_get_mark(&c->index, block, TC_DIRTY);
}

u32 tc_slot_of(struct tc_cache *c, struct tc_entry *e)
{
	return e - c->entries;
}

u32 tc_nr_used(struct tc_cache *c)
{
	return c->nr_slots - READ_ONCE(c->nr_free);
}

/*
 * Reclaim the clean slot under the CLOCK hand, if it is not referenced and
 * its block can be locked.  Called with alloc_lock held.
 */
static bool tc_clock_try(struct tc_cache *c, struct tc_entry *e)
{
	struct tc_holder h;

	if (!test_bit(TC_E_VALID, &e->flags))
		return false;
	if (test_and_clear_bit(TC_E_REF, &e->flags))
		return false;
	/* dirty on disk until a commit says otherwise */
	if (tc_meta_disk_dirty(c, tc_slot_of(c, e)))
		return false;
	if (!tc_trylock(&c->locks, &h, READ_ONCE(e->block), TC_LK_EXCL))
		return false;
	/*
	 * Under the block lock the entry is stable: is it still this one,
	 * still clean, and not made dirty and committed since the check?
	 */
	if (tc_lookup(c, h.block) != e || tc_is_dirty(c, h.block) ||
	    tc_meta_disk_dirty(c, tc_slot_of(c, e))) {
		tc_unlock(&c->locks, &h);
		return false;
	}
	xa_erase(&c->index, h.block);
	clear_bit(TC_E_VALID, &e->flags);
	tc_meta_clear(c, tc_slot_of(c, e));
	tc_unlock(&c->locks, &h);
	return true;
}

static int tc_clock_reclaim(struct tc_cache *c, u32 *slot)
{
	unsigned int steps;

	if (atomic_read(&c->nr_dirty) >= c->nr_slots)
		return -ENOSPC;
	for (steps = 0; steps < TC_CLOCK_MAX_STEPS; steps++) {
		u32 hand = c->clock_hand;

		c->clock_hand = hand + 1 < c->nr_slots ? hand + 1 : 0;
		if (tc_clock_try(c, &c->entries[hand])) {
			*slot = hand;
			return 0;
		}
	}
	return -ENOSPC;
}

static bool tc_take_free(struct tc_cache *c, u32 slot)
{
	if (slot >= c->nr_slots || test_bit(slot, c->used_map))
		return false;
	__set_bit(slot, c->used_map);
	c->nr_free--;
	return true;
}

/* The free slot for @block that keeps origin neighbours together. */
static u32 tc_pick_free(struct tc_cache *c, u64 block)
{
	struct tc_entry *prev = block ? tc_lookup(c, block - 1) : NULL;
	u32 home, slot;

	if (prev) {
		slot = tc_slot_of(c, prev) + 1;
		if (tc_take_free(c, slot))
			return slot;
	}
	div_u64_rem(block, c->nr_slots, &home);
	if (tc_take_free(c, home))
		return home;
	slot = find_next_zero_bit(c->used_map, c->nr_slots, c->free_hint);
	if (slot >= c->nr_slots)
		slot = find_first_zero_bit(c->used_map, c->nr_slots);
	tc_take_free(c, slot);
	c->free_hint = slot + 1;
	return slot;
}

/* A slot to fill with @block: a free one, else a reclaimed clean one. */
int tc_alloc_slot(struct tc_cache *c, u64 block, u32 *slot)
{
	int r = 0;

	spin_lock(&c->alloc_lock);
	if (c->nr_free)
		*slot = tc_pick_free(c, block);
	else
		r = tc_clock_reclaim(c, slot);
	spin_unlock(&c->alloc_lock);
	return r;
}

void tc_free_slot(struct tc_cache *c, u32 slot)
{
	if (tc_meta_defer_free(c, slot))
		return;		/* freed by the commit that records it */
	spin_lock(&c->alloc_lock);
	__clear_bit(slot, c->used_map);
	c->nr_free++;
	spin_unlock(&c->alloc_lock);
}

/* Index @block in @slot.  The caller holds the block lock. */
int tc_insert(struct tc_cache *c, u32 slot, u64 block, bool dirty, gfp_t gfp)
{
	struct tc_entry *e = &c->entries[slot];
	int r;

	e->block = block;
	e->seq = atomic64_inc_return(&c->write_seq);
	e->flags = 0;
	set_bit(TC_E_VALID, &e->flags);
	r = xa_err(xa_store(&c->index, block, e, gfp));
	if (r) {
		clear_bit(TC_E_VALID, &e->flags);
		return r;
	}
	if (dirty) {
		xa_set_mark(&c->index, block, TC_DIRTY);
		atomic_inc(&c->nr_dirty);
	}
	return 0;
}

/* Drop a cached block, dirty or not, and free its slot. */
void tc_remove(struct tc_cache *c, struct tc_entry *e)
{
	if (xa_get_mark(&c->index, e->block, TC_DIRTY))
		atomic_dec(&c->nr_dirty);
	xa_erase(&c->index, e->block);
	clear_bit(TC_E_VALID, &e->flags);
	tc_meta_clear(c, tc_slot_of(c, e));
	tc_free_slot(c, tc_slot_of(c, e));
}

/* The block was written in the cache: newer than the origin. */
void tc_mark_dirty(struct tc_cache *c, struct tc_entry *e)
{
	u64 seq = atomic64_inc_return(&c->write_seq);

	if (!xa_get_mark(&c->index, e->block, TC_DIRTY)) {
		xa_set_mark(&c->index, e->block, TC_DIRTY);
		atomic_inc(&c->nr_dirty);
	} else if (tc_flush_owes(c, e->seq)) {
		/* a full flush still owes the origin a version of the block */
		set_bit(TC_E_OWED, &e->flags);
	}
	/* the flag before the sequence: tc_wb_skipped() reads them backwards */
	smp_wmb();
	WRITE_ONCE(e->seq, seq);
	/* the slot holds this block already: safe to record before the data */
	tc_meta_set(c, tc_slot_of(c, e), e->block, true);
}

/*
 * The origin now holds the data of write sequence @seq of @block.  Mark the
 * entry clean unless it was dropped, reused or rewritten meanwhile.
 */
bool tc_mark_clean(struct tc_cache *c, struct tc_entry *e, u64 block, u64 seq)
{
	if (!test_bit(TC_E_VALID, &e->flags) || e->block != block ||
	    e->seq != seq)
		return false;
	if (!xa_get_mark(&c->index, block, TC_DIRTY))
		return false;
	xa_clear_mark(&c->index, block, TC_DIRTY);
	atomic_dec(&c->nr_dirty);
	tc_meta_set(c, tc_slot_of(c, e), block, false);
	return true;
}
