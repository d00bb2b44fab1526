// SPDX-License-Identifier: GPL-2.0
/*
 * dm-tiercache: per-block locks, shared or exclusive.
 *
 * A holder (embedded in the per-bio data of a bio, or in a writeback
 * request) holds one origin block in one of three modes:
 *   read:       read hits; shared with reads and writeback;
 *   writeback:  a writeback request, which only reads the block: shared
 *               with reads, but one request at a time;
 *   exclusive:  anything that changes the block's data or its slot:
 *               writes, promotions, eviction, discard.  Holders sit in a hashed table of buckets,
 * each with its own spinlock, so unrelated blocks never contend.  A bio
 * that finds its block held is parked on the bucket and handed back to the
 * owner's requeue callback when any holder of the bucket goes away; callers
 * that may sleep wait on a waitqueue instead.
 */
#include <linux/slab.h>
#include <linux/hash.h>
#include <linux/log2.h>
#include <linux/vmalloc.h>

#include "tiercache.h"

static struct tc_lock_bucket *tc_bucket(struct tc_locks *l, u64 block)
{
	return &l->buckets[hash_64(block, ilog2(l->nr_buckets))];
}

int tc_locks_init(struct tc_locks *l, unsigned int nr_buckets,
		  void (*requeue)(void *ctx, struct bio_list *bios), void *ctx)
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
	l->requeue = requeue;
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

/* Take @block for @h if nothing conflicts; @bio (if any) waits otherwise. */
static bool tc_lock_bucket_try(struct tc_locks *l, struct tc_holder *h,
			       u64 block, enum tc_lock_mode mode,
			       struct bio *bio)
{
	struct tc_lock_bucket *b = tc_bucket(l, block);
	unsigned long flags;
	bool taken = false;

	spin_lock_irqsave(&b->lock, flags);
	if (!tc_bucket_conflicts(b, block, mode)) {
		h->block = block;
		h->mode = mode;
		hlist_add_head(&h->node, &b->held);
		taken = true;
	} else if (bio) {
		bio_list_add(&b->waiters, bio);
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
 * Take @block for @h, or park @bio until a holder of its bucket lets go.
 * Returns false if the bio was parked: it now belongs to the lock table.
 */
bool tc_lock_or_defer(struct tc_locks *l, struct tc_holder *h, u64 block,
		      enum tc_lock_mode mode, struct bio *bio)
{
	return tc_lock_bucket_try(l, h, block, mode, bio);
}

/* Take @block for @h exclusively, sleeping while somebody else holds it. */
void tc_lock_wait(struct tc_locks *l, struct tc_holder *h, u64 block)
{
	wait_event_idle(l->wait, tc_trylock(l, h, block, TC_LK_EXCL));
}

void tc_unlock(struct tc_locks *l, struct tc_holder *h)
{
	struct tc_lock_bucket *b = tc_bucket(l, h->block);
	struct bio_list waiters;
	unsigned long flags;

	spin_lock_irqsave(&b->lock, flags);
	hlist_del_init(&h->node);
	waiters = b->waiters;
	bio_list_init(&b->waiters);
	spin_unlock_irqrestore(&b->lock, flags);

	if (!bio_list_empty(&waiters))
		l->requeue(l->ctx, &waiters);
	if (wq_has_sleeper(&l->wait))
		wake_up(&l->wait);
}
