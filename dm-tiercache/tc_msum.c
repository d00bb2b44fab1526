// SPDX-License-Identifier: GPL-2.0
/*
 * dm-tiercache: the metadata summary (format version 4, tc_disk.h).
 *
 * One bit per 4 KiB metadata block, "may hold a dirty entry", so that a
 * load reads the summary and then only the marked blocks.  The rule kept
 * here: a metadata block that holds a dirty entry of ours, committed or
 * not, is marked in a summary block that was durable before that entry
 * was written.  So, in each commit (under commit_lock):
 *   1. tc_msum_prepare(), after the snapshot and before any entry is
 *      written: a block of the snapshot that should hold a dirty entry is
 *      marked; a marked block whose last complete write left it with no
 *      dirty entry, and which should hold none now, is cleared; the
 *      summary blocks that changed are written with REQ_FUA;
 *   2. tc_meta_fill_block() never writes a dirty entry into an unmarked
 *      block (only a change made after step 1 can ask for one: it waits
 *      for the next commit, whose step 1 marks the block);
 *   3. once the commit is complete, tc_msum_written() notes the blocks it
 *      wrote with no dirty entry: the next commit may clear them.
 * Clearing a bit in the commit that wrote its block clean would be wrong:
 * a crash before its superblock leaves the previous commit's dirty
 * entries on disk, unmarked.
 *
 * A format writes every summary block, all clear, in its generation
 * (tc_msum_format()), so a block that does not decode as this
 * generation's is torn or damaged: it reads as all set.
 *
 * Memory: three bits per metadata block (128 slots) and one per summary
 * block.  Caches of versions 1 to 3 have no summary (sum_blocks 0): every
 * function here is then a no-op, and a load reads every block.
 */
#include <linux/bitmap.h>
#include <linux/slab.h>

#include "tiercache.h"

/* unmarked metadata blocks a load reads through rather than seek over */
#define TC_MSUM_BRIDGE	32

int tc_msum_alloc(struct tc_meta *m)
{
	u64 n = m->layout.meta_blocks;

	if (!m->layout.sum_blocks)
		return 0;
	m->sum = tc_bitmap_alloc(n);
	m->sum_clear = tc_bitmap_alloc(n);
	m->sum_nodirty = tc_bitmap_alloc(n);
	m->sum_write = tc_bitmap_alloc(m->layout.sum_blocks);
	if (!m->sum || !m->sum_clear || !m->sum_nodirty || !m->sum_write)
		return -ENOMEM;
	return 0;
}

void tc_msum_free(struct tc_meta *m)
{
	kvfree(m->sum);
	kvfree(m->sum_clear);
	kvfree(m->sum_nodirty);
	kvfree(m->sum_write);
	m->sum = NULL;
	m->sum_clear = NULL;
	m->sum_nodirty = NULL;
	m->sum_write = NULL;
}

/* May metadata block @mb hold dirty entries (may the commit write one)? */
bool tc_msum_marked(struct tc_meta *m, u64 mb)
{
	return !m->layout.sum_blocks || test_bit(mb, m->sum);
}

/* Should a slot of metadata block @mb be dirty on disk?  Under the lock. */
static bool tc_msum_wants_dirty(struct tc_meta *m, u64 mb)
{
	u64 first = mb * TC_ENTRIES_PER_MBLOCK;
	u64 last = min_t(u64, first + TC_ENTRIES_PER_MBLOCK,
			 m->layout.nr_slots);

	return find_next_bit(m->want_dirty, last, first) < last;
}

static void tc_msum_assign(struct tc_meta *m, u64 mb, bool mark)
{
	if (test_bit(mb, m->sum) == mark)
		return;
	__assign_bit(mb, m->sum, mark);
	__set_bit(mb / TC_SUM_BITS, m->sum_write);
}

/* Step 1a: mark the blocks of the snapshot that will get a dirty entry. */
static void tc_msum_mark(struct tc_meta *m)
{
	u64 mb, n = m->layout.meta_blocks;
	bool dirty;

	for_each_set_bit(mb, m->snap, n) {
		if (test_bit(mb, m->sum))
			continue;
		spin_lock_irq(&m->lock);
		dirty = tc_msum_wants_dirty(m, mb);
		spin_unlock_irq(&m->lock);
		if (dirty)
			tc_msum_assign(m, mb, true);
		cond_resched();
	}
}

/*
 * Step 1b: clear the marked blocks whose last complete write left no
 * dirty entry, unless a slot of theirs should be dirty again.
 */
static void tc_msum_unmark(struct tc_meta *m)
{
	u64 mb, n = m->layout.meta_blocks;
	bool dirty;

	m->sum_pending = false;
	for_each_set_bit(mb, m->sum_clear, n) {
		__clear_bit(mb, m->sum_clear);
		if (!test_bit(mb, m->sum))
			continue;
		spin_lock_irq(&m->lock);
		dirty = tc_msum_wants_dirty(m, mb);
		spin_unlock_irq(&m->lock);
		if (!dirty)
			tc_msum_assign(m, mb, false);
		cond_resched();
	}
}

/* Encode summary block @k from the bits in memory into @blk. */
static void tc_msum_encode(struct tc_meta *m, u64 k, struct tc_disk_sum *blk)
{
	u64 first = k * TC_SUM_BITS;
	u64 last = min_t(u64, first + TC_SUM_BITS, m->layout.meta_blocks);
	u64 mb;

	memset(blk, 0, sizeof(*blk));
	for (mb = find_next_bit(m->sum, last, first); mb < last;
	     mb = find_next_bit(m->sum, last, mb + 1))
		tc_sum_set(blk, mb - first);
	tc_sum_seal(blk, k, m->gen);
}

/* Step 1c: write the summary blocks that changed, each durable (FUA). */
static int tc_msum_write(struct tc_cache *c)
{
	struct tc_meta *m = &c->meta;
	u64 k;
	int r;

	for_each_set_bit(k, m->sum_write, m->layout.sum_blocks) {
		tc_msum_encode(m, k, m->bounce);
		r = tc_meta_rw(c, m->bounce,
			       m->layout.sum_start + k * TC_MBLOCK_SECTORS,
			       TC_MBLOCK_BYTES,
			       REQ_OP_WRITE | REQ_SYNC | REQ_FUA);
		if (r) {
			DMERR_LIMIT("%s: metadata summary block %llu: write error %d",
				    c->name, k, r);
			return r;	/* still to write: the commit fails */
		}
		__clear_bit(k, m->sum_write);
	}
	return 0;
}

/* Step 1, before the commit writes any entry (under commit_lock). */
int tc_msum_prepare(struct tc_cache *c)
{
	struct tc_meta *m = &c->meta;

	if (!m->layout.sum_blocks)
		return 0;
	tc_msum_mark(m);
	tc_msum_unmark(m);
	return tc_msum_write(c);
}

/*
 * What the running commit writes into metadata block @mb: @dirty, some
 * entry dirty (or left dirty); else none.  Under commit_lock.
 */
void tc_msum_note(struct tc_meta *m, u64 mb, bool dirty)
{
	if (m->layout.sum_blocks)
		__assign_bit(mb, m->sum_nodirty, !dirty);
}

/* Step 3: the commit is complete; its block @mb may be cleared next. */
void tc_msum_written(struct tc_meta *m, u64 mb)
{
	if (m->layout.sum_blocks && test_bit(mb, m->sum_nodirty) &&
	    test_bit(mb, m->sum)) {
		__set_bit(mb, m->sum_clear);
		m->sum_pending = true;
	}
}

/*
 * Are marks waiting to be cleared?  Then another commit clears them (the
 * caller arranges one), so that the next load does not read blocks that
 * hold no dirty entry.  Under commit_lock.
 */
bool tc_msum_pending(struct tc_meta *m)
{
	return m->sum_pending;
}

/* ---- load ---- */

/* Take summary block @k as decoded under generation @gen into m->sum. */
static void tc_msum_take(struct tc_cache *c, u64 k,
			 const struct tc_disk_sum *blk, u32 gen)
{
	struct tc_meta *m = &c->meta;
	u64 first = k * TC_SUM_BITS;
	u64 last = min_t(u64, first + TC_SUM_BITS, m->layout.meta_blocks);
	enum tc_sum_result r = tc_sum_decode(blk, k, gen);
	u64 mb;

	if (r != TC_SUM_OK) {
		DMWARN_LIMIT("%s: metadata summary block %llu: %s", c->name, k,
			     tc_sum_result_str(r));
		bitmap_set(m->sum, first, last - first);
		return;
	}
	for (mb = first; mb < last; mb++)
		if (tc_sum_test(blk, mb - first))
			__set_bit(mb, m->sum);
}

/*
 * Read the summary written under generation @gen into m->sum (a load, or
 * the count of dirty entries before a format of the same layout).
 */
int tc_msum_load(struct tc_cache *c, u32 gen)
{
	struct tc_meta *m = &c->meta;
	u64 k, n, i;
	int r;

	if (!m->layout.sum_blocks)
		return 0;
	bitmap_zero(m->sum, m->layout.meta_blocks);
	for (k = 0; k < m->layout.sum_blocks; k += n) {
		n = min(m->bounce_blocks, m->layout.sum_blocks - k);
		r = tc_meta_rw(c, m->bounce,
			       m->layout.sum_start + k * TC_MBLOCK_SECTORS,
			       n * TC_MBLOCK_BYTES, REQ_OP_READ);
		if (r)
			return r;
		for (i = 0; i < n; i++)
			tc_msum_take(c, k + i, (struct tc_disk_sum *)
				     ((u8 *)m->bounce + i * TC_MBLOCK_BYTES),
				     gen);
		cond_resched();
	}
	return 0;
}

/*
 * The next run of metadata blocks a load reads, from @mb: [*start, end),
 * at most @max blocks, from a marked block to the end of a marked one.
 * Gaps of at most TC_MSUM_BRIDGE unmarked blocks are read through (the
 * caller skips their entries): dirty slots spread over the cache mark
 * most blocks in short runs, and one read of a few blocks more costs
 * less than a read per run.  Returns end, or meta_blocks with *start too
 * when nothing is left.  Without a summary, every block.
 */
u64 tc_msum_next_run(struct tc_meta *m, u64 mb, u64 max, u64 *start)
{
	u64 n = m->layout.meta_blocks, end, next;

	if (!m->layout.sum_blocks) {
		*start = mb;
		return min(n, mb + max);
	}
	mb = find_next_bit(m->sum, n, mb);
	*start = mb;
	if (mb >= n)
		return n;
	end = find_next_zero_bit(m->sum, n, mb);
	while (end < n && end - mb < max) {
		next = find_next_bit(m->sum, n, end);
		if (next >= n || next - end > TC_MSUM_BRIDGE ||
		    next - mb >= max)
			break;
		end = find_next_zero_bit(m->sum, n, next);
	}
	return min(end, mb + max);
}

/*
 * A load read metadata block @mb: @may_dirty if it holds a committed dirty
 * entry or an uncommitted one (which the first commit rewrites).  A block
 * with neither may be cleared by the first commit.
 */
void tc_msum_loaded(struct tc_meta *m, u64 mb, bool may_dirty)
{
	if (m->layout.sum_blocks && !may_dirty) {
		__set_bit(mb, m->sum_clear);
		m->sum_pending = true;
	}
}

/* Forget the summary in memory: every bit clear. */
void tc_msum_reset(struct tc_meta *m)
{
	if (!m->layout.sum_blocks)
		return;
	bitmap_zero(m->sum, m->layout.meta_blocks);
	bitmap_zero(m->sum_clear, m->layout.meta_blocks);
	bitmap_zero(m->sum_write, m->layout.sum_blocks);
	m->sum_pending = false;
}

/*
 * A format of generation m->gen: every summary block written all clear,
 * before the superblock that makes the generation (whose REQ_PREFLUSH
 * makes them durable first).  So a summary block that does not decode as
 * this generation's is torn or damaged, and reads as all set.
 */
int tc_msum_format(struct tc_cache *c)
{
	struct tc_meta *m = &c->meta;
	u64 k, i, n;
	int r;

	tc_msum_reset(m);
	for (k = 0; k < m->layout.sum_blocks; k += n) {
		n = min(m->bounce_blocks, m->layout.sum_blocks - k);
		for (i = 0; i < n; i++)
			tc_msum_encode(m, k + i, (struct tc_disk_sum *)
				       ((u8 *)m->bounce + i * TC_MBLOCK_BYTES));
		r = tc_meta_rw(c, m->bounce,
			       m->layout.sum_start + k * TC_MBLOCK_SECTORS,
			       n * TC_MBLOCK_BYTES, REQ_OP_WRITE | REQ_SYNC);
		if (r)
			return r;
		cond_resched();
	}
	return 0;
}
