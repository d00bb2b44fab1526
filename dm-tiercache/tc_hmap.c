// SPDX-License-Identifier: GPL-2.0
/*
 * dm-tiercache: the map from origin block to slot (tc_hmap.h).
 *
 * Why a lookup that sums the region sequences is enough.  A lookup of a
 * key K present throughout can only miss K if K moved from a bucket the
 * lookup had not read yet to one it had read already.  Entries move only
 * under the locks of every region from the home bucket of the change to
 * the first empty bucket after it, and such a move advances all those
 * sequences.  The moved entry's old and new buckets are both in the
 * lookup's path (the new one was read, the old one is before the empty
 * bucket the lookup stopped at), so at least one region of the path was
 * locked after the lookup entered it, and its sequence no longer equals
 * the one the lookup added in.  Sequences never go below a value a lookup
 * read (it reads only even values; a lock adds one, an unlock removes it
 * or adds one more), so equal sums mean equal sequences.
 *
 * The same check makes a hit safe: a slot read from a bucket may be
 * removed and given another block while the lookup reads its key, but the
 * removal advanced the sequence of its region, so a torn key is retried.
 */
#ifdef __KERNEL__
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/irqflags.h>
#include <linux/processor.h>
#include <linux/errno.h>
#include <asm/barrier.h>
#endif

#include "tc_hmap.h"

#define TC_HMAP_NONE	U64_MAX

/* The host tests widen the windows of the races a lookup must survive. */
#ifndef tc_hmap_race_window
#define tc_hmap_race_window()	do { } while (0)
#endif

void tc_hmap_geometry(u32 nr_slots, struct tc_hmap_geometry *g)
{
	u64 n = (u64)nr_slots + DIV_ROUND_UP((u64)nr_slots, 5);

	n = max_t(u64, n, 1);
	g->nr_buckets = round_up(n, (u64)TC_HMAP_REGION);
	g->nr_regions = g->nr_buckets >> TC_HMAP_REGION_SHIFT;
	g->bytes = g->nr_buckets * sizeof(u32) + g->nr_regions * sizeof(u32);
}

int tc_hmap_create(struct tc_hmap *m, struct tc_slots *sl)
{
	struct tc_hmap_geometry g;

	tc_hmap_geometry(sl->nr, &g);
	m->sl = sl;
	m->nr_buckets = g.nr_buckets;
	m->nr_regions = g.nr_regions;
	m->bucket = tc_bigalloc(g.nr_buckets, sizeof(u32), GFP_KERNEL);
	m->region = tc_bigalloc(g.nr_regions, sizeof(u32),
				GFP_KERNEL | __GFP_ZERO);
	if (!m->bucket || !m->region) {
		tc_hmap_destroy(m);
		return -ENOMEM;
	}
	memset(m->bucket, 0xff, g.nr_buckets * sizeof(u32));
	return 0;
}

void tc_hmap_destroy(struct tc_hmap *m)
{
	kvfree(m->bucket);
	kvfree(m->region);
	m->bucket = NULL;
	m->region = NULL;
}

static inline u64 tc_hmap_next(const struct tc_hmap *m, u64 pos)
{
	return pos + 1 < m->nr_buckets ? pos + 1 : 0;
}

static inline u64 tc_hmap_prev(const struct tc_hmap *m, u64 pos)
{
	return pos ? pos - 1 : m->nr_buckets - 1;
}

/* How far @to is after @from, going forward around the table. */
static inline u64 tc_hmap_dist(const struct tc_hmap *m, u64 from, u64 to)
{
	return to >= from ? to - from : to + m->nr_buckets - from;
}

static inline u64 tc_hmap_key(const struct tc_hmap *m, u32 slot)
{
	return tc_slot_block(m->sl, slot);
}

/*
 * Bucket stores are releases and lockless bucket loads acquires: a lookup
 * that reads a slot number reads the block written into its slot word
 * before it was mapped, and, in a shift, the copy of a moved entry before
 * the emptying of its old bucket.
 */
static inline void tc_hmap_set(struct tc_hmap *m, u64 pos, u32 slot)
{
	smp_store_release(&m->bucket[pos], slot);	/* see above */
}

static inline u32 tc_hmap_get(const struct tc_hmap *m, u64 pos)
{
	return smp_load_acquire(&m->bucket[pos]);	/* see above */
}

/* ---- lookups ---- */

static u32 tc_hmap_seq_begin(const u32 *seq)
{
	u32 s;

	for (;;) {
		/* the buckets are read after the sequence */
		s = smp_load_acquire(seq);
		if (!(s & 1))
			return s;
		cpu_relax();
	}
}

/* Are the @nr regions from @r still at the sequences that summed @sum? */
static bool tc_hmap_seq_same(const struct tc_hmap *m, u64 r, u64 nr, u64 sum)
{
	u64 now = 0;

	/* the buckets were read before the sequences are read again */
	smp_rmb();
	while (nr--) {
		now += READ_ONCE(m->region[r]);
		r = r + 1 < m->nr_regions ? r + 1 : 0;
	}
	return now == sum;
}

/*
 * One probe for @block from its home bucket: the first slot holding it
 * after slot @after has been passed (from the start if @after is
 * TC_SLOT_NONE).  False if a change raced the probe.
 */
static bool tc_hmap_probe(const struct tc_hmap *m, u64 block, u32 after,
			  u32 *found)
{
	u64 pos = tc_hmap_home(m, block);
	u64 r0 = pos >> TC_HMAP_REGION_SHIFT;
	u64 sum = tc_hmap_seq_begin(&m->region[r0]);
	bool passed = after == TC_SLOT_NONE;
	u64 nr = 1, steps;
	u32 s;

	*found = TC_SLOT_NONE;
	for (steps = 0; steps < m->nr_buckets; steps++) {
		s = tc_hmap_get(m, pos);
		if (s == TC_SLOT_NONE)
			break;
		if (!passed)
			passed = s == after;
		else if (tc_hmap_key(m, s) == block)
			*found = s;
		if (*found != TC_SLOT_NONE)
			break;
		tc_hmap_race_window();
		pos = tc_hmap_next(m, pos);
		if (!(pos & (TC_HMAP_REGION - 1))) {
			sum += tc_hmap_seq_begin(&m->region[pos >>
						TC_HMAP_REGION_SHIFT]);
			nr++;
		}
	}
	return tc_hmap_seq_same(m, r0, nr, sum);
}

static u32 tc_hmap_find(const struct tc_hmap *m, u64 block, u32 after)
{
	u32 found;

	while (!tc_hmap_probe(m, block, after, &found))
		cpu_relax();
	return found;
}

/* The newest slot holding @block, or TC_SLOT_NONE. */
u32 tc_hmap_lookup(struct tc_hmap *m, u64 block)
{
	return tc_hmap_find(m, block, TC_SLOT_NONE);
}

/*
 * The next older slot holding @block after slot @after (which holds it), or
 * TC_SLOT_NONE.  Meant for the holder of the block's lock.
 */
u32 tc_hmap_lookup_next(struct tc_hmap *m, u64 block, u32 after)
{
	return tc_hmap_find(m, block, after);
}

/* ---- region locks ---- */

static void tc_hmap_region_lock(u32 *seq)
{
	u32 old;

	for (;;) {
		old = READ_ONCE(*seq);
		if (!(old & 1) && try_cmpxchg(seq, &old, old + 1))
			return;
		cpu_relax();
	}
}

/* Back to the sequence it had, or on to the next one if entries moved. */
static void tc_hmap_region_unlock(u32 *seq, bool moved)
{
	u32 s = READ_ONCE(*seq);

	/* the bucket stores are seen before the lock is seen free */
	smp_store_release(seq, moved ? s + 1 : s - 1);
}

/*
 * The regions of a span of @nr regions from @r0, as at most two runs in
 * ascending order: [0, @end1) when the span wraps, then [@start2, @end2).
 */
struct tc_hmap_runs {
	u64 end1;
	u64 start2;
	u64 end2;
};

static void tc_hmap_runs(const struct tc_hmap *m, u64 r0, u64 nr,
			 struct tc_hmap_runs *rr)
{
	if (nr >= m->nr_regions) {
		rr->end1 = 0;
		rr->start2 = 0;
		rr->end2 = m->nr_regions;
	} else if (r0 + nr <= m->nr_regions) {
		rr->end1 = 0;
		rr->start2 = r0;
		rr->end2 = r0 + nr;
	} else {
		rr->end1 = r0 + nr - m->nr_regions;
		rr->start2 = r0;
		rr->end2 = m->nr_regions;
	}
}

static void tc_hmap_lock_span(struct tc_hmap *m, u64 r0, u64 nr)
{
	struct tc_hmap_runs rr;
	u64 r;

	tc_hmap_runs(m, r0, nr, &rr);
	for (r = 0; r < rr.end1; r++)
		tc_hmap_region_lock(&m->region[r]);
	for (r = rr.start2; r < rr.end2; r++)
		tc_hmap_region_lock(&m->region[r]);
}

static void tc_hmap_unlock_span(struct tc_hmap *m, u64 r0, u64 nr,
				bool moved)
{
	struct tc_hmap_runs rr;
	u64 r;

	tc_hmap_runs(m, r0, nr, &rr);
	for (r = 0; r < rr.end1; r++)
		tc_hmap_region_unlock(&m->region[r], moved);
	for (r = rr.start2; r < rr.end2; r++)
		tc_hmap_region_unlock(&m->region[r], moved);
}

/* The first empty bucket at or after @pos, or TC_HMAP_NONE. */
static u64 tc_hmap_first_empty(const struct tc_hmap *m, u64 pos)
{
	u64 steps;

	for (steps = 0; steps < m->nr_buckets; steps++) {
		if (READ_ONCE(m->bucket[pos]) == TC_SLOT_NONE)
			return pos;
		pos = tc_hmap_next(m, pos);
	}
	return TC_HMAP_NONE;
}

/* Regions from the one of @home to the one of @end (all if @end is none). */
static u64 tc_hmap_span(const struct tc_hmap *m, u64 home, u64 end)
{
	u64 r0 = home >> TC_HMAP_REGION_SHIFT;
	u64 r1 = end >> TC_HMAP_REGION_SHIFT;

	if (end == TC_HMAP_NONE)
		return m->nr_regions;
	if (end >= home)
		return r1 - r0 + 1;
	return m->nr_regions - r0 + r1 + 1;
}

/*
 * Lock the regions from @home to the first empty bucket after it, and
 * return their number.  The span is guessed without the locks, then checked
 * under them: a cluster that grew meanwhile means a larger span, taken anew
 * from its start so that the regions are always locked in ascending order.
 */
static u64 tc_hmap_lock_home(struct tc_hmap *m, u64 home, u64 *end)
{
	u64 r0 = home >> TC_HMAP_REGION_SHIFT;
	u64 nr = tc_hmap_span(m, home, tc_hmap_first_empty(m, home));
	u64 need;

	for (;;) {
		tc_hmap_lock_span(m, r0, nr);
		*end = tc_hmap_first_empty(m, home);
		need = tc_hmap_span(m, home, *end);
		if (need <= nr)
			return nr;
		tc_hmap_unlock_span(m, r0, nr, false);
		nr = need;
	}
}

/* ---- insert ---- */

/*
 * Put @slot in the empty bucket @end, or, if older versions of @block are
 * in [@home, @end), in front of them: each version moves on to the bucket
 * of the next one, the last to @end, written from the back so that every
 * version is in a bucket at every instant.  Returns true if entries moved.
 */
static bool tc_hmap_place(struct tc_hmap *m, u64 home, u64 end, u32 slot,
			  u64 block)
{
	u64 pos, first = TC_HMAP_NONE, q;
	u32 s;

	for (pos = home; pos != end; pos = tc_hmap_next(m, pos)) {
		if (tc_hmap_key(m, READ_ONCE(m->bucket[pos])) == block) {
			first = pos;
			break;
		}
	}
	if (first == TC_HMAP_NONE) {
		tc_hmap_set(m, end, slot);
		return false;
	}
	q = end;
	pos = end;
	do {
		pos = tc_hmap_prev(m, pos);
		s = READ_ONCE(m->bucket[pos]);
		if (tc_hmap_key(m, s) == block) {
			tc_hmap_set(m, q, s);
			q = pos;
		}
	} while (pos != first);
	tc_hmap_set(m, q, slot);
	return true;
}

/*
 * Map the block of @slot's slot word to @slot, as its newest version.  The
 * caller holds the block's lock and has not mapped @slot yet.  -ENOSPC only
 * if the table is full, which cannot happen while each of the slots it was
 * sized for is mapped at most once.
 */
int tc_hmap_insert(struct tc_hmap *m, u32 slot)
{
	u64 block = tc_hmap_key(m, slot);
	u64 home = tc_hmap_home(m, block);
	unsigned long flags;
	bool moved = false;
	u64 nr, end;

	local_irq_save(flags);
	nr = tc_hmap_lock_home(m, home, &end);
	if (end != TC_HMAP_NONE)
		moved = tc_hmap_place(m, home, end, slot, block);
	tc_hmap_unlock_span(m, home >> TC_HMAP_REGION_SHIFT, nr, moved);
	local_irq_restore(flags);
	return end == TC_HMAP_NONE ? -ENOSPC : 0;
}

/* ---- delete ---- */

/*
 * Close the hole at @hole: every later entry of the cluster that may live
 * before its current bucket (its home is not in (@hole, its bucket]) moves
 * back into the hole, which moves to where the entry was.  The copy comes
 * before the hole is emptied, so a moving entry is never missing.
 */
static void tc_hmap_shift(struct tc_hmap *m, u64 hole)
{
	u64 pos = hole, home;
	u32 s;

	for (;;) {
		pos = tc_hmap_next(m, pos);
		s = READ_ONCE(m->bucket[pos]);
		if (s == TC_SLOT_NONE)
			break;
		home = tc_hmap_home(m, tc_hmap_key(m, s));
		if (tc_hmap_dist(m, home, pos) < tc_hmap_dist(m, hole, pos))
			continue;
		tc_hmap_set(m, hole, s);
		hole = pos;
	}
	tc_hmap_set(m, hole, TC_SLOT_NONE);
}

/*
 * Unmap @slot, whose slot word still holds its block.  The caller holds the
 * block's lock.  Returns false if @slot was not mapped.
 */
bool tc_hmap_delete(struct tc_hmap *m, u32 slot)
{
	u64 home = tc_hmap_home(m, tc_hmap_key(m, slot));
	u64 nr, end, pos;
	unsigned long flags;
	bool found = false;

	local_irq_save(flags);
	nr = tc_hmap_lock_home(m, home, &end);
	/* a full table (impossible, see tc_hmap_insert()) is left alone */
	for (pos = home; end != TC_HMAP_NONE && pos != end;
	     pos = tc_hmap_next(m, pos)) {
		if (READ_ONCE(m->bucket[pos]) == slot) {
			found = true;
			tc_hmap_shift(m, pos);
			break;
		}
	}
	tc_hmap_unlock_span(m, home >> TC_HMAP_REGION_SHIFT, nr, found);
	local_irq_restore(flags);
	return found;
}
