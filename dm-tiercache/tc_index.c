// SPDX-License-Identifier: GPL-2.0
/*
 * dm-tiercache: cache slots and the index from origin block to slot
 * (tc_index.h).
 *
 * Free slots are a bitmap.  A block goes to the slot after its origin
 * predecessor's, else to its home slot (block mod slots), else to any free
 * slot: origin neighbours then tend to be cache neighbours, and writeback
 * reads a whole request with few bios (merging never depends on it).  When
 * no slot is free a CLOCK hand reclaims a clean slot that has not been
 * referenced since its last pass.  Dirty slots, slots still in the dirty
 * order or in writeback, and slots whose block is locked are never
 * reclaimed.
 *
 * A write that must survive a writeback in flight needs no sequence
 * number: a request takes a dirty slot under its block's lock (WB set,
 * REWRITTEN cleared), every write that dirties the slot afterwards sets
 * REWRITTEN, and the request marks the slot clean, under the lock again,
 * only if REWRITTEN is still clear.  A slot in writeback is not given to
 * another block before the request lets go of it (TC_SF_OWNERS), so the
 * request's slot number stays its block's.
 *
 * A full flush writes back what was dirty when it began: the engine sets
 * OWED on every dirty slot when it begins (tc_index_owe_dirty()), a
 * request that writes a slot pays its debt, and a busy slot that owes
 * nothing is not waited for.
 */
#include <linux/jiffies.h>
#include <linux/slab.h>
#include <linux/vmalloc.h>

#include "tiercache.h"

/* How far one allocation may sweep before the write goes around. */
#define TC_CLOCK_MAX_STEPS	1024
/* slots the owed walk marks between reschedules */
#define TC_OWE_BATCH		4096
/* a full cache's merges for cleaned slots: at most one per this */
#define TC_MERGE_FULL_GAP	(HZ / 10)

static void tc_index_release(void *ctx, u32 slot)
{
	tc_free_slot(ctx, slot);
}

int tc_index_init(struct tc_cache *c)
{
	struct tc_index *ix = &c->ix;
	int r;

	spin_lock_init(&ix->alloc_lock);
	atomic_set(&ix->nr_dirty, 0);
	ix->nr_free = c->nr_slots;
	ix->free_hint = 0;
	ix->clock_hand = 0;
	r = tc_slots_create(&ix->sl, c->nr_slots);
	if (r)
		return r;
	r = tc_hmap_create(&ix->map, &ix->sl);
	if (r)
		goto fail_slots;
	r = tc_dorder_create(&ix->dorder, &ix->sl, tc_index_release, c);
	if (r)
		goto fail_map;
	r = tc_epochs_create(&ix->ep, c->nr_slots);
	if (r)
		goto fail_dorder;
	ix->used_map = tc_bigalloc(BITS_TO_LONGS(c->nr_slots), sizeof(long),
				   GFP_KERNEL | __GFP_ZERO);
	if (!ix->used_map) {
		r = -ENOMEM;
		goto fail_epochs;
	}
	ix->merged = jiffies - TC_MERGE_FULL_GAP - 1;
	ix->ready = true;
	return 0;

fail_epochs:
	tc_epochs_destroy(&ix->ep);
fail_dorder:
	tc_dorder_destroy(&ix->dorder);
fail_map:
	tc_hmap_destroy(&ix->map);
fail_slots:
	tc_slots_destroy(&ix->sl);
	return r;
}

void tc_index_exit(struct tc_cache *c)
{
	struct tc_index *ix = &c->ix;

	if (!ix->ready)
		return;
	ix->ready = false;
	kvfree(ix->used_map);
	ix->used_map = NULL;
	tc_epochs_destroy(&ix->ep);
	tc_dorder_destroy(&ix->dorder);
	tc_hmap_destroy(&ix->map);
	tc_slots_destroy(&ix->sl);
}

/*
 * Kernel memory the index of @nr slots takes when empty, in bytes, at
 * most: the epoch tags are counted, though only the ordered policy (or a
 * load of its epochs) allocates them.
 */
size_t tc_index_bytes(u32 nr)
{
	struct tc_hmap_geometry g;

	tc_hmap_geometry(nr, &g);
	return tc_slots_bytes(nr) + g.bytes + nr * sizeof(u8) +
	       BITS_TO_LONGS(nr) * sizeof(long) +
	       (size_t)tc_dorder_tail_cap(nr) * (2 * sizeof(u32) + sizeof(u64));
}

/* ---- lookups and state ---- */

/*
 * The slot of @block, or TC_SLOT_NONE.  Stable for the holder of the
 * block's lock; a hint for anyone else.
 */
u32 tc_lookup(struct tc_cache *c, u64 block)
{
	return tc_hmap_lookup(&c->ix.map, block);
}

bool tc_slot_dirty(struct tc_cache *c, u32 slot)
{
	return tc_slot_test(&c->ix.sl, slot, TC_SF_DIRTY);
}

bool tc_is_dirty(struct tc_cache *c, u64 block)
{
	u32 s = tc_lookup(c, block);

	return s != TC_SLOT_NONE && tc_slot_dirty(c, s);
}

/* A hit: CLOCK spares the slot once (no store when it is marked already). */
void tc_touch(struct tc_cache *c, u32 slot)
{
	if (!tc_slot_test(&c->ix.sl, slot, TC_SF_REF))
		tc_slot_set(&c->ix.sl, slot, TC_SF_REF);
}

bool tc_slot_in_wb(struct tc_cache *c, u32 slot)
{
	return tc_slot_test(&c->ix.sl, slot, TC_SF_WB);
}

u64 tc_slot_origin(struct tc_cache *c, u32 slot)
{
	return tc_slot_block(&c->ix.sl, slot);
}

u32 tc_nr_used(struct tc_cache *c)
{
	return c->nr_slots - READ_ONCE(c->ix.nr_free);
}

u32 tc_nr_dirty(struct tc_cache *c)
{
	return c->ix.ready ? atomic_read(&c->ix.nr_dirty) : 0;
}

/* ---- allocation ---- */

/* Does the CLOCK hand leave @f alone (dirty, queued, in writeback)? */
static bool tc_clock_spares(unsigned int f)
{
	return !(f & BIT(TC_SF_VALID)) ||
	       (f & (BIT(TC_SF_DIRTY) | BIT(TC_SF_QUEUED) | BIT(TC_SF_WB)));
}

/*
 * Is @s referenced?  The hand (@hand) takes the bit as it passes: a
 * referenced block gets its second chance once.  A run that only looks
 * at the slot next to its last one leaves the bit as it is.
 */
static bool tc_clock_referenced(struct tc_slots *sl, u32 s, bool hand)
{
	if (hand)
		return tc_slot_test_and_clear(sl, s, TC_SF_REF);
	return tc_slot_test(sl, s, TC_SF_REF);
}

/*
 * Reclaim the clean slot @s (under the CLOCK hand if @hand), if it is not
 * referenced and its block can be locked.  Called with alloc_lock held.
 */
static bool tc_clock_try(struct tc_cache *c, u32 s, bool hand)
{
	struct tc_slots *sl = &c->ix.sl;
	struct tc_holder h;

	if (tc_clock_spares(tc_slot_flags(sl, s)))
		return false;
	if (tc_clock_referenced(sl, s, hand))
		return false;
	/* dirty on disk until a commit says otherwise */
	if (tc_meta_disk_dirty(c, s))
		return false;
	if (!tc_trylock(&c->locks, &h, tc_slot_block(sl, s), TC_LK_EXCL))
		return false;
	/*
	 * Under the block lock the slot is stable: is it still this block's,
	 * still clean, and not made dirty and committed since the check?
	 */
	if (tc_lookup(c, h.block) != s || tc_clock_spares(tc_slot_flags(sl, s)) ||
	    tc_meta_disk_dirty(c, s)) {
		tc_unlock(&c->locks, &h);
		return false;
	}
	tc_hmap_delete(&c->ix.map, s);
	/* neither queued nor in writeback: nobody else owns it */
	WARN_ON_ONCE(tc_slot_retire(sl, s));
	tc_meta_clear(c, s);
	tc_unlock(&c->locks, &h);
	return true;
}

static int tc_clock_reclaim(struct tc_cache *c, u32 *slot)
{
	struct tc_index *ix = &c->ix;
	unsigned int steps;

	if (atomic_read(&ix->nr_dirty) >= c->nr_slots)
		return -ENOSPC;
	for (steps = 0; steps < TC_CLOCK_MAX_STEPS; steps++) {
		u32 hand = ix->clock_hand;

		ix->clock_hand = hand + 1 < c->nr_slots ? hand + 1 : 0;
		if (tc_clock_try(c, hand, true)) {
			*slot = hand;
			return 0;
		}
	}
	return -ENOSPC;
}

static bool tc_take_free(struct tc_cache *c, u32 slot)
{
	struct tc_index *ix = &c->ix;

	if (slot >= c->nr_slots || test_bit(slot, ix->used_map))
		return false;
	__set_bit(slot, ix->used_map);
	ix->nr_free--;
	return true;
}

/* The free slot for @block that keeps origin neighbours together. */
static u32 tc_pick_free(struct tc_cache *c, u64 block)
{
	struct tc_index *ix = &c->ix;
	u32 prev = block ? tc_lookup(c, block - 1) : TC_SLOT_NONE;
	u32 home, slot;

	if (prev != TC_SLOT_NONE && tc_take_free(c, prev + 1))
		return prev + 1;
	div_u64_rem(block, c->nr_slots, &home);
	if (tc_take_free(c, home))
		return home;
	slot = find_next_zero_bit(ix->used_map, c->nr_slots, ix->free_hint);
	if (slot >= c->nr_slots)
		slot = find_first_zero_bit(ix->used_map, c->nr_slots);
	tc_take_free(c, slot);
	ix->free_hint = slot + 1;
	return slot;
}

/* A slot to fill with @block: a free one, else a reclaimed clean one. */
int tc_alloc_slot(struct tc_cache *c, u64 block, u32 *slot)
{
	struct tc_index *ix = &c->ix;
	int r = 0;

	spin_lock(&ix->alloc_lock);
	if (ix->nr_free)
		*slot = tc_pick_free(c, block);
	else
		r = tc_clock_reclaim(c, slot);
	spin_unlock(&ix->alloc_lock);
	/* slots cleaned but still in the dirty order: a merge frees them */
	if (r && READ_ONCE(ix->cleaned)) {
		WRITE_ONCE(ix->starved, true);
		tc_flush_kick(c);
	}
	return r;
}

/*
 * Allocate @slot for a run (the slot after its last one): if it is free,
 * or, when no slot is free, if the CLOCK would reclaim it now (clean, not
 * referenced, its block unlocked).  Nothing else is taken or reclaimed.
 * A slot taken from under the hand moves the hand on, as if it had
 * reclaimed it.
 */
bool tc_alloc_slot_at(struct tc_cache *c, u32 slot)
{
	struct tc_index *ix = &c->ix;
	bool taken;

	if (slot >= c->nr_slots)
		return false;
	spin_lock(&ix->alloc_lock);
	taken = tc_take_free(c, slot);
	if (!taken && !ix->nr_free && tc_clock_try(c, slot, false)) {
		taken = true;
		if (ix->clock_hand == slot)
			ix->clock_hand = slot + 1 < c->nr_slots ? slot + 1 : 0;
	}
	spin_unlock(&ix->alloc_lock);
	return taken;
}

/*
 * Park @slot, which has no owner and may be dirty on disk, until a commit
 * records it clean; called under the metadata lock, like tc_slot_unpark().
 */
void tc_slot_park(struct tc_cache *c, u32 slot)
{
	WARN_ON_ONCE(tc_slot_test_and_set(&c->ix.sl, slot, TC_SF_PARKED));
}

/* A commit recorded @slot clean: true if it was parked (free it now). */
bool tc_slot_unpark(struct tc_cache *c, u32 slot)
{
	return tc_slot_test_and_clear(&c->ix.sl, slot, TC_SF_PARKED);
}

/* @slot holds nothing and nobody owns it: give it back. */
void tc_free_slot(struct tc_cache *c, u32 slot)
{
	struct tc_index *ix = &c->ix;

	if (tc_meta_defer_free(c, slot))
		return;		/* freed by the commit that records it */
	spin_lock(&ix->alloc_lock);
	__clear_bit(slot, ix->used_map);
	ix->nr_free++;
	spin_unlock(&ix->alloc_lock);
}

/* ---- changes, by the holder of the block's lock ---- */

/* Put @slot in the dirty order: the caller holds the block's lock. */
static int tc_queue_dirty(struct tc_cache *c, u32 slot)
{
	struct tc_index *ix = &c->ix;
	bool was = tc_slot_dirty(c, slot);
	int r;

	r = tc_dorder_mark_dirty(&ix->dorder, slot);
	if (r) {
		/* the tail is full: the engine merges it */
		tc_flush_kick(c);
		return r;
	}
	if (!was) {
		tc_epoch_enter(&ix->ep, slot);
		atomic_inc(&ix->nr_dirty);
	}
	if (tc_dorder_want_merge(&ix->dorder))
		tc_flush_kick(c);
	return 0;
}

/*
 * Index @block in the allocated @slot, clean or dirty.  -ENOSPC: the dirty
 * order cannot take another slot now; nothing changed, the caller frees
 * the slot.
 */
int tc_insert(struct tc_cache *c, u32 slot, u64 block, bool dirty)
{
	struct tc_slots *sl = &c->ix.sl;
	int r;

	tc_slot_set_block(sl, slot, block);
	tc_slot_set(sl, slot, TC_SF_VALID);
	r = tc_hmap_insert(&c->ix.map, slot);
	if (!r && dirty)
		r = tc_queue_dirty(c, slot);
	if (r) {
		tc_hmap_delete(&c->ix.map, slot);
		tc_slot_clear(sl, slot, TC_SF_VALID);
	}
	return r;
}

/*
 * Drop a cached block, dirty or not; its slot is freed by its last owner.
 * A slot still in the dirty order waits for a merge: the engine is kicked
 * for it, or the slot would stay taken while nothing else merges.
 */
void tc_remove(struct tc_cache *c, u32 slot)
{
	bool queued = tc_slot_test(&c->ix.sl, slot, TC_SF_QUEUED);
	bool dirty = tc_slot_dirty(c, slot);

	if (dirty)
		atomic_dec(&c->ix.nr_dirty);
	tc_hmap_delete(&c->ix.map, slot);
	tc_meta_clear(c, slot);
	/* after the entry is wanted empty: see tc_wb_written() */
	if (dirty)
		tc_epoch_leave(&c->ix.ep, slot);
	if (!tc_slot_retire(&c->ix.sl, slot)) {
		tc_free_slot(c, slot);
	} else if (queued) {
		/* after the retire: see tc_index_merge() */
		WRITE_ONCE(c->ix.cleaned, true);
		tc_flush_kick(c);
	}
}

/* Drop every version of @block (the caller holds its lock). */
void tc_remove_chain(struct tc_cache *c, u64 block)
{
	u32 s;

	while ((s = tc_lookup(c, block)) != TC_SLOT_NONE)
		tc_remove(c, s);
}

/*
 * A version of @block that a writeback request still writes, or
 * TC_SLOT_NONE (the caller holds the block's lock).
 */
u32 tc_chain_in_wb(struct tc_cache *c, u64 block)
{
	u32 s;

	for (s = tc_lookup(c, block); s != TC_SLOT_NONE;
	     s = tc_hmap_lookup_next(&c->ix.map, block, s))
		if (tc_slot_in_wb(c, s))
			return s;
	return TC_SLOT_NONE;
}

/*
 * The dirty version of @block of @epoch, or TC_SLOT_NONE.  Stable for the
 * holder of the block's lock; a hint for anyone else.
 */
u32 tc_lookup_version(struct tc_cache *c, u64 block, u64 epoch)
{
	u32 s;

	for (s = tc_lookup(c, block); s != TC_SLOT_NONE;
	     s = tc_hmap_lookup_next(&c->ix.map, block, s))
		if (tc_slot_dirty(c, s) && tc_epoch_in(&c->ix.ep, s, epoch))
			return s;
	return TC_SLOT_NONE;
}

/*
 * A write to the newest version of a block, @slot: written in place, or
 * (a dirty version of an epoch older than the open one, which writeback
 * must still send to the origin as it is) copied to a new slot first?
 */
bool tc_epoch_needs_cow(struct tc_cache *c, u32 slot)
{
	return tc_slot_dirty(c, slot) && tc_epoch_older(&c->ix.ep, slot);
}

/*
 * The block is being written in the cache: newer than the origin.  -ENOSPC
 * if a clean slot cannot be queued now: it stays clean, and the caller
 * writes the origin too.  The caller records a clean slot dirty in the
 * metadata once the data is written (tc_meta_set()).
 */
int tc_mark_dirty(struct tc_cache *c, u32 slot)
{
	int r = tc_queue_dirty(c, slot);

	if (r)
		return r;
	/*
	 * A request writing the older data must leave it dirty.  WB is set
	 * only under a lock that excludes this writer's: the test is exact.
	 */
	if (tc_slot_in_wb(c, slot))
		tc_slot_set(&c->ix.sl, slot, TC_SF_REWRITTEN);
	return 0;
}

/*
 * Writers filled the dirty order's tail: no block can become dirty until
 * the engine merges it (tc_queue_dirty() kicked it).
 */
bool tc_index_tail_full(struct tc_cache *c)
{
	return tc_dorder_full(&c->ix.dorder);
}

/*
 * Loading: the versions of one block go into the map oldest first, so
 * that the newest comes first in the chain.  @slot, of @epoch, joins the
 * versions loaded before it.
 */
static int tc_index_load_version(struct tc_cache *c, u32 slot, u64 epoch)
{
	struct tc_index *ix = &c->ix;
	u64 block = tc_slot_block(&ix->sl, slot);
	u64 base = ix->ep.floor;
	u32 *v, s, t;
	int n = 0, i, j, r = 0;

	s = tc_lookup(c, block);
	if (s == TC_SLOT_NONE || tc_epoch_of(&ix->ep, s, base) < epoch)
		return tc_hmap_insert(&ix->map, slot);	/* the newest */
	/* rare: an older version found after a newer one */
	v = kmalloc_array(TC_EPOCH_TAGS + 1, sizeof(*v), GFP_KERNEL);
	if (!v)
		return -ENOMEM;
	for (; s != TC_SLOT_NONE && n < TC_EPOCH_TAGS;
	     s = tc_hmap_lookup_next(&ix->map, block, s)) {
		if (tc_epoch_of(&ix->ep, s, base) == epoch)
			r = -EUCLEAN;	/* two versions of one epoch */
		v[n++] = s;
	}
	if (r)
		goto out;
	for (i = 0; i < n; i++)
		tc_hmap_delete(&ix->map, v[i]);
	v[n++] = slot;
	/* oldest first: few versions, an insertion sort */
	for (i = 1; i < n; i++)
		for (j = i; j > 0 && tc_epoch_of(&ix->ep, v[j - 1], base) <
				     tc_epoch_of(&ix->ep, v[j], base); j--) {
			t = v[j];
			v[j] = v[j - 1];
			v[j - 1] = t;
		}
	for (i = n - 1; i >= 0 && !r; i--)
		r = tc_hmap_insert(&ix->map, v[i]);
out:
	kfree(v);
	return r;
}

/*
 * Loading: @slot holds @block, dirty on disk in @epoch.  The engine is not
 * running: the slot joins the dirty order unsorted (tc_index_load_end()
 * sorts).
 */
int tc_index_load(struct tc_cache *c, u32 slot, u64 block, u64 epoch)
{
	struct tc_index *ix = &c->ix;
	int r;

	spin_lock(&ix->alloc_lock);
	if (!tc_take_free(c, slot)) {
		spin_unlock(&ix->alloc_lock);
		return -EUCLEAN;
	}
	spin_unlock(&ix->alloc_lock);
	r = tc_epoch_load(&ix->ep, slot, epoch);
	if (r)	/* -ERANGE: no live epoch; else no memory for the tags */
		return r == -ERANGE ? -EUCLEAN : r;
	tc_slot_set_block(&ix->sl, slot, block);
	tc_slot_set(&ix->sl, slot, TC_SF_VALID);
	r = tc_index_load_version(c, slot, epoch);
	if (!r)
		r = tc_dorder_load(&ix->dorder, slot);
	if (r)
		return r;
	atomic_inc(&ix->nr_dirty);
	return 0;
}

/*
 * Loading is over: the loaded dirty slots are sorted once.  -ENOMEM if
 * the ordered policy's epoch tags cannot be had.
 */
int tc_index_load_end(struct tc_cache *c)
{
	tc_dorder_load_end(&c->ix.dorder);
	return tc_epoch_load_end(&c->ix.ep, c->val[TC_KEY_ORDERED]);
}

/* ---- writeback ---- */

/*
 * Bring the dirty slots written since into the ordered walk, and drop the
 * slots cleaned since.  Nothing to do (no slot queued or cleaned since the
 * last merge) costs nothing: a merge reads every dirty slot's word.
 * @fed: an allocation found no slot while cleaned slots waited for a
 * merge, and they can be had now (the caller wakes the writes parked for
 * a slot).
 */
int tc_index_merge(struct tc_cache *c, gfp_t gfp, bool *fed)
{
	struct tc_index *ix = &c->ix;
	struct tc_dorder *d = &ix->dorder;
	bool starved = READ_ONCE(ix->starved);
	u64 dropped;
	int r;

	/*
	 * After a merge that found no memory (it left slots pending), not
	 * again before TC_MERGE_FULL_GAP: each one walks every dirty slot,
	 * and the engine would try at every request while memory is short.
	 */
	*fed = false;
	if (d->nr_pending &&
	    !time_after(jiffies, READ_ONCE(ix->merged) + TC_MERGE_FULL_GAP))
		return -ENOMEM;
	*fed = starved;
	if (!READ_ONCE(d->nr_tail) && !d->nr_pending &&
	    !READ_ONCE(ix->cleaned)) {
		/* set after the last merge took the cleaned slots: fed */
		WRITE_ONCE(ix->starved, false);
		return 0;
	}
	/*
	 * A slot is marked cleaned after its DIRTY went (the atomic update
	 * that cleared it orders the two): cleared here before the slot words
	 * are read, the mark of a slot this merge may miss is seen by the
	 * next one.
	 */
	WRITE_ONCE(ix->cleaned, false);
	WRITE_ONCE(ix->starved, false);
	smp_mb();	/* the mark cleared, then the slot words read */
	dropped = d->nr_dropped;
	r = tc_dorder_merge(d, gfp);
	if (r) {
		/*
		 * The dirty slots taken over wait for the next merge, which
		 * must come.  The clean ones it dropped before it failed to
		 * grow can be had: only then are the writes parked for a
		 * slot woken (each would find none and kick the engine again
		 * at once, a loop for as long as memory stays short).
		 */
		WRITE_ONCE(ix->cleaned, true);
		if (d->nr_dropped == dropped) {
			*fed = false;
			if (starved)
				WRITE_ONCE(ix->starved, true);
		}
	}
	/* the gap counts from the end: a long merge is not followed at once */
	WRITE_ONCE(ix->merged, jiffies);
	return r;
}

/*
 * Writers filled half the tail, or an allocation found no slot while
 * slots cleaned by writeback wait in the dirty order (CLOCK cannot take
 * them before a merge drops them; at most one such merge per
 * TC_MERGE_FULL_GAP after the last one ended).
 */
bool tc_index_want_merge(struct tc_cache *c)
{
	struct tc_index *ix = &c->ix;

	if (tc_dorder_want_merge(&ix->dorder))
		return true;
	return READ_ONCE(ix->starved) &&
	       time_after(jiffies, READ_ONCE(ix->merged) + TC_MERGE_FULL_GAP);
}

/*
 * The first dirty block in [@from, @to] that the last merge saw, its slot
 * returned (TC_SLOT_NONE: none).  The caller checks it under its lock.
 */
u32 tc_next_dirty(struct tc_cache *c, u64 from, u64 to, u64 *block)
{
	return tc_dorder_next(&c->ix.dorder, from, to, block);
}

/* The same, for the dirty versions of @epoch only. */
u32 tc_next_dirty_in(struct tc_cache *c, u64 epoch, u64 from, u64 to,
		     u64 *block)
{
	u64 single;
	const u8 *tags = tc_epoch_tags(&c->ix.ep, &single);

	if (tags)
		return tc_dorder_next_tagged(&c->ix.dorder, from, to, tags,
					     (u8)epoch, block);
	/* no tags: every dirty slot is in the one epoch */
	if (epoch != single)
		return TC_SLOT_NONE;
	return tc_dorder_next(&c->ix.dorder, from, to, block);
}

/* Set OWED on @s if it is dirty. */
static void tc_slot_owe(struct tc_slots *sl, u32 s)
{
	/* pairs with the barrier before the check in tc_wb_pay() */
	unsigned long *w = tc_slot_word(sl, s);
	unsigned int sh = tc_slot_shift(s);
	unsigned long old = READ_ONCE(*w);

	do {
		if (!(old & (BIT(TC_SF_DIRTY) << sh)) ||
		    (old & (BIT(TC_SF_OWED) << sh)))
			return;
	} while (!try_cmpxchg(w, &old, old | (BIT(TC_SF_OWED) << sh)));
}

/*
 * A full flush begins: it owes the origin every slot dirty now.  Called by
 * the engine after a merge that took the whole tail, so every slot dirtied
 * before is in the sorted part.
 */
void tc_index_owe_dirty(struct tc_cache *c)
{
	struct tc_dorder *d = &c->ix.dorder;
	u64 i, n = tc_dorder_nr_sorted(d);

	for (i = 0; i < n; i++) {
		tc_slot_owe(&c->ix.sl, tc_dorder_at(d, i));
		if (!((i + 1) % TC_OWE_BATCH))
			cond_resched();
	}
}

/*
 * Writeback lets go of @slot: WB and the flags in @clear are cleared, OWED
 * given back if @owed and the slot still holds its block; if writeback was
 * the slot's last owner, the slot is freed.
 */
static void tc_wb_drop(struct tc_cache *c, u32 slot, unsigned int clear,
		       bool owed)
{
	struct tc_slots *sl = &c->ix.sl;
	unsigned long *w = tc_slot_word(sl, slot);
	unsigned int sh = tc_slot_shift(slot), f, nf;
	unsigned long old = READ_ONCE(*w), new;

	do {
		f = (old >> sh) & TC_SF_MASK;
		nf = f & ~(clear | BIT(TC_SF_WB));
		if (owed && (f & BIT(TC_SF_VALID)))
			nf |= BIT(TC_SF_OWED);
		new = (old & ~(TC_SF_MASK << sh)) | ((unsigned long)nf << sh);
	} while (!try_cmpxchg(w, &old, new));
	if (WARN_ON_ONCE(!(f & BIT(TC_SF_WB))))
		return;
	if (!(nf & TC_SF_OWNERS))
		tc_free_slot(c, slot);
}

/*
 * Take the dirty @slot into a writeback request (the caller holds its
 * block's lock).  False if an earlier request still writes it.  *@owed:
 * the slot carried a full flush's debt, which the request now pays.
 */
bool tc_wb_take(struct tc_cache *c, u32 slot, bool *owed)
{
	struct tc_slots *sl = &c->ix.sl;
	unsigned long *w = tc_slot_word(sl, slot);
	unsigned int sh = tc_slot_shift(slot);
	unsigned long old = READ_ONCE(*w), new;

	do {
		if (old & (BIT(TC_SF_WB) << sh))
			return false;
		new = old | (BIT(TC_SF_WB) << sh);
		new &= ~((BIT(TC_SF_REWRITTEN) | BIT(TC_SF_OWED)) << sh);
	} while (!try_cmpxchg(w, &old, new));
	*owed = old & (BIT(TC_SF_OWED) << sh);
	return true;
}

/* A taken slot leaves its request unwritten: its debt stays. */
void tc_wb_untake(struct tc_cache *c, u32 slot, bool owed)
{
	tc_wb_drop(c, slot, 0, owed);
}

/*
 * The request's data of @slot is durable on the origin; the caller holds
 * the block's lock.  The slot is clean unless it was rewritten (or removed)
 * meanwhile.
 */
void tc_wb_written(struct tc_cache *c, u32 slot)
{
	unsigned int f = tc_slot_flags(&c->ix.sl, slot);

	if ((f & BIT(TC_SF_VALID)) &&
	    tc_lookup(c, tc_slot_block(&c->ix.sl, slot)) != slot) {
		if (f & BIT(TC_SF_REWRITTEN)) {
			/* rewritten in its epoch before it became older */
			tc_wb_drop(c, slot, 0, false);
			return;
		}
		/* an older version: its epoch is on the origin, it goes */
		tc_remove(c, slot);
		tc_wb_drop(c, slot, BIT(TC_SF_OWED), false);
		return;
	}
	if ((f & (BIT(TC_SF_VALID) | BIT(TC_SF_DIRTY) | BIT(TC_SF_REWRITTEN))) !=
	    (BIT(TC_SF_VALID) | BIT(TC_SF_DIRTY))) {
		tc_wb_drop(c, slot, 0, false);
		return;
	}
	/* what the origin holds now pays any debt */
	tc_wb_drop(c, slot, BIT(TC_SF_DIRTY) | BIT(TC_SF_OWED), false);
	atomic_dec(&c->ix.nr_dirty);
	/* after DIRTY went: see tc_index_merge() */
	WRITE_ONCE(c->ix.cleaned, true);
	tc_meta_set(c, slot, false);
	/*
	 * Recorded clean, then counted out: an epoch is retired only once
	 * no commit can write one of its entries dirty.
	 */
	tc_epoch_leave(&c->ix.ep, slot);
}

/*
 * A written request of full flush @gen paid the debt of @slot, which it
 * still holds (WB).  If another full flush began meanwhile, its walk may
 * have set OWED before this clears it: the slot then owes the new flush
 * again if it is dirty (OWED on a dirty slot the flush did not need costs
 * at most a pass).
 */
void tc_wb_pay(struct tc_cache *c, u32 slot, u32 gen)
{
	tc_slot_clear(&c->ix.sl, slot, TC_SF_OWED);
	smp_mb__after_atomic();	/* the cleared OWED, then the generation */
	if (READ_ONCE(c->fl.full_gen) != gen)
		tc_slot_owe(&c->ix.sl, slot);
}

/* The request is written but the block is busy: it stays dirty. */
void tc_wb_let_go(struct tc_cache *c, u32 slot)
{
	tc_wb_drop(c, slot, 0, false);
}

/*
 * A dirty block was busy: does a running full flush have to come back for
 * it?  Yes if its slot owes the flush or is being written (the request may
 * fail); a block not found is left to the next pass to decide.
 */
bool tc_wb_owed(struct tc_cache *c, u64 block)
{
	u64 ep = READ_ONCE(c->fl.pass_epoch);
	u32 s = tc_lookup_version(c, block, ep);

	/* a closed epoch must be written whole before the next one */
	if (s == TC_SLOT_NONE || ep != tc_epoch_cur(&c->ix.ep))
		return true;
	return tc_slot_flags(&c->ix.sl, s) &
	       (BIT(TC_SF_OWED) | BIT(TC_SF_WB));
}
