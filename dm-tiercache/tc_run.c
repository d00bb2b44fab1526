// SPDX-License-Identifier: GPL-2.0
/*
 * dm-tiercache: runs, bios that go to the cache device whole although
 * they span blocks.
 *
 * tc_map() trims a bio that spans blocks to its first block, unless its
 * first blocks form a run: blocks that sit in consecutive slots, and so
 * in consecutive sectors of the cache device.  Splitting those into
 * block-sized bios would only cost per-bio work on both layers.  (Runs of
 * blocks that are not cached are tc_miss.c's.)
 *
 *  - A read run: blocks that are all cached, each read-locked as a one-block
 *    read hit is.
 *  - A write run: whole blocks of a write in writeback mode under the
 *    default policy, each locked exclusively, each either a copy written
 *    in place (dirty, or clean and recorded dirty once written) or, for a
 *    miss, a fresh slot taken next to the slot before it.  No block that
 *    needs more than that joins one: a copy on write, a block with a
 *    version in writeback, a full dirty-order tail.  A FUA run completes
 *    after a metadata commit, as a one-block FUA write does.
 *
 * Nothing here waits: locks are only tried, and a block that cannot join
 * ends the run there.  Device-mapper sends the rest of the bio on as a new
 * one (dm_accept_partial_bio(), so only in the map function).
 *
 * The cache device may fail a run.  A read run goes to the origin if every
 * block is clean; otherwise the error stands.  A write run goes to the
 * origin whole, durable (REQ_FUA), before the dirty copies it replaces are
 * dropped, as a failed cache's write to a dirty block does (tc_map.c).
 */
#include "tiercache.h"

bool tc_spans_blocks(struct tc_cache *c, struct bio *bio)
{
	return bio_sectors(bio) &&
	       (bio->bi_iter.bi_sector ^ (bio_end_sector(bio) - 1)) >>
	       c->block_shift;
}

/* Device-mapper sends the part of @bio after its first @n blocks on. */
void tc_trim_blocks(struct tc_cache *c, struct bio *bio, u64 n)
{
	sector_t end = ((bio->bi_iter.bi_sector >> c->block_shift) + n) <<
		       c->block_shift;

	if (end < bio_end_sector(bio))
		dm_accept_partial_bio(bio, end - bio->bi_iter.bi_sector);
}

/*
 * A run of TC_RUN_MAX blocks comes from a cache of its own: its lock
 * holders are just over 8 KiB, past the largest kmalloc cache, and a run
 * is allocated in the map function of every bio that spans blocks.
 * Shorter runs are kmalloc'ed to their size.
 */
static struct kmem_cache *tc_run_cache;

int __init tc_run_cache_init(void)
{
	tc_run_cache = kmem_cache_create("dm_tiercache_run",
					 sizeof(struct tc_run) +
					 (TC_RUN_MAX - 1) * sizeof(struct tc_holder),
					 0, 0, NULL);
	return tc_run_cache ? 0 : -ENOMEM;
}

void tc_run_cache_exit(void)
{
	kmem_cache_destroy(tc_run_cache);
}

/* A run of @n blocks at most (1..TC_RUN_MAX), or NULL: no memory now. */
struct tc_run *tc_run_alloc(unsigned int n)
{
	const gfp_t gfp = GFP_NOWAIT | __GFP_NOWARN;
	struct tc_run *run;

	if (WARN_ON_ONCE(!n || n > TC_RUN_MAX))
		return NULL;
	if (n == TC_RUN_MAX)
		run = kmem_cache_alloc(tc_run_cache, gfp);
	else
		run = kmalloc(struct_size(run, h, n - 1), gfp);
	if (run) {
		run->nr = 0;
		run->full = n == TC_RUN_MAX;
		bitmap_zero(run->record, TC_RUN_MAX);
	}
	return run;
}

void tc_run_free(struct tc_run *run)
{
	if (run && run->full)
		kmem_cache_free(tc_run_cache, run);
	else
		kfree(run);
}

void tc_run_unlock(struct tc_cache *c, struct tc_bio *pb)
{
	unsigned int i;

	for (i = 0; i < pb->run->nr; i++)
		tc_unlock(&c->locks, &pb->run->h[i]);
	tc_run_free(pb->run);
	pb->run = NULL;
}

/*
 * How many blocks may a run from @first take, @n wanted?  From @slot on
 * (TC_SLOT_NONE: a run that fills no slot), no more than the slots left.
 */
unsigned int tc_run_limit(struct tc_cache *c, u64 first, u32 slot, u64 n)
{
	n = min3(n, c->nr_blocks - first, (u64)TC_RUN_MAX);
	if (slot == TC_SLOT_NONE)
		return n;
	return min_t(u64, n, c->nr_slots - slot);
}

/* The run's blocks are in: lock state, and the rest of the bio goes on. */
void tc_run_start(struct tc_cache *c, struct bio *bio, struct tc_bio *pb,
		  u32 slot, unsigned int n)
{
	tc_trim_blocks(c, bio, n);
	pb->iter = bio->bi_iter;
	pb->locked = true;
	pb->slot = slot;
}

/* Send the run to its slots: a DM_MAPIO_* value. */
static int tc_run_remap(struct tc_cache *c, struct bio *bio,
			struct tc_bio *pb)
{
	tc_remap_cache(c, bio, pb);
	return DM_MAPIO_REMAPPED;
}

/* ---- read runs ---- */

/* Read-lock @block if it is still cached in @slot. */
static bool tc_rrun_trylock(struct tc_cache *c, struct tc_holder *h,
			    u64 block, u32 slot)
{
	if (tc_lookup(c, block) != slot ||
	    !tc_trylock(&c->locks, h, block, TC_LK_READ))
		return false;
	/* looked up again under the lock: it may have gone meanwhile */
	if (tc_lookup(c, block) == slot)
		return true;
	tc_unlock(&c->locks, h);
	return false;
}

/*
 * Lock the blocks after @pb's first while they sit in the slots after
 * its slot, @n blocks in all at most.  Returns how many blocks the run
 * holds, the first included.
 */
static unsigned int tc_rrun_lock(struct tc_cache *c, struct tc_bio *pb,
				 unsigned int n)
{
	struct tc_run *run = tc_run_alloc(n);
	unsigned int i;

	if (!run)
		return 1;
	for (i = 1; i < n; i++)
		if (!tc_rrun_trylock(c, &run->h[i - 1], pb->block + i,
				     pb->slot + i))
			break;
	run->nr = i - 1;
	if (!run->nr) {
		tc_run_free(run);
		return 1;
	}
	pb->run = run;
	return i;
}

static bool tc_map_read_run(struct tc_cache *c, struct bio *bio,
			    struct tc_bio *pb)
{
	u64 first = bio->bi_iter.bi_sector >> c->block_shift;
	u64 n = ((bio_end_sector(bio) - 1) >> c->block_shift) - first + 1;
	unsigned int i;
	u32 slot;

	if (c->mode == TC_MODE_PASSTHROUGH || tc_failed(c) ||
	    first + 1 >= c->nr_blocks)
		return false;
	/* unlocked hints first: most bios that are no such run stop here */
	slot = tc_lookup(c, first);
	if (slot == TC_SLOT_NONE || slot + 1 >= c->nr_slots ||
	    tc_lookup(c, first + 1) != slot + 1 ||
	    !tc_rrun_trylock(c, &pb->holder, first, slot))
		return false;
	pb->block = first;
	pb->slot = slot;
	n = tc_rrun_lock(c, pb, tc_run_limit(c, first, slot, n));
	if (n < 2) {
		tc_unlock(&c->locks, &pb->holder);
		return false;
	}
	/* one bio, one count: the device's own read count agrees */
	tc_count(c, TC_S_READ_HIT);
	for (i = 0; i < n; i++)
		tc_touch(c, slot + i);
	tc_run_start(c, bio, pb, slot, n);
	return true;
}

/* Is a block a read hit holds dirty (the cache holds its only copy)? */
bool tc_run_dirty(struct tc_cache *c, struct tc_bio *pb)
{
	unsigned int i, n = pb->run ? pb->run->nr : 0;

	for (i = 0; i <= n; i++)
		if (tc_is_dirty(c, pb->block + i))
			return true;
	return false;
}

/* ---- write runs ---- */

/*
 * May @bio start a write run: whole blocks, and the origin never waited
 * for (a run that the cache device fails goes there at once,
 * tc_wrun_failed()).
 */
static bool tc_wrun_may(struct tc_cache *c, struct bio *bio)
{
	return bio_op(bio) == REQ_OP_WRITE && !READ_ONCE(c->read_only) &&
	       tc_writes_dirty(c) &&
	       !READ_ONCE(c->val[TC_KEY_ORDERED]) && !tc_origin_behind(c) &&
	       !tc_epoch_must_open(&c->ix.ep) &&
	       !(bio->bi_iter.bi_sector & (c->block_sectors - 1)) &&
	       bio_sectors(bio) >= 2 * c->block_sectors;
}

/*
 * A miss joins the run in a fresh dirty slot: @want, if it is free (any
 * slot for the first block: TC_SLOT_NONE).  Recorded in the metadata once
 * written.
 */
static bool tc_wrun_miss(struct tc_cache *c, u64 block, u32 want, u32 *slot)
{
	if (tc_index_tail_full(c))
		return false;
	if (want == TC_SLOT_NONE) {
		if (tc_alloc_slot(c, block, slot))
			return false;
	} else if (tc_alloc_slot_at(c, want)) {
		*slot = want;
	} else {
		return false;
	}
	if (tc_insert(c, *slot, block, true)) {
		tc_free_slot(c, *slot);
		return false;
	}
	return true;
}

/*
 * A hit joins the run if its copy is written in place: no version of the
 * block in writeback (whose request would then need this write's data
 * dropped or carried), no copy on write, no stale clean entry.  A clean
 * copy is recorded dirty once written, as in tc_write().
 */
static bool tc_wrun_hit(struct tc_cache *c, u64 block, u32 s, bool *record)
{
	if (tc_chain_in_wb(c, block) != TC_SLOT_NONE ||
	    tc_epoch_needs_cow(c, s) || tc_stale_clean(c, s))
		return false;
	*record = !tc_slot_dirty(c, s);
	if (tc_mark_dirty(c, s))
		return false;
	tc_touch(c, s);
	return true;
}

/*
 * Block @i of @pb's write run, locked: into slot @want (TC_SLOT_NONE for
 * the first; its slot is then @pb's).  Returns false, having changed
 * nothing, if it cannot join.
 */
static bool tc_wrun_block(struct tc_cache *c, struct tc_bio *pb,
			  unsigned int i, u32 want, bool *hit)
{
	u64 block = pb->block + i;
	u32 s = tc_lookup(c, block);
	bool record = true;

	*hit = s != TC_SLOT_NONE;
	if (*hit) {
		if ((want != TC_SLOT_NONE && s != want) ||
		    !tc_wrun_hit(c, block, s, &record))
			return false;
	} else if (!tc_wrun_miss(c, block, want, &s)) {
		return false;
	}
	if (!i)
		pb->slot = s;
	if (record)
		__set_bit(i, pb->run->record);
	return true;
}

/*
 * Take the blocks after the first (locked, in) in turn while they join,
 * @n blocks in all at most.  Returns how many joined, the first included.
 */
static unsigned int tc_wrun_take(struct tc_cache *c, struct tc_bio *pb,
				 unsigned int n, bool *all_hit)
{
	struct tc_run *run = pb->run;
	unsigned int i;
	bool hit;

	for (i = 1; i < n; i++) {
		struct tc_holder *h = &run->h[i - 1];

		if (!tc_trylock(&c->locks, h, pb->block + i, TC_LK_EXCL))
			break;
		if (!tc_wrun_block(c, pb, i, pb->slot + i, &hit)) {
			tc_unlock(&c->locks, h);
			break;
		}
		run->nr = i;
		*all_hit = *all_hit && hit;
	}
	return i;
}

/*
 * A write of whole blocks in writeback mode: as many of them as form a
 * run go to the cache device as one bio.  Once its first block is in,
 * the run goes, even alone (nothing of it is undone).  A FUA run is
 * written, then completes after a metadata commit, as a one-block FUA
 * write is (TC_ST_FUA in tc_map.c).
 */
static bool tc_map_write_run(struct tc_cache *c, struct bio *bio,
			     struct tc_bio *pb)
{
	u64 first = bio->bi_iter.bi_sector >> c->block_shift;
	u64 n = (bio_end_sector(bio) >> c->block_shift) - first;
	bool all_hit = false;

	if (!tc_wrun_may(c, bio) || first + 1 >= c->nr_blocks ||
	    !tc_trylock(&c->locks, &pb->holder, first, TC_LK_EXCL))
		return false;
	n = min_t(u64, n, TC_RUN_MAX);
	pb->run = tc_run_alloc(n);
	pb->block = first;
	if (!pb->run || !tc_wrun_block(c, pb, 0, TC_SLOT_NONE, &all_hit)) {
		tc_run_free(pb->run);
		pb->run = NULL;
		tc_unlock(&c->locks, &pb->holder);
		return false;
	}
	pb->epoch = min(pb->epoch, tc_epoch_cur(&c->ix.ep));
	n = tc_wrun_take(c, pb, tc_run_limit(c, first, pb->slot, n), &all_hit);
	/* one bio, one count, as a one-block write */
	tc_count(c, all_hit ? TC_S_WRITE_HIT : TC_S_WRITE_MISS);
	tc_flush_check_watermark(c);
	tc_run_start(c, bio, pb, pb->slot, n);
	return true;
}

/* Record the run's fresh and once-clean slots dirty: their data is in. */
void tc_run_record(struct tc_cache *c, struct tc_bio *pb)
{
	unsigned int i;

	for_each_set_bit(i, pb->run->record, pb->run->nr + 1)
		tc_meta_set(c, pb->slot + i, true);
	bitmap_zero(pb->run->record, TC_RUN_MAX);
}

/*
 * Drop blocks of the run from the cache: the slots that were fresh or
 * clean (->record: the origin holds their older data), or once the run's
 * data is durable on the origin, every version of every block (@chain).
 */
static void tc_wrun_drop(struct tc_cache *c, struct tc_bio *pb, bool chain)
{
	unsigned int i;

	for (i = 0; i <= pb->run->nr; i++) {
		u64 block = pb->block + i;

		if ((!chain && !test_bit(i, pb->run->record)) ||
		    tc_lookup(c, block) != pb->slot + i)
			continue;
		if (chain)
			tc_remove_chain(c, block);
		else
			tc_remove(c, pb->slot + i);
	}
}

/*
 * The cache device failed a write run (tc_end_io() took it back): the
 * fresh and clean slots go at once, and the run goes to the origin whole,
 * REQ_FUA.  If the origin may not take it yet (an older epoch is not all
 * there: the policy was changed while the run was in flight), it fails.
 */
void tc_wrun_failed(struct tc_cache *c, struct bio *bio, struct tc_bio *pb)
{
	blk_opf_t opf = REQ_OP_WRITE | REQ_FUA | (bio->bi_opf & REQ_SYNC);

	DMERR_LIMIT("%s: cache device error on a write of blocks %llu-%llu: using the origin",
		    c->name, pb->block, pb->block + pb->run->nr);
	pb->to_cache = false;	/* its end_io must not take it back again */
	tc_wrun_drop(c, pb, false);
	bitmap_zero(pb->run->record, TC_RUN_MAX);
	tc_count(c, TC_S_WRITE_BYPASS);
	bio->bi_iter = pb->iter;
	if (tc_around_waits(c, pb->epoch)) {
		bio->bi_status = BLK_STS_IOERR;
		bio_endio(bio);
		return;
	}
	pb->stage = TC_ST_RUN_DROP;
	pb->status = BLK_STS_OK;
	atomic_set(&pb->pending, 1);
	tc_submit_clone(c, bio, c->origin_bdev, bio->bi_iter.bi_sector, opf);
}

/*
 * The run is durable on the origin: the dirty copies it replaced go.  A
 * FUA run is durable once a commit has recorded that, as for any write
 * around the cache (tc_drop_done()).
 */
void tc_wrun_drop_done(struct tc_cache *c, struct bio *bio,
		       struct tc_bio *pb)
{
	if (!pb->status) {
		tc_wrun_drop(c, pb, true);
		if (tc_around_needs_commit(c, pb) && tc_meta_commit(c))
			pb->status = BLK_STS_IOERR;
	}
	bio->bi_status = pb->status;
	bio_endio(bio);
}

/*
 * A bio that spans blocks: does a run of its first blocks go to the cache
 * device whole, or, for blocks that are not cached, to the origin or into
 * fresh slots whole (tc_miss.c)?  Only in the map function
 * (dm_accept_partial_bio()).
 * Returns false, holding nothing and having changed nothing, if not: the
 * bio is then trimmed to its first block.  If so, @r is the DM_MAPIO_*
 * value for the map function.
 */
bool tc_map_run(struct tc_cache *c, struct bio *bio, struct tc_bio *pb,
		int *r)
{
	if (bio_data_dir(bio) == READ) {
		if (!tc_map_read_run(c, bio, pb))
			return tc_map_miss(c, bio, pb, r);
	} else if (!tc_map_write_run(c, bio, pb)) {
		return tc_map_miss(c, bio, pb, r);
	}
	if (bio_data_dir(bio) == WRITE && pb->fua) {
		pb->stage = TC_ST_FUA;
		tc_queue_io(c, bio);
		*r = DM_MAPIO_SUBMITTED;
		return true;
	}
	*r = tc_run_remap(c, bio, pb);
	return true;
}
