// SPDX-License-Identifier: GPL-2.0
/*
 * dm-tiercache: epochs (tc_epoch.h).
 */
#ifdef __KERNEL__
#include <linux/mm.h>
#include <linux/slab.h>
#include <linux/vmalloc.h>
#endif

#include "tc_epoch.h"
#include "tc_slots.h"

int tc_epochs_create(struct tc_epochs *e, u32 nr_slots)
{
	int i;

	e->tag = NULL;		/* one epoch so far: tc_epoch_need_tags() */
	e->nr_slots = nr_slots;
	for (i = 0; i < TC_EPOCH_TAGS; i++)
		atomic_set(&e->nr[i], 0);
	e->oldest = 0;
	e->cur = 0;
	e->floor = 0;
	e->must_open = false;
	e->retiring = U64_MAX;
	spin_lock_init(&e->lock);
	return 0;
}

void tc_epochs_destroy(struct tc_epochs *e)
{
	kvfree(e->tag);
	e->tag = NULL;
}

/* The tags, each @fill: published once, by whoever comes first. */
static int tc_epoch_alloc_tags(struct tc_epochs *e, u8 fill)
{
	u8 *tag;

	/* published ones are whole: pairs with the cmpxchg() below */
	if (smp_load_acquire(&e->tag))
		return 0;
	/* a byte per slot: past INT_MAX bytes for the largest caches */
	tag = tc_bigalloc(e->nr_slots, sizeof(*tag), GFP_KERNEL);
	if (!tag)
		return -ENOMEM;
	memset(tag, fill, e->nr_slots);
	/*
	 * The bytes, then the pointer, then whatever the caller does next
	 * (a `set` switches the policy on): pairs with tc_epoch_tags().
	 */
	if (cmpxchg(&e->tag, NULL, tag))
		kvfree(tag);
	return 0;
}

/*
 * Allocate the tags before a second epoch may be opened (process
 * context).  Until then every dirty slot is in cur, which does not move:
 * every tag is cur.  Whoever opens an epoch next reads the pointer, then
 * moves cur with a release (tc_epoch_open()), so a reader that finds cur
 * moved and then reads the pointer finds the tags too.
 */
int tc_epoch_need_tags(struct tc_epochs *e)
{
	return tc_epoch_alloc_tags(e, (u8)READ_ONCE(e->cur));
}

/*
 * @slot becomes dirty in the open epoch: count it there and tag it.
 * Returns the tag.
 */
u8 tc_epoch_enter(struct tc_epochs *e, u32 slot)
{
	u8 *tag;
	u64 ep;

	for (;;) {
		ep = READ_ONCE(e->cur);
		atomic_inc(&e->nr[(u8)ep]);
		/* counted, then the retirement read: see tc_epoch_retire() */
		smp_mb__after_atomic();
		if (READ_ONCE(e->retiring) != ep) {
			/* a retirement over: its oldest is seen */
			smp_rmb();
			if (READ_ONCE(e->oldest) <= ep)
				break;
		}
		/* retired under our feet: a later epoch is open */
		atomic_dec(&e->nr[(u8)ep]);
	}
	/* cur read before (the barrier above): see tc_epoch_need_tags() */
	tag = smp_load_acquire(&e->tag);
	if (tag)
		WRITE_ONCE(tag[slot], (u8)ep);
	return (u8)ep;
}

/* Dirty @slot is clean now, or gone. */
void tc_epoch_leave(struct tc_epochs *e, u32 slot)
{
	atomic_dec(&e->nr[tc_epoch_tag(e, slot)]);
}

/*
 * A flush: the writes before it are one epoch, the writes after it the
 * next.  Nothing written since the last one: no new epoch is needed.
 * Returns false if one more live epoch is not allowed now.
 */
/* Could a flush open an epoch now?  (A hint: the caller re-checks.) */
bool tc_epoch_can_open(struct tc_epochs *e)
{
	u64 cur = READ_ONCE(e->cur);

	return !atomic_read(&e->nr[(u8)cur]) ||
	       cur + 1 <= min(READ_ONCE(e->oldest), READ_ONCE(e->floor)) +
			  TC_EPOCH_SPAN;
}

bool tc_epoch_open(struct tc_epochs *e)
{
	bool ok = true;
	u64 low;

	spin_lock(&e->lock);
	/* no tags, no second epoch: only a default-policy cache has none */
	if (atomic_read(&e->nr[(u8)e->cur]) && smp_load_acquire(&e->tag)) {
		low = min(e->oldest, e->floor);
		if (e->cur + 1 > low + TC_EPOCH_SPAN)
			ok = false;
		else	/* the tags seen, then cur: see tc_epoch_need_tags() */
			smp_store_release(&e->cur, e->cur + 1);
	}
	if (ok) {
		/* the new cur, then the flag: pairs with tc_epoch_must_open() */
		smp_store_release(&e->must_open, false);
	}
	spin_unlock(&e->lock);
	return ok;
}

/*
 * A load found no room for a new epoch after the newest one loaded
 * (tc_epoch_load_end()): the writes after it must not join that epoch, as
 * the crash before the load was a flush point.  Open the new epoch as
 * soon as writeback has retired enough.  True while writes must wait.
 */
bool tc_epoch_must_open(struct tc_epochs *e)
{
	/* the flag, then cur: pairs with tc_epoch_open() */
	if (likely(!smp_load_acquire(&e->must_open)))
		return false;
	return !tc_epoch_open(e);
}

/*
 * The oldest epoch has no dirty slot left (the writeback made them all
 * durable on the origin): the next one is written back from now on.  The
 * open epoch is never retired.  Returns true if one was.
 */
bool tc_epoch_retire(struct tc_epochs *e)
{
	bool done = false;
	u64 ep;

	spin_lock(&e->lock);
	ep = e->oldest;
	if (ep < e->cur && !atomic_read(&e->nr[(u8)ep])) {
		WRITE_ONCE(e->retiring, ep);
		/* announced, then the count read again: see tc_epoch_enter() */
		smp_mb();
		if (!atomic_read(&e->nr[(u8)ep])) {
			WRITE_ONCE(e->oldest, ep + 1);
			done = true;
		}
		/* a late writer otherwise: it stays */
		smp_wmb();	/* oldest before the announcement goes */
		WRITE_ONCE(e->retiring, U64_MAX);
	}
	spin_unlock(&e->lock);
	return done;
}

/* A commit wrote @floor in the superblock: no dirty entry is older. */
void tc_epoch_set_floor(struct tc_epochs *e, u64 floor)
{
	spin_lock(&e->lock);
	e->floor = floor;
	spin_unlock(&e->lock);
}

/*
 * The absolute epoch of dirty @slot, given @base, an epoch that is at most
 * its own and at most TC_EPOCH_SPAN below it.
 */
u64 tc_epoch_of(struct tc_epochs *e, u32 slot, u64 base)
{
	return base + (u8)(tc_epoch_tag(e, slot) - (u8)base);
}

/* The dirty slots of live @epoch (a hint unless the caller holds it). */
u32 tc_epoch_nr(struct tc_epochs *e, u64 epoch)
{
	return atomic_read(&e->nr[(u8)epoch]);
}

/* ---- loading: the dirty entries of a cache, with their epochs ---- */

void tc_epoch_load_begin(struct tc_epochs *e, u64 floor)
{
	e->retiring = U64_MAX;
	e->must_open = false;
	e->floor = floor;
	e->oldest = floor;
	e->cur = floor;
	e->loaded_any = false;
}

/*
 * @slot is dirty in @epoch; -ERANGE if that is not a live epoch, -ENOMEM
 * if a second epoch needs the tags and there is no memory for them.
 * Without tags, cur is the one epoch loaded so far.
 */
int tc_epoch_load(struct tc_epochs *e, u32 slot, u64 epoch)
{
	int r;

	if (epoch < e->floor || epoch > e->floor + TC_EPOCH_SPAN)
		return -ERANGE;
	if (!e->tag) {
		if (!e->loaded_any) {
			e->oldest = epoch;
			e->cur = epoch;
		} else if (epoch != e->cur) {
			r = tc_epoch_alloc_tags(e, (u8)e->cur);
			if (r)
				return r;
		}
	}
	if (!e->loaded_any || epoch < e->load_min)
		e->load_min = epoch;
	if (!e->loaded_any || epoch > e->load_max)
		e->load_max = epoch;
	e->loaded_any = true;
	atomic_inc(&e->nr[(u8)epoch]);
	if (e->tag)
		e->tag[slot] = (u8)epoch;
	return 0;
}

/*
 * The live epochs are those loaded.  With @open_new (the ordered policy),
 * writes go to a new epoch after the newest (a crash was a flush point).
 * The span counts from the oldest loaded epoch: the load's commit makes
 * it the floor before any write.  If the span is full, the newest loaded
 * epoch stays open for now but no write may join it (tc_epoch_must_open()).
 * Without @open_new the writes join the newest loaded epoch, whose writes
 * no flush followed (the default policy: rewrites of the blocks loaded go
 * in place).  -ENOMEM if the tags the new epoch needs cannot be had.
 */
int tc_epoch_load_end(struct tc_epochs *e, bool open_new)
{
	int r;

	if (!e->loaded_any)
		return 0;
	e->oldest = e->load_min;
	e->cur = e->load_max;
	if (!open_new)
		return 0;
	r = tc_epoch_need_tags(e);
	if (r)
		return r;
	if (e->cur + 1 <= e->load_min + TC_EPOCH_SPAN)
		e->cur++;
	else
		e->must_open = true;
	return 0;
}
