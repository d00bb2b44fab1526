// SPDX-License-Identifier: GPL-2.0
/*
 * dm-tiercache: a pool of buffer chunks for the writeback engine.
 *
 * A flush fills hundreds of MiB of buffers, and a fresh page costs more
 * than the I/O it carries: with init_on_alloc (the default of many
 * distributions) every page is zeroed when it is allocated, and that was
 * most of the time the engine spent issuing a sparse flush.  The pool
 * takes that cost off the engine's path in two ways while writeback runs:
 *
 *  - a refill work, on the unbound workqueue and so usually on another
 *    CPU, allocates chunks ahead of the engine up to a target;
 *  - chunks of finished requests go back to the pool (up to the same
 *    target) instead of to the page allocator, so a long flush that is
 *    paced by flush_depth reuses its chunks.
 *
 * Chunks are compound pages of TC_BUF_MAX_ORDER.  The part of a chunk a
 * request uses is filled by its reads before any of it is written, so
 * reusing a chunk without clearing it exposes nothing.  The pool is
 * emptied when writeback goes idle or stops.
 */
#include <linux/mm.h>
#include <linux/gfp.h>

#include "tiercache.h"

#define TC_POOL_GFP	(GFP_NOIO | __GFP_COMP | __GFP_NORETRY | __GFP_NOWARN)

static void tc_pool_refill(struct work_struct *w)
{
	struct tc_pool *p = container_of(w, struct tc_pool, refill);

	for (;;) {
		struct page *pg;

		if (READ_ONCE(p->nr) >= READ_ONCE(p->target))
			return;
		pg = alloc_pages(TC_POOL_GFP, TC_BUF_MAX_ORDER);
		if (!pg)
			return;	/* memory is short: the engine allocates its own */
		if (!tc_pool_put(p, pg)) {
			__free_pages(pg, TC_BUF_MAX_ORDER);
			return;
		}
		cond_resched();
	}
}

void tc_pool_init(struct tc_pool *p)
{
	spin_lock_init(&p->lock);
	INIT_LIST_HEAD(&p->chunks);
	INIT_WORK(&p->refill, tc_pool_refill);
}

/* Writeback runs: keep up to @target chunks ready, allocated on @wq. */
void tc_pool_start(struct tc_pool *p, struct workqueue_struct *wq,
		   unsigned int target)
{
	spin_lock(&p->lock);
	p->wq = wq;
	p->target = target;
	spin_unlock(&p->lock);
	if (READ_ONCE(p->nr) < target)
		queue_work(wq, &p->refill);
}

/* Writeback stopped: refill no more and give every chunk back. */
void tc_pool_stop(struct tc_pool *p)
{
	struct page *pg, *tmp;
	LIST_HEAD(chunks);

	spin_lock(&p->lock);
	p->target = 0;
	spin_unlock(&p->lock);
	cancel_work_sync(&p->refill);

	spin_lock(&p->lock);
	list_splice_init(&p->chunks, &chunks);
	p->nr = 0;
	spin_unlock(&p->lock);
	list_for_each_entry_safe(pg, tmp, &chunks, lru) {
		list_del(&pg->lru);
		__free_pages(pg, TC_BUF_MAX_ORDER);
	}
}

/* A ready chunk, or NULL when the pool is empty. */
struct page *tc_pool_get(struct tc_pool *p)
{
	struct page *pg;
	bool low;

	spin_lock(&p->lock);
	pg = list_first_entry_or_null(&p->chunks, struct page, lru);
	if (pg) {
		list_del(&pg->lru);
		p->nr--;
	}
	low = p->target && p->nr < p->target / 2;
	spin_unlock(&p->lock);
	if (low)
		queue_work(p->wq, &p->refill);
	return pg;
}

/* Keep @pg for a later request; false: the pool is full or stopped. */
bool tc_pool_put(struct tc_pool *p, struct page *pg)
{
	bool kept = false;

	spin_lock(&p->lock);
	if (p->nr < p->target) {
		list_add(&pg->lru, &p->chunks);
		p->nr++;
		kept = true;
	}
	spin_unlock(&p->lock);
	return kept;
}
