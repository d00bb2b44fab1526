// SPDX-License-Identifier: GPL-2.0
/*
 * dm-tiercache: per-block locks, shared or exclusive, and range locks.
 *
 * A holder (embedded in the per-bio data of a bio, or in a writeback
 * request) holds one origin block in one of three modes:
 *   read:       read hits; shared with reads and writeback;
 *   writeback:  a writeback request, which only reads the block: shared
 *               with reads, but one request at a time;
 *   exclusive:  anything that changes the block's data or its slot:
 *               writes, promotions, eviction.
 * Holders sit in a hashed table of buckets, each with its own spinlock, so
 * unrelated blocks never contend.
 *
 * A bio that finds its block held is parked on the bucket, in arrival
 * order.  When a holder lets go, the parked bios of that block (only that
 * block) are granted the lock in order for as long as they do not conflict
 * with the holders, and handed back to the owner's requeue callback already
 * holding it.  A bio parked for an exclusive lock keeps later shared
 * lockers of the same block out, so a stream of readers cannot starve a
 * writer.
 *
 * A reservation (the writeback engine's, which cannot park a bio) waits in
 * the held list: new conflicting lockers park behind it, and the unlock
 * that leaves no conflicting holder turns it into a hold and calls the
 * owner's reserved callback.  So a block that overlapping writers hand to
 * each other for ever is still taken by writeback, in its turn.
 *
 * A range lock (a discard) keeps every new holder out of its blocks and
 * waits for the holders already in them; bios that meet a range are parked
 * until a range goes.  Ranges do not overlap: a second one waits.
 */
#include <linux/slab.h>
#include <linux/hash.h>
#include <linux/log2.h>
#include <linux/vmalloc.h>

#include "tc_lock.h"

static struct tc_lock_bucket *tc_bucket(struct tc_locks *l, u64 block)
{
	return &l->buckets[hash_64(block, ilog2(l->nr_buckets))];
}

int tc_locks_init(struct tc_locks *l, unsigned int nr_buckets,
		  struct tc_holder *(*holder_of)(struct bio *bio),
		  void (*requeue)(void *ctx, struct bio_list *bios),
		  void (*reserved)(void *ctx), void *ctx)
{
	unsigned int i;

	if (!is_power_of_2(nr_buckets))
		return -EINVAL;
	l->buckets = kvcalloc(nr_buckets, sizeof(*l->buckets), GFP_KERNEL);
	if (!l->buckets)
		return -ENOMEM;
	l->nr_buckets = nr_buckets;
	for (i = 0; i < nr_buckets; i++) {
		spin_lock_init(&l->buckets[i].lock);
		INIT_HLIST_HEAD(&l->buckets[i].held);
		bio_list_init(&l->buckets[i].waiters);
	}
	init_waitqueue_head(&l->wait);
	spin_lock_init(&l->range_lock);
	INIT_LIST_HEAD(&l->ranges);
	atomic_set(&l->nr_ranges, 0);
	atomic_set(&l->nr_queued, 0);
	bio_list_init(&l->range_waiters);
	l->holder_of = holder_of;
	l->requeue = requeue;
	l->reserved = reserved;
	l->ctx = ctx;
	return 0;
}

void tc_locks_exit(struct tc_locks *l)
{
	kvfree(l->buckets);
	l->buckets = NULL;
}

static bool tc_modes_conflict(enum tc_lock_mode a, enum tc_lock_mode b)
{
	return a == TC_LK_EXCL || b == TC_LK_EXCL ||
	       (a == TC_LK_WB && b == TC_LK_WB);
}

/* Does a holder of @block in @b conflict with a new one in @mode? */
static bool tc_bucket_conflicts(struct tc_lock_bucket *b, u64 block,
				enum tc_lock_mode mode)
{
	struct tc_holder *h;

	hlist_for_each_entry(h, &b->held, node)
		if (h->block == block && tc_modes_conflict(h->mode, mode))
			return true;
	return false;
}

/* Is a bio parked on @b waiting for @block exclusively? */
static bool tc_writer_waits(struct tc_locks *l, struct tc_lock_bucket *b,
			    u64 block)
{
	struct bio *bio;

	bio_list_for_each(bio, &b->waiters) {
		struct tc_holder *w = l->holder_of(bio);

		if (w->block == block && w->mode == TC_LK_EXCL)
			return true;
	}
	return false;
}

/*
 * Is @block inside a held range?  If so @bio (if any) is parked until a
 * range goes.  Called under the block's bucket lock: a range is added
 * before its holder scan takes the bucket locks, so either the scan sees
 * this holder or this check sees the range.
 */
static bool tc_range_blocks(struct tc_locks *l, u64 block, struct bio *bio)
{
	struct tc_range *r;
	bool in = false;

	if (!atomic_read(&l->nr_ranges))
		return false;
	spin_lock(&l->range_lock);
	list_for_each_entry(r, &l->ranges, list) {
		if (block >= r->first && block < r->end) {
			in = true;
			break;
		}
	}
	if (in && bio)
		bio_list_add(&l->range_waiters, bio);
	spin_unlock(&l->range_lock);
	return in;
}

static void tc_hold(struct tc_lock_bucket *b, struct tc_holder *h, u64 block,
		    enum tc_lock_mode mode)
{
	h->block = block;
	h->mode = mode;
	h->queued = false;
	hlist_add_head(&h->node, &b->held);
}

/* Does a holder (not a reservation) of @block conflict with @mode? */
static bool tc_holders_conflict(struct tc_lock_bucket *b, u64 block,
				enum tc_lock_mode mode)
{
	struct tc_holder *h;

	hlist_for_each_entry(h, &b->held, node)
		if (h->block == block && !h->queued &&
		    tc_modes_conflict(h->mode, mode))
			return true;
	return false;
}

/*
 * A holder of @block let go: the reservation of the block, if nothing
 * conflicts with it now, holds.  Returns it.  Under the bucket lock.
 */
static struct tc_holder *tc_reserve_grant(struct tc_locks *l,
					  struct tc_lock_bucket *b, u64 block)
{
	struct tc_holder *h;

	if (!atomic_read(&l->nr_queued))
		return NULL;
	hlist_for_each_entry(h, &b->held, node) {
		if (h->block != block || !h->queued)
			continue;
		if (tc_holders_conflict(b, block, h->mode))
			return NULL;
		h->queued = false;
		atomic_dec(&l->nr_queued);
		return h;
	}
	return NULL;
}

/* Take @block for @h if nothing conflicts; @bio (if any) waits otherwise. */
static bool tc_lock_bucket_try(struct tc_locks *l, struct tc_holder *h,
			       u64 block, enum tc_lock_mode mode,
			       struct bio *bio)
{
	struct tc_lock_bucket *b = tc_bucket(l, block);
	unsigned long flags;
	bool taken = false;

	spin_lock_irqsave(&b->lock, flags);
	if (tc_bucket_conflicts(b, block, mode) ||
	    (mode != TC_LK_EXCL && tc_writer_waits(l, b, block))) {
		if (bio) {
			h->block = block;
			h->mode = mode;
			bio_list_add(&b->waiters, bio);
		}
	} else if (!tc_range_blocks(l, block, bio)) {
		tc_hold(b, h, block, mode);
		taken = true;
	}
	spin_unlock_irqrestore(&b->lock, flags);
	return taken;
}

bool tc_trylock(struct tc_locks *l, struct tc_holder *h, u64 block,
		enum tc_lock_mode mode)
{
	return tc_lock_bucket_try(l, h, block, mode, NULL);
}

/*
 * Take @block for @h, or park @bio until it is granted (h->granted is then
 * set when the bio comes back) or a range goes (it then tries again).
 * Returns false if the bio was parked: it now belongs to the lock table.
 */
bool tc_lock_or_defer(struct tc_locks *l, struct tc_holder *h, u64 block,
		      enum tc_lock_mode mode, struct bio *bio)
{
	h->granted = false;
	return tc_lock_bucket_try(l, h, block, mode, bio);
}

/*
 * Grant @block to the bios parked for it, oldest first, while they do not
 * conflict; they go to @granted.  A range over the block sends them all to
 * @granted ungranted, to meet it.  Called under the bucket lock.
 */
static void tc_grant(struct tc_locks *l, struct tc_lock_bucket *b, u64 block,
		     struct bio_list *granted)
{
	struct bio_list keep;
	struct bio *bio;
	bool blocked = false;

	bio_list_init(&keep);
	while ((bio = bio_list_pop(&b->waiters))) {
		struct tc_holder *w = l->holder_of(bio);

		if (w->block != block) {
			bio_list_add(&keep, bio);
		} else if (atomic_read(&l->nr_ranges)) {
			bio_list_add(granted, bio);	/* retries, meets it */
		} else if (blocked || tc_bucket_conflicts(b, block, w->mode)) {
			blocked = true;		/* no overtaking */
			bio_list_add(&keep, bio);
		} else {
			tc_hold(b, w, block, w->mode);
			w->granted = true;
			bio_list_add(granted, bio);
		}
	}
	b->waiters = keep;
}

void tc_unlock(struct tc_locks *l, struct tc_holder *h)
{
	struct tc_lock_bucket *b = tc_bucket(l, h->block);
	struct tc_holder *reserved;
	struct bio_list granted;
	unsigned long flags;

	bio_list_init(&granted);
	spin_lock_irqsave(&b->lock, flags);
	hlist_del_init(&h->node);
	reserved = tc_reserve_grant(l, b, h->block);
	if (!bio_list_empty(&b->waiters))
		tc_grant(l, b, h->block, &granted);
	spin_unlock_irqrestore(&b->lock, flags);

	if (reserved)
		l->reserved(l->ctx);
	if (!bio_list_empty(&granted))
		l->requeue(l->ctx, &granted);
	if (wq_has_sleeper(&l->wait))
		wake_up(&l->wait);
}

/* @to takes over what @from holds (a descriptor is being replaced). */
void tc_lock_move(struct tc_locks *l, struct tc_holder *from,
		  struct tc_holder *to)
{
	struct tc_lock_bucket *b = tc_bucket(l, from->block);
	unsigned long flags;

	spin_lock_irqsave(&b->lock, flags);
	to->block = from->block;
	to->mode = from->mode;
	to->granted = false;
	to->queued = false;
	hlist_add_behind(&to->node, &from->node);
	hlist_del_init(&from->node);
	spin_unlock_irqrestore(&b->lock, flags);
}

/*
 * Take @block for @h, or else reserve it: @h waits in the held list, ahead
 * of the bios parked later, and holds once the holders in its way let go
 * (the reserved callback says so).  A block inside a range is neither
 * taken nor reserved (@h stays unhashed).  Returns true if @h holds the
 * block now.
 */
bool tc_lock_or_reserve(struct tc_locks *l, struct tc_holder *h, u64 block,
			enum tc_lock_mode mode)
{
	struct tc_lock_bucket *b = tc_bucket(l, block);
	unsigned long flags;
	bool taken = false;

	spin_lock_irqsave(&b->lock, flags);
	if (!tc_range_blocks(l, block, NULL)) {
		taken = !tc_holders_conflict(b, block, mode);
		tc_hold(b, h, block, mode);
		if (!taken) {
			h->queued = true;
			atomic_inc(&l->nr_queued);
		}
	}
	spin_unlock_irqrestore(&b->lock, flags);
	return taken;
}

/* Does the reservation @h hold its block now? */
bool tc_reserve_holds(struct tc_locks *l, struct tc_holder *h)
{
	struct tc_lock_bucket *b = tc_bucket(l, h->block);
	unsigned long flags;
	bool holds;

	spin_lock_irqsave(&b->lock, flags);
	holds = !hlist_unhashed(&h->node) && !h->queued;
	spin_unlock_irqrestore(&b->lock, flags);
	return holds;
}

/* Give a reservation up, whether it holds its block yet or not. */
void tc_reserve_cancel(struct tc_locks *l, struct tc_holder *h)
{
	struct tc_lock_bucket *b = tc_bucket(l, h->block);
	struct bio_list granted;
	unsigned long flags;
	bool holds;

	bio_list_init(&granted);
	spin_lock_irqsave(&b->lock, flags);
	holds = !hlist_unhashed(&h->node) && !h->queued;
	if (h->queued) {
		/* the bios parked behind it may go */
		hlist_del_init(&h->node);
		h->queued = false;
		atomic_dec(&l->nr_queued);
		if (!bio_list_empty(&b->waiters))
			tc_grant(l, b, h->block, &granted);
	}
	spin_unlock_irqrestore(&b->lock, flags);
	if (!bio_list_empty(&granted))
		l->requeue(l->ctx, &granted);
	if (holds)
		tc_unlock(l, h);
	else if (wq_has_sleeper(&l->wait))
		wake_up(&l->wait);	/* a range waiting for it */
}

/* ---- range locks ---- */

static bool tc_range_add(struct tc_locks *l, struct tc_range *r)
{
	struct tc_range *o;
	bool added = false;

	spin_lock_irq(&l->range_lock);
	list_for_each_entry(o, &l->ranges, list)
		if (o->first < r->end && r->first < o->end)
			goto out;
	list_add_tail(&r->list, &l->ranges);
	atomic_inc(&l->nr_ranges);
	added = true;
out:
	spin_unlock_irq(&l->range_lock);
	return added;
}

/* Does any holder hold a block in [first, end)? */
static bool tc_range_held(struct tc_locks *l, u64 first, u64 end)
{
	struct tc_holder *h;
	unsigned int i;
	bool held = false;

	for (i = 0; i < l->nr_buckets && !held; i++) {
		struct tc_lock_bucket *b = &l->buckets[i];

		spin_lock_irq(&b->lock);
		hlist_for_each_entry(h, &b->held, node) {
			if (h->block >= first && h->block < end) {
				held = true;
				break;
			}
		}
		spin_unlock_irq(&b->lock);
	}
	return held;
}

/* Hold [first, end): no new holder gets in; wait for the ones inside. */
void tc_range_lock(struct tc_locks *l, struct tc_range *r, u64 first, u64 end)
{
	r->first = first;
	r->end = end;
	wait_event_idle(l->wait, tc_range_add(l, r));
	wait_event_idle(l->wait, !tc_range_held(l, first, end));
}

/* Let the range go; bios parked on ranges try again.  Any context. */
void tc_range_unlock(struct tc_locks *l, struct tc_range *r)
{
	struct bio_list waiters;
	unsigned long flags;

	spin_lock_irqsave(&l->range_lock, flags);
	list_del_init(&r->list);
	atomic_dec(&l->nr_ranges);
	waiters = l->range_waiters;
	bio_list_init(&l->range_waiters);
	spin_unlock_irqrestore(&l->range_lock, flags);

	if (!bio_list_empty(&waiters))
		l->requeue(l->ctx, &waiters);
	wake_up(&l->wait);
}
