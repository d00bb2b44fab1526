// SPDX-License-Identifier: GPL-2.0
/*
 * dm-tiercache: the neighbour-merging writeback engine.
 *
 * The engine sweeps dirty blocks in ascending origin order from a cursor.
 * Each request starts at a dirty block and grows over origin-adjacent dirty
 * blocks (and bridged holes, see tc_plan.c) up to max_flush_kb, wherever
 * the blocks sit in the cache.  A request goes through three stages:
 *
 *   read:  its blocks are read from their slots (holes that are not cached
 *          from the origin) into one buffer, contiguous sources in one bio.
 *          When the request has several uncached holes, the origin span
 *          from the first to the last is read first as one request, and
 *          the cached blocks are laid over it: one origin read per request
 *          instead of one per hole, which is what a seeking disk needs;
 *   write: the buffer goes to the origin as one bio;
 *   clean: once the writes in flight have completed, one REQ_PREFLUSH is
 *          sent to the origin, and then the blocks are marked clean unless
 *          they were rewritten meanwhile (tc_index.c).
 *
 * A request locks its blocks in writeback mode (reads go on).  A dirty
 * block is let go as soon as its data is in the buffer: a write to it then
 * proceeds, marks its slot rewritten and so keeps it dirty.  Its slot is
 * in writeback (TC_SF_WB) until the request is done, so no other request
 * takes it, it is not given to another block, and a discard waits (a
 * discarded block written around the cache must not be overtaken by this
 * older copy).  Hole blocks stay locked until the
 * write completes, so nothing written around the cache meanwhile is
 * overwritten by the filler.  At
 * most flush_depth requests are between gather and write completion.
 * Completions run in done_work; the engine itself only gathers and issues,
 * and never waits for done_work (both run on one WQ_MEM_RECLAIM queue, whose
 * rescuer runs one item at a time): at the end of a pass it returns, and
 * the last request released queues it again.
 *
 * When the origin cannot be read under a bridged hole, the request writes
 * its dirty runs alone.  An error pauses background writeback, which tries
 * again after a back-off (1 s, doubling up to 8 s).  A full flush writes
 * what was dirty when it began: blocks rewritten since need no second pass.
 */
#include <linux/slab.h>
#include <linux/vmalloc.h>
#include <linux/delay.h>
#include <linux/sched/mm.h>

#include "tiercache.h"

/* buffer chunks the pool keeps ready: a few requests' worth, 16 MiB most */
#define TC_WB_POOL_REQS		4
#define TC_WB_POOL_MAX		(16 << 20)
/* back-off of background writeback after an error */
#define TC_WB_BACKOFF_MIN_MS	1000
/* no memory for a request descriptor: the engine tries again after this */
#define TC_WB_NOMEM_DELAY	(HZ / 10)
#define TC_WB_BACKOFF_MAX_MS	8000

enum tc_wb_stage {
	TC_WB_SPAN,		/* one origin read under all the holes */
	TC_WB_READ,		/* slot reads (and holes, without a span) */
	TC_WB_WRITE,
};

struct tc_wb_blk {
	struct tc_holder h;
	u32 slot;			/* TC_SLOT_NONE: read the origin */
	bool dirty;
	bool owed;			/* took OWED: give it back unwritten */
	bool held;			/* h is in the lock table */
	bool keep;			/* an older version: locked to the end */
};

struct tc_wb_req {
	struct list_head list;
	struct tc_cache *c;
	enum tc_wb_stage stage;
	u32 full_gen;			/* fl->full_gen when gathered */
	u64 first;
	u32 nr;
	u32 nr_dirty;
	atomic_t pending;
	bool nomem;			/* no buffer: not an I/O error */
	blk_status_t status;		/* cache reads, the write */
	blk_status_t hole_status;	/* reads of holes (origin or cache) */
	struct tc_buf buf;
	/* the first request of a batch leads it: the others, the flush */
	struct list_head batch;
	struct tc_oflush_req oflush;
	blk_status_t flush_status;
	struct tc_wb_blk blks[];
};

/* ---- state ---- */

/* A dm event for the active table (dmsetup wait, dmeventd). */
void tc_flush_event(struct tc_cache *c)
{
	struct dm_target *ti = READ_ONCE(c->owner);

	if (ti)
		dm_table_event(ti->table);
}

static void tc_flush_latch(struct tc_cache *c, int err)
{
	struct tc_flush *fl = &c->fl;

	if (!fl->error)
		fl->error = err;
	fl->pass_error = err;
}

/* Is a full flush asked for or running?  (What a waiter waits for.) */
static bool tc_full_pending(struct tc_flush *fl)
{
	if (test_bit(TC_FL_FULL_REQ, &fl->bits))
		return true;
	smp_rmb();	/* pairs with tc_wb_begin_full() */
	return test_bit(TC_FL_FULL, &fl->bits);
}

const char *tc_flush_state(struct tc_cache *c)
{
	struct tc_flush *fl = &c->fl;

	if (tc_full_pending(fl))
		return "flushing";
	if (READ_ONCE(c->cleaner) && tc_nr_dirty(c))
		return "cleaning";
	if (test_bit(TC_FL_BACKGROUND, &fl->bits) &&
	    !test_bit(TC_FL_PAUSED, &fl->bits))
		return "background";
	return "idle";
}

static bool tc_wb_wanted(struct tc_cache *c)
{
	struct tc_flush *fl = &c->fl;

	if (test_bit(TC_FL_STOPPED, &fl->bits))
		return false;
	if (test_bit(TC_FL_FULL, &fl->bits))
		return true;
	if (test_bit(TC_FL_PAUSED, &fl->bits))
		return false;
	if (READ_ONCE(c->cleaner) && tc_nr_dirty(c))
		return true;
	/* writes or a flush wait for older versions to reach the origin */
	if (test_bit(TC_FL_EPOCH_WAIT, &fl->bits) && tc_origin_behind(c))
		return true;
	return test_bit(TC_FL_BACKGROUND, &fl->bits);
}

/* ---- gathering: the tc_plan callbacks ---- */

struct tc_gather {
	struct tc_cache *c;
	struct tc_wb_req *req;
	bool lock_busy;			/* a block's lock was taken */
};

/* Only the engine links or unlinks its reservation: no lock needed. */
static bool tc_wb_has_resv(struct tc_flush *fl)
{
	return !hlist_unhashed_lockless(&fl->resv.node);
}

/* The writeback lock of @b: the reservation of @b once it holds, or a try. */
static bool tc_wb_trylock(struct tc_cache *c, struct tc_holder *h, u64 b)
{
	struct tc_flush *fl = &c->fl;

	if (tc_wb_has_resv(fl) && fl->resv.block == b) {
		if (!tc_reserve_holds(&c->locks, &fl->resv))
			return false;
		tc_lock_move(&c->locks, &fl->resv, h);
		return true;
	}
	return tc_trylock(&c->locks, h, b, TC_LK_WB);
}

static enum tc_blk_kind tc_gather_take(void *ctx, u64 b)
{
	struct tc_gather *g = ctx;
	struct tc_wb_blk *blk = &g->req->blks[b - g->req->first];
	struct tc_cache *c = g->c;

	blk->held = false;
	blk->dirty = false;
	blk->owed = false;
	blk->keep = false;
	blk->slot = TC_SLOT_NONE;
	if (!tc_wb_trylock(c, &blk->h, b)) {
		g->lock_busy = true;
		return TC_BLK_BUSY;
	}
	blk->held = true;
	blk->slot = tc_lookup_version(c, b, c->fl.pass_epoch);
	blk->dirty = blk->slot != TC_SLOT_NONE;
	if (!blk->dirty) {
		/*
		 * A hole: filled from a clean copy, or from the origin, never
		 * with a dirty version of a later epoch.
		 */
		blk->slot = tc_lookup(c, b);
		if (blk->slot != TC_SLOT_NONE && tc_slot_dirty(c, blk->slot))
			blk->slot = TC_SLOT_NONE;
		return TC_BLK_HOLE;
	}
	/* written, the newest version pays what a full flush owes */
	if (!tc_wb_take(c, blk->slot, &blk->owed)) {
		/* still being written by an earlier request */
		tc_unlock(&c->locks, &blk->h);
		blk->held = false;
		return TC_BLK_BUSY;
	}
	/*
	 * An older version keeps its lock until the request is done: it is
	 * then dropped, which needs the lock, and writers must not keep it
	 * from that (its epoch could never retire).
	 */
	blk->keep = tc_lookup(c, b) != blk->slot;
	return TC_BLK_DIRTY;
}

static void tc_gather_give_back(void *ctx, u64 b)
{
	struct tc_gather *g = ctx;
	struct tc_wb_blk *blk = &g->req->blks[b - g->req->first];

	if (blk->dirty)
		tc_wb_untake(g->c, blk->slot, blk->owed);
	tc_unlock(&g->c->locks, &blk->h);
	blk->held = false;
}

static u64 tc_gather_next_dirty(void *ctx, u64 from, u64 to)
{
	struct tc_gather *g = ctx;
	u64 block;

	if (tc_next_dirty_in(g->c, g->c->fl.pass_epoch, from, to, &block) !=
	    TC_SLOT_NONE)
		return block;
	return TC_PLAN_NONE;
}

static const struct tc_plan_ops tc_gather_ops = {
	.take = tc_gather_take,
	.give_back = tc_gather_give_back,
	.next_dirty = tc_gather_next_dirty,
};

static void tc_wb_free(struct tc_wb_req *req)
{
	tc_buf_free(&req->c->fl.pool, &req->buf);
	kvfree(req);
}

/*
 * A dirty block was busy at the cursor.  A full flush must come back for
 * it only if it owes the block: one dirtied after the flush began, or
 * whose debt a request paid, was promised nothing.  Returns true if the
 * pass must come back.
 */
static bool tc_wb_skipped(struct tc_cache *c, u64 block)
{
	struct tc_flush *fl = &c->fl;

	if (test_bit(TC_FL_FULL, &fl->bits) && !tc_wb_owed(c, block))
		return false;
	fl->pass_skipped = true;
	return true;
}

/* Lock-table callback: the engine's reservation holds its block. */
void tc_flush_reserved(void *ctx)
{
	struct tc_cache *c = ctx;

	set_bit(TC_FL_RESV_READY, &c->fl.bits);
	tc_flush_kick(c);
}

/*
 * A block a full flush (or the cleaner) must write was locked: writers
 * that overlap may hand it to each other for ever.  Reserve it, one block
 * at a time: writers that come later wait for writeback to read it.
 */
static void tc_wb_reserve(struct tc_cache *c, u64 b)
{
	struct tc_flush *fl = &c->fl;

	/* a closed epoch must be written whole before the next one */
	if (tc_wb_has_resv(fl) ||
	    (!test_bit(TC_FL_FULL, &fl->bits) && !READ_ONCE(c->cleaner) &&
	     fl->pass_epoch == tc_epoch_cur(&c->ix.ep)))
		return;
	if (tc_lock_or_reserve(&c->locks, &fl->resv, b, TC_LK_WB))
		set_bit(TC_FL_RESV_READY, &fl->bits);
}

/* Give the reservation up (the flush is over, or the engine stops). */
static void tc_wb_drop_resv(struct tc_cache *c)
{
	struct tc_flush *fl = &c->fl;

	if (tc_wb_has_resv(fl))
		tc_reserve_cancel(&c->locks, &fl->resv);
	clear_bit(TC_FL_RESV_READY, &fl->bits);
}

/*
 * Descriptors may be large (max_flush_kb of blocks): kvmalloc() falls back
 * to vmalloc() only for GFP_KERNEL, so no I/O is kept out by the scope.
 * It may fail rather than wait for memory (the engine tries again later).
 */
static void *tc_wb_alloc(size_t bytes)
{
	unsigned int noio = memalloc_noio_save();
	void *p = kvmalloc(bytes, GFP_KERNEL | __GFP_RETRY_MAYFAIL |
				  __GFP_NOWARN);

	memalloc_noio_restore(noio);
	return p;
}

/* The gather descriptor, for requests of up to @blocks blocks. */
static struct tc_wb_req *tc_wb_scratch(struct tc_cache *c, u32 blocks)
{
	struct tc_flush *fl = &c->fl;

	if (fl->scratch_blocks < blocks) {
		kvfree(fl->scratch);
		fl->scratch_blocks = 0;
		fl->scratch = tc_wb_alloc(struct_size(fl->scratch, blks,
						      blocks));
		if (!fl->scratch)
			return NULL;
		fl->scratch_blocks = blocks;
	}
	return fl->scratch;
}

/*
 * The gathered request, in a descriptor of its own size: the memory of
 * the requests in flight follows their size, not max_flush_kb.  The locks
 * move with the blocks.  NULL if there is no memory (all is given back).
 */
static struct tc_wb_req *tc_wb_own(struct tc_cache *c, struct tc_wb_req *g)
{
	struct tc_wb_req *req;
	u32 i;

	req = tc_wb_alloc(struct_size(req, blks, g->nr));
	if (req) {
		memset(req, 0, sizeof(*req));
		req->c = c;
		req->first = g->first;
		req->nr = g->nr;
		req->full_gen = READ_ONCE(c->fl.full_gen);
		INIT_LIST_HEAD(&req->batch);
	}
	for (i = 0; i < g->nr; i++) {
		struct tc_wb_blk *from = &g->blks[i], *to;

		if (!req) {
			if (from->dirty)
				tc_wb_untake(c, from->slot, from->owed);
			tc_unlock(&c->locks, &from->h);
			continue;
		}
		to = &req->blks[i];
		*to = *from;
		tc_lock_move(&c->locks, &from->h, &to->h);
	}
	return req;
}

/*
 * The next request from *@cursor (the sweep's, or a reserved block).  NULL
 * at the end of a pass, ERR_PTR(-EAGAIN) when the dirty block under the
 * cursor was busy.
 */
static struct tc_wb_req *tc_wb_gather(struct tc_cache *c, u64 *cursor)
{
	struct tc_plan_limits lim = {
		.end = c->nr_blocks,
		.max_blocks = (READ_ONCE(c->val[TC_KEY_MAX_FLUSH_KB]) * 2) >>
			      c->block_shift,
		.gap_blocks = (READ_ONCE(c->val[TC_KEY_BRIDGE_GAP_KB]) * 2) >>
			      c->block_shift,
	};
	struct tc_gather g = { .c = c };
	struct tc_wb_req *req;
	enum tc_blk_kind k;
	u64 idx;

	if (*cursor >= c->nr_blocks ||
	    tc_next_dirty_in(c, c->fl.pass_epoch, *cursor, c->nr_blocks - 1,
			     &idx) == TC_SLOT_NONE)
		return NULL;
	*cursor = idx + 1;
	req = tc_wb_scratch(c, max_t(u32, lim.max_blocks, 1));
	if (!req) {
		*cursor = idx;
		return ERR_PTR(-ENOMEM);
	}
	req->c = c;
	req->first = idx;
	g.req = req;
	k = tc_gather_take(&g, idx);
	if (k != TC_BLK_DIRTY) {
		if (k == TC_BLK_HOLE)
			tc_gather_give_back(&g, idx);
		else if (tc_wb_skipped(c, idx) && g.lock_busy)
			tc_wb_reserve(c, idx);
		return ERR_PTR(-EAGAIN);
	}
	req->nr = tc_plan_extend(&tc_gather_ops, &g, idx, &lim);
	*cursor = idx + req->nr;
	req = tc_wb_own(c, req);
	if (!req) {
		*cursor = idx;
		return ERR_PTR(-ENOMEM);
	}
	return req;
}

/*
 * The reservation holds its block: a request from that block now, so the
 * writers parked behind it wait no longer than its read.  If the block is
 * no longer dirty, the reservation goes.  NULL if there is none to take.
 */
static struct tc_wb_req *tc_wb_gather_reserved(struct tc_cache *c)
{
	struct tc_flush *fl = &c->fl;
	struct tc_wb_req *req = NULL;
	u64 at = fl->resv.block;

	if (!test_and_clear_bit(TC_FL_RESV_READY, &fl->bits) ||
	    !tc_wb_has_resv(fl) || !tc_reserve_holds(&c->locks, &fl->resv))
		return NULL;
	if (tc_lookup_version(c, at, fl->pass_epoch) != TC_SLOT_NONE)
		req = tc_wb_gather(c, &at);
	if (tc_wb_has_resv(fl))
		tc_wb_drop_resv(c);	/* not taken (ENOMEM: tried again) */
	return req;
}

/* ---- completion plumbing ---- */

static void tc_wb_completed(struct tc_wb_req *req)
{
	struct tc_cache *c = req->c;
	unsigned long flags;

	/* queued under the lock: see tc_wb_flushed() */
	spin_lock_irqsave(&c->fl.lock, flags);
	list_add_tail(&req->list, &c->fl.completed);
	queue_work(c->wq, &c->fl.done_work);
	spin_unlock_irqrestore(&c->fl.lock, flags);
}

static void tc_wb_put(struct tc_wb_req *req)
{
	if (atomic_dec_and_test(&req->pending))
		tc_wb_completed(req);
}

/* A bio of @req ended: its error (if any) goes to @status. */
static void tc_wb_bio_done(struct bio *bio, blk_status_t *status)
{
	struct tc_wb_req *req = bio->bi_private;

	if (bio->bi_status)
		*status = bio->bi_status;
	bio_put(bio);
	tc_wb_put(req);
}

static void tc_wb_endio(struct bio *bio)
{
	struct tc_wb_req *req = bio->bi_private;

	tc_wb_bio_done(bio, &req->status);
}

/*
 * A read of holes (bridging), from the origin or from clean cached copies:
 * its failure only takes the bridge off (tc_wb_write_runs()).  Told apart
 * at submission, for a stacked device may have remapped bi_bdev by
 * completion.
 */
static void tc_wb_hole_endio(struct bio *bio)
{
	struct tc_wb_req *req = bio->bi_private;

	tc_wb_bio_done(bio, &req->hole_status);
}

/* Submit [off, off + len) of the buffer as one or more bios. */
static void tc_wb_submit(struct tc_wb_req *req, size_t off, size_t len,
			 struct block_device *bdev, sector_t sector,
			 blk_opf_t opf, bio_end_io_t *end_io)
{
	struct tc_cache *c = req->c;

	while (len) {
		size_t part = len;
		struct bio *bio = tc_buf_bio(c, &req->buf, off, &part, bdev,
					     sector, opf);

		bio->bi_private = req;
		bio->bi_end_io = end_io;
		atomic_inc(&req->pending);
		if (op_is_write(opf))
			atomic64_inc(&c->stats.wb_requests);
		submit_bio(bio);
		off += part;
		len -= part;
		sector += part >> SECTOR_SHIFT;
	}
}

/* ---- stage 1: read the blocks into the buffer ---- */

static struct block_device *tc_wb_src(struct tc_cache *c, struct tc_wb_req *req,
				      u32 i, sector_t *sector)
{
	struct tc_wb_blk *blk = &req->blks[i];

	if (blk->slot != TC_SLOT_NONE) {
		*sector = tc_slot_sector(c, blk->slot);
		return c->cache_bdev;
	}
	*sector = (req->first + i) << c->block_shift;
	return c->origin_bdev;
}

/* Read the blocks of @req into the buffer; cached ones only if asked. */
static void tc_wb_read(struct tc_cache *c, struct tc_wb_req *req,
		       bool cached_only)
{
	size_t bb = tc_block_bytes(c);
	u32 i = 0;

	req->stage = TC_WB_READ;
	atomic_set(&req->pending, 1);
	while (i < req->nr) {
		sector_t start, s;
		struct block_device *bdev = tc_wb_src(c, req, i, &start);
		u32 j = i + 1;

		/* one bio for sources contiguous on one device, of one kind */
		while (j < req->nr && tc_wb_src(c, req, j, &s) == bdev &&
		       s == start + (sector_t)(j - i) * c->block_sectors &&
		       req->blks[j].dirty == req->blks[i].dirty)
			j++;
		if (!cached_only || bdev == c->cache_bdev)
			tc_wb_submit(req, i * bb, (j - i) * bb, bdev, start,
				     REQ_OP_READ, req->blks[i].dirty ?
				     tc_wb_endio : tc_wb_hole_endio);
		i = j;
	}
	tc_wb_put(req);
}

/*
 * The first and last uncached blocks of @req, and whether cached blocks
 * lie between them (then the holes are not one contiguous origin read).
 */
static bool tc_wb_split_holes(struct tc_wb_req *req, u32 *lo, u32 *hi)
{
	bool seen = false, split = false;
	u32 i;

	for (i = 0; i < req->nr; i++) {
		if (req->blks[i].slot != TC_SLOT_NONE) {
			split |= seen;
			continue;
		}
		if (!seen)
			*lo = i;
		seen = true;
		*hi = i;
	}
	return seen && split && *hi > *lo;
}

static void tc_wb_begin_read(struct tc_cache *c, struct tc_wb_req *req)
{
	size_t bb = tc_block_bytes(c);
	u32 lo = 0, hi = 0;

	if (tc_buf_alloc(&c->fl.pool, &req->buf, (size_t)req->nr * bb)) {
		req->stage = TC_WB_READ;
		req->nomem = true;
		req->status = BLK_STS_RESOURCE;
		atomic_set(&req->pending, 1);
		tc_wb_put(req);
		return;
	}
	if (!tc_wb_split_holes(req, &lo, &hi)) {
		tc_wb_read(c, req, false);
		return;
	}
	req->stage = TC_WB_SPAN;
	atomic_set(&req->pending, 1);
	tc_wb_submit(req, lo * bb, (hi - lo + 1) * bb, c->origin_bdev,
		     (req->first + lo) << c->block_shift, REQ_OP_READ,
		     tc_wb_hole_endio);
	tc_wb_put(req);
}

/* ---- stage 2: one write to the origin ---- */

/*
 * Let go of the locks of @req's dirty blocks (@dirty) or holes, but not
 * of an older version's: it keeps its lock to the end (tc_wb_release()).
 */
static void tc_wb_unlock(struct tc_cache *c, struct tc_wb_req *req, bool dirty)
{
	u32 i;

	for (i = 0; i < req->nr; i++) {
		struct tc_wb_blk *blk = &req->blks[i];

		if (blk->held && blk->dirty == dirty && !blk->keep) {
			tc_unlock(&c->locks, &blk->h);
			blk->held = false;
		}
	}
}

static void tc_wb_write(struct tc_cache *c, struct tc_wb_req *req)
{
	size_t bytes = (size_t)req->nr * tc_block_bytes(c);

	/* the dirty blocks' data is in the buffer: writes to them may go on */
	tc_wb_unlock(c, req, true);

	req->stage = TC_WB_WRITE;
	atomic_set(&req->pending, 1);
	atomic64_add(bytes >> SECTOR_SHIFT, &c->stats.wb_sectors);
	atomic64_add(req->nr_dirty, &c->stats.wb_blocks);
	atomic64_add(req->nr - req->nr_dirty, &c->stats.bridged_blocks);
	tc_wb_submit(req, 0, bytes, c->origin_bdev,
		     req->first << c->block_shift, REQ_OP_WRITE, tc_wb_endio);
	tc_wb_put(req);
}

/*
 * A hole could not be read (from the origin, or from its clean copy in
 * the cache): the bridge is off.  The holes let go, and each run of dirty
 * blocks is written on its own.
 */
static void tc_wb_write_runs(struct tc_cache *c, struct tc_wb_req *req)
{
	size_t bb = tc_block_bytes(c);
	u32 i = 0, j;

	DMERR_LIMIT("%s: read error under a bridged hole at block %llu: writing the dirty runs alone",
		    c->name, req->first);
	tc_wb_unlock(c, req, true);
	tc_wb_unlock(c, req, false);
	req->stage = TC_WB_WRITE;
	atomic_set(&req->pending, 1);
	atomic64_add(req->nr_dirty, &c->stats.wb_blocks);
	while (i < req->nr) {
		if (!req->blks[i].dirty) {
			i++;
			continue;
		}
		for (j = i; j < req->nr && req->blks[j].dirty; j++)
			;
		atomic64_add(((j - i) * bb) >> SECTOR_SHIFT,
			     &c->stats.wb_sectors);
		tc_wb_submit(req, i * bb, (j - i) * bb, c->origin_bdev,
			     (req->first + i) << c->block_shift, REQ_OP_WRITE,
			     tc_wb_endio);
		i = j;
	}
	tc_wb_put(req);
}

/* ---- stage 3: origin flush, then clean ---- */

/*
 * A written dirty block is clean unless it was rewritten: checked under its
 * lock, so no write changes it meanwhile (tc_wb_written()).  A block whose
 * lock is busy is being written: it stays dirty.  Either way the request
 * lets go of the slot (a slot removed meanwhile is freed then).
 */
static void tc_wb_finish_blk(struct tc_cache *c, struct tc_wb_req *req, u32 i,
			     bool written)
{
	struct tc_wb_blk *blk = &req->blks[i];

	if (!written) {
		tc_wb_untake(c, blk->slot, blk->owed);
		return;
	}
	/*
	 * Taken during the running full flush, the version written pays what
	 * the flush owed, the block's newest when the request took it.  A
	 * request taken before the flush began may have written an older one.
	 */
	if (test_bit(TC_FL_FULL, &c->fl.bits) &&
	    req->full_gen == READ_ONCE(c->fl.full_gen))
		tc_wb_pay(c, blk->slot, req->full_gen);
	if (blk->held) {
		/* an older version, locked since it was taken */
		tc_wb_written(c, blk->slot);
		return;
	}
	if (tc_trylock(&c->locks, &blk->h, req->first + i, TC_LK_WB)) {
		tc_wb_written(c, blk->slot);
		tc_unlock(&c->locks, &blk->h);
		return;
	}
	tc_wb_let_go(c, blk->slot);
	/* still dirty: a full flush comes back if it still owes the block */
	tc_wb_skipped(c, req->first + i);
}

static void tc_wb_release(struct tc_cache *c, struct tc_wb_req *req,
			  bool written)
{
	struct tc_flush *fl = &c->fl;
	u32 i;

	/* older versions under the lock they kept, then the others */
	for (i = 0; i < req->nr; i++) {
		struct tc_wb_blk *blk = &req->blks[i];

		if (!blk->dirty || !blk->keep || WARN_ON_ONCE(!blk->held))
			continue;
		tc_wb_finish_blk(c, req, i, written);
		tc_unlock(&c->locks, &blk->h);
		blk->held = false;
	}
	tc_wb_unlock(c, req, true);
	tc_wb_unlock(c, req, false);
	for (i = 0; i < req->nr; i++)
		if (req->blks[i].dirty && !req->blks[i].keep)
			tc_wb_finish_blk(c, req, i, written);
	if (wq_has_sleeper(&c->locks.wait))
		wake_up(&c->locks.wait);
	tc_wake_wb_waiters(c);
	tc_wb_free(req);
	if (atomic_dec_and_test(&fl->outstanding)) {
		wake_up_all(&fl->wait);
		if (test_bit(TC_FL_PASS_END, &fl->bits))
			queue_work(c->wq, &fl->work);
	}
}

static void tc_wb_flushed(struct tc_oflush_req *req, blk_status_t status)
{
	struct tc_wb_req *lead = container_of(req, struct tc_wb_req, oflush);
	struct tc_cache *c = lead->c;
	unsigned long flags;

	lead->flush_status = status;
	/*
	 * Queued under the lock: a done_work already running cannot take the
	 * batch, release the last request and let tc_flush_stop() and the
	 * teardown go on before this queue_work().
	 */
	spin_lock_irqsave(&c->fl.lock, flags);
	list_add_tail(&lead->list, &c->fl.flushed);
	queue_work(c->wq, &c->fl.done_work);
	spin_unlock_irqrestore(&c->fl.lock, flags);
}

/*
 * The requests written so far become durable with one origin flush.  The
 * first of them leads the batch (no allocation here: this runs on the
 * reclaim path).
 */
static void tc_wb_send_flush(struct tc_cache *c)
{
	struct tc_flush *fl = &c->fl;
	struct tc_wb_req *lead;

	lead = list_first_entry(&fl->done, struct tc_wb_req, list);
	list_del(&lead->list);
	list_splice_init(&fl->done, &lead->batch);
	fl->nr_done = 0;
	lead->oflush.done = tc_wb_flushed;
	tc_oflush(c, &lead->oflush);
}

static void tc_wb_batch_done(struct tc_cache *c, struct tc_wb_req *lead)
{
	blk_status_t status = lead->flush_status;
	struct tc_wb_req *req, *tmp;

	if (status)
		tc_flush_latch(c, blk_status_to_errno(status));
	list_for_each_entry_safe(req, tmp, &lead->batch, list) {
		list_del(&req->list);
		tc_wb_release(c, req, !status);
	}
	tc_wb_release(c, lead, !status);
	/* record the clean blocks, so that their slots can be reused */
	tc_meta_kick(c);
}

/*
 * Written requests wait in done for one origin flush: send it when nothing
 * else is in flight, or when flush_depth of them wait.  Called whenever a
 * request leaves the flight, written or not: a request that fails at its
 * read stage must not leave the written ones waiting for ever.
 */
static void tc_wb_maybe_flush(struct tc_cache *c)
{
	struct tc_flush *fl = &c->fl;

	if (fl->nr_done &&
	    (!atomic_read(&fl->inflight) ||
	     fl->nr_done >= READ_ONCE(c->val[TC_KEY_FLUSH_DEPTH])))
		tc_wb_send_flush(c);
}

static void tc_wb_write_done(struct tc_cache *c, struct tc_wb_req *req)
{
	struct tc_flush *fl = &c->fl;

	tc_buf_free(&fl->pool, &req->buf);
	atomic_dec(&fl->inflight);
	/* the filler is on the origin: writes around the cache may go on */
	tc_wb_unlock(c, req, false);
	if (req->status) {
		tc_flush_latch(c, blk_status_to_errno(req->status));
		tc_wb_release(c, req, false);
	} else {
		list_add_tail(&req->list, &fl->done);
		fl->nr_done++;
	}
	tc_wb_maybe_flush(c);
	queue_work(c->wq, &fl->work);
}

static void tc_wb_stage_done(struct tc_cache *c, struct tc_wb_req *req)
{
	if (req->stage == TC_WB_WRITE) {
		tc_wb_write_done(c, req);
		return;
	}
	if (!req->status && req->stage == TC_WB_SPAN) {
		/* the cached blocks are read even if the span failed */
		tc_wb_read(c, req, true);
		return;
	}
	if (!req->status && req->hole_status) {
		tc_wb_write_runs(c, req);
		return;
	}
	if (!req->status) {
		tc_wb_write(c, req);
		return;
	}
	/* a read failed: nothing was written, the blocks stay dirty */
	atomic_dec(&c->fl.inflight);
	if (req->nomem) {
		c->fl.pass_skipped = true;	/* tried again, later */
	} else {
		tc_flush_latch(c, blk_status_to_errno(req->status));
		tc_cache_fail(c, blk_status_to_errno(req->status),
			      "writeback read of a dirty block");
	}
	tc_wb_release(c, req, false);
	tc_wb_maybe_flush(c);
	queue_work(c->wq, &c->fl.work);
}

static void tc_wb_done_work(struct work_struct *w)
{
	struct tc_cache *c = container_of(w, struct tc_cache, fl.done_work);
	struct tc_flush *fl = &c->fl;
	struct tc_wb_req *req, *rtmp, *lead, *ltmp;
	LIST_HEAD(reqs);
	LIST_HEAD(batches);

	spin_lock_irq(&fl->lock);
	list_splice_init(&fl->completed, &reqs);
	list_splice_init(&fl->flushed, &batches);
	spin_unlock_irq(&fl->lock);

	list_for_each_entry_safe(req, rtmp, &reqs, list) {
		list_del(&req->list);
		tc_wb_stage_done(c, req);
		cond_resched();
	}
	list_for_each_entry_safe(lead, ltmp, &batches, list) {
		list_del(&lead->list);
		tc_wb_batch_done(c, lead);
		cond_resched();
	}
}

/* ---- the engine ---- */

/*
 * Keep buffer chunks for a few requests ready (fewer when less is dirty),
 * allocated beside the engine rather than in its path.
 */
static void tc_wb_pool_start(struct tc_cache *c)
{
	size_t chunk = PAGE_SIZE << TC_BUF_MAX_ORDER;
	size_t req_bytes = (size_t)READ_ONCE(c->val[TC_KEY_MAX_FLUSH_KB]) << 10;
	size_t dirty = (size_t)tc_nr_dirty(c) * tc_block_bytes(c);
	size_t ahead = min3(TC_WB_POOL_REQS * req_bytes, dirty,
			    (size_t)TC_WB_POOL_MAX);

	tc_pool_start(&c->fl.pool, c->wq, DIV_ROUND_UP(ahead, chunk));
}

static void tc_wb_start(struct tc_cache *c, struct tc_wb_req *req)
{
	struct tc_flush *fl = &c->fl;
	int n;
	u32 i;

	for (i = 0; i < req->nr; i++)
		req->nr_dirty += req->blks[i].dirty;
	atomic_inc(&fl->outstanding);
	n = atomic_inc_return(&fl->inflight);
	if (n > atomic_read(&c->stats.inflight_max))
		atomic_set(&c->stats.inflight_max, n);
	fl->pass_issued = true;
	tc_wb_begin_read(c, req);
}

/* An error: background writeback rests, then tries again. */
static void tc_wb_pause(struct tc_cache *c)
{
	struct tc_flush *fl = &c->fl;
	unsigned int ms = fl->backoff_ms ?: TC_WB_BACKOFF_MIN_MS;

	set_bit(TC_FL_PAUSED, &fl->bits);
	fl->backoff_ms = min(ms * 2, (unsigned int)TC_WB_BACKOFF_MAX_MS);
	mod_delayed_work(c->wq, &fl->retry_work, msecs_to_jiffies(ms));
}

static void tc_wb_retry_work(struct work_struct *w)
{
	struct tc_flush *fl = container_of(to_delayed_work(w), struct tc_flush,
					   retry_work);
	struct tc_cache *c = container_of(fl, struct tc_cache, fl);

	clear_bit(TC_FL_PAUSED, &fl->bits);
	tc_flush_kick(c);
}

/*
 * The dirty slots written since the last merge join the ordered walk.  The
 * engine may run on the reclaim path: its allocations do no I/O and give
 * up rather than wait (the slots then wait for the next merge).  Writes
 * parked for room in the tail try again, merged or not (each waits for
 * at most TC_ORDER_WAITS merges).  If an allocation found no slot while
 * cleaned slots waited for this merge (CLOCK cannot take them before), the
 * writes parked for a slot try again too; only then, or a write parked
 * while writeback waits out a back-off would go round for every merge.
 */
static int tc_wb_merge(struct tc_cache *c)
{
	unsigned int noio = memalloc_noio_save();
	bool fed;
	int r = tc_index_merge(c, GFP_KERNEL | __GFP_NORETRY | __GFP_NOWARN,
			       &fed);

	memalloc_noio_restore(noio);
	/*
	 * A merge that failed (no memory to grow the order) leaves slots out
	 * of the walk: the pass still writes back what the walk sees, but the
	 * next one waits a while instead of starting at once
	 * (tc_wb_pass_over()).  Were the slots left out all that is left of
	 * the oldest epoch, each pass would find nothing, the epoch would not
	 * retire, and passes would follow each other for as long as memory
	 * stays short: a spin, perhaps on the rescuer the workqueue's other
	 * items need.  The engine's own: a plain flag would do, but it lives
	 * with the others.
	 */
	if (r)
		set_bit(TC_FL_MERGE_NOMEM, &c->fl.bits);
	else
		clear_bit(TC_FL_MERGE_NOMEM, &c->fl.bits);
	tc_wake_order_waiters(c);
	if (fed)
		tc_wake_wb_waiters(c);
	return r;
}

/*
 * A full flush begins, after a merge that took every slot dirtied before:
 * it owes the origin each of them.
 */
static void tc_wb_begin_full(struct tc_cache *c)
{
	struct tc_flush *fl = &c->fl;

	WRITE_ONCE(fl->full_gen, fl->full_gen + 1);
	smp_mb__before_atomic();	/* the generation, then the flag */
	set_bit(TC_FL_FULL, &fl->bits);
	/*
	 * The request goes only once the flush is seen running (a waiter
	 * never sees neither); one asked for from now on starts another.
	 */
	smp_mb__before_atomic();
	clear_bit(TC_FL_FULL_REQ, &fl->bits);
	/* the generation before any OWED: see tc_wb_pay() */
	smp_mb__after_atomic();
	tc_index_owe_dirty(c);
	/* what is dirty now is in this epoch or an older one */
	fl->full_epoch = tc_epoch_cur(&c->ix.ep);
	clear_bit(TC_FL_PAUSED, &fl->bits);
	fl->error = 0;
	fl->cursor = 0;
	fl->pass_skipped = false;
	fl->pass_error = 0;
	fl->pass_issued = false;
}

static void tc_wb_end_full(struct tc_cache *c, bool ok)
{
	struct tc_flush *fl = &c->fl;

	if (!READ_ONCE(c->cleaner))
		tc_wb_drop_resv(c);
	if (ok)
		fl->flushes++;
	clear_bit(TC_FL_FULL, &fl->bits);
	wake_up_all(&fl->wait);
	tc_flush_event(c);
}

/*
 * The cursor reached the end: wait for the pass's requests to be clean,
 * then decide whether another pass is wanted.
 */
enum tc_pass_next {
	TC_PASS_IDLE,		/* nothing more is wanted */
	TC_PASS_AGAIN,		/* another pass, now */
	TC_PASS_LATER,		/* another pass once busy blocks moved on */
};

/*
 * The pass's epoch is on the origin if no dirty version of it is left:
 * retire it, and every empty one after it, and wake what waited for that.
 */
static void tc_wb_retire(struct tc_cache *c)
{
	bool any = false;

	while (tc_epoch_retire(&c->ix.ep))
		any = true;
	/* nothing older left: no waiter can still be waiting for one */
	if (test_bit(TC_FL_EPOCH_WAIT, &c->fl.bits) && !tc_origin_behind(c))
		any = true;
	if (!any)
		return;
	clear_bit(TC_FL_EPOCH_WAIT, &c->fl.bits);
	tc_epoch_waiters_go(c);
}

/*
 * Before epoch e goes to the origin, a commit must have recorded every
 * version of the epochs before e clean or gone: after a crash the load
 * writes back what the disk still says is dirty, in epoch order, over
 * whatever the origin has by then.  An older version still recorded dirty
 * would be written over a version of e whose own dirty record a later
 * commit (or a torn one) may already have replaced by a clean or empty
 * entry: the newer data would be lost.  False if the pass must wait for
 * that commit (asked for here).
 */
static bool tc_wb_floor_ok(struct tc_cache *c)
{
	u64 ep = c->fl.pass_epoch;

	/*
	 * Once a commit failed, no commit moves the floor, and the superblock
	 * is marked failed: the device is never loaded again, and writeback
	 * goes on without the rule.  A failed cache whose commits succeed may
	 * be loaded again after a crash: the rule holds for it.
	 */
	if (ep <= READ_ONCE(c->ix.ep.floor) || READ_ONCE(c->meta.error))
		return true;
	set_bit(TC_FL_FLOOR_WAIT, &c->fl.bits);
	/* asked, then the floor read again: pairs with tc_meta_commit() */
	smp_mb__after_atomic();
	if (ep <= READ_ONCE(c->ix.ep.floor)) {
		clear_bit(TC_FL_FLOOR_WAIT, &c->fl.bits);
		return true;
	}
	tc_meta_commit_floor(c);
	return false;
}

static enum tc_pass_next tc_wb_end_pass(struct tc_cache *c)
{
	struct tc_flush *fl = &c->fl;
	bool skipped, issued, more;
	int err;

	skipped = fl->pass_skipped;
	issued = fl->pass_issued;
	err = fl->pass_error;
	fl->cursor = 0;
	fl->pass_skipped = false;
	fl->pass_issued = false;
	fl->pass_error = 0;

	if (!err) {
		tc_wb_retire(c);
	} else {
		/*
		 * Paused before the waiters fail: a write that must wait for
		 * writeback on a failed cache then fails at once
		 * (tc_write_failed()) rather than wait out the back-off.
		 */
		tc_wb_pause(c);
		if (test_and_clear_bit(TC_FL_EPOCH_WAIT, &fl->bits))
			tc_epoch_waiters_fail(c, err);
	}
	/* an older epoch than the full flush's still to write back */
	more = test_bit(TC_FL_FULL, &fl->bits) && !err && !skipped &&
	       fl->pass_epoch < fl->full_epoch;
	if (test_bit(TC_FL_FULL, &fl->bits)) {
		if (err || (!skipped && !more))
			tc_wb_end_full(c, !err);
	} else if (!err && issued) {
		fl->backoff_ms = 0;
	}
	if (test_bit(TC_FL_BACKGROUND, &fl->bits) &&
	    (u64)tc_nr_dirty(c) * 100 <=
	    (u64)READ_ONCE(c->val[TC_KEY_LOW_WATERMARK]) * c->nr_slots)
		clear_bit(TC_FL_BACKGROUND, &fl->bits);
	if (!tc_wb_wanted(c))
		return TC_PASS_IDLE;
	/* the next epoch's pass */
	if (!skipped && tc_epoch_oldest(&c->ix.ep) != fl->pass_epoch)
		return TC_PASS_AGAIN;
	/* an epoch not retired though nothing was skipped: not at once */
	if (more && !issued)
		return TC_PASS_LATER;
	/* everything left was busy: its holders may need this workqueue */
	if (skipped && !issued)
		return TC_PASS_LATER;
	return TC_PASS_AGAIN;
}

/*
 * Run the engine again after @delay jiffies, from a timer: the engine
 * never sleeps or spins in its work item, which may be the workqueue's
 * rescuer, needed by the bios that hold the blocks it waits for.
 */
static void tc_wb_later(struct tc_cache *c, unsigned long delay)
{
	mod_delayed_work(c->wq, &c->fl.later_work, delay);
}

static void tc_wb_later_work(struct work_struct *w)
{
	struct tc_flush *fl = container_of(to_delayed_work(w), struct tc_flush,
					   later_work);

	tc_flush_kick(container_of(fl, struct tc_cache, fl));
}

/*
 * The walk found nothing more: the pass is over once its requests are
 * released (the last release requeues the engine: TC_PASS_LATER, as when
 * the next pass is to start later, from a timer).  After a pass whose
 * merge found no memory, the next one waits (tc_wb_merge()).
 */
static enum tc_pass_next tc_wb_pass_over(struct tc_cache *c)
{
	struct tc_flush *fl = &c->fl;
	enum tc_pass_next next;
	bool nomem;

	set_bit(TC_FL_PASS_END, &fl->bits);
	smp_mb__after_atomic();		/* pairs with tc_wb_release() */
	if (atomic_read(&fl->outstanding))
		return TC_PASS_LATER;
	clear_bit(TC_FL_PASS_END, &fl->bits);
	next = tc_wb_end_pass(c);
	nomem = test_and_clear_bit(TC_FL_MERGE_NOMEM, &fl->bits);
	if (next == TC_PASS_IDLE)
		return next;
	if (nomem)
		tc_wb_later(c, TC_WB_NOMEM_DELAY);
	else if (next == TC_PASS_LATER)
		tc_wb_later(c, 1);
	return nomem ? TC_PASS_LATER : next;
}

static void tc_flush_work(struct work_struct *w)
{
	struct tc_cache *c = container_of(w, struct tc_cache, fl.work);
	struct tc_flush *fl = &c->fl;
	enum tc_pass_next next;
	bool pool = false;
	struct tc_wb_req *req;

	for (;;) {
		if (test_bit(TC_FL_STOPPED, &fl->bits))
			return;		/* tc_flush_stop() empties the pool */
		if (test_bit(TC_FL_FULL_REQ, &fl->bits)) {
			/* a full flush must see every dirty slot */
			if (tc_wb_merge(c)) {
				tc_wb_later(c, TC_WB_NOMEM_DELAY);
				return;
			}
			tc_wb_begin_full(c);
		}
		if (!tc_wb_wanted(c))
			break;
		/* a pass starts, or writers filled the tail */
		if (!fl->cursor || tc_index_want_merge(c))
			tc_wb_merge(c);
		if (atomic_read(&fl->inflight) >=
		    READ_ONCE(c->val[TC_KEY_FLUSH_DEPTH]))
			return;		/* a write completion requeues us */
		/* a pass writes back one epoch, the oldest */
		if (!fl->cursor) {
			fl->pass_epoch = tc_epoch_oldest(&c->ix.ep);
			if (!tc_wb_floor_ok(c))
				return;	/* the commit kicks the engine */
		}
		req = tc_wb_gather_reserved(c);
		if (!req)
			req = tc_wb_gather(c, &fl->cursor);
		if (req == ERR_PTR(-ENOMEM)) {
			tc_wb_later(c, TC_WB_NOMEM_DELAY);
			return;
		}
		if (IS_ERR(req)) {
			cond_resched();
			continue;
		}
		if (!req) {
			next = tc_wb_pass_over(c);
			if (next == TC_PASS_IDLE)
				break;
			if (next != TC_PASS_AGAIN)
				return;
			cond_resched();
			continue;
		}
		if (!pool) {
			tc_wb_pool_start(c);
			pool = true;
		}
		tc_wb_start(c, req);
		cond_resched();
	}
	/* writeback is idle: slots cleaned by it can be reclaimed now */
	tc_wb_merge(c);
	/* its buffers go back to the system */
	tc_wb_drop_resv(c);
	tc_pool_stop(&fl->pool);
}

/* ---- control ---- */

void tc_flush_init(struct tc_cache *c)
{
	struct tc_flush *fl = &c->fl;

	INIT_WORK(&fl->work, tc_flush_work);
	INIT_WORK(&fl->done_work, tc_wb_done_work);
	spin_lock_init(&fl->lock);
	INIT_LIST_HEAD(&fl->completed);
	INIT_LIST_HEAD(&fl->flushed);
	INIT_LIST_HEAD(&fl->done);
	atomic_set(&fl->inflight, 0);
	atomic_set(&fl->outstanding, 0);
	init_waitqueue_head(&fl->wait);
	tc_pool_init(&fl->pool);
	INIT_DELAYED_WORK(&fl->retry_work, tc_wb_retry_work);
	INIT_DELAYED_WORK(&fl->later_work, tc_wb_later_work);
	INIT_HLIST_NODE(&fl->resv.node);
	fl->bits = BIT(TC_FL_STOPPED);
}

void tc_flush_exit(struct tc_cache *c)
{
	kvfree(c->fl.scratch);
	c->fl.scratch = NULL;
	c->fl.scratch_blocks = 0;
}

void tc_flush_kick(struct tc_cache *c)
{
	queue_work(c->wq, &c->fl.work);
}

/* A full flush: returns at once; its end raises a dm event. */
void tc_flush_start_full(struct tc_cache *c)
{
	set_bit(TC_FL_FULL_REQ, &c->fl.bits);
	tc_flush_kick(c);
}

/* Called after a write dirtied a block: start writeback at high_watermark. */
void tc_flush_check_watermark(struct tc_cache *c)
{
	struct tc_flush *fl = &c->fl;

	if (test_bit(TC_FL_BACKGROUND, &fl->bits))
		return;
	if ((u64)tc_nr_dirty(c) * 100 <
	    (u64)READ_ONCE(c->val[TC_KEY_HIGH_WATERMARK]) * c->nr_slots)
		return;
	if (!test_and_set_bit(TC_FL_BACKGROUND, &fl->bits))
		tc_flush_kick(c);
}

/* Quiesce: issue nothing more and wait for every request to be released. */
void tc_flush_stop(struct tc_cache *c)
{
	struct tc_flush *fl = &c->fl;

	set_bit(TC_FL_STOPPED, &fl->bits);
	cancel_work_sync(&fl->work);
	wait_event_idle(fl->wait, !atomic_read(&fl->outstanding));
	flush_work(&fl->done_work);
	cancel_work_sync(&fl->work);	/* queued by the last release */
	/* the engine is not running: nothing re-arms its timer */
	cancel_delayed_work_sync(&fl->later_work);
	/* only the engine pauses: after it, the retry timer stays off */
	cancel_delayed_work_sync(&fl->retry_work);
	clear_bit(TC_FL_PASS_END, &fl->bits);
	tc_wb_drop_resv(c);
	tc_pool_stop(&fl->pool);
}

void tc_flush_resume(struct tc_cache *c)
{
	struct tc_flush *fl = &c->fl;

	if (READ_ONCE(c->read_only)) {
		/* writes nothing back: a flush asked for or begun ends here */
		if (test_bit(TC_FL_FULL_REQ, &fl->bits) ||
		    test_bit(TC_FL_FULL, &fl->bits)) {
			WRITE_ONCE(fl->error, -EROFS);
			smp_mb__before_atomic();	/* the error, then the end */
			clear_bit(TC_FL_FULL_REQ, &fl->bits);
			clear_bit(TC_FL_FULL, &fl->bits);
			wake_up_all(&fl->wait);
			tc_flush_event(c);
		}
		return;
	}
	clear_bit(TC_FL_STOPPED, &fl->bits);
	if (test_bit(TC_FL_PAUSED, &fl->bits))
		mod_delayed_work(c->wq, &fl->retry_work, 0);
	tc_flush_kick(c);
}

/*
 * Write every dirty block back while the device is suspended (a resume
 * that needs a clean cache): the engine runs for this flush only.
 * Returns 0 once nothing is dirty, else the error that stopped it.
 */
int tc_flush_drain(struct tc_cache *c)
{
	int r = 0;

	if (tc_nr_dirty(c)) {
		clear_bit(TC_FL_STOPPED, &c->fl.bits);
		r = tc_flush_sync(c);
		tc_flush_stop(c);
		if (!r && tc_nr_dirty(c))
			r = -EBUSY;
	}
	/* the clean marks on disk before the cache is left or bypassed */
	if (!r)
		r = tc_meta_commit(c);
	return r;
}

/* A full flush, waited for.  Returns 0 or the error that ended it. */
int tc_flush_sync(struct tc_cache *c)
{
	struct tc_flush *fl = &c->fl;

	tc_flush_start_full(c);
	wait_event_idle(fl->wait, !tc_full_pending(fl));
	return fl->error;
}
