// SPDX-License-Identifier: GPL-2.0
/*
 * dm-tiercache: origin flushes, one at a time.
 *
 * Two callers need the origin's volatile cache flushed: writeback, before
 * it marks a batch of written blocks clean, and a flush of the cached
 * device, for the writes that went around the cache.  Both ask here.  At
 * most one origin flush is in flight: a request that arrives while one is,
 * waits for the next (the one in flight may have been issued before the
 * writes the request must cover completed), and every request that arrives
 * meanwhile shares that next one.  So the origin sees one flush at a time,
 * shared by every request that arrived while the one before was in
 * flight (a request waits for at most two), not one flush per fsync; and
 * a logging device below (dm-log-writes) records each write before the
 * first flush that made it durable.  The flush is the workqueue's: it is
 * not charged to the cgroup of any one of the requests it serves.
 *
 * A request completes in the flush's end_io context, with its status.  The
 * flushes are issued from the cache's workqueue (WQ_MEM_RECLAIM): never
 * from a map function, where a bio allocation could wait for bios this
 * thread has not submitted yet.
 */
#include "tiercache.h"

static void tc_oflush_endio(struct bio *bio)
{
	struct tc_cache *c = bio->bi_private;
	struct tc_oflush *of = &c->oflush;
	blk_status_t status = bio->bi_status;
	struct tc_oflush_req *req, *tmp;
	unsigned long flags;
	LIST_HEAD(done);

	bio_put(bio);
	spin_lock_irqsave(&of->lock, flags);
	list_splice_init(&of->cur, &done);
	if (list_empty(&of->next))
		of->running = false;
	else
		queue_work(c->wq, &of->work);
	spin_unlock_irqrestore(&of->lock, flags);
	list_for_each_entry_safe(req, tmp, &done, list) {
		list_del(&req->list);
		req->done(req, status);
	}
}

/* Issue one origin flush for every request waiting now. */
static void tc_oflush_work(struct work_struct *w)
{
	struct tc_cache *c = container_of(w, struct tc_cache, oflush.work);
	struct tc_oflush *of = &c->oflush;
	struct bio *bio;

	spin_lock_irq(&of->lock);
	list_splice_tail_init(&of->next, &of->cur);
	spin_unlock_irq(&of->lock);
	bio = bio_alloc_bioset(c->origin_bdev, 0, REQ_OP_WRITE | REQ_PREFLUSH | REQ_SYNC,
			       GFP_NOIO, &c->bs);
	bio->bi_private = c;
	bio->bi_end_io = tc_oflush_endio;
	submit_bio(bio);
}

void tc_oflush_init(struct tc_cache *c)
{
	struct tc_oflush *of = &c->oflush;

	spin_lock_init(&of->lock);
	INIT_LIST_HEAD(&of->next);
	INIT_LIST_HEAD(&of->cur);
	of->running = false;
	INIT_WORK(&of->work, tc_oflush_work);
}

/*
 * Ask for an origin flush issued after this call: @req->done runs once it
 * has completed (any context).
 */
void tc_oflush(struct tc_cache *c, struct tc_oflush_req *req)
{
	struct tc_oflush *of = &c->oflush;
	unsigned long flags;
	bool issue;

	spin_lock_irqsave(&of->lock, flags);
	list_add_tail(&req->list, &of->next);
	issue = !of->running;
	of->running = true;
	spin_unlock_irqrestore(&of->lock, flags);
	if (issue)
		queue_work(c->wq, &of->work);
}

/* A flush of the cached device's second bio: done with the origin's. */
static void tc_oflush_bio_done(struct tc_oflush_req *req, blk_status_t status)
{
	struct tc_bio *pb = container_of(req, struct tc_bio, oflush);
	struct bio *bio = tc_bio_of(pb);

	bio->bi_status = status;
	bio_endio(bio);
}

void tc_oflush_bio(struct tc_cache *c, struct bio *bio)
{
	struct tc_bio *pb = dm_per_bio_data(bio, sizeof(struct tc_bio));

	pb->oflush.done = tc_oflush_bio_done;
	tc_oflush(c, &pb->oflush);
}
