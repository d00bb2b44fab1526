// SPDX-License-Identifier: GPL-2.0
/*
 * dm-tiercache: the dirty order (tc_dorder.h).
 */
#ifdef __KERNEL__
#include <linux/slab.h>
#include <linux/sort.h>
#include <linux/string.h>
#include <linux/errno.h>
#include <linux/minmax.h>
#include <linux/sched.h>
#include <linux/gfp.h>
#endif

#include "tc_dorder.h"

#define TC_DORDER_TAIL_MIN	1024U
#define TC_DORDER_TAIL_MAX	(1U << 20)
/* a sort key: block << 24 | index in the tail */
#define TC_DORDER_IDX_BITS	24
#define TC_DORDER_IDX_MASK	((1ULL << TC_DORDER_IDX_BITS) - 1)

u32 tc_dorder_tail_cap(u32 nr_slots)
{
	return clamp(nr_slots / 256, TC_DORDER_TAIL_MIN, TC_DORDER_TAIL_MAX);
}

int tc_dorder_create(struct tc_dorder *d, struct tc_slots *sl,
		     void (*release)(void *ctx, u32 slot), void *ctx)
{
	memset(d, 0, sizeof(*d));
	d->sl = sl;
	d->release = release;
	d->ctx = ctx;
	spin_lock_init(&d->lock);
	d->tail_cap = tc_dorder_tail_cap(sl->nr);
	d->tail = kvmalloc_array(d->tail_cap, sizeof(u32), GFP_KERNEL);
	d->pending = kvmalloc_array(d->tail_cap, sizeof(u32), GFP_KERNEL);
	/* a merge sorts with these: it allocates only to grow the order */
	d->keys = kvmalloc_array(d->tail_cap, sizeof(u64), GFP_KERNEL);
	if (!d->tail || !d->pending || !d->keys) {
		tc_dorder_destroy(d);
		return -ENOMEM;
	}
	return 0;
}

void tc_dorder_destroy(struct tc_dorder *d)
{
	kvfree(d->sorted);
	kvfree(d->tail);
	kvfree(d->pending);
	kvfree(d->keys);
	d->sorted = NULL;
	d->tail = NULL;
	d->pending = NULL;
	d->keys = NULL;
}

/* ---- marking dirty ---- */

/* Set DIRTY on a QUEUED slot, in one step; false if it is not QUEUED. */
static bool tc_dorder_redirty(struct tc_slots *sl, u32 s)
{
	unsigned long *w = tc_slot_word(sl, s);
	unsigned long queued = BIT(TC_SF_QUEUED) << tc_slot_shift(s);
	unsigned long dirty = BIT(TC_SF_DIRTY) << tc_slot_shift(s);
	unsigned long old = READ_ONCE(*w);

	do {
		if (!(old & queued))
			return false;
		if (old & dirty)
			return true;
	} while (!try_cmpxchg(w, &old, old | dirty));
	return true;
}

/*
 * Mark @slot dirty.  A slot not yet in the order goes into the tail; with
 * the tail full, nothing changes and -ENOSPC is returned.
 */
int tc_dorder_mark_dirty(struct tc_dorder *d, u32 slot)
{
	unsigned long flags;
	int r = 0;

	if (tc_dorder_redirty(d->sl, slot))
		return 0;
	spin_lock_irqsave(&d->lock, flags);
	/* QUEUED is set under this lock only: check again under it */
	if (tc_dorder_redirty(d->sl, slot))
		goto out;
	if (d->nr_tail == d->tail_cap) {
		r = -ENOSPC;
		goto out;
	}
	tc_slot_update(d->sl, slot, 0, BIT(TC_SF_DIRTY) | BIT(TC_SF_QUEUED));
	d->tail[d->nr_tail] = slot;
	WRITE_ONCE(d->nr_tail, d->nr_tail + 1);
out:
	spin_unlock_irqrestore(&d->lock, flags);
	return r;
}

/* Half the tail is used: time for the owner to merge. */
bool tc_dorder_want_merge(struct tc_dorder *d)
{
	return READ_ONCE(d->nr_tail) >= d->tail_cap / 2;
}

/* The tail is full: tc_dorder_mark_dirty() of a slot not queued fails. */
bool tc_dorder_full(struct tc_dorder *d)
{
	return READ_ONCE(d->nr_tail) >= d->tail_cap;
}

/* ---- merging ---- */

/*
 * Does @s stay in the order?  Yes while it is dirty.  Otherwise QUEUED is
 * dropped in the same atomic step that saw it clean (a slot dirtied again
 * at that instant keeps its place), and a slot retired meanwhile whose
 * writeback let go too goes to the release callback.
 */
static bool tc_dorder_keep(struct tc_dorder *d, u32 s)
{
	unsigned long *w = tc_slot_word(d->sl, s);
	unsigned int sh = tc_slot_shift(s);
	unsigned long old = READ_ONCE(*w);

	do {
		if (old & (BIT(TC_SF_DIRTY) << sh))
			return true;
	} while (!try_cmpxchg(w, &old, old & ~(BIT(TC_SF_QUEUED) << sh)));
	d->nr_dropped++;
	/* the last owner of a retired slot frees it (tc_slot_let_go()) */
	if (!(old & ((BIT(TC_SF_VALID) | BIT(TC_SF_WB)) << sh)))
		d->release(d->ctx, s);
	return false;
}

/* Take the tail over as the pending part; the tail starts empty. */
static void tc_dorder_take_tail(struct tc_dorder *d)
{
	unsigned long flags;
	u32 *t;

	spin_lock_irqsave(&d->lock, flags);
	t = d->tail;
	d->tail = d->pending;
	d->pending = t;
	d->nr_pending = d->nr_tail;
	WRITE_ONCE(d->nr_tail, 0);
	spin_unlock_irqrestore(&d->lock, flags);
}

/* The sorted part's buffer, for @nr entries, @nr + 1/8 on growing. */
static int tc_dorder_resize(struct tc_dorder *d, u64 nr, gfp_t gfp)
{
	u64 cap = min_t(u64, nr + nr / 8, d->sl->nr);
	u32 *p;

	if (nr <= d->cap_sorted && d->cap_sorted <= 2 * cap)
		return 0;
	if (!cap) {
		kvfree(d->sorted);
		d->sorted = NULL;
		d->cap_sorted = 0;
		return 0;
	}
	p = tc_bigalloc(cap, sizeof(u32), gfp);
	if (!p)
		return nr <= d->cap_sorted ? 0 : -ENOMEM;
	if (d->nr_sorted)
		memcpy(p, d->sorted, d->nr_sorted * sizeof(u32));
	kvfree(d->sorted);
	d->sorted = p;
	d->cap_sorted = cap;
	return 0;
}

/* Slots a merge visits between reschedules, when it may sleep. */
#define TC_DORDER_BATCH		(1U << 16)

static void tc_dorder_resched(u64 i, gfp_t gfp)
{
	if (!((i + 1) % TC_DORDER_BATCH) && gfpflags_allow_blocking(gfp))
		cond_resched();
}

/* Drop the slots of the sorted part that are no longer dirty. */
static void tc_dorder_compact(struct tc_dorder *d, gfp_t gfp)
{
	u64 i, n = 0;

	for (i = 0; i < d->nr_sorted; i++) {
		if (tc_dorder_keep(d, d->sorted[i]))
			d->sorted[n++] = d->sorted[i];
		tc_dorder_resched(i, gfp);
	}
	d->nr_sorted = n;
}

static int tc_dorder_cmp(const void *a, const void *b)
{
	u64 x = *(const u64 *)a, y = *(const u64 *)b;

	return x < y ? -1 : x > y;
}

/* Drop the pending slots that are no longer dirty. */
static void tc_dorder_compact_pending(struct tc_dorder *d)
{
	u32 i, n = 0;

	for (i = 0; i < d->nr_pending; i++)
		if (tc_dorder_keep(d, d->pending[i]))
			d->pending[n++] = d->pending[i];
	d->nr_pending = n;
}

/* Sort keys of the pending slots. */
static void tc_dorder_sort_pending(struct tc_dorder *d, u64 *keys)
{
	u32 i;

	for (i = 0; i < d->nr_pending; i++)
		keys[i] = tc_slot_block(d->sl, d->pending[i]) <<
			  TC_DORDER_IDX_BITS | i;
	sort(keys, d->nr_pending, sizeof(*keys), tc_dorder_cmp, NULL);
}

/* The first index in [0, @hi) of the sorted part with a block above @b. */
static u64 tc_dorder_after(struct tc_dorder *d, u64 hi, u64 b)
{
	u64 lo = 0, mid;

	while (lo < hi) {
		mid = lo + (hi - lo) / 2;
		if (tc_slot_block(d->sl, d->sorted[mid]) <= b)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/*
 * Merge @n sorted pending slots into the sorted part, from the back: each
 * pending slot finds its place by a binary search, and the sorted slots
 * after it move up as a block.  Blocks are read for the searches only, not
 * for every sorted slot: a slot word is a cache miss on a large cache.
 */
static void tc_dorder_merge_keys(struct tc_dorder *d, const u64 *keys, u32 n)
{
	u64 i = d->nr_sorted, w = d->nr_sorted + n, at;

	/* at most nr_sorted + n slots move: no reschedule needed (a tail) */
	while (n--) {
		at = tc_dorder_after(d, i, keys[n] >> TC_DORDER_IDX_BITS);
		w -= i - at;
		memmove(&d->sorted[w], &d->sorted[at], (i - at) * sizeof(u32));
		i = at;
		d->sorted[--w] = d->pending[keys[n] & TC_DORDER_IDX_MASK];
	}
}

/*
 * One merge: the pending part (a tail a failed merge took over) or else
 * the tail.  Clean slots are dropped first, so the sorted part grows only
 * for the dirty ones.  -ENOMEM (it had to grow) leaves the dirty slots
 * taken over pending: the next merge brings them in, and until then the
 * walk does not see them.
 */
static int tc_dorder_merge_once(struct tc_dorder *d, gfp_t gfp)
{
	if (!d->nr_pending)
		tc_dorder_take_tail(d);
	tc_dorder_compact(d, gfp);
	tc_dorder_compact_pending(d);
	if (tc_dorder_resize(d, d->nr_sorted + d->nr_pending, gfp))
		return -ENOMEM;
	tc_dorder_sort_pending(d, d->keys);
	tc_dorder_merge_keys(d, d->keys, d->nr_pending);
	d->nr_sorted += d->nr_pending;
	d->nr_pending = 0;
	/* give memory back once many were cleaned; failing is harmless */
	tc_dorder_resize(d, d->nr_sorted, gfp);
	return 0;
}

/*
 * Bring every slot queued before the call into the sorted part, and drop
 * the slots that are clean.  After a merge that failed, that takes two:
 * the part it left pending, then the tail.
 */
int tc_dorder_merge(struct tc_dorder *d, gfp_t gfp)
{
	bool left = d->nr_pending;
	int r = tc_dorder_merge_once(d, gfp);

	if (!r && left)
		r = tc_dorder_merge_once(d, gfp);
	return r;
}

/* ---- loading ---- */

/*
 * Loading (the owner, nothing else running): @slot is dirty.  It goes to
 * the end of the sorted part, which tc_dorder_load_end() sorts once: one
 * sort of all loaded slots instead of a merge per tail.
 */
int tc_dorder_load(struct tc_dorder *d, u32 slot)
{
	if (d->nr_sorted == d->cap_sorted &&
	    tc_dorder_resize(d, max_t(u64, 2 * d->nr_sorted, 1024), GFP_KERNEL))
		return -ENOMEM;
	tc_slot_update(d->sl, slot, 0, BIT(TC_SF_DIRTY) | BIT(TC_SF_QUEUED));
	d->sorted[d->nr_sorted++] = slot;
	return 0;
}

static int tc_dorder_cmp_slots(const void *a, const void *b, const void *priv)
{
	const struct tc_slots *sl = priv;
	u64 x = tc_slot_block(sl, *(const u32 *)a);
	u64 y = tc_slot_block(sl, *(const u32 *)b);

	return x < y ? -1 : x > y;
}

void tc_dorder_load_end(struct tc_dorder *d)
{
	sort_r(d->sorted, d->nr_sorted, sizeof(u32), tc_dorder_cmp_slots, NULL,
	       d->sl);
}

/* ---- the walk ---- */

/* The first index of the sorted part whose block is at least @from. */
static u64 tc_dorder_seek(struct tc_dorder *d, u64 from)
{
	u64 lo = 0, hi = d->nr_sorted, mid;

	while (lo < hi) {
		mid = lo + (hi - lo) / 2;
		if (tc_slot_block(d->sl, d->sorted[mid]) < from)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/*
 * The first slot of the sorted part that is dirty now and holds a block in
 * [@from, @to], its block in @block; TC_SLOT_NONE if there is none.  The
 * caller checks it again under the block's lock.
 */
u32 tc_dorder_next(struct tc_dorder *d, u64 from, u64 to, u64 *block)
{
	u64 i, b;
	u32 s;

	for (i = tc_dorder_seek(d, from); i < d->nr_sorted; i++) {
		s = d->sorted[i];
		b = tc_slot_block(d->sl, s);
		if (b > to)
			break;
		if (tc_slot_test(d->sl, s, TC_SF_DIRTY)) {
			*block = b;
			return s;
		}
	}
	return TC_SLOT_NONE;
}

/*
 * As tc_dorder_next(), for the dirty slots whose tag in @tags (one byte
 * per slot) is @tag only: one epoch's (tc_epoch.h).
 */
u32 tc_dorder_next_tagged(struct tc_dorder *d, u64 from, u64 to,
			  const u8 *tags, u8 tag, u64 *block)
{
	u64 i, b;
	u32 s;

	for (i = tc_dorder_seek(d, from); i < d->nr_sorted; i++) {
		s = d->sorted[i];
		b = tc_slot_block(d->sl, s);
		if (b > to)
			break;
		if (READ_ONCE(tags[s]) == tag &&
		    tc_slot_test(d->sl, s, TC_SF_DIRTY)) {
			*block = b;
			return s;
		}
	}
	return TC_SLOT_NONE;
}

/* The number of slots in the sorted part (the owner's). */
u64 tc_dorder_nr_sorted(struct tc_dorder *d)
{
	return d->nr_sorted;
}

/* The slot at index @i of the sorted part (the owner's). */
u32 tc_dorder_at(struct tc_dorder *d, u64 i)
{
	return d->sorted[i];
}
