// SPDX-License-Identifier: GPL-2.0
/*
 * dm-tiercache: persistent metadata (format in tc_disk.h).
 *
 * No copy of the entry area is kept in memory.  What each slot's entry
 * should say is two bits per slot (want_valid, want_dirty; the block is the
 * slot's, tc_index.c); a change of them marks the slot's 4 KiB metadata
 * block changed.  A commit
 *   1. flushes the cache device, so every data write that completed before
 *      it is durable,
 *   2. reads the changed blocks, a run of at most 1 MiB at a time, into a
 *      bounce buffer, rewrites the entries that differ from what they
 *      should say, and writes the run back (an entry that is right keeps
 *      the sequence of the commit that wrote it),
 *   3. writes the superblock with the new commit sequence, with
 *      REQ_PREFLUSH | REQ_FUA.
 * Entries carry the sequence of the commit that wrote them; a commit that
 * does not reach step 3 leaves entries the next load ignores.
 *
 * Commits run on REQ_PREFLUSH (the flush bio completes after it), after
 * REQ_FUA writes (which complete after it), every commit_ms while anything
 * changed, on suspend and when the last table goes.
 *
 * A slot that may be dirty on disk (disk_dirty) is not reused until a
 * commit has recorded it otherwise: freeing it parks it (PARKED in its slot
 * word, tc_slots.h).  An entry dropped while its slot may be dirty on disk
 * is stale (tc_meta_stale()): disk_dirty without want_valid, counted.
 *
 * The commit takes the wanted state of one block at a time under the lock
 * (bio completions change it, so it is taken with interrupts off, for 128
 * slots' bits at most; entries are compared and encoded outside it).  The
 * open sequence moves on when the
 * commit starts: an entry whose state changed after that (a *late* change,
 * one bit per slot) is written with the next sequence, so if its block is
 * written by this commit, a load after a crash before the next commit
 * ignores it as uncommitted.  (An entry that a late change brings back to
 * what the disk says already is kept as it is: the same as a rewrite of a
 * dirty block in flight at a crash.)  A block that cannot be read fails
 * the commit: its entries' sequences cannot be rebuilt (a cache device
 * that cannot read its metadata is failing).  The commit, once complete,
 * forgets the disk dirtiness of the entries of its blocks that are wanted
 * clean and did not change since it started: those it wrote clean, or
 * found clean.  An entry changed since (late) stays dirty on disk for the
 * next commit, which its change queued.
 * Changes of an entry never turn a committed dirty entry into one whose
 * loss loses data (see tc_meta_set()).
 *
 * Nothing is written while the device is suspended (the timer is off; a
 * commit with nothing to do does not even flush the cache device) or while
 * the table is read-only.
 *
 * A format writes the superblock and the summary (version 4) only, with a
 * new format generation (tc_disk.h): entries of other generations, and
 * whatever else the entry area holds, read as empty (foreign).  A commit
 * rewrites a foreign entry only when its slot is to hold a block; one that
 * should be empty is right as it is.  Every superblock written is of its
 * layout's version: 4 with a summary (tc_msum.c: before step 2, the
 * summary blocks whose marks change are written with REQ_FUA), 3 without;
 * a cache of version 1 (generation 0) or 2 is upgraded to 3 by its first
 * commit, whose superblock first says so alone (tc_meta_upgrade_sb()).
 */
#include <linux/vmalloc.h>
#include <linux/slab.h>
#include <linux/random.h>

#include "tiercache.h"

#define TC_META_MAX_REPORT	10
/* the commit's bounce buffer: 1 MiB, one bio's worth (tc_meta_rw()) */
#define TC_META_BOUNCE_BLOCKS	(BIO_MAX_VECS - 1)

static void *tc_meta_mblock(void *base, u64 mb)
{
	return (u8 *)base + mb * TC_MBLOCK_BYTES;
}

/* ---- in-memory changes ---- */

/* The wanted state of @slot changed (called with the lock held). */
static void tc_meta_changed(struct tc_cache *c, u32 slot)
{
	struct tc_meta *m = &c->meta;
	u64 mb = slot / TC_ENTRIES_PER_MBLOCK;

	/*
	 * The slot changed in the open sequence: its late bit says so while
	 * the block's late_seq is that sequence (bits of an older one are
	 * stale and forgotten here).  A commit writes an entry changed after
	 * it started with the next sequence (tc_meta_fill_block()).
	 */
	if (m->late_seq[mb] != m->open_seq) {
		bitmap_clear(m->late, mb * TC_ENTRIES_PER_MBLOCK,
			     TC_ENTRIES_PER_MBLOCK);
		m->late_seq[mb] = m->open_seq;
	}
	__set_bit(slot, m->late);
	__set_bit(mb, m->changed);
	m->any_changed = true;
	if (!m->suspended && !delayed_work_pending(&m->timer_work))
		queue_delayed_work(c->wq, &m->timer_work,
			msecs_to_jiffies(READ_ONCE(c->val[TC_KEY_COMMIT_MS])));
}

/*
 * The slot holds (a version of) its block (the one in its slot word, which
 * the entry names); @dirty: newer than the origin.  Callers hold the
 * block's lock, and only holders change a slot's entry: an entry that
 * already says so (a rewrite of a dirty block) is left without taking the
 * metadata lock.
 */
void tc_meta_set(struct tc_cache *c, u32 slot, bool dirty)
{
	struct tc_meta *m = &c->meta;
	unsigned long flags;

	if (test_bit(slot, m->want_valid) &&
	    test_bit(slot, m->want_dirty) == dirty)
		return;
	spin_lock_irqsave(&m->lock, flags);
	/*
	 * A stale slot is not given another block (tc_meta_defer_free()).
	 * If one were, nr_stale is left raised (for good): its entry on disk
	 * names the old block dirty until a commit, and a FUA write around
	 * the cache must not skip that commit (tc_meta_stale()).  Extra
	 * commits are the safe side.
	 */
	WARN_ON_ONCE(!test_bit(slot, m->want_valid) &&
		     test_bit(slot, m->disk_dirty));
	__set_bit(slot, m->want_valid);
	__assign_bit(slot, m->want_dirty, dirty);
	if (dirty && !__test_and_set_bit(slot, m->disk_dirty))
		atomic64_inc(&m->nr_disk_dirty);
	tc_meta_changed(c, slot);
	spin_unlock_irqrestore(&m->lock, flags);
}

/* The slot holds nothing (before it may take another block). */
void tc_meta_clear(struct tc_cache *c, u32 slot)
{
	struct tc_meta *m = &c->meta;
	unsigned long flags;

	spin_lock_irqsave(&m->lock, flags);
	if (test_bit(slot, m->want_valid)) {
		__clear_bit(slot, m->want_valid);
		__clear_bit(slot, m->want_dirty);
		tc_meta_changed(c, slot);
		/* stale now: see tc_meta_stale() */
		if (test_bit(slot, m->disk_dirty))
			atomic_inc(&m->nr_stale);
	}
	spin_unlock_irqrestore(&m->lock, flags);
}

/*
 * May any slot be dirty on disk?  Then a crash would load it: a flush
 * needs a commit (one that records it clean, or makes its data durable).
 */
bool tc_meta_any_disk_dirty(struct tc_cache *c)
{
	return atomic64_read(&c->meta.nr_disk_dirty);
}

/* May the slot be dirty on disk (so it must not take another block)? */
bool tc_meta_disk_dirty(struct tc_cache *c, u32 slot)
{
	return test_bit(slot, c->meta.disk_dirty);
}

/* Freeing @slot: true if it waits for a commit (it stays allocated). */
bool tc_meta_defer_free(struct tc_cache *c, u32 slot)
{
	struct tc_meta *m = &c->meta;
	unsigned long flags;
	bool defer;

	spin_lock_irqsave(&m->lock, flags);
	defer = test_bit(slot, m->disk_dirty);
	if (defer)
		tc_slot_park(c, slot);
	spin_unlock_irqrestore(&m->lock, flags);
	return defer;
}

/*
 * Are entries dropped while the disk may still record them dirty?  Until a
 * commit records them empty, a crash would bring their older data back
 * over anything written to those blocks around the cache.  Counted when
 * the entry is dropped (tc_meta_clear()), not when its slot is freed: the
 * slot may wait for the dirty order or a writeback request first.  A stale
 * slot is one with disk_dirty but not want_valid: it takes no other block
 * before a commit clears disk_dirty (and the count) after_commit.
 */
bool tc_meta_stale(struct tc_cache *c)
{
	return atomic_read(&c->meta.nr_stale);
}

/* Complete @bio (a flush or a FUA write) once a commit has ended. */
void tc_meta_queue_bio(struct tc_cache *c, struct bio *bio)
{
	struct tc_meta *m = &c->meta;
	unsigned long flags;

	spin_lock_irqsave(&m->lock, flags);
	bio_list_add(&m->waiting, bio);
	spin_unlock_irqrestore(&m->lock, flags);
	queue_work(c->wq, &m->commit_work);
}

void tc_meta_kick(struct tc_cache *c)
{
	queue_work(c->wq, &c->meta.commit_work);
}

/* ---- commit ---- */

/* Take the changed blocks for a commit; returns its commit sequence. */
static u64 tc_meta_snapshot(struct tc_meta *m, bool *any)
{
	u64 seq;

	spin_lock_irq(&m->lock);
	*any = m->force_sb || m->any_changed;
	m->force_sb = false;
	m->any_changed = false;
	seq = m->open_seq;
	if (*any) {
		m->open_seq++;
		bitmap_copy(m->snap, m->changed, m->layout.meta_blocks);
		bitmap_zero(m->changed, m->layout.meta_blocks);
	}
	spin_unlock_irq(&m->lock);
	return seq;
}

/*
 * Did slot @s change since the running commit took its block (a late bit
 * of the open sequence: bits of an older one are stale)?  Under the lock.
 */
static bool tc_meta_late(const struct tc_meta *m, u32 s)
{
	return m->late_seq[s / TC_ENTRIES_PER_MBLOCK] == m->open_seq &&
	       test_bit(s, m->late);
}

/*
 * Note what the entries of metadata block @mb should say, with commit
 * sequence @seq (the next one for late changes).  Called with the lock
 * held: bits and blocks only, no checksums.
 */
static void tc_meta_want_block(struct tc_cache *c, u64 mb, u64 seq)
{
	struct tc_meta *m = &c->meta;
	struct tc_meta_want *w = m->want_buf;
	u32 s = mb * TC_ENTRIES_PER_MBLOCK;
	u32 last = min_t(u64, s + TC_ENTRIES_PER_MBLOCK, m->layout.nr_slots);

	for (; s < last; s++, w++) {
		w->valid = test_bit(s, m->want_valid);
		w->dirty = test_bit(s, m->want_dirty);
		w->block = w->valid ? tc_slot_origin(c, s) : 0;
		w->epoch = w->dirty ? (u16)tc_epoch_of(&c->ix.ep, s,
						       m->commit_epoch) : 0;
		w->seq = tc_meta_late(m, s) ? seq + 1 : seq;
	}
}

/*
 * Is entry @d of @slot already what @w says, under format generation
 * @gen?  An entry written by a commit newer than @seq (the one being made)
 * is not: it was left by a commit that did not finish before a load, and
 * would look uncommitted.  An empty slot's entry may be all zero or
 * foreign (another generation's, or leftover bytes): both read as empty.
 */
static bool tc_meta_entry_right(u32 slot, const struct tc_disk_entry *d,
				const struct tc_meta_want *w, u64 seq, u32 gen)
{
	struct tc_de_info info;
	enum tc_de_result r = tc_de_decode(d, slot, U64_MAX, seq, gen,
					   TC_DISK_VERSION, &info);

	if (!w->valid)
		return tc_de_free(r);
	return (r == TC_DE_CLEAN || r == TC_DE_DIRTY_OK) &&
	       info.dirty == w->dirty && info.block == w->block &&
	       info.epoch == w->epoch;
}

/* A dirty entry the commit could not write yet: the next one writes it. */
static void tc_meta_rechange(struct tc_meta *m, u64 mb)
{
	spin_lock_irq(&m->lock);
	__set_bit(mb, m->changed);
	m->any_changed = true;
	spin_unlock_irq(&m->lock);
}

/*
 * Bring metadata block @mb, read into @blk, to what its entries should say
 * (commit sequence @seq): the wanted state is taken under the lock, the
 * entries are compared and encoded outside it.  An entry that is right
 * keeps the sequence that wrote it.
 */
static void tc_meta_fill_block(struct tc_cache *c, u64 mb, void *blk,
			       u64 seq)
{
	struct tc_meta *m = &c->meta;
	struct tc_disk_entry *d = blk;
	struct tc_meta_want *w = m->want_buf;
	u32 s = mb * TC_ENTRIES_PER_MBLOCK;
	u32 last = min_t(u64, s + TC_ENTRIES_PER_MBLOCK, m->layout.nr_slots);
	bool marked = tc_msum_marked(m, mb), dirty = false, held = false;

	spin_lock_irq(&m->lock);
	tc_meta_want_block(c, mb, seq);
	spin_unlock_irq(&m->lock);
	for (; s < last; s++, d++, w++) {
		dirty |= w->dirty;
		if (tc_meta_entry_right(s, d, w, seq, m->gen))
			continue;
		if (w->dirty && !marked) {
			/* changed since the summary was written (late) */
			WARN_ON_ONCE(w->seq == seq);
			held = true;
			continue;
		}
		if (!w->valid)
			tc_de_encode_empty(d);
		else
			tc_de_encode(d, s, w->block, w->dirty, w->seq, m->gen,
				     w->epoch);
	}
	/* past the last slot: the rest of the last block stays as it is */
	tc_msum_note(m, mb, dirty);
	if (held)
		tc_meta_rechange(m, mb);
}

/* A failed commit: its blocks are changed again. */
static void tc_meta_unsnap(struct tc_meta *m)
{
	spin_lock_irq(&m->lock);
	bitmap_or(m->changed, m->changed, m->snap, m->layout.meta_blocks);
	m->any_changed = true;
	spin_unlock_irq(&m->lock);
}

/* One synchronous bio of at most BIO_MAX_VECS pages of @buf. */
static int tc_meta_bio(struct tc_cache *c, void *buf, sector_t sector,
		       size_t bytes, blk_opf_t opf)
{
	unsigned int nr = DIV_ROUND_UP(bytes, PAGE_SIZE);
	size_t off;
	struct bio *bio;
	int r;

	bio = bio_alloc(c->cache_bdev, nr + 1, opf, GFP_NOIO);
	bio->bi_iter.bi_sector = sector;
	for (off = 0; off < bytes; ) {
		void *p = (u8 *)buf + off;
		struct page *pg = is_vmalloc_addr(p) ? vmalloc_to_page(p) :
						       virt_to_page(p);
		size_t len = min_t(size_t, PAGE_SIZE - offset_in_page(p),
				   bytes - off);

		__bio_add_page(bio, pg, len, offset_in_page(p));
		off += len;
	}
	if (is_vmalloc_addr(buf) && op_is_write(opf))
		flush_kernel_vmap_range(buf, bytes);
	r = submit_bio_wait(bio);
	if (is_vmalloc_addr(buf) && !op_is_write(opf))
		invalidate_kernel_vmap_range(buf, bytes);
	bio_put(bio);
	return r;
}

/*
 * Read or write @bytes of a page-aligned buffer, in bios of just under
 * 1 MiB: tc_meta_bio() allocates a vector more than the pages it covers,
 * and more than BIO_MAX_VECS is a BUG() in bvec_alloc().
 */
int tc_meta_rw(struct tc_cache *c, void *buf, sector_t sector,
	       size_t bytes, blk_opf_t opf)
{
	const size_t max = (size_t)(BIO_MAX_VECS - 1) * PAGE_SIZE;
	size_t off, n;
	int r;

	for (off = 0; off < bytes; off += n) {
		n = min(bytes - off, max);
		r = tc_meta_bio(c, (u8 *)buf + off, sector + (off >> 9), n,
				off + n < bytes ? opf & ~(REQ_PREFLUSH | REQ_FUA) :
						  opf);
		if (r)
			return r;
	}
	return 0;
}

/*
 * Copy the run of adjacent snapshot blocks from @mb (at most the bounce
 * buffer's worth) and write it.  Returns the block after the run, or a
 * negative error.
 */
static s64 tc_meta_write_run(struct tc_cache *c, u64 mb, u64 seq)
{
	struct tc_meta *m = &c->meta;
	u64 end = find_next_zero_bit(m->snap, m->layout.meta_blocks, mb);
	sector_t sector = m->layout.meta_start + mb * TC_MBLOCK_SECTORS;
	u64 i;
	int r;

	end = min(end, mb + m->bounce_blocks);
	r = tc_meta_rw(c, m->bounce, sector, (end - mb) * TC_MBLOCK_BYTES,
		       REQ_OP_READ);
	if (r) {
		/* every commit touching these blocks fails until they read */
		DMERR_LIMIT("%s: metadata blocks %llu-%llu unreadable (%d)",
			    c->name, mb, end - 1, r);
		return r;
	}
	for (i = mb; i < end; i++) {
		tc_meta_fill_block(c, i, tc_meta_mblock(m->bounce, i - mb), seq);
		cond_resched();
	}
	r = tc_meta_rw(c, m->bounce, sector, (end - mb) * TC_MBLOCK_BYTES,
		       REQ_OP_WRITE | REQ_SYNC);
	return r ? r : end;
}

/* Write the snapshot's blocks, runs of adjacent ones in one bio. */
static int tc_meta_write_blocks(struct tc_cache *c, u64 seq)
{
	struct tc_meta *m = &c->meta;
	u64 n = m->layout.meta_blocks;
	u64 mb = find_first_bit(m->snap, n);
	s64 next;

	while (mb < n) {
		next = tc_meta_write_run(c, mb, seq);
		if (next < 0)
			return next;
		mb = find_next_bit(m->snap, n, next);
	}
	return 0;
}

static int tc_meta_write_sb(struct tc_cache *c, u64 seq)
{
	struct tc_meta *m = &c->meta;
	struct tc_sb_info i = {
		.layout = m->layout,
		.commit_seq = seq,
		.origin_sectors = m->origin_sectors,
		.gen = m->gen,
		.flags = m->sb_flags,
		.epoch = m->commit_epoch,
	};

	memcpy(i.uuid, m->uuid, sizeof(i.uuid));
	tc_sb_encode(m->sb, &i);
	return tc_meta_rw(c, m->sb, 0, TC_MBLOCK_BYTES,
			  REQ_OP_WRITE | REQ_SYNC | REQ_PREFLUSH | REQ_FUA);
}

/*
 * After a commit, slot @s of one of its blocks: is its entry on disk clean
 * (or empty) for sure?  Yes if it is wanted clean and did not change since
 * the commit started: the commit wrote it so, or found it so.  A change
 * since (a late bit of the open sequence) may have come after the commit
 * took the entry dirty: the next commit, which it queued, decides.  Under
 * the lock.
 */
static bool tc_meta_disk_clean(struct tc_meta *m, u32 s)
{
	return !test_bit(s, m->want_dirty) && !tc_meta_late(m, s);
}

/* After a commit: slot @s is no longer dirty on disk if it can tell. */
static void tc_meta_settle_slot(struct tc_cache *c, u32 s)
{
	struct tc_meta *m = &c->meta;
	bool release = false;

	spin_lock_irq(&m->lock);
	if (test_bit(s, m->disk_dirty) && tc_meta_disk_clean(m, s)) {
		__clear_bit(s, m->disk_dirty);
		atomic64_dec(&m->nr_disk_dirty);
		if (!test_bit(s, m->want_valid))
			atomic_dec(&m->nr_stale);	/* no longer stale */
		release = tc_slot_unpark(c, s);
	}
	spin_unlock_irq(&m->lock);
	if (release)
		tc_free_slot(c, s);
}

/* After a commit: forget disk dirtiness it cleared, free parked slots. */
static void tc_meta_after_commit(struct tc_cache *c)
{
	struct tc_meta *m = &c->meta;
	u64 mb;
	u32 s, first, last;

	for_each_set_bit(mb, m->snap, m->layout.meta_blocks) {
		tc_msum_written(m, mb);
		first = mb * TC_ENTRIES_PER_MBLOCK;
		last = min_t(u64, first + TC_ENTRIES_PER_MBLOCK,
			     m->layout.nr_slots);
		for (s = first; s < last; s++)
			tc_meta_settle_slot(c, s);
		cond_resched();
	}
}

static void tc_meta_end_bios(struct bio_list *bios, int r)
{
	struct bio *bio;

	while ((bio = bio_list_pop(bios))) {
		if (r)
			bio->bi_status = errno_to_blk_status(r);
		bio_endio(bio);
	}
}

/*
 * A commit failed: the metadata on the cache device may no longer say what
 * the cache holds (a block written around the cache since may still be
 * recorded dirty there, with older data).  Mark the superblock
 * (tc_disk.h, TC_SB_FAILED), as one write of its own: the device may take
 * that and fail the rest of a commit.  If it fails too, every later
 * commit's superblock carries the mark.  Under commit_lock.
 */
static void tc_meta_mark_failed(struct tc_cache *c)
{
	struct tc_meta *m = &c->meta;
	int r;

	/* a load that cannot commit is refused: its metadata stands */
	if (!c->meta_loaded || (m->sb_flags & TC_SB_FAILED))
		return;
	m->sb_flags |= TC_SB_FAILED;
	/* the epoch bound of the commit the mark keeps, not the failed one's */
	m->commit_epoch = m->committed_epoch;
	r = tc_meta_write_sb(c, m->committed_seq);
	if (r)
		DMERR("%s: cannot mark the cache device's superblock failed (%d): do not load that device again without 'format'",
		      c->name, r);
	else
		DMINFO("%s: superblock marked failed: the cache device will not be loaded again as it is",
		       c->name);
}

static void tc_meta_floor_moved(struct tc_cache *c);

/*
 * A cache of an earlier format version that a read-only table loaded (a
 * writable one commits at once) still has its old superblock, which reads
 * epoch bits in an entry as corruption.  Before the first commit writes
 * entries of the current version, the superblock says so: the last
 * committed state, in the current format, with its own sequence and
 * epoch (its entries all decode the same under it).  Else a commit torn
 * between its entries and its superblock would leave a cache that no
 * longer loads.
 */
static int tc_meta_upgrade_sb(struct tc_cache *c)
{
	struct tc_meta *m = &c->meta;
	u32 version = tc_disk_layout_version(&m->layout);
	u64 epoch = m->commit_epoch;
	int r;

	if (m->version == version)
		return 0;
	m->commit_epoch = m->committed_epoch;
	r = tc_meta_write_sb(c, m->committed_seq);
	m->commit_epoch = epoch;
	if (!r) {
		m->version = version;
		DMINFO("%s: superblock rewritten in format version %u",
		       c->name, version);
	}
	return r;
}

/*
 * Summary marks wait to be cleared (tc_msum.c): another commit, after
 * commit_ms, or at once if the device is being suspended (the caller
 * commits again).  Under commit_lock.
 */
static void tc_meta_commit_again(struct tc_cache *c)
{
	struct tc_meta *m = &c->meta;
	unsigned long delay;

	if (!tc_msum_pending(m))
		return;
	delay = msecs_to_jiffies(READ_ONCE(c->val[TC_KEY_COMMIT_MS]));
	/* under the lock: a suspend then finds the timer and cancels it */
	spin_lock_irq(&m->lock);
	m->force_sb = true;
	if (!m->suspended)
		queue_delayed_work(c->wq, &m->timer_work, delay);
	spin_unlock_irq(&m->lock);
}

int tc_meta_commit(struct tc_cache *c)
{
	struct tc_meta *m = &c->meta;
	struct bio_list bios;
	bool any;
	u64 seq;
	int r;

	mutex_lock(&m->commit_lock);
	spin_lock_irq(&m->lock);
	bios = m->waiting;
	bio_list_init(&m->waiting);
	any = m->force_sb || m->any_changed;
	spin_unlock_irq(&m->lock);

	if (READ_ONCE(m->read_only) || (!any && bio_list_empty(&bios))) {
		/* read-only: nothing was written; or nothing to do */
		mutex_unlock(&m->commit_lock);
		tc_meta_end_bios(&bios, 0);
		return 0;
	}
	r = blkdev_issue_flush(c->cache_bdev);
	if (!r)
		r = tc_meta_upgrade_sb(c);
	if (!r) {
		/* before the snapshot: every dirty entry it writes is newer */
		m->commit_epoch = tc_epoch_oldest(&c->ix.ep);
		seq = tc_meta_snapshot(m, &any);
		if (any) {
			r = tc_msum_prepare(c);
			if (!r)
				r = tc_meta_write_blocks(c, seq);
			if (!r)
				r = tc_meta_write_sb(c, seq);
			if (r) {
				tc_meta_unsnap(m);
			} else {
				m->committed_seq = seq;
				m->committed_epoch = m->commit_epoch;
				tc_epoch_set_floor(&c->ix.ep, m->commit_epoch);
				atomic64_inc(&m->commits);
				tc_meta_after_commit(c);
				tc_meta_commit_again(c);
			}
		}
	}
	if (r && !m->error) {
		WRITE_ONCE(m->error, r);
		DMERR("%s: metadata commit failed (%d)", c->name, r);
	}
	if (r)
		tc_meta_mark_failed(c);
	mutex_unlock(&m->commit_lock);
	if (r)
		tc_cache_fail(c, r, "metadata commit");
	tc_meta_end_bios(&bios, r);
	/* failed too: a failed cache waits for no epoch bound */
	tc_meta_floor_moved(c);
	return r;
}

/*
 * A commit wrote a new epoch bound, or failed (which latched the failed
 * state): a writeback pass that waited for it goes on, and the flushes
 * and writes that waited for a free epoch try again.
 */
static void tc_meta_floor_moved(struct tc_cache *c)
{
	if (test_and_clear_bit(TC_FL_FLOOR_WAIT, &c->fl.bits))
		tc_flush_kick(c);
	/* under the lock: no parked flush or write misses the new floor */
	tc_epoch_waiters_go(c);
}

/* A writeback pass waits for a commit that moves the epoch bound. */
void tc_meta_commit_floor(struct tc_cache *c)
{
	struct tc_meta *m = &c->meta;

	spin_lock_irq(&m->lock);
	m->force_sb = true;
	spin_unlock_irq(&m->lock);
	tc_meta_kick(c);
}

static void tc_meta_commit_work(struct work_struct *w)
{
	struct tc_meta *m = container_of(w, struct tc_meta, commit_work);

	tc_meta_commit(container_of(m, struct tc_cache, meta));
}

static void tc_meta_timer_work(struct work_struct *w)
{
	struct tc_meta *m = container_of(to_delayed_work(w), struct tc_meta,
					 timer_work);

	tc_meta_commit(container_of(m, struct tc_cache, meta));
}

/* ---- open: format or load ---- */

/* A zeroed bitmap of @bits bits, from vmalloc if large (tc_bigalloc()). */
unsigned long *tc_bitmap_alloc(u64 bits)
{
	return tc_bigalloc(BITS_TO_LONGS(bits), sizeof(unsigned long),
			   GFP_KERNEL | __GFP_ZERO);
}

static int tc_meta_alloc(struct tc_meta *m)
{
	u64 n = m->layout.meta_blocks;

	m->bounce_blocks = min_t(u64, n, TC_META_BOUNCE_BLOCKS);
	m->bounce = vmalloc(m->bounce_blocks * TC_MBLOCK_BYTES);
	/* per-slot and per-block bitmaps: vmalloc, whatever the size */
	m->changed = tc_bitmap_alloc(n);
	m->snap = tc_bitmap_alloc(n);
	m->disk_dirty = tc_bitmap_alloc(m->layout.nr_slots);
	m->want_valid = tc_bitmap_alloc(m->layout.nr_slots);
	m->want_dirty = tc_bitmap_alloc(m->layout.nr_slots);
	/* slots rounded up to whole blocks: late bits are cleared by block */
	m->late = tc_bitmap_alloc(n * TC_ENTRIES_PER_MBLOCK);
	m->late_seq = kvcalloc(n, sizeof(u64), GFP_KERNEL | __GFP_NOWARN);
	m->want_buf = kmalloc_array(TC_ENTRIES_PER_MBLOCK,
				    sizeof(*m->want_buf), GFP_KERNEL);
	if (!m->bounce || !m->changed || !m->snap || !m->disk_dirty ||
	    !m->want_valid || !m->want_dirty || !m->late || !m->late_seq ||
	    !m->want_buf)
		return -ENOMEM;
	return tc_msum_alloc(m);
}

void tc_meta_free(struct tc_cache *c)
{
	struct tc_meta *m = &c->meta;

	vfree(m->bounce);
	kvfree(m->want_valid);
	kvfree(m->want_dirty);
	kvfree(m->late);
	kvfree(m->late_seq);
	kfree(m->want_buf);
	kvfree(m->changed);
	kvfree(m->snap);
	kvfree(m->disk_dirty);
	tc_msum_free(m);
	free_page((unsigned long)m->sb);
	m->bounce = NULL;
	m->sb = NULL;
}

void tc_meta_init(struct tc_cache *c)
{
	struct tc_meta *m = &c->meta;

	spin_lock_init(&m->lock);
	mutex_init(&m->commit_lock);
	bio_list_init(&m->waiting);
	atomic_set(&m->nr_stale, 0);
	INIT_WORK(&m->commit_work, tc_meta_commit_work);
	INIT_DELAYED_WORK(&m->timer_work, tc_meta_timer_work);
	m->suspended = true;	/* until the first resume */
}

/*
 * The last commit before a suspend or the end: and one more if it left
 * summary marks to clear (tc_meta_commit_again()), so that the next load
 * reads only blocks with dirty entries.
 */
static int tc_meta_commit_last(struct tc_cache *c)
{
	struct tc_meta *m = &c->meta;
	bool again;
	int r;

	r = tc_meta_commit(c);
	spin_lock_irq(&m->lock);
	again = m->force_sb;
	spin_unlock_irq(&m->lock);
	if (!r && again)
		r = tc_meta_commit(c);
	return r;
}

/*
 * commit_ms was set: a commit already waiting for its timer waits no
 * longer than the new value from now (a shorter value would otherwise
 * take effect only after a long one ran out).
 */
void tc_meta_commit_ms_changed(struct tc_cache *c)
{
	struct tc_meta *m = &c->meta;
	unsigned long delay = msecs_to_jiffies(READ_ONCE(c->val[TC_KEY_COMMIT_MS]));

	/* under the lock: a suspend then finds the timer and cancels it */
	spin_lock_irq(&m->lock);
	if (!m->suspended && delayed_work_pending(&m->timer_work) &&
	    time_before(jiffies + delay, READ_ONCE(m->timer_work.timer.expires)))
		mod_delayed_work(c->wq, &m->timer_work, delay);
	spin_unlock_irq(&m->lock);
}

/* The device is suspended: commit what changed, then nothing more. */
void tc_meta_suspend(struct tc_cache *c)
{
	struct tc_meta *m = &c->meta;

	spin_lock_irq(&m->lock);
	m->suspended = true;
	spin_unlock_irq(&m->lock);
	cancel_delayed_work_sync(&m->timer_work);
	flush_work(&m->commit_work);
	tc_meta_commit_last(c);
}

void tc_meta_resume(struct tc_cache *c)
{
	struct tc_meta *m = &c->meta;
	bool arm;

	spin_lock_irq(&m->lock);
	m->suspended = false;
	m->read_only = READ_ONCE(c->read_only);
	arm = m->any_changed || m->force_sb;
	spin_unlock_irq(&m->lock);
	if (arm)
		queue_delayed_work(c->wq, &m->timer_work,
			msecs_to_jiffies(READ_ONCE(c->val[TC_KEY_COMMIT_MS])));
}

/* Stop the timer and write what changed: the last table is going. */
int tc_meta_close(struct tc_cache *c)
{
	struct tc_meta *m = &c->meta;

	if (!m->bounce)
		return 0;
	spin_lock_irq(&m->lock);
	m->suspended = true;	/* no timer armed from now */
	spin_unlock_irq(&m->lock);
	cancel_delayed_work_sync(&m->timer_work);
	flush_work(&m->commit_work);
	return tc_meta_commit_last(c);
}

/*
 * The generation of a new format: the one after the generation of the
 * valid superblock @old (its entries, and those of every earlier format,
 * then read as foreign), or a random one if the device holds no valid
 * superblock (@old NULL).  Never 0, the generation of version 1 caches.
 */
static u32 tc_meta_new_gen(const struct tc_sb_info *old)
{
	u32 gen;

	if (old)
		return old->gen + 1 ?: 1;
	do {
		gen = get_random_u32();
	} while (!gen);
	return gen;
}

/*
 * Format: write a superblock of a new generation, with commit sequence 1.
 * The entry area is not touched: what it holds reads as empty.  @old is
 * the valid superblock the device holds, or NULL.
 */
static int tc_meta_format(struct tc_cache *c, const struct tc_sb_info *old,
			  char **error)
{
	struct tc_meta *m = &c->meta;
	int r;

	m->gen = tc_meta_new_gen(old);
	r = tc_msum_format(c);
	if (!r)
		r = tc_meta_write_sb(c, 1);
	if (r) {
		*error = "Cannot format the cache device (write error)";
		DMERR("%s: formatting the cache device failed: %d", c->name, r);
		return r;
	}
	m->committed_seq = 1;
	m->open_seq = 2;
	m->version = TC_DISK_VERSION;
	m->commit_epoch = 0;
	m->committed_epoch = 0;
	DMINFO("%s: formatted the cache device: %llu slots, data from sector %llu, generation %u",
	       c->name, m->layout.nr_slots, m->layout.data_start, m->gen);
	return 0;
}

/* What a load found. */
struct tc_meta_load {
	unsigned int nr_bad;
	unsigned int nr_dirty;
	unsigned int nr_stale;
	u64 nr_read;		/* metadata blocks read and loaded */
	u64 nr_gap;		/* ... read through between them */
};

static void tc_meta_report(struct tc_cache *c, u32 slot, enum tc_de_result r,
			   unsigned int *nr_bad)
{
	if (++*nr_bad <= TC_META_MAX_REPORT)
		DMERR("%s: corrupt metadata entry for slot %u: %s", c->name,
		      slot, tc_de_result_str(r));
}

/*
 * Index one committed dirty block found on disk, a version of @epoch.  A
 * block may be dirty in several slots, one per epoch (tc_disk.h).
 */
static int tc_meta_load_dirty(struct tc_cache *c, u32 slot, u64 block,
			      u64 epoch)
{
	u32 other = tc_lookup(c, block);
	int r;

	r = tc_index_load(c, slot, block, epoch);
	if (r == -EUCLEAN && other != TC_SLOT_NONE)
		DMERR("%s: corrupt metadata: block %llu is dirty in slots %u and %u of one epoch",
		      c->name, block, other, slot);
	else if (r == -EUCLEAN)
		DMERR("%s: corrupt metadata: slot %u's epoch %llu is not live (superblock epoch %llu)",
		      c->name, slot, epoch, c->ix.ep.floor);
	if (r)
		return r;
	if (!__test_and_set_bit(slot, c->meta.disk_dirty))
		atomic64_inc(&c->meta.nr_disk_dirty);
	__set_bit(slot, c->meta.want_valid);
	__set_bit(slot, c->meta.want_dirty);
	return 0;
}

/*
 * Take in one entry found at load; an error ends the load.  @may_dirty:
 * the entry is dirty or uncommitted (the summary keeps its block marked).
 */
static int tc_meta_load_entry(struct tc_cache *c, u32 s,
			      const struct tc_disk_entry *d,
			      struct tc_meta_load *ld, bool *may_dirty)
{
	struct tc_meta *m = &c->meta;
	struct tc_de_info info;
	enum tc_de_result res;
	int r;

	res = tc_de_decode(d, s, c->nr_blocks, m->committed_seq, m->gen,
			   m->version, &info);
	switch (res) {
	case TC_DE_EMPTY:
	case TC_DE_FOREIGN:	/* another generation's, or leftover bytes */
	case TC_DE_CLEAN:
		return 0;
	case TC_DE_UNCOMMITTED:
		/* rewritten empty by the first commit (nothing is wanted) */
		__set_bit(s / TC_ENTRIES_PER_MBLOCK, m->changed);
		ld->nr_stale++;
		*may_dirty = true;
		return 0;
	case TC_DE_DIRTY_OK:
		*may_dirty = true;
		r = tc_meta_load_dirty(c, s, info.block,
				       tc_disk_epoch(c->ix.ep.floor, info.epoch));
		if (r == -EUCLEAN)
			ld->nr_bad++;
		else if (r)
			return r;
		ld->nr_dirty++;
		return 0;
	default:
		*may_dirty = true;
		tc_meta_report(c, s, res, &ld->nr_bad);
		return 0;
	}
}

/* Take in the entries of metadata block @mb, read into @blk. */
static int tc_meta_load_block(struct tc_cache *c, u64 mb, void *blk,
			      struct tc_meta_load *ld)
{
	struct tc_disk_entry *d = blk;
	u64 s = mb * TC_ENTRIES_PER_MBLOCK;
	u64 last = min_t(u64, s + TC_ENTRIES_PER_MBLOCK,
			 c->meta.layout.nr_slots);
	bool may_dirty = false;
	int r;

	for (; s < last; s++, d++) {
		r = tc_meta_load_entry(c, s, d, ld, &may_dirty);
		if (r)
			return r;
	}
	tc_msum_loaded(&c->meta, mb, may_dirty);
	ld->nr_read++;
	return 0;
}

/*
 * Read the entries of the blocks the summary marks (every block without
 * one), a bounce buffer at a time, and index the committed dirty blocks.
 * Entries of a commit that did not finish are rewritten empty by the
 * first commit, before its sequence could make them look committed.
 */
static int tc_meta_load_entries(struct tc_cache *c, char **error)
{
	struct tc_meta *m = &c->meta;
	struct tc_meta_load ld = { };
	u64 mb, end, start;
	int r;

	r = tc_msum_load(c, m->gen);
	if (r)
		goto unreadable;
	for (mb = 0; ; mb = end) {
		end = tc_msum_next_run(m, mb, m->bounce_blocks, &start);
		if (start >= end)
			break;
		r = tc_meta_rw(c, m->bounce,
			       m->layout.meta_start + start * TC_MBLOCK_SECTORS,
			       (end - start) * TC_MBLOCK_BYTES, REQ_OP_READ);
		if (r)
			goto unreadable;
		for (mb = start; mb < end; mb++) {
			void *blk = tc_meta_mblock(m->bounce, mb - start);

			if (!tc_msum_marked(m, mb)) {
				ld.nr_gap++;	/* read through, not loaded */
				continue;
			}
			r = tc_meta_load_block(c, mb, blk, &ld);
			if (r)
				goto nomem;
		}
		cond_resched();
	}
	r = tc_index_load_end(c);
	if (r)
		goto nomem;
	if (ld.nr_bad) {
		*error = "Cache metadata has corrupt entries (see the kernel log; tiercache check)";
		DMERR("%s: %u corrupt metadata entries: refusing to load", c->name,
		      ld.nr_bad);
		return -EUCLEAN;
	}
	m->any_changed |= ld.nr_stale;
	DMINFO("%s: loaded %u dirty blocks (commit %llu), ignored %u uncommitted entries; read %llu of %llu metadata blocks (and %llu between them)",
	       c->name, ld.nr_dirty, m->committed_seq, ld.nr_stale,
	       ld.nr_read, m->layout.meta_blocks, ld.nr_gap);
	return 0;
unreadable:
	*error = "Cannot read the cache metadata";
	return r;
nomem:
	*error = "Cannot allocate the index of the loaded cache";
	return r;
}

/* Does the superblock belong to this table? */
static int tc_meta_check_sb(struct tc_cache *c, const struct tc_sb_info *i,
			    char **error)
{
	struct tc_meta *m = &c->meta;

	if (i->layout.block_sectors != c->block_sectors) {
		*error = "Block size differs from the one the cache was formatted with";
		DMERR("%s: the cache was formatted with %u-sector blocks, the table says %u",
		      c->name, i->layout.block_sectors, c->block_sectors);
		return -EINVAL;
	}
	if (i->layout.nr_slots != m->layout.nr_slots) {
		*error = "Cache device size differs from the formatted size";
		DMERR("%s: the cache was formatted for %llu slots, the device holds %llu",
		      c->name, i->layout.nr_slots, m->layout.nr_slots);
		return -EINVAL;
	}
	if (i->origin_sectors != m->origin_sectors) {
		*error = "The cache belongs to an origin of another size";
		DMERR("%s: the cache was formatted for an origin of %llu sectors, the table maps %llu",
		      c->name, i->origin_sectors, m->origin_sectors);
		return -EINVAL;
	}
	if (i->uuid[0] && m->uuid[0] && strcmp(i->uuid, m->uuid)) {
		*error = "The cache belongs to another device (uuid differs)";
		DMERR("%s: the cache belongs to device uuid '%s', this one is '%s'",
		      c->name, i->uuid, m->uuid);
		return -EINVAL;
	}
	return 0;
}

static int tc_meta_load(struct tc_cache *c, struct tc_target *t,
			const struct tc_sb_info *i, char **error)
{
	struct tc_meta *m = &c->meta;
	int r;

	r = tc_meta_check_sb(c, i, error);
	if (r)
		return r;
	m->committed_seq = i->commit_seq;
	m->open_seq = i->commit_seq + 1;
	m->gen = i->gen;
	m->version = i->version;
	m->commit_epoch = i->epoch;
	m->committed_epoch = i->epoch;
	tc_epoch_load_begin(&c->ix.ep, i->epoch);
	r = tc_meta_load_entries(c, error);
	if (r)
		return r;
	/* refused before the load's commit: a refusal writes nothing */
	if (t->args.mode == TC_MODE_PASSTHROUGH && tc_nr_dirty(c)) {
		*error = "Passthrough refused: the cache device holds dirty blocks (load it in writeback mode and flush first)";
		return -EBUSY;
	}
	/* keep the stored identity unless this table names one */
	if (!m->uuid[0])
		memcpy(m->uuid, i->uuid, sizeof(m->uuid));
	m->force_sb = true;	/* a new sequence before any IO */
	if (i->version != tc_disk_layout_version(&m->layout))
		DMINFO("%s: metadata of format version %u: version %u from the first commit",
		       c->name, i->version, tc_disk_layout_version(&m->layout));
	if (t->read_only)
		return 0;	/* written when a writable table resumes */
	r = tc_meta_commit(c);
	if (r)
		*error = "Cannot write the cache metadata";
	return r;
}

static bool tc_layout_equal(const struct tc_layout *a,
			    const struct tc_layout *b)
{
	return a->block_sectors == b->block_sectors &&
	       a->nr_slots == b->nr_slots && a->meta_start == b->meta_start &&
	       a->meta_blocks == b->meta_blocks &&
	       a->sum_start == b->sum_start &&
	       a->sum_blocks == b->sum_blocks &&
	       a->data_start == b->data_start;
}

/*
 * tc_meta_count_dirty() of a cache of the layout about to be written, with
 * a summary: only the blocks it marks.
 */
static int tc_meta_count_marked(struct tc_cache *c, const struct tc_sb_info *i,
				u64 *dirty)
{
	struct tc_meta *m = &c->meta;
	struct tc_disk_entry *buf = m->bounce;
	struct tc_de_info info;
	u64 mb, end, start, s, last;
	int r;

	r = tc_msum_load(c, i->gen);
	for (mb = 0; !r; mb = end) {
		end = tc_msum_next_run(m, mb, m->bounce_blocks, &start);
		if (start >= end)
			break;
		r = tc_meta_rw(c, buf, m->layout.meta_start +
			       start * TC_MBLOCK_SECTORS,
			       (end - start) * TC_MBLOCK_BYTES, REQ_OP_READ);
		s = start * TC_ENTRIES_PER_MBLOCK;
		last = min_t(u64, end * TC_ENTRIES_PER_MBLOCK,
			     m->layout.nr_slots);
		for (; s < last && !r; s++)
			if (tc_msum_marked(m, s / TC_ENTRIES_PER_MBLOCK) &&
			    tc_de_decode(buf + s - start * TC_ENTRIES_PER_MBLOCK,
					 s, U64_MAX, i->commit_seq, i->gen,
					 i->version, &info) == TC_DE_DIRTY_OK)
				(*dirty)++;
		cond_resched();
	}
	/* that summary was the old generation's */
	tc_msum_reset(m);
	return r;
}

/*
 * Count the committed dirty entries of a cache about to be formatted, in
 * the layout and generation its superblock @i describes.
 */
static int tc_meta_count_dirty(struct tc_cache *c, const struct tc_sb_info *i,
			       u64 *dirty)
{
	const u64 per_chunk = TC_ENTRIES_PER_MBLOCK * c->meta.bounce_blocks;
	const struct tc_layout *l = &i->layout;
	struct tc_disk_entry *buf = c->meta.bounce;
	struct tc_de_info info;
	u64 s, k, n;
	int r = 0;

	*dirty = 0;
	if (l->data_start + l->nr_slots * l->block_sectors >
	    bdev_nr_sectors(c->cache_bdev))
		return 0;	/* cannot be this device's: nothing to lose */
	if (l->sum_blocks && tc_layout_equal(l, &c->meta.layout))
		return tc_meta_count_marked(c, i, dirty);
	for (s = 0; s < l->nr_slots && !r; s += per_chunk) {
		n = min(per_chunk, l->nr_slots - s);
		r = tc_meta_rw(c, buf, l->meta_start + s * sizeof(*buf) / 512,
			       round_up(n * sizeof(*buf), TC_MBLOCK_BYTES),
			       REQ_OP_READ);
		for (k = 0; k < n && !r; k++)
			if (tc_de_decode(buf + k, s + k, U64_MAX, i->commit_seq,
					 i->gen, i->version, &info) ==
			    TC_DE_DIRTY_OK)
				(*dirty)++;
		cond_resched();
	}
	return r;
}

/*
 * "format" over a valid superblock: only of the same geometry (another one
 * may describe entries this device no longer has, or a device that grew:
 * the module does not guess), and only if no dirty data would be lost.
 */
static int tc_meta_may_format(struct tc_cache *c, const struct tc_sb_info *i,
			      char **error)
{
	struct tc_layout same;
	u64 dirty;
	int r;

	/* this device, in the layout of the superblock's version */
	if (tc_disk_layout_v(bdev_nr_sectors(c->cache_bdev), c->block_sectors,
			     i->version, &same) ||
	    !tc_layout_equal(&i->layout, &same)) {
		*error = "Cache superblock of another geometry: 'format' refused (check it with tiercache check, then wipe it)";
		DMERR("%s: format refused: the cache was formatted for %llu slots of %u sectors, this device holds %llu of %u in that format version",
		      c->name, i->layout.nr_slots, i->layout.block_sectors,
		      same.nr_slots, c->block_sectors);
		return -EBUSY;
	}
	if (i->flags & TC_SB_FAILED) {
		/* its dirty blocks were given up when it failed */
		DMINFO("%s: formatting a cache device marked failed", c->name);
		return 0;
	}
	r = tc_meta_count_dirty(c, i, &dirty);
	if (r) {
		*error = "Cannot read the cache metadata";
		return r;
	}
	if (dirty) {
		*error = "Cache device holds dirty blocks: 'format' refused (load it without 'format', or write them back first)";
		DMERR("%s: format refused: the cache device holds %llu committed dirty blocks: load it without 'format', or write them back first ('tiercache writeback')",
		      c->name, dirty);
		return -EBUSY;
	}
	return 0;
}

/*
 * Read the superblock and take the layout it implies, before anything is
 * sized by the slot count (c->nr_slots): a cache of version 1 to 3 keeps
 * its own (no summary); a format, or a device without a valid superblock,
 * gets the current one.
 */
int tc_meta_read_sb(struct tc_cache *c, struct tc_target *t, char **error)
{
	struct tc_meta *m = &c->meta;
	sector_t size = bdev_nr_sectors(c->cache_bdev);
	int r;

	m->sb = (void *)get_zeroed_page(GFP_KERNEL);
	if (!m->sb) {
		*error = "Cannot allocate the metadata state";
		return -ENOMEM;
	}
	r = tc_meta_rw(c, m->sb, 0, TC_MBLOCK_BYTES, REQ_OP_READ);
	if (r) {
		*error = "Cannot read the cache superblock";
		return r;
	}
	m->sb_res = tc_sb_decode(m->sb, &m->sb_info);
	r = tc_disk_layout(size, c->block_sectors, &m->layout);
	if (!r && m->sb_res == TC_SB_OK && !t->args.format &&
	    !m->sb_info.layout.sum_blocks)
		r = tc_disk_layout_v(size, c->block_sectors,
				     m->sb_info.version, &m->layout);
	if (r || m->layout.nr_slots < TC_MIN_SLOTS) {
		*error = "The cache device is too small";
		DMERR("%s: the cache device holds %llu slots in its layout, at least %u needed",
		      c->name, r ? 0 : m->layout.nr_slots, TC_MIN_SLOTS);
		return -EINVAL;
	}
	c->nr_slots = m->layout.nr_slots;
	return 0;
}

/*
 * Set up the metadata of a new cache state (superblock read by
 * tc_meta_read_sb()): format (if asked and safe) or load.  Nothing is
 * written on a refusal.
 */
int tc_meta_open(struct tc_cache *c, struct tc_target *t, char **error)
{
	struct tc_meta *m = &c->meta;
	struct mapped_device *md = dm_table_get_md(t->ti->table);
	const struct tc_sb_info *i = &m->sb_info;
	enum tc_sb_result res = m->sb_res;
	char name[DM_NAME_LEN];
	int r;

	BUILD_BUG_ON(sizeof(struct tc_disk_sb) != 512);
	BUILD_BUG_ON(sizeof(struct tc_disk_entry) != 32);
	BUILD_BUG_ON(offsetof(struct tc_disk_sb, gen) != 192);
	BUILD_BUG_ON(TC_MBLOCK_BYTES > PAGE_SIZE);

	m->origin_sectors = c->target_len;
	m->read_only = t->read_only;
	if (dm_copy_name_and_uuid(md, name, m->uuid))
		m->uuid[0] = 0;
	r = tc_meta_alloc(m);
	if (r) {
		*error = "Cannot allocate the metadata state";
		return r;
	}
	if (t->args.format && t->read_only) {
		*error = "A read-only table cannot format the cache device";
		return -EROFS;
	}
	if (res == TC_SB_OK && t->args.format)
		r = tc_meta_may_format(c, i, error);
	if (res == TC_SB_BAD_VERSION && t->args.format) {
		/* perhaps a newer module's cache, with dirty data */
		*error = "Cache superblock of an unknown format version: 'format' refused (wipe the superblock to start anew)";
		r = -EBUSY;
	}
	if (r)
		return r;
	if (res == TC_SB_OK && !t->args.format && (i->flags & TC_SB_FAILED)) {
		*error = "The cache device failed earlier (its superblock is marked failed): its dirty blocks may be older than the origin; format it (tiercache writeback --force writes them back offline)";
		DMERR("%s: the cache device's superblock is marked failed: load refused",
		      c->name);
		return -EINVAL;
	}
	if (res == TC_SB_OK && !t->args.format)
		return tc_meta_load(c, t, i, error);
	if (t->args.format)
		return tc_meta_format(c, res == TC_SB_OK ? i : NULL, error);
	if (res == TC_SB_BLANK)
		*error = "No tiercache superblock on the cache device: add the 'format' feature argument to create a new cache";
	else
		*error = "Cache superblock unusable (see the kernel log; tiercache check)";
	DMERR("%s: cache device: %s", c->name, tc_sb_result_str(res));
	return -EINVAL;
}
