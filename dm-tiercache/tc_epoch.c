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

	/* a byte per slot: past INT_MAX bytes for the largest caches */
	e->tag = tc_bigalloc(nr_slots, sizeof(*e->tag), GFP_KERNEL | __GFP_ZERO);
	if (!e->tag)
		return -ENOMEM;
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

/*
 * @slot becomes dirty in the open epoch: count it there and tag it.
 * Returns the tag.
 */
u8 tc_epoch_enter(struct tc_epochs *e, u32 slot)
{
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
	WRITE_ONCE(e->tag[slot], (u8)ep);
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
	if (atomic_read(&e->nr[(u8)e->cur])) {
		low = min(e->oldest, e->floor);
		if (e->cur + 1 > low + TC_EPOCH_SPAN)
			ok = false;
		else
			WRITE_ONCE(e->cur, e->cur + 1);
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

/* @slot is dirty in @epoch; -ERANGE if that is not a live epoch. */
int tc_epoch_load(struct tc_epochs *e, u32 slot, u64 epoch)
{
	if (epoch < e->floor || epoch > e->floor + TC_EPOCH_SPAN)
		return -ERANGE;
	if (!e->loaded_any || epoch < e->load_min)
		e->load_min = epoch;
	if (!e->loaded_any || epoch > e->load_max)
		e->load_max = epoch;
	e->loaded_any = true;
	atomic_inc(&e->nr[(u8)epoch]);
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
 * in place).
 */
void tc_epoch_load_end(struct tc_epochs *e, bool open_new)
{
	if (!e->loaded_any)
		return;
	e->oldest = e->load_min;
	e->cur = e->load_max;
	if (!open_new)
		return;
	if (e->cur + 1 <= e->load_min + TC_EPOCH_SPAN)
		e->cur++;
	else
		e->must_open = true;
}
