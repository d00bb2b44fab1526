// SPDX-License-Identifier: GPL-2.0
/*
 * dm-tiercache: runs of blocks that are not cached.
 *
 * tc_map() trims a bio that spans blocks to its first block unless a run
 * of its first blocks can go whole.  tc_run.c sends runs of cached blocks
 * (and of writes in writeback mode) to the cache device; here, runs of
 * blocks the cache does not hold go whole too, so that a slow origin gets
 * the bio's size and not one request per block:
 *
 *  - A promotion run: a read of whole blocks, none of them cached, that
 *    may fill slots fills consecutive ones (1 MiB and a sixteenth of the
 *    slots at most).  The origin is read once into
 *    a buffer of the target's own, the reader is served from it, and the
 *    slots are written with one bio and indexed clean (TC_ST_PROMOTE in
 *    tc_map.c).  Each block is locked exclusively, as a one-block
 *    promotion is.  When no slot is free, the slot after the run's last
 *    one is taken over if the CLOCK would reclaim it now
 *    (tc_alloc_slot_at()).
 *  - A run around the cache: blocks that are not cached and will not be
 *    go to the origin as one bio.  A read that fills no slot (passthrough,
 *    a read-only table, a failed cache, no slot for its first block: none
 *    free and none the CLOCK can reclaim), each block read-locked; a write that makes no block dirty (writethrough,
 *    passthrough, the cleaner, a table being loaded), each block locked
 *    exclusively, and only while no older epoch is due at the origin.
 *
 * As in tc_run.c nothing waits: locks are only tried, and a block that
 * cannot join ends the run there.  A run may hold its first block alone:
 * the one-block path would do the same with it.
 */
#include "tiercache.h"

/* most bytes a promotion run reads into its buffer at once */
#define TC_PROMOTE_MAX_BYTES	(1U << 20)

/*
 * Most blocks a promotion run takes: 1 MiB, and a sixteenth of the slots
 * (its slots can be had by nobody else until it completes).
 */
static u64 tc_promote_max(struct tc_cache *c)
{
	return max(min(TC_PROMOTE_MAX_BYTES / tc_block_bytes(c),
		       c->nr_slots / 16), 1U);
}

/* May a read miss fill a slot (as tc_read() decides for one block)? */
static bool tc_may_promote(struct tc_cache *c)
{
	return c->mode != TC_MODE_PASSTHROUGH && !READ_ONCE(c->read_only) &&
	       !tc_failed(c);
}

/* Lock @block (@mode) if it is not cached. */
static bool tc_miss_trylock(struct tc_cache *c, struct tc_holder *h,
			    u64 block, enum tc_lock_mode mode)
{
	if (tc_lookup(c, block) != TC_SLOT_NONE ||
	    !tc_trylock(&c->locks, h, block, mode))
		return false;
	/* looked up again under the lock: a promotion may have filled it */
	if (tc_lookup(c, block) == TC_SLOT_NONE)
		return true;
	tc_unlock(&c->locks, h);
	return false;
}

/*
 * Lock the blocks after @pb's first (locked) while they are not cached,
 * and for a promotion (@promote) while the slot after the last one can be
 * had; @n blocks in all at most.  Returns how many joined, the first
 * included.
 */
static unsigned int tc_miss_take(struct tc_cache *c, struct tc_bio *pb,
				 unsigned int n, enum tc_lock_mode mode,
				 bool promote)
{
	struct tc_run *run = pb->run;
	unsigned int i;

	for (i = 1; i < n; i++) {
		struct tc_holder *h = &run->h[i - 1];

		if (!tc_miss_trylock(c, h, pb->block + i, mode))
			break;
		if (promote && !tc_alloc_slot_at(c, pb->slot + i)) {
			tc_unlock(&c->locks, h);
			break;
		}
		run->nr = i;
	}
	return i;
}

/*
 * @pb holds its first block (and its slot, for a promotion): take the
 * blocks after it, @n in all at most, and trim @bio to them.
 */
static void tc_miss_run(struct tc_cache *c, struct bio *bio,
			struct tc_bio *pb, unsigned int n,
			enum tc_lock_mode mode, bool promote)
{
	pb->run = n > 1 ? tc_run_alloc(n) : NULL;
	if (!pb->run) {
		n = 1;		/* no memory: the first block alone */
	} else {
		n = tc_miss_take(c, pb, n, mode, promote);
		if (!pb->run->nr) {
			tc_run_free(pb->run);
			pb->run = NULL;
		}
	}
	tc_run_start(c, bio, pb, pb->slot, n);
}

/* The blocks of @bio from its first, @whole ones only or every one. */
static u64 tc_bio_blocks(struct tc_cache *c, struct bio *bio, bool whole)
{
	u64 first = bio->bi_iter.bi_sector >> c->block_shift;

	if (whole)
		return (bio_end_sector(bio) >> c->block_shift) - first;
	return ((bio_end_sector(bio) - 1) >> c->block_shift) - first + 1;
}

/*
 * A read whose first block is not cached: a promotion run if it may fill
 * slots and its first block gets one, else a run around the cache.
 * Returns false, holding nothing, if its first block is cached or cannot
 * be locked now (the one-block path then waits for it); else @r is the
 * DM_MAPIO_* value for the map function.
 */
static bool tc_map_read_miss(struct tc_cache *c, struct bio *bio,
			     struct tc_bio *pb, int *r)
{
	u64 first = bio->bi_iter.bi_sector >> c->block_shift;
	bool promote = tc_may_promote(c);
	enum tc_lock_mode mode = promote ? TC_LK_EXCL : TC_LK_READ;
	u64 n;

	/*
	 * A part of a block is not promoted: it goes alone (the one-block
	 * path), and the rest of the bio comes back from a block boundary.
	 */
	if (promote && (bio->bi_iter.bi_sector & (c->block_sectors - 1)))
		return false;
	if (first >= c->nr_blocks ||
	    !tc_miss_trylock(c, &pb->holder, first, mode))
		return false;
	pb->block = first;
	pb->slot = TC_SLOT_NONE;
	/* no slot for the first block: none of them fills one */
	if (promote && tc_alloc_slot(c, first, &pb->slot)) {
		pb->slot = TC_SLOT_NONE;
		promote = false;
	}
	n = tc_bio_blocks(c, bio, promote);
	if (promote)
		n = min_t(u64, n, tc_promote_max(c));
	tc_count(c, TC_S_READ_MISS);	/* one bio, one count */
	tc_miss_run(c, bio, pb, tc_run_limit(c, first, pb->slot, n),
		    promote ? TC_LK_EXCL : TC_LK_READ, promote);
	if (promote) {
		pb->stage = TC_ST_PROMOTE;
		tc_queue_io(c, bio);
		*r = DM_MAPIO_SUBMITTED;
	} else {
		bio_set_dev(bio, c->origin_bdev);
		*r = DM_MAPIO_REMAPPED;
	}
	return true;
}

/*
 * May a write go around the cache as a run: it makes no block dirty, and
 * no older epoch is due at the origin before it (checked again under the
 * first block's lock).
 */
static bool tc_around_may(struct tc_cache *c, struct bio *bio)
{
	return bio_op(bio) == REQ_OP_WRITE && !READ_ONCE(c->read_only) &&
	       !tc_failed(c) && !tc_writes_dirty(c) &&
	       !tc_epoch_must_open(&c->ix.ep) && !tc_origin_behind(c);
}

/*
 * A write whose first block is not cached, while writes make no block
 * dirty: the blocks that are not cached go to the origin as one bio.
 * Returns false, holding nothing, if it cannot (the one-block path then
 * takes its first block); else @r is the DM_MAPIO_* value.
 */
static bool tc_map_write_around(struct tc_cache *c, struct bio *bio,
				struct tc_bio *pb, int *r)
{
	u64 first = bio->bi_iter.bi_sector >> c->block_shift;

	if (!tc_around_may(c, bio) || first >= c->nr_blocks ||
	    !tc_miss_trylock(c, &pb->holder, first, TC_LK_EXCL))
		return false;
	if (tc_origin_behind(c)) {
		tc_unlock(&c->locks, &pb->holder);
		return false;
	}
	pb->block = first;
	pb->slot = TC_SLOT_NONE;
	pb->epoch = min(pb->epoch, tc_epoch_cur(&c->ix.ep));
	/* one bio, one count, as a one-block write miss */
	tc_count(c, TC_S_WRITE_MISS);
	if (c->mode == TC_MODE_PASSTHROUGH)
		tc_count(c, TC_S_WRITE_BYPASS);
	tc_miss_run(c, bio, pb,
		    tc_run_limit(c, first, TC_SLOT_NONE,
				 tc_bio_blocks(c, bio, false)),
		    TC_LK_EXCL, false);
	if (tc_around_needs_commit(c, pb)) {
		pb->stage = TC_ST_AROUND_FUA;
		tc_queue_io(c, bio);
		*r = DM_MAPIO_SUBMITTED;
		return true;
	}
	bio_set_dev(bio, c->origin_bdev);
	*r = DM_MAPIO_REMAPPED;
	return true;
}

/*
 * A bio that spans blocks and is no run of tc_run.c: does a run of its
 * first blocks that are not cached go whole?  Only in the map function.
 * Returns false, holding nothing and having changed nothing, if not.
 */
bool tc_map_miss(struct tc_cache *c, struct bio *bio, struct tc_bio *pb,
		 int *r)
{
	if (bio_data_dir(bio) == READ)
		return tc_map_read_miss(c, bio, pb, r);
	return tc_map_write_around(c, bio, pb, r);
}
