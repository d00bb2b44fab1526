// SPDX-License-Identifier: GPL-2.0
/*
 * dm-tiercache: bio dispatch.
 *
 * A bio that spans blocks is trimmed to its first block in tc_map()
 * (device-mapper sends the rest on as a new bio), so a read or write
 * touches one block, except a run: blocks in consecutive slots, which go
 * to the cache device whole (tc_run.c), and blocks that are not cached,
 * which go to the origin, or into fresh slots, whole (tc_miss.c).
 * A bio takes its block's lock, then the read or write helper decides
 * where it goes and returns an action the dispatcher carries out.  Bios
 * that need more than a remap (writes to both devices, promotions)
 * continue in process context in tc_io_work(), still holding the lock;
 * the lock is dropped in tc_end_io().
 *
 * When the cache device fails a bio that has a good copy elsewhere (a read
 * of a clean block, a write to a fresh or clean slot), tc_end_io() takes
 * it back (DM_ENDIO_INCOMPLETE) and tc_io_work() sends it, as it was
 * mapped, to the origin; the slot is dropped first.  The bio completes
 * once, when the origin is done with it.
 *
 * Once the cache device has failed (tc_cache_fail()), nothing new goes to
 * it: only dirty blocks are read from it (their only copy), writes go to
 * the origin and drop the cached copy.
 */
#include "tiercache.h"

enum tc_action {
	TC_TO_CACHE,
	TC_TO_ORIGIN,
	TC_CONTINUE,		/* stage set: finish in tc_io_work() */
	TC_WAIT_WB,		/* wait for the slot's writeback request */
	TC_WAIT_EPOCH,		/* wait for writeback of an older epoch */
	TC_WAIT_OPEN,		/* wait for room for a new epoch */
	TC_WAIT_SLOT,		/* wait for writeback to free a slot */
	TC_WAIT_ORDER,		/* wait for a merge of the dirty order's tail */
	TC_FAIL,		/* fail with an I/O error */
};

/* merges a write may wait for when the dirty order's tail is full */
#define TC_ORDER_WAITS	4

static bool tc_whole_block(struct tc_cache *c, struct bio *bio)
{
	return !(bio->bi_iter.bi_sector & (c->block_sectors - 1)) &&
	       bio_sectors(bio) == c->block_sectors;
}

static sector_t tc_cache_sector(struct tc_cache *c, u32 slot, sector_t sector)
{
	return tc_slot_sector(c, slot) + (sector & (c->block_sectors - 1));
}

/*
 * What the cache device may change in a bio it completes, which
 * tc_cache_failed() may take back and send again (see tc_bio).
 */
static void tc_bio_record(struct tc_bio *pb, struct bio *bio)
{
	pb->end_io = bio->bi_end_io;
	pb->bi_flags = bio->bi_flags;
	pb->remaining = atomic_read(&bio->__bi_remaining);
}

/* @bio goes to @pb's slot as it is: the cache device may fail it. */
void tc_remap_cache(struct tc_cache *c, struct bio *bio, struct tc_bio *pb)
{
	pb->to_cache = true;
	tc_bio_record(pb, bio);
	bio_set_dev(bio, c->cache_bdev);
	bio->bi_iter.bi_sector = tc_cache_sector(c, pb->slot,
						 bio->bi_iter.bi_sector);
}

void tc_queue_io(struct tc_cache *c, struct bio *bio)
{
	unsigned long flags;

	spin_lock_irqsave(&c->defer_lock, flags);
	bio_list_add(&c->deferred, bio);
	spin_unlock_irqrestore(&c->defer_lock, flags);
	queue_work(c->wq, &c->io_work);
}

/* Lock-table callback: bios granted their block, or to try again. */
void tc_requeue(void *ctx, struct bio_list *bios)
{
	struct tc_cache *c = ctx;
	unsigned long flags;

	spin_lock_irqsave(&c->defer_lock, flags);
	bio_list_merge(&c->deferred, bios);
	spin_unlock_irqrestore(&c->defer_lock, flags);
	queue_work(c->wq, &c->io_work);
}

/* Lock-table callback: the lock holder of a parked bio. */
struct tc_holder *tc_holder_of(struct bio *bio)
{
	struct tc_bio *pb = dm_per_bio_data(bio, sizeof(struct tc_bio));

	return &pb->holder;
}

static enum tc_action tc_read(struct tc_cache *c, struct bio *bio,
			      struct tc_bio *pb, u64 block)
{
	u32 slot;

	if (c->mode == TC_MODE_PASSTHROUGH) {
		tc_count(c, TC_S_READ_MISS);
		return TC_TO_ORIGIN;
	}
	slot = tc_lookup(c, block);
	/* a failed cache serves only what the origin does not hold */
	if (slot != TC_SLOT_NONE &&
	    (!tc_failed(c) || tc_slot_dirty(c, slot))) {
		tc_count(c, TC_S_READ_HIT);
		tc_touch(c, slot);
		pb->slot = slot;
		return TC_TO_CACHE;
	}
	tc_count(c, TC_S_READ_MISS);
	/* promotion fills a slot: only under an exclusive lock */
	if (pb->holder.mode == TC_LK_EXCL && !READ_ONCE(c->read_only) &&
	    !tc_failed(c) && tc_whole_block(c, bio) &&
	    !tc_alloc_slot(c, block, &pb->slot)) {
		pb->stage = TC_ST_PROMOTE;
		return TC_CONTINUE;
	}
	return TC_TO_ORIGIN;
}

bool tc_writes_dirty(struct tc_cache *c)
{
	return c->mode == TC_MODE_WRITEBACK && !READ_ONCE(c->cleaner) &&
	       !atomic_read(&c->no_dirty) && !tc_failed(c);
}

/*
 * A full-block write miss in writeback mode: give it a fresh dirty slot.
 * -EAGAIN: the dirty order's tail is full (nothing changed for the write);
 * -ENOSPC: no slot.
 */
static int tc_write_allocate(struct tc_cache *c, struct tc_bio *pb, u64 block)
{
	if (tc_alloc_slot(c, block, &pb->slot))
		return -ENOSPC;
	if (tc_insert(c, pb->slot, block, true)) {
		tc_free_slot(c, pb->slot);
		return -EAGAIN;
	}
	/* on disk only once the slot holds the data: see tc_end_io() */
	pb->meta_new = true;
	return 0;
}

/*
 * Writers filled the dirty order's tail before the engine merged it: a
 * write that would make a block dirty waits for a merge (the engine was
 * kicked) rather than go to the origin as a small random write, which is
 * what the cache is there to avoid.  New writes may fill the tail again
 * before a parked one comes back, so it may wait again, a few times at
 * most: merges that fail (no memory) must not hold it for ever.  After
 * that it goes on as before, through to the origin or around the cache.
 */
static bool tc_order_wait(struct tc_bio *pb)
{
	if (pb->order_waits >= TC_ORDER_WAITS)
		return false;
	pb->order_waits++;
	return true;
}

/* A write for the cache: a FUA one completes after a metadata commit. */
static enum tc_action tc_write_cache(struct tc_cache *c, struct bio *bio,
				     struct tc_bio *pb)
{
	tc_flush_check_watermark(c);
	if (bio->bi_opf & REQ_FUA) {
		pb->stage = TC_ST_FUA;
		return TC_CONTINUE;
	}
	return TC_TO_CACHE;
}

/*
 * A write hit while writes do not make blocks dirty (writethrough, cleaner,
 * or no room in the dirty order): it goes to the cache and the origin.  A
 * dirty block stays dirty and is marked rewritten, so a writeback request
 * that read its older data cannot mark it clean; if that request is still
 * writing, the new data goes to the cache only (two writes of one block in
 * flight to the origin may land in any order) and writeback carries it
 * later.
 */
static enum tc_action tc_write_through(struct tc_cache *c, struct bio *bio,
				       struct tc_bio *pb, u32 slot)
{
	/* a dirty slot is in the dirty order: marking it cannot fail */
	if (tc_slot_dirty(c, slot) && !tc_mark_dirty(c, slot) &&
	    tc_slot_in_wb(c, slot))
		return tc_write_cache(c, bio, pb);
	pb->stage = TC_ST_BOTH;
	return TC_CONTINUE;
}

/*
 * Epochs older than the open one are not all on the origin: a write must
 * not reach the origin before them (it would leave the origin in a state
 * no power cut could).
 */
static bool tc_older_epochs(struct tc_cache *c)
{
	return tc_epoch_oldest(&c->ix.ep) != tc_epoch_cur(&c->ix.ep);
}

/*
 * May a write mapped in epoch @epoch not reach the origin around the cache
 * yet?  While an epoch before @epoch is not all on the origin.  A write
 * belongs to its epoch or to any later one (it was not acknowledged when
 * the flushes after it came): it need not wait for epochs opened since,
 * which a steady stream of flushes would keep ahead of it for ever.  On a
 * failed cache under the ordered policy, also while the cache holds any
 * dirty version (see tc_origin_behind()).
 */
bool tc_around_waits(struct tc_cache *c, u64 epoch)
{
	if (tc_failed(c) && READ_ONCE(c->val[TC_KEY_ORDERED]) && tc_nr_dirty(c))
		return true;
	/* at most the open one: a failed cache opens none (TC_EPOCH_NEXT) */
	return tc_epoch_oldest(&c->ix.ep) <
	       min(epoch, tc_epoch_cur(&c->ix.ep));
}

/*
 * May a write not reach the origin around the cache yet?  While epochs
 * older than the open one are live; and on a failed cache under the
 * ordered policy, while it holds any dirty version: a failed cache opens
 * no epoch at a flush, so every dirty version may be older than the write
 * (acknowledged before a flush that came before it).  Such a write waits
 * for writeback, and fails with it if the cache can no longer be read:
 * the origin stays a state a power cut could have left.
 */
bool tc_origin_behind(struct tc_cache *c)
{
	if (tc_failed(c) && READ_ONCE(c->val[TC_KEY_ORDERED]))
		return tc_nr_dirty(c) || tc_older_epochs(c);
	return tc_older_epochs(c);
}

/*
 * The cache device failed: writes go to the origin, and the cached copy is
 * dropped.  A dirty copy is dropped only once the origin holds the whole
 * block durably (a commit could record the drop at once): the write goes
 * with REQ_FUA, and a write that covers part of the block first reads the
 * rest from its slot (tc_rmw_read()), failing if the slot cannot be read.
 * And only once no writeback request of it is still writing (its older
 * copy must not land on the origin after this write).  As in the good state, the
 * write is durable only once a commit has recorded the dropped entry
 * (tc_around_needs_commit(), tc_map_flush()): until the cache device
 * takes commits again, FUA writes and flushes after such a drop fail.
 */
static enum tc_action tc_write_failed(struct tc_cache *c, struct bio *bio,
				      struct tc_bio *pb, u64 block)
{
	u32 slot = tc_lookup(c, block);

	if (!pb->again) {
		tc_count(c, slot != TC_SLOT_NONE ? TC_S_WRITE_HIT :
						   TC_S_WRITE_MISS);
		tc_count(c, TC_S_WRITE_BYPASS);
	}
	if (tc_around_waits(c, pb->epoch)) {
		/*
		 * Writeback failed and waits out its back-off: the write would
		 * wait for it only to fail (after each of a file system's
		 * writes, for seconds).  It fails now.
		 */
		if (test_bit(TC_FL_PAUSED, &c->fl.bits)) {
			DMERR_LIMIT("%s: writeback failed: a write that must wait for it fails",
				    c->name);
			return TC_FAIL;
		}
		return TC_WAIT_EPOCH;
	}
	if (slot == TC_SLOT_NONE)
		return TC_TO_ORIGIN;
	/* no version of the block may still be on its way to the origin */
	pb->slot = tc_chain_in_wb(c, block);
	if (pb->slot != TC_SLOT_NONE)
		return TC_WAIT_WB;
	pb->slot = slot;
	if (tc_slot_dirty(c, slot)) {
		pb->stage = tc_whole_block(c, bio) ? TC_ST_DROP_WRITE :
						     TC_ST_RMW;
		return TC_CONTINUE;
	}
	tc_remove_chain(c, block);
	return TC_TO_ORIGIN;
}

/*
 * Note how many times slots were let go before @pb looks for one: parked
 * for a slot, it goes round again if any were let go since
 * (tc_still_waits()).  The count read, then the slots: pairs with
 * tc_wake_wb_waiters(), which lets go of slots before it counts.
 */
static void tc_slot_wakes_mark(struct tc_cache *c, struct tc_bio *pb)
{
	pb->slot_wakes = atomic_read_acquire(&c->slot_wakes);
}

/*
 * A write to a block whose newest version, @old, is dirty in an older
 * epoch: that version stays as it is for its epoch's writeback, and the
 * write goes to a new slot, the block's newest version from now on.  A
 * write covering part of the block first copies the rest from @old
 * (TC_ST_COW_READ).  No slot now: the write waits for writeback.
 */
static enum tc_action tc_write_cow(struct tc_cache *c, struct bio *bio,
				   struct tc_bio *pb, u64 block, u32 old)
{
	u32 slot;

	tc_slot_wakes_mark(c, pb);
	/*
	 * The dirty order's tail is full: a merge makes room.  It cannot go
	 * around the cache, so after a few merges it waits for writeback
	 * like a write that found no slot.  Checked before a slot is taken,
	 * which may evict a clean block (the tail may still fill between
	 * the two: tc_insert() then refuses the slot).
	 */
	if (tc_index_tail_full(c))
		return tc_order_wait(pb) ? TC_WAIT_ORDER : TC_WAIT_SLOT;
	if (tc_alloc_slot(c, block, &slot))
		return TC_WAIT_SLOT;
	if (tc_insert(c, slot, block, true)) {
		tc_free_slot(c, slot);
		return tc_order_wait(pb) ? TC_WAIT_ORDER : TC_WAIT_SLOT;
	}
	pb->slot = slot;
	pb->cow_from = old;
	/* on disk once the new slot holds the data: see tc_end_io() */
	pb->meta_new = true;
	if (tc_whole_block(c, bio))
		return tc_write_cache(c, bio, pb);
	tc_flush_check_watermark(c);
	pb->stage = TC_ST_COW_READ;
	return TC_CONTINUE;
}

/*
 * A clean copy whose entry on disk may still say "dirty" in an older
 * epoch than the open one (written back since the last commit): rewritten
 * in place, a crash would load the new data as that epoch's and write it
 * back before the epochs in between.
 */
bool tc_stale_clean(struct tc_cache *c, u32 slot)
{
	return !tc_slot_dirty(c, slot) && tc_epoch_older(&c->ix.ep, slot) &&
	       tc_meta_disk_dirty(c, slot);
}

/*
 * A write hit while writes do not make blocks dirty (the cleaner, a table
 * being loaded, writethrough): it reaches the origin, so it waits for the
 * epochs before it, as a write around the cache does.  A dirty version of
 * an older epoch than the open one must not take its data either: that
 * version is its epoch's, and would carry the write to the origin with
 * it.  The write then belongs to the open epoch (it was not acknowledged
 * before the flushes that opened it), and waits for every older one.
 */
static enum tc_action tc_write_hit_through(struct tc_cache *c,
					   struct bio *bio, struct tc_bio *pb,
					   u32 slot)
{
	if (tc_epoch_needs_cow(c, slot))
		pb->epoch = tc_epoch_cur(&c->ix.ep);
	if (tc_around_waits(c, pb->epoch))
		return TC_WAIT_EPOCH;
	return tc_write_through(c, bio, pb, slot);
}

/*
 * A write that goes to the origin and has no cached copy to mind: a miss
 * while writes do not make blocks dirty, or a write to the tail past the
 * last whole block (never cached).  It goes after the epochs before it.
 */
static enum tc_action tc_write_uncached(struct tc_cache *c,
					struct tc_bio *pb)
{
	if (tc_around_waits(c, pb->epoch))
		return TC_WAIT_EPOCH;
	return TC_TO_ORIGIN;
}

static enum tc_action tc_write(struct tc_cache *c, struct bio *bio,
			       struct tc_bio *pb, u64 block)
{
	u32 slot;
	int r;

	if (tc_failed(c))
		return tc_write_failed(c, bio, pb, block);
	slot = tc_lookup(c, block);
	/* loaded with the span of epochs full: not into the newest loaded one */
	if (tc_epoch_must_open(&c->ix.ep)) {
		if (!pb->again)
			tc_count(c, slot != TC_SLOT_NONE ? TC_S_WRITE_HIT :
							   TC_S_WRITE_MISS);
		return TC_WAIT_OPEN;
	}
	/* mapped while it was: the epoch opened for it (or the empty newest) */
	pb->epoch = min(pb->epoch, tc_epoch_cur(&c->ix.ep));
	if (block >= c->nr_blocks)
		return tc_write_uncached(c, pb);
	if (c->mode == TC_MODE_PASSTHROUGH) {
		tc_count(c, slot != TC_SLOT_NONE ? TC_S_WRITE_HIT :
						   TC_S_WRITE_MISS);
		tc_count(c, TC_S_WRITE_BYPASS);
		if (slot != TC_SLOT_NONE)
			tc_remove(c, slot);
		return TC_TO_ORIGIN;
	}
	if (slot != TC_SLOT_NONE) {
		if (!pb->again)
			tc_count(c, TC_S_WRITE_HIT);
		tc_touch(c, slot);
		pb->slot = slot;
		if (!tc_writes_dirty(c))
			return tc_write_hit_through(c, bio, pb, slot);
		if (tc_epoch_needs_cow(c, slot))
			return tc_write_cow(c, bio, pb, block, slot);
		if (tc_stale_clean(c, slot)) {
			/* as a miss: the copy goes, a fresh slot takes it */
			tc_remove(c, slot);
			goto miss;
		}
		pb->was_clean = !tc_slot_dirty(c, slot);
		if (tc_mark_dirty(c, slot)) {
			/* -ENOSPC: the tail is full */
			if (tc_order_wait(pb))
				return TC_WAIT_ORDER;
			if (tc_around_waits(c, pb->epoch))
				return TC_WAIT_EPOCH;
			return tc_write_through(c, bio, pb, slot);
		}
		/*
		 * A clean copy is recorded dirty once the data is there, as a
		 * new slot is: a failed write then leaves no entry that a crash
		 * could bring back (tc_meta_stale()).
		 */
		pb->meta_new = pb->was_clean;
		return tc_write_cache(c, bio, pb);
	}
	if (!pb->again)
		tc_count(c, TC_S_WRITE_MISS);
miss:
	if (!tc_writes_dirty(c))
		return tc_write_uncached(c, pb);
	/* a full tail: no clean block is evicted for a slot it cannot take */
	if (tc_whole_block(c, bio) && tc_index_tail_full(c)) {
		if (tc_order_wait(pb))
			return TC_WAIT_ORDER;
	} else if (tc_whole_block(c, bio)) {
		r = tc_write_allocate(c, pb, block);
		if (!r)
			return tc_write_cache(c, bio, pb);
		if (r == -EAGAIN && tc_order_wait(pb))
			return TC_WAIT_ORDER;
	}
	if (tc_around_waits(c, pb->epoch))
		return TC_WAIT_EPOCH;
	tc_count(c, TC_S_WRITE_BYPASS);
	return TC_TO_ORIGIN;
}

/*
 * Reads share their block's lock when they will not fill a slot: in
 * passthrough mode, and when the block is cached (a hint taken before
 * locking; a read that then finds it gone goes to the origin).
 */
static enum tc_lock_mode tc_bio_lock_mode(struct tc_cache *c, struct bio *bio,
					  u64 block)
{
	if (bio_data_dir(bio) == READ &&
	    (c->mode == TC_MODE_PASSTHROUGH ||
	     tc_lookup(c, block) != TC_SLOT_NONE))
		return TC_LK_READ;
	return TC_LK_EXCL;
}

/*
 * A FUA write that goes around the cache is durable only once no dropped
 * slot is still recorded dirty on disk: after a crash, such a stale entry
 * would write its older data over the block.  Dropped slots wait for a
 * commit only after cache device errors, passthrough write hits and the
 * like, so such a write rarely has to commit first.
 */
bool tc_around_needs_commit(struct tc_cache *c, struct tc_bio *pb)
{
	return pb->fua && tc_meta_stale(c);
}

/*
 * A write parked until the writeback request of its slot is done (the
 * request's older copy is still on its way to the origin): it keeps its
 * block's lock, and goes through the dispatcher again once the request
 * lets go of the slot (tc_wake_wb_waiters()).
 */
static void tc_wait_wb(struct tc_cache *c, struct bio *bio, struct tc_bio *pb)
{
	u32 slot = pb->slot;	/* once parked, the bio may be gone */
	unsigned long flags;

	pb->stage = TC_ST_AGAIN;
	spin_lock_irqsave(&c->defer_lock, flags);
	bio_list_add(&c->wb_wait, bio);
	spin_unlock_irqrestore(&c->defer_lock, flags);
	/* parked, then the slot read: pairs with tc_wake_wb_waiters() */
	smp_mb();
	if (!tc_slot_in_wb(c, slot))
		tc_wake_wb_waiters(c);
}

/* The writes parked on @list go through the dispatcher again. */
static void tc_requeue_parked(struct tc_cache *c, struct bio_list *list)
{
	unsigned long flags;
	bool any;

	spin_lock_irqsave(&c->defer_lock, flags);
	any = !bio_list_empty(list);
	bio_list_merge(&c->deferred, list);
	bio_list_init(list);
	spin_unlock_irqrestore(&c->defer_lock, flags);
	if (any)
		queue_work(c->wq, &c->io_work);
}

/* Writeback retired an epoch: the writes parked for one try again. */
static void tc_wake_ep_waiters(struct tc_cache *c)
{
	tc_requeue_parked(c, &c->ep_wait);
}

/*
 * Does a write parked for @why (a TC_WAIT_* of tc_wait_epoch()) still wait?
 * @epoch and @wakes are its pb->epoch and pb->slot_wakes.
 */
static bool tc_still_waits(struct tc_cache *c, enum tc_action why, u64 epoch,
			   int wakes)
{
	switch (why) {
	case TC_WAIT_EPOCH:
		/* writeback failed meanwhile: it fails at once (tc_write_failed()) */
		if (tc_failed(c) && test_bit(TC_FL_PAUSED, &c->fl.bits))
			return false;
		return tc_around_waits(c, epoch);
	case TC_WAIT_OPEN:
		return !tc_epoch_can_open(&c->ix.ep);
	case TC_WAIT_ORDER:
		return tc_index_tail_full(c);
	default:
		/* slots let go since it looked: it tries again */
		if (atomic_read(&c->slot_wakes) != wakes)
			return false;
		/* a free slot: writeback lets go of one, or no copy is needed */
		return tc_origin_behind(c);
	}
}

/* The list a write parked for @why (a TC_WAIT_* of tc_wait_epoch()) joins. */
static struct bio_list *tc_wait_list(struct tc_cache *c, enum tc_action why)
{
	switch (why) {
	case TC_WAIT_SLOT:
		return &c->wb_wait;
	case TC_WAIT_ORDER:
		return &c->order_wait;
	default:
		return &c->ep_wait;
	}
}

/*
 * A write parked until writeback has sent older epochs to the origin
 * (TC_WAIT_EPOCH), retired one to make room for a new epoch
 * (TC_WAIT_OPEN), freed a slot for a copy (TC_WAIT_SLOT), or merged the
 * dirty order's full tail (TC_WAIT_ORDER).  Nothing of its own was
 * changed for it.
 * It lets go of its block's lock (writeback may need that block: the
 * older version this write would copy) and starts over when writeback
 * retires an epoch (tc_epoch_waiters_go()), lets go of slots
 * (tc_wake_wb_waiters()) or merges (tc_wake_order_waiters()).  The engine
 * runs for it, watermark or not.
 */
static void tc_wait_epoch(struct tc_cache *c, struct bio *bio,
			  struct tc_bio *pb, enum tc_action why)
{
	struct bio_list *list = tc_wait_list(c, why);
	u64 epoch = pb->epoch;	/* once parked, the bio may be gone */
	int wakes = why == TC_WAIT_SLOT ? pb->slot_wakes : 0;
	unsigned long flags;

	pb->locked = false;
	tc_unlock(&c->locks, &pb->holder);
	pb->holder.granted = false;
	pb->stage = TC_ST_NEW;
	pb->again = true;
	/* it starts over: nothing of this dispatch may stay */
	pb->was_clean = false;
	pb->meta_new = false;
	pb->to_cache = false;
	pb->cow_from = TC_SLOT_NONE;
	spin_lock_irqsave(&c->defer_lock, flags);
	bio_list_add(list, bio);
	spin_unlock_irqrestore(&c->defer_lock, flags);
	/* a merge is not writeback: the engine runs one for any kick */
	if (why != TC_WAIT_ORDER)
		set_bit(TC_FL_EPOCH_WAIT, &c->fl.bits);
	/*
	 * Parked, then the state read again: pairs with the wakers, which
	 * change it before they read the lists.
	 */
	smp_mb();
	if (!tc_still_waits(c, why, epoch, wakes))
		tc_requeue_parked(c, list);
	tc_flush_kick(c);
}

/*
 * Writeback let go of slots: the writes parked for them try again (not
 * those waiting for an epoch: each release would send them round again).
 */
void tc_wake_wb_waiters(struct tc_cache *c)
{
	/* the slots let go, then counted (not all under alloc_lock) */
	smp_mb__before_atomic();
	atomic_inc(&c->slot_wakes);
	/*
	 * Counted, then the list read: pairs with tc_wait_wb() and
	 * tc_wait_epoch()
	 */
	smp_mb__after_atomic();
	tc_requeue_parked(c, &c->wb_wait);
}

/*
 * The engine merged the dirty order (or tried to): the writes parked for
 * room in its tail try again.
 */
void tc_wake_order_waiters(struct tc_cache *c)
{
	/* the tail emptied, then the list read: pairs with tc_wait_epoch() */
	smp_mb();
	tc_requeue_parked(c, &c->order_wait);
}

/* Decide where a bio holding its block's lock goes, and send it on. */
static int tc_dispatch(struct tc_cache *c, struct bio *bio, struct tc_bio *pb)
{
	enum tc_action act;

	if (bio_data_dir(bio) == READ)
		act = tc_read(c, bio, pb, pb->block);
	else
		act = tc_write(c, bio, pb, pb->block);

	switch (act) {
	case TC_TO_CACHE:
		tc_remap_cache(c, bio, pb);
		return DM_MAPIO_REMAPPED;
	case TC_TO_ORIGIN:
		if (bio_data_dir(bio) == WRITE && tc_around_needs_commit(c, pb)) {
			pb->stage = TC_ST_AROUND_FUA;
			tc_queue_io(c, bio);
			return DM_MAPIO_SUBMITTED;
		}
		bio_set_dev(bio, c->origin_bdev);
		return DM_MAPIO_REMAPPED;
	case TC_CONTINUE:
		tc_queue_io(c, bio);
		return DM_MAPIO_SUBMITTED;
	case TC_WAIT_WB:
		tc_wait_wb(c, bio, pb);
		return DM_MAPIO_SUBMITTED;
	case TC_WAIT_EPOCH:
	case TC_WAIT_OPEN:
	case TC_WAIT_SLOT:
	case TC_WAIT_ORDER:
		tc_wait_epoch(c, bio, pb, act);
		return DM_MAPIO_SUBMITTED;
	case TC_FAIL:
		break;
	default:
		WARN_ON_ONCE(1);	/* not reached */
		break;
	}
	/* no end_io follows a bio the map function kills: unlock it here */
	pb->locked = false;
	tc_unlock(&c->locks, &pb->holder);
	return DM_MAPIO_KILL;
}

/* Lock the bio's block and send it on.  Returns a DM_MAPIO_* value. */
static int tc_map_rw(struct tc_cache *c, struct bio *bio, struct tc_bio *pb)
{
	u64 block = bio->bi_iter.bi_sector >> c->block_shift;

	/*
	 * Before the lock: device-mapper calls no end_io for a bio its map
	 * function kills, so a killed bio must not hold one.
	 */
	if (bio_data_dir(bio) == WRITE && READ_ONCE(c->read_only))
		return DM_MAPIO_KILL;	/* a read-only table writes nothing */
	if (block >= c->nr_blocks && bio_data_dir(bio) == READ) {
		/* the tail past the last whole block is never cached */
		bio_set_dev(bio, c->origin_bdev);
		return DM_MAPIO_REMAPPED;
	}
	/* a parked bio comes back holding the lock it was granted */
	if (!pb->holder.granted &&
	    !tc_lock_or_defer(&c->locks, &pb->holder, block,
			      tc_bio_lock_mode(c, bio, block), bio))
		return DM_MAPIO_SUBMITTED;
	pb->holder.granted = false;
	pb->locked = true;
	pb->block = block;
	return tc_dispatch(c, bio, pb);
}

/*
 * Under the ordered policy a flush closes the open epoch: the writes
 * after it go to a new one.  If one more live epoch is not allowed, the
 * flush waits for writeback to retire the oldest (tc_epoch_waiters_go()).
 * Then it commits the metadata.
 */
static void tc_flush_epoch(struct tc_cache *c, struct bio *bio)
{
	unsigned long flags;

	/* a read-only table makes nothing durable: it never waits */
	if (READ_ONCE(c->val[TC_KEY_ORDERED]) && !tc_failed(c) &&
	    !READ_ONCE(c->read_only) && !tc_epoch_open(&c->ix.ep)) {
		spin_lock_irqsave(&c->defer_lock, flags);
		bio_list_add(&c->ep_flushes, bio);
		spin_unlock_irqrestore(&c->defer_lock, flags);
		set_bit(TC_FL_EPOCH_WAIT, &c->fl.bits);
		/*
		 * Parked, then the state read again: a failure, a retirement
		 * or a commit since the test must not leave it waiting.
		 */
		smp_mb();
		if (tc_failed(c) || tc_epoch_can_open(&c->ix.ep))
			tc_epoch_waiters_go(c);
		else
			tc_flush_kick(c);
		return;
	}
	tc_meta_queue_bio(c, bio);
}

/*
 * Writeback retired an epoch (or gave up): parked writes and flushes try
 * again.
 */
void tc_epoch_waiters_go(struct tc_cache *c)
{
	struct bio_list flushes;
	struct bio *bio;

	spin_lock_irq(&c->defer_lock);
	flushes = c->ep_flushes;
	bio_list_init(&c->ep_flushes);
	spin_unlock_irq(&c->defer_lock);
	while ((bio = bio_list_pop(&flushes)))
		tc_flush_epoch(c, bio);
	tc_wake_ep_waiters(c);
	tc_wake_wb_waiters(c);
}

/*
 * Writeback failed while writes or flushes waited for an epoch to be
 * written back: they fail with it rather than wait for an origin that may
 * never take the epoch (a write waiting cannot go around the cache: an
 * older version of its block would later be written over it).
 */
void tc_epoch_waiters_fail(struct tc_cache *c, int err)
{
	struct bio_list bios;
	struct bio *bio;

	spin_lock_irq(&c->defer_lock);
	bios = c->ep_flushes;
	bio_list_init(&c->ep_flushes);
	spin_unlock_irq(&c->defer_lock);
	while ((bio = bio_list_pop(&bios))) {
		bio->bi_status = errno_to_blk_status(err);
		bio_endio(bio);
	}
	spin_lock_irq(&c->defer_lock);
	bios = c->ep_wait;
	bio_list_init(&c->ep_wait);
	bio_list_merge(&bios, &c->wb_wait);
	bio_list_init(&c->wb_wait);
	spin_unlock_irq(&c->defer_lock);
	while ((bio = bio_list_pop(&bios))) {
		struct tc_bio *pb = dm_per_bio_data(bio, sizeof(struct tc_bio));

		if (pb->locked) {
			/* waits for its slot's writeback request: still does */
			tc_wait_wb(c, bio, pb);
			continue;
		}
		DMERR_LIMIT("%s: writeback error %d: a write waiting for an older epoch fails",
			    c->name, err);
		bio->bi_status = errno_to_blk_status(err);
		bio_endio(bio);
	}
}

/*
 * Empty flushes: bio 0 commits the metadata (which flushes the cache
 * device first), bio 1 waits for an origin flush (tc_oflush.c).
 */
static int tc_map_flush(struct tc_cache *c, struct bio *bio)
{
	/*
	 * A failed cache takes no new data, but the dirty blocks it holds
	 * (acknowledged, maybe only in the device's volatile cache) and the
	 * entries the disk may still record dirty (written back or dropped
	 * since: a crash would load them and bring their older data back)
	 * need a commit, which flushes the device first: without them, the
	 * origin's flush is all.
	 */
	if (dm_bio_get_target_bio_nr(bio) == 0 && tc_failed(c) &&
	    !tc_nr_dirty(c) && !tc_meta_any_disk_dirty(c)) {
		bio_endio(bio);
		return DM_MAPIO_SUBMITTED;
	}
	if (dm_bio_get_target_bio_nr(bio) == 0) {
		tc_flush_epoch(c, bio);
		return DM_MAPIO_SUBMITTED;
	}
	tc_oflush_bio(c, bio);
	return DM_MAPIO_SUBMITTED;
}

static void tc_queue_discard(struct tc_cache *c, struct bio *bio)
{
	unsigned long flags;

	spin_lock_irqsave(&c->defer_lock, flags);
	bio_list_add(&c->discards, bio);
	spin_unlock_irqrestore(&c->defer_lock, flags);
	queue_work(c->discard_wq, &c->discard_work);
}

/*
 * The epoch of a write mapped now: the flushes it may not overtake came
 * before it (see tc_around_waits()).  While a load's newest epoch may not
 * be joined (tc_epoch_must_open()), the epoch to be opened after it:
 * TC_EPOCH_NEXT until tc_write() knows which.
 */
static u64 tc_map_epoch(struct tc_epochs *e)
{
	/* the flag, then cur: pairs with tc_epoch_open() */
	if (smp_load_acquire(&e->must_open))
		return TC_EPOCH_NEXT;
	return tc_epoch_cur(e);
}

/*
 * @bio came back from a device below and will be submitted again.  If
 * that device split it, each part ended it once and its remaining count
 * is now 0 (BIO_CHAIN cleared): split again without this, its first part
 * to end would end it while the others are still in flight, and the last
 * would end it a second time.
 */
static void tc_bio_restore(struct tc_bio *pb, struct bio *bio)
{
	bio->bi_end_io = pb->end_io;
	bio->bi_flags = pb->bi_flags;
	atomic_set(&bio->__bi_remaining, pb->remaining);
}

int tc_map(struct dm_target *ti, struct bio *bio)
{
	struct tc_target *t = ti->private;
	struct tc_cache *c = t->c;
	struct tc_bio *pb = dm_per_bio_data(bio, sizeof(struct tc_bio));
	int r;

	pb->c = c;
	pb->locked = false;
	pb->run = NULL;
	pb->to_cache = false;
	pb->was_clean = false;
	pb->discard = false;
	pb->meta_new = false;
	pb->again = false;
	pb->order_waits = 0;
	pb->cow_from = TC_SLOT_NONE;
	pb->fua = bio->bi_opf & REQ_FUA;
	pb->holder.granted = false;
	pb->stage = TC_ST_NEW;
	pb->status = BLK_STS_OK;
	pb->cache_status = BLK_STS_OK;
	pb->buf.chunks = NULL;
	pb->epoch = tc_map_epoch(&c->ix.ep);

	if (bio->bi_opf & REQ_PREFLUSH)
		return tc_map_flush(c, bio);

	bio->bi_iter.bi_sector = dm_target_offset(ti, bio->bi_iter.bi_sector);
	if (bio_op(bio) == REQ_OP_DISCARD) {
		if (READ_ONCE(c->read_only))
			return DM_MAPIO_KILL;	/* drops nothing, sends nothing */
		pb->iter = bio->bi_iter;
		tc_queue_discard(c, bio);
		return DM_MAPIO_SUBMITTED;
	}
	/*
	 * Trimmed here, not split by device-mapper (max_io_len): a run
	 * stays whole.  No zoned, atomic or REQ_NOWAIT bios come here (the
	 * target claims none of those features); such bios must not be
	 * trimmed.
	 */
	if (tc_spans_blocks(c, bio)) {
		if (tc_map_run(c, bio, pb, &r))
			return r;
		tc_trim_blocks(c, bio, 1);
	}
	pb->iter = bio->bi_iter;
	return tc_map_rw(c, bio, pb);
}

/*
 * A new dirty slot goes into the metadata once its data write succeeded
 * (a write run's: each of its new and once-clean slots).
 */
static void tc_record_new(struct tc_bio *pb)
{
	if (pb->run)
		tc_run_record(pb->c, pb);
	if (!pb->meta_new)
		return;
	pb->meta_new = false;
	tc_meta_set(pb->c, pb->slot, true);
}

/*
 * The new version of a copy on write is dropped (its write failed, or the
 * older version could not be read): the older one is the newest again.
 */
static void tc_drop_cow(struct tc_cache *c, struct tc_bio *pb)
{
	pb->meta_new = false;
	if (tc_lookup(c, pb->block) == pb->slot)
		tc_remove(c, pb->slot);
	pb->slot = pb->cow_from;
	pb->cow_from = TC_SLOT_NONE;
}

/*
 * The cache device failed a bio that has a good copy elsewhere: a read of
 * a clean block (the origin holds it), a write to a fresh slot or to a
 * clean copy (the write can go around the cache), a write run (it goes
 * there whole, tc_wrun_failed()).  Take it back: it goes to the origin
 * from tc_io_work().
 */
static bool tc_cache_failed(struct tc_bio *pb, struct bio *bio,
			    blk_status_t error)
{
	struct tc_cache *c = pb->c;

	if (!error || !pb->to_cache)
		return false;
	if (bio_data_dir(bio) == READ && tc_run_dirty(c, pb)) {
		/* the only copy: the error stands */
		tc_cache_fail(c, blk_status_to_errno(error),
			      "read of a dirty block");
		return false;
	}
	tc_bio_restore(pb, bio);	/* before tc_io_work() may send it */
	if (bio_data_dir(bio) == WRITE) {
		tc_cache_fail(c, blk_status_to_errno(error), "write");
		if (pb->run) {
			/* to the origin whole, in tc_wrun_failed() */
			pb->stage = TC_ST_RUN_FAILED;
			tc_queue_io(c, bio);
			return true;
		}
		if (pb->cow_from != TC_SLOT_NONE) {
			/* the copy goes in tc_again(), not in interrupt context */
			pb->stage = TC_ST_AGAIN;
			tc_queue_io(c, bio);
			return true;
		}
		if (!pb->meta_new && !pb->was_clean) {
			/* a dirty block's: now a write to the failed cache */
			pb->stage = TC_ST_AGAIN;
			tc_queue_io(c, bio);
			return true;
		}
	}
	pb->stage = TC_ST_TO_ORIGIN;
	tc_queue_io(pb->c, bio);
	return true;
}

int tc_end_io(struct dm_target *ti, struct bio *bio, blk_status_t *error)
{
	struct tc_bio *pb = dm_per_bio_data(bio, sizeof(struct tc_bio));

	if (tc_cache_failed(pb, bio, *error))
		return DM_ENDIO_INCOMPLETE;
	tc_record_new(pb);
	if (pb->locked) {
		pb->locked = false;
		tc_unlock(&pb->c->locks, &pb->holder);
	}
	if (pb->run)
		tc_run_unlock(pb->c, pb);
	if (pb->discard) {
		pb->discard = false;
		tc_range_unlock(&pb->c->locks, &pb->range);
	}
	return DM_ENDIO_DONE;
}

/* ---- bios continued in process context ---- */

/*
 * Drop the slot of a write that goes around the cache after all (if the
 * slot may be dirty on disk, it waits for a commit: tc_meta_stale()).
 */
static void tc_drop_slot(struct tc_cache *c, struct tc_bio *pb)
{
	if (!pb->meta_new && !pb->was_clean)
		return;
	pb->meta_new = false;
	pb->was_clean = false;
	if (tc_lookup(c, pb->block) == pb->slot)
		tc_remove(c, pb->slot);
	tc_count(c, TC_S_WRITE_BYPASS);
}

static void tc_again(struct tc_cache *c, struct bio *bio, struct tc_bio *pb);

/*
 * Send @bio, as it was mapped, to the origin (still holding its lock): a
 * bio the cache device failed, taken back in tc_end_io() or never
 * submitted itself (the FUA path writes a clone).
 */
static void tc_to_origin(struct tc_cache *c, struct bio *bio,
			 struct tc_bio *pb)
{
	DMERR_LIMIT("%s: cache device error on block %llu (%u blocks): using the origin",
		    c->name, pb->block, pb->run ? pb->run->nr + 1 : 1);
	pb->to_cache = false;	/* its end_io must not take it back again */
	if (bio_data_dir(bio) == WRITE) {
		tc_drop_slot(c, pb);
		/* older versions go first: the dispatcher parks it for them */
		if (tc_around_waits(c, pb->epoch)) {
			tc_again(c, bio, pb);
			return;
		}
		/* taken back from the cache: it can only be resubmitted */
		if (tc_around_needs_commit(c, pb) && tc_meta_commit(c)) {
			bio_io_error(bio);
			return;
		}
	}
	bio->bi_iter = pb->iter;
	bio->bi_status = BLK_STS_OK;
	bio_set_dev(bio, c->origin_bdev);
	dm_submit_bio_remap(bio, NULL);	/* accounts the bio once only */
}

static void tc_pb_put(struct tc_bio *pb)
{
	if (!atomic_dec_and_test(&pb->pending))
		return;
	switch (pb->stage) {
	case TC_ST_BOTH:
		pb->stage = TC_ST_BOTH_DONE;
		break;
	case TC_ST_PROMOTE:
		pb->stage = pb->status ? TC_ST_PROMOTE_DONE :
					 TC_ST_PROMOTE_WRITE;
		break;
	case TC_ST_FUA:
		pb->stage = TC_ST_FUA_DONE;
		break;
	case TC_ST_RMW:
		pb->stage = TC_ST_DROP_WRITE;
		break;
	case TC_ST_DROP_WRITE:
		pb->stage = TC_ST_DROP_DONE;
		break;
	case TC_ST_COW_READ:
		pb->stage = TC_ST_COW_WRITE;
		break;
	case TC_ST_COW_WRITE:
		pb->stage = TC_ST_COW_DONE;
		break;
	case TC_ST_RUN_DROP:
		pb->stage = TC_ST_RUN_DROP_DONE;
		break;
	default:
		pb->stage = TC_ST_PROMOTE_DONE;
		break;
	}
	tc_queue_io(pb->c, tc_bio_of(pb));
}

static void tc_clone_ended(struct bio *clone, bool to_cache)
{
	struct tc_bio *pb = clone->bi_private;

	if (clone->bi_status) {
		if (to_cache)
			pb->cache_status = clone->bi_status;
		else
			pb->status = clone->bi_status;
	}
	bio_put(clone);
	tc_pb_put(pb);
}

static void tc_cache_clone_endio(struct bio *clone)
{
	tc_clone_ended(clone, true);
}

static void tc_origin_clone_endio(struct bio *clone)
{
	tc_clone_ended(clone, false);
}

static void tc_submit_child(struct tc_cache *c, struct tc_bio *pb,
			    struct bio *clone, struct block_device *bdev)
{
	clone->bi_private = pb;
	clone->bi_end_io = bdev == c->cache_bdev ? tc_cache_clone_endio :
						   tc_origin_clone_endio;
	submit_bio_noacct(clone);
}

/* A clone of @bio over the same pages, to @bdev at @sector. */
void tc_submit_clone(struct tc_cache *c, struct bio *bio,
		     struct block_device *bdev, sector_t sector, blk_opf_t opf)
{
	struct bio *clone = bio_alloc_clone(bdev, bio, GFP_NOIO, &c->bs);

	/* nobody polls a child: it must complete by interrupt */
	clone->bi_opf = opf & ~REQ_POLLED;
	clone->bi_iter.bi_sector = sector;
	tc_submit_child(c, dm_per_bio_data(bio, sizeof(struct tc_bio)), clone,
			bdev);
}

/* The blocks of @pb: a run's, or its one block. */
static unsigned int tc_pb_blocks(struct tc_bio *pb)
{
	return pb->run ? pb->run->nr + 1 : 1;
}

/* @pb's buffer (a block for each of its blocks) to or from @bdev. */
static void tc_submit_buf(struct tc_cache *c, struct tc_bio *pb,
			  struct block_device *bdev, sector_t sector,
			  blk_opf_t opf)
{
	size_t off = 0, bytes = (size_t)tc_pb_blocks(pb) * tc_block_bytes(c);

	atomic_set(&pb->pending, 1);
	while (off < bytes) {
		size_t len = bytes - off;
		struct bio *b = tc_buf_bio(c, &pb->buf, off, &len, bdev,
					   sector + (off >> SECTOR_SHIFT), opf);

		atomic_inc(&pb->pending);
		tc_submit_child(c, pb, b, bdev);
		off += len;
	}
	tc_pb_put(pb);
}

/* A promotion's slots go back: nothing was indexed in them. */
static void tc_promote_free(struct tc_cache *c, struct tc_bio *pb)
{
	unsigned int i;

	for (i = 0; i < tc_pb_blocks(pb); i++)
		tc_free_slot(c, pb->slot + i);
	tc_wake_wb_waiters(c);
}

/*
 * A read miss fills a slot, or a promotion run consecutive ones
 * (tc_miss.c): the origin is read into a buffer of the target's own,
 * copied to the reader, and the slots are written from the buffer, never
 * from the reader's pages (which the reader may change meanwhile: an
 * O_DIRECT reader, a VM guest).
 */
static void tc_promote_read(struct tc_cache *c, struct bio *bio,
			    struct tc_bio *pb)
{
	if (tc_buf_alloc(NULL, &pb->buf,
			 (size_t)tc_pb_blocks(pb) * tc_block_bytes(c))) {
		/* no memory: an ordinary read, and no promotion */
		tc_promote_free(c, pb);
		bio_set_dev(bio, c->origin_bdev);
		dm_submit_bio_remap(bio, NULL);
		return;
	}
	tc_submit_buf(c, pb, c->origin_bdev, bio->bi_iter.bi_sector,
		      REQ_OP_READ);
}

static void tc_promote_write(struct tc_cache *c, struct bio *bio,
			     struct tc_bio *pb)
{
	tc_buf_copy_to_bio(&pb->buf, bio);
	tc_submit_buf(c, pb, c->cache_bdev, tc_slot_sector(c, pb->slot),
		      REQ_OP_WRITE);
}

/* Writethrough (or cleaner) write hit: the origin and the cached copy. */
static void tc_issue_both(struct tc_cache *c, struct bio *bio,
			  struct tc_bio *pb)
{
	sector_t sector = bio->bi_iter.bi_sector;

	atomic_set(&pb->pending, 2);
	tc_submit_clone(c, bio, c->origin_bdev, sector, bio->bi_opf);
	tc_submit_clone(c, bio, c->cache_bdev,
			tc_cache_sector(c, pb->slot, sector), bio->bi_opf);
}

/* Carry out a DM_MAPIO_* decision taken in process context. */
static void tc_mapped(struct bio *bio, int r)
{
	switch (r) {
	case DM_MAPIO_REMAPPED:
		dm_submit_bio_remap(bio, NULL);
		break;
	case DM_MAPIO_KILL:
		bio_io_error(bio);
		break;
	}
}

/*
 * A bio that holds its block's lock goes through the dispatcher again, as
 * it was mapped: a write parked for its slot's writeback, or one whose
 * cache write failed, which the failed cache now sends around it
 * (tc_write_failed()).
 */
static void tc_again(struct tc_cache *c, struct bio *bio, struct tc_bio *pb)
{
	if (pb->cow_from != TC_SLOT_NONE)
		tc_drop_cow(c, pb);	/* its write failed */
	pb->stage = TC_ST_NEW;
	pb->again = true;
	pb->cow_from = TC_SLOT_NONE;
	pb->to_cache = false;
	pb->cache_status = BLK_STS_OK;
	bio->bi_iter = pb->iter;
	bio->bi_status = BLK_STS_OK;
	tc_mapped(bio, tc_dispatch(c, bio, pb));
}

/*
 * A clean copy must equal the origin: if either write failed it is
 * dropped.  A dirty block stays dirty (its cache copy is the newest data);
 * a failure of its cache write is the bio's error.
 */
static void tc_both_done(struct tc_cache *c, struct bio *bio,
			 struct tc_bio *pb)
{
	u64 block = bio->bi_iter.bi_sector >> c->block_shift;
	u32 slot = tc_lookup(c, block);
	bool dirty = slot != TC_SLOT_NONE && tc_slot_dirty(c, slot);

	if (pb->cache_status)
		tc_cache_fail(c, blk_status_to_errno(pb->cache_status),
			      "write");
	if (slot != TC_SLOT_NONE && !dirty && (pb->status || pb->cache_status))
		tc_remove(c, slot);
	/* a dirty block's copy failed: the failed cache sends it around */
	if (dirty && pb->cache_status && !pb->status) {
		tc_again(c, bio, pb);
		return;
	}
	if (dirty && pb->cache_status)
		pb->status = pb->cache_status;
	/* the data is on the origin: a stale entry must not overwrite it */
	if (!pb->status && tc_around_needs_commit(c, pb) && tc_meta_commit(c))
		pb->status = BLK_STS_IOERR;
	bio->bi_status = pb->status;
	bio_endio(bio);
}

/*
 * The slots are written (or the origin read failed): index each block
 * clean.  The reader has its data unless the origin failed it.
 */
static void tc_promote_done(struct tc_cache *c, struct bio *bio,
			    struct tc_bio *pb)
{
	unsigned int i;

	tc_buf_free(NULL, &pb->buf);
	if (pb->cache_status)
		tc_cache_fail(c, blk_status_to_errno(pb->cache_status),
			      "promotion write");
	for (i = 0; i < tc_pb_blocks(pb); i++) {
		u32 slot = pb->slot + i;

		/* a promotion may fail: no waiting for memory on reclaim */
		if (pb->status || pb->cache_status ||
		    tc_insert(c, slot, pb->block + i, false))
			tc_free_slot(c, slot);
		else
			tc_meta_set(c, slot, false);
	}
	/*
	 * The slots are free or clean now, and so can be had: a write parked
	 * for a slot (TC_WAIT_SLOT) may have found none because this
	 * promotion held them, and writeback, which wakes such writes, may
	 * have nothing left to do.
	 */
	tc_wake_wb_waiters(c);
	bio->bi_status = pb->status;
	bio_endio(bio);
}

/*
 * A FUA write is in the cache: it completes after a commit.  Under the
 * ordered policy it also ends its epoch, as a flush does: a write issued
 * once it has completed must not reach the origin before it (a journal's
 * commit block, then the journalled blocks written in place).  If no epoch
 * can be opened now, it waits as a flush does, without its block's lock:
 * the writeback it waits for may need that block.
 */
static void tc_fua_commit(struct tc_cache *c, struct bio *bio,
			  struct tc_bio *pb)
{
	tc_record_new(pb);
	if (!READ_ONCE(c->val[TC_KEY_ORDERED])) {
		tc_meta_queue_bio(c, bio);
		return;
	}
	if (pb->locked) {
		pb->locked = false;
		tc_unlock(&c->locks, &pb->holder);
	}
	if (pb->run)
		tc_run_unlock(c, pb);
	tc_flush_epoch(c, bio);
}

/* A FUA write is in the cache: record it, complete after a commit. */
static void tc_fua_done(struct tc_cache *c, struct bio *bio,
			struct tc_bio *pb)
{
	if (pb->cache_status) {
		tc_cache_fail(c, blk_status_to_errno(pb->cache_status),
			      "write");
		if (pb->run) {
			tc_wrun_failed(c, bio, pb);
			return;
		}
		if (pb->cow_from != TC_SLOT_NONE) {
			tc_drop_cow(c, pb);
		} else if (pb->meta_new || pb->was_clean) {
			tc_to_origin(c, bio, pb);
			return;
		}
		tc_again(c, bio, pb);
		return;
	}
	tc_fua_commit(c, bio, pb);
}

/*
 * A copy on write of part of a block (tc_write_cow()): the older version
 * is read from its slot into a buffer of the target's own.
 */
static void tc_cow_read(struct tc_cache *c, struct bio *bio, struct tc_bio *pb)
{
	if (tc_buf_alloc(NULL, &pb->buf, tc_block_bytes(c))) {
		/* no memory now: the copy goes, the write starts over later */
		tc_drop_cow(c, pb);
		tc_slot_wakes_mark(c, pb);
		tc_wait_epoch(c, bio, pb, TC_WAIT_SLOT);
		return;
	}
	tc_submit_buf(c, pb, c->cache_bdev, tc_slot_sector(c, pb->cow_from),
		      REQ_OP_READ);
}

/* The copy ended badly: the cache failed, the write goes through it again. */
static void tc_cow_failed(struct tc_cache *c, struct bio *bio,
			  struct tc_bio *pb, const char *what)
{
	tc_buf_free(NULL, &pb->buf);
	tc_cache_fail(c, blk_status_to_errno(pb->cache_status), what);
	tc_drop_cow(c, pb);
	tc_again(c, bio, pb);
}

/* The older version is in the buffer: the write is merged, then written. */
static void tc_cow_write(struct tc_cache *c, struct bio *bio,
			 struct tc_bio *pb)
{
	sector_t first = pb->block << c->block_shift;

	if (pb->cache_status) {
		tc_cow_failed(c, bio, pb, "read of a dirty block");
		return;
	}
	tc_buf_copy_from_bio(&pb->buf,
			     (bio->bi_iter.bi_sector - first) << SECTOR_SHIFT,
			     bio);
	tc_submit_buf(c, pb, c->cache_bdev, tc_slot_sector(c, pb->slot),
		      REQ_OP_WRITE);
}

/* The new version is written: recorded, and a FUA write committed. */
static void tc_cow_done(struct tc_cache *c, struct bio *bio, struct tc_bio *pb)
{
	if (pb->cache_status) {
		tc_cow_failed(c, bio, pb, "write");
		return;
	}
	tc_buf_free(NULL, &pb->buf);
	if (pb->fua) {
		tc_fua_commit(c, bio, pb);
		return;
	}
	tc_record_new(pb);
	bio_endio(bio);
}

/*
 * A failed cache, a write to part of a dirty block: the block is read from
 * its slot into a buffer of the target's own.
 */
static void tc_rmw_read(struct tc_cache *c, struct bio *bio, struct tc_bio *pb)
{
	if (tc_buf_alloc(NULL, &pb->buf, tc_block_bytes(c))) {
		DMERR_LIMIT("%s: no memory to merge a partial write to block %llu",
			    c->name, pb->block);
		bio->bi_status = BLK_STS_RESOURCE;
		bio_endio(bio);
		return;
	}
	tc_submit_buf(c, pb, c->cache_bdev, tc_slot_sector(c, pb->slot),
		      REQ_OP_READ);
}

/*
 * A failed cache, a write to a dirty block: the whole block goes to the
 * origin, durable when it completes (merged into the slot's data first if
 * the write covers part of it).
 */
static void tc_drop_write(struct tc_cache *c, struct bio *bio,
			  struct tc_bio *pb)
{
	sector_t first = pb->block << c->block_shift;
	blk_opf_t opf = REQ_OP_WRITE | REQ_FUA | (bio->bi_opf & REQ_SYNC);

	if (!pb->buf.chunks) {
		atomic_set(&pb->pending, 1);
		tc_submit_clone(c, bio, c->origin_bdev, first, opf);
		return;
	}
	if (pb->cache_status) {
		DMERR_LIMIT("%s: partial write to block %llu, unreadable in the failed cache: I/O error",
			    c->name, pb->block);
		tc_buf_free(NULL, &pb->buf);
		bio->bi_status = BLK_STS_IOERR;
		bio_endio(bio);
		return;
	}
	tc_buf_copy_from_bio(&pb->buf,
			     (bio->bi_iter.bi_sector - first) << SECTOR_SHIFT,
			     bio);
	tc_submit_buf(c, pb, c->origin_bdev, first, opf);
}

/*
 * The block is durable on the origin: its dirty copy goes.  A FUA write is
 * durable once a commit recorded that (a crash would bring the older copy
 * back over it), as for any write around the cache.
 */
static void tc_drop_done(struct tc_cache *c, struct bio *bio,
			 struct tc_bio *pb)
{
	tc_buf_free(NULL, &pb->buf);
	if (!pb->status) {
		if (tc_lookup(c, pb->block) == pb->slot)
			tc_remove_chain(c, pb->block);
		if (tc_around_needs_commit(c, pb) && tc_meta_commit(c))
			pb->status = BLK_STS_IOERR;
	}
	bio->bi_status = pb->status;
	bio_endio(bio);
}

/*
 * A FUA write around the cache while dropped slots wait for a commit:
 * the commit first (the write holds its block, so no stale entry of the
 * block appears meanwhile), then the origin.
 */
static void tc_around_fua(struct tc_cache *c, struct bio *bio)
{
	if (tc_meta_commit(c)) {
		bio_io_error(bio);
		return;
	}
	bio_set_dev(bio, c->origin_bdev);
	dm_submit_bio_remap(bio, NULL);
}

static void tc_process(struct tc_cache *c, struct bio *bio)
{
	struct tc_bio *pb = dm_per_bio_data(bio, sizeof(struct tc_bio));

	switch (pb->stage) {
	case TC_ST_NEW:
		tc_mapped(bio, tc_map_rw(c, bio, pb));
		break;
	case TC_ST_AGAIN:
		tc_again(c, bio, pb);
		break;
	case TC_ST_RMW:
		tc_rmw_read(c, bio, pb);
		break;
	case TC_ST_DROP_WRITE:
		tc_drop_write(c, bio, pb);
		break;
	case TC_ST_DROP_DONE:
		tc_drop_done(c, bio, pb);
		break;
	case TC_ST_COW_READ:
		tc_cow_read(c, bio, pb);
		break;
	case TC_ST_COW_WRITE:
		tc_cow_write(c, bio, pb);
		break;
	case TC_ST_COW_DONE:
		tc_cow_done(c, bio, pb);
		break;
	case TC_ST_BOTH:
		tc_issue_both(c, bio, pb);
		break;
	case TC_ST_BOTH_DONE:
		tc_both_done(c, bio, pb);
		break;
	case TC_ST_PROMOTE:
		tc_promote_read(c, bio, pb);
		break;
	case TC_ST_PROMOTE_WRITE:
		tc_promote_write(c, bio, pb);
		break;
	case TC_ST_PROMOTE_DONE:
		tc_promote_done(c, bio, pb);
		break;
	case TC_ST_FUA:
		atomic_set(&pb->pending, 1);
		tc_submit_clone(c, bio, c->cache_bdev,
				tc_cache_sector(c, pb->slot,
						bio->bi_iter.bi_sector),
				bio->bi_opf & ~REQ_FUA);
		break;
	case TC_ST_FUA_DONE:
		tc_fua_done(c, bio, pb);
		break;
	case TC_ST_TO_ORIGIN:
		tc_to_origin(c, bio, pb);
		break;
	case TC_ST_AROUND_FUA:
		tc_around_fua(c, bio);
		break;
	case TC_ST_RUN_FAILED:
		tc_wrun_failed(c, bio, pb);
		break;
	case TC_ST_RUN_DROP_DONE:
		tc_wrun_drop_done(c, bio, pb);
		break;
	case TC_ST_RUN_DROP:
		WARN_ON_ONCE(1);	/* not reached: its clone is in flight */
		break;
	}
}

/* Take every bio queued on @list (one of the cache's deferred lists). */
static void tc_take_bios(struct tc_cache *c, struct bio_list *list,
			 struct bio_list *bios)
{
	spin_lock_irq(&c->defer_lock);
	*bios = *list;
	bio_list_init(list);
	spin_unlock_irq(&c->defer_lock);
}

void tc_io_work(struct work_struct *w)
{
	struct tc_cache *c = container_of(w, struct tc_cache, io_work);
	struct bio_list bios;
	struct bio *bio;

	tc_take_bios(c, &c->deferred, &bios);
	while ((bio = bio_list_pop(&bios))) {
		tc_process(c, bio);
		cond_resched();
	}
}

/* ---- discards ---- */

/*
 * Drop the cached copies in [lo, hi), which the caller holds as a range (no
 * other holder is inside).  Blocks wholly inside the discard, [first, end),
 * are dropped; a block it covers in part is dropped only if clean (the
 * origin is about to change under it): a dirty one keeps its newer copy,
 * which writeback writes whole.  Every block in a writeback request is
 * waited for, kept or dropped: the request's write must not land on the
 * origin after the discard (a device may reorder writes in flight), and a
 * dropped block must not be overtaken by a write around the cache.  (The
 * request cannot mark a block clean meanwhile: it needs the block's lock,
 * which the range keeps.)  If the origin cannot discard (first == end),
 * no dirty copy is dropped: the origin would keep an older version, and
 * reads after the discard would go back in time.  Returns true if a dropped
 * slot may be dirty on disk: a commit must record it before the discard
 * ends, or a crash would bring the old data back over anything written
 * later.
 */
static bool tc_discard_block(struct tc_cache *c, u64 block, u32 slot,
			     u64 first, u64 end)
{
	bool disk_dirty;

	/* no copy of the block still on its way to the origin */
	wait_event_idle(c->locks.wait, !tc_slot_in_wb(c, slot));
	if ((block < first || block >= end) && tc_slot_dirty(c, slot))
		return false;
	/* before the slot may be freed and taken by another block */
	disk_dirty = tc_meta_disk_dirty(c, slot);
	tc_remove(c, slot);
	return disk_dirty;
}

/* How many lookups or slot words a discard visits between reschedules. */
#define TC_DISCARD_BATCH	1024

static bool tc_discard_range(struct tc_cache *c, u64 lo, u64 hi, u64 first,
			     u64 end)
{
	bool commit = false;
	u64 b;
	u32 s;

	/* the cheaper walk: every block of the range, or every slot */
	if (hi - lo <= c->nr_slots) {
		for (b = lo; b < hi; b++) {
			s = tc_lookup(c, b);
			if (s != TC_SLOT_NONE)
				commit |= tc_discard_block(c, b, s, first, end);
			if (!((b + 1 - lo) % TC_DISCARD_BATCH))
				cond_resched();
		}
		return commit;
	}
	for (s = 0; s < c->nr_slots; s++) {
		/* a hint: under the range lock, the map has the last word */
		b = tc_slot_origin(c, s);
		if (b >= lo && b < hi && tc_lookup(c, b) == s)
			commit |= tc_discard_block(c, b, s, first, end);
		if (!((s + 1) % TC_DISCARD_BATCH))
			cond_resched();
	}
	return commit;
}

/* Is any block of [first, end) dirty in the cache?  The caller holds it. */
static bool tc_range_dirty(struct tc_cache *c, u64 first, u64 end)
{
	u64 b;
	u32 s;

	if (end - first <= c->nr_slots) {
		for (b = first; b < end; b++) {
			s = tc_lookup(c, b);
			if (s != TC_SLOT_NONE && tc_slot_dirty(c, s))
				return true;
			if (!((b + 1 - first) % TC_DISCARD_BATCH))
				cond_resched();
		}
		return false;
	}
	for (s = 0; s < c->nr_slots; s++) {
		b = tc_slot_origin(c, s);
		if (b >= first && b < end && tc_lookup(c, b) == s &&
		    tc_slot_dirty(c, s))
			return true;
		if (!((s + 1) % TC_DISCARD_BATCH))
			cond_resched();
	}
	return false;
}

/*
 * The blocks whose dirty copies a discard of [start, end) may drop: those
 * wholly inside units the origin discards, [*first, *end).  A unit is a
 * block, or the origin's discard granularity if that is coarser (from its
 * discard alignment on): a thin origin completes a discard of part of its
 * block without discarding anything, and the older data would be read
 * where the newest was.
 */
static void tc_discard_whole(struct tc_cache *c, sector_t start,
			     sector_t end, u64 *first, u64 *last)
{
	struct block_device *o = c->origin_bdev;
	u64 g = max_t(u64, c->block_sectors,
		      bdev_discard_granularity(o) >> SECTOR_SHIFT);
	u64 a, s, e;

	div64_u64_rem(bdev_discard_alignment(o) >> SECTOR_SHIFT, g, &a);
	s = start > a ? a + div64_u64(start - a + g - 1, g) * g : a;
	e = end > a ? a + div64_u64(end - a, g) * g : a;
	*first = DIV_ROUND_UP_ULL(s, c->block_sectors);
	*last = max(min_t(u64, e >> c->block_shift, c->nr_blocks), *first);
}

/*
 * A discard whose range holds dirty copies: the origin discards first, and
 * only then are they dropped.  Dropped first, a discard the origin failed
 * would leave the origin's older data where the newest write was (reads
 * would go back in time).  The caller holds the range and has dropped the
 * clean copies.  Returns 0 or the error the bio ends with.
 */
static int tc_discard_dirty(struct tc_cache *c, struct bio *bio, u64 lo,
			    u64 hi, u64 first, u64 end)
{
	struct bio *d;
	int r;

	d = bio_alloc_bioset(c->origin_bdev, 0,
			     REQ_OP_DISCARD | (bio->bi_opf & REQ_SYNC), GFP_NOIO,
			     &c->bs);
	bio_clone_blkg_association(d, bio);
	d->bi_ioprio = bio->bi_ioprio;
	d->bi_iter.bi_sector = bio->bi_iter.bi_sector;
	d->bi_iter.bi_size = bio->bi_iter.bi_size;
	r = submit_bio_wait(d);
	bio_put(d);
	if (r)
		return r;
	if (tc_discard_range(c, lo, hi, first, end) && tc_meta_commit(c))
		return -EIO;
	return 0;
}

/*
 * Hold the blocks the discard touches, drop their cached copies, commit if
 * that is needed, then pass the discard down (or, if dirty copies are in
 * its range, pass it down, then drop them: tc_discard_dirty()).  The range
 * is held until the origin has discarded (tc_end_io()), so no promotion or
 * bridge filler brings the old data back.
 */
static void tc_discard(struct tc_cache *c, struct bio *bio)
{
	struct tc_bio *pb = dm_per_bio_data(bio, sizeof(struct tc_bio));
	bool passdown = bdev_max_discard_sectors(c->origin_bdev);
	sector_t start = bio->bi_iter.bi_sector;
	u64 first, end;
	u64 lo = start >> c->block_shift;
	u64 hi = min_t(u64, (bio_end_sector(bio) + c->block_sectors - 1) >>
			    c->block_shift, c->nr_blocks);

	tc_discard_whole(c, start, bio_end_sector(bio), &first, &end);
	if (lo < hi) {
		tc_range_lock(&c->locks, &pb->range, lo, hi);
		pb->discard = true;
	}
	/*
	 * While older epochs (or, on a failed cache, dirty versions: see
	 * tc_origin_behind()) are not all on the origin, the origin is not
	 * discarded (a state after a power cut at an older flush may still
	 * need the data), and only clean copies are dropped.  Decided under
	 * the range: no version of a block in it can appear meanwhile.
	 */
	if (tc_origin_behind(c))
		passdown = false;
	if (!passdown)
		end = first;	/* only clean copies go */
	if (lo < hi && first < end && tc_range_dirty(c, first, end)) {
		/* the clean copies now, the dirty ones once the origin has discarded */
		if (tc_discard_range(c, lo, hi, first, first) &&
		    tc_meta_commit(c)) {
			bio_io_error(bio);
			return;
		}
		bio->bi_status = errno_to_blk_status(tc_discard_dirty(c, bio, lo,
								      hi, first,
								      end));
		bio_endio(bio);
		return;
	}
	if (lo < hi) {
		if (tc_discard_range(c, lo, hi, first, end) &&
		    tc_meta_commit(c)) {
			bio_io_error(bio);
			return;
		}
	}
	if (passdown) {
		bio_set_dev(bio, c->origin_bdev);
		dm_submit_bio_remap(bio, NULL);
	} else {
		bio_endio(bio);
	}
}

void tc_discard_work(struct work_struct *w)
{
	struct tc_cache *c = container_of(w, struct tc_cache, discard_work);
	struct bio_list bios;
	struct bio *bio;

	tc_take_bios(c, &c->discards, &bios);
	while ((bio = bio_list_pop(&bios)))
		tc_discard(c, bio);
}
