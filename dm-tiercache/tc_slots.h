/* SPDX-License-Identifier: GPL-2.0 */
/*
 * dm-tiercache: the slot words, 6 bytes of RAM per cache slot.
 *
 * Each slot has an origin block of 40 bits (4 PiB of 4 KiB blocks) and
 * eight state bits, kept in three arrays without padding:
 *
 *   lo[s]     u32: block bits 0..31
 *   hi[s]     u8:  block bits 32..39
 *   flags     8 bits per slot in an array of unsigned long: the bits of
 *             slot s are bits 8 * (s % 8) .. 8 * (s % 8) + 7 of word s / 8
 *
 * so 4 + 1 + 1 = 6 bytes per slot (plus at most 7 bytes of rounding).
 *
 * Why not a u32 and a u16 holding the high block bits with the flags: the
 * flags are changed concurrently by different contexts (below), so every
 * change must be an atomic read-modify-write.  The kernel's atomic bitops
 * and cmpxchg() work on unsigned long on every architecture, a 16-bit
 * cmpxchg() does not.  With the flags of eight slots in one aligned long,
 * single bits are set_bit()/clear_bit() on that long and multi-bit changes
 * one try_cmpxchg() on it.  The cost: a cmpxchg() retries when a neighbour
 * slot's flags changed meanwhile (eight slots share a word), and a slot's
 * state is in three cache lines instead of two.
 *
 * Who changes what (all flag changes are atomic RMW on the word):
 *   block       written only while the slot is in neither the map nor the
 *               dirty order (not VALID, not QUEUED), by its one owner; read
 *               locklessly by map lookups, which publish the slot with a
 *               release store after the block is written (tc_hmap.c)
 *   VALID       set before the map insert, cleared by tc_slot_retire(),
 *               both by the holder of the block's lock
 *   DIRTY       set by tc_dorder_mark_dirty() (holder of the block lock),
 *               cleared by the writeback or a removal (holder of the lock);
 *               read and conditionally dropped with QUEUED by the merge of
 *               the dirty order, which holds no block lock
 *   REF         set by hits (shared block lock), cleared by the CLOCK hand
 *   WB          set and cleared by the writeback, read by writers/discards
 *   REWRITTEN   set by a write while WB is set, cleared by the writeback
 *   OWED        set by a write a running full flush owes, cleared by it
 *   PARKED      the slot has no owner but waits for a commit before it may
 *               be given out again (it may be dirty on disk); set and
 *               cleared under the metadata lock (tc_meta.c)
 *   QUEUED      the slot is in the dirty order (tc_dorder.c), exactly once;
 *               set with DIRTY under the tail lock, cleared by the merge
 *               when the slot is no longer dirty.  While QUEUED (or WB)
 *               the block must not change: the slot is not given out
 *               again before the last owner let go (tc_slot_let_go()).
 */
#ifndef DM_TIERCACHE_SLOTS_H
#define DM_TIERCACHE_SLOTS_H

#ifdef __KERNEL__
#include <linux/types.h>
#include <linux/bitops.h>
#include <linux/atomic.h>
#include <linux/compiler.h>
#include <linux/gfp.h>
#else
#include "tc_host.h"
#endif

/* no slot: also the empty bucket of the map */
#define TC_SLOT_NONE		U32_MAX
/* slot numbers are 0 .. TC_SLOTS_MAX - 1 */
#define TC_SLOTS_MAX		U32_MAX
#define TC_SLOT_BLOCK_BITS	40
#define TC_SLOT_MAX_BLOCK	((1ULL << TC_SLOT_BLOCK_BITS) - 1)

enum tc_slot_flag {
	TC_SF_VALID,		/* holds a block, is in the map */
	TC_SF_DIRTY,		/* newer than the origin */
	TC_SF_REF,		/* referenced since the last CLOCK pass */
	TC_SF_WB,		/* in a writeback request */
	TC_SF_REWRITTEN,	/* written while in writeback: stays dirty */
	TC_SF_OWED,		/* a running full flush owes the origin this */
	TC_SF_PARKED,		/* free once a commit records it clean */
	TC_SF_QUEUED,		/* in the dirty order */
	TC_SF_NR,
};

#define TC_SF_BITS		8
#define TC_SF_PER_LONG		(BITS_PER_LONG / TC_SF_BITS)
#define TC_SF_MASK		((1UL << TC_SF_BITS) - 1)

struct tc_slots {
	u32 *lo;
	u8 *hi;
	unsigned long *flags;
	u32 nr;
};

int tc_slots_create(struct tc_slots *sl, u32 nr);
void tc_slots_destroy(struct tc_slots *sl);
size_t tc_slots_bytes(u32 nr);
void *tc_bigalloc(size_t n, size_t size, gfp_t gfp);

static inline u64 tc_slot_block(const struct tc_slots *sl, u32 s)
{
	return READ_ONCE(sl->lo[s]) | (u64)READ_ONCE(sl->hi[s]) << 32;
}

/* Only for a slot that is neither VALID nor QUEUED (see above). */
static inline void tc_slot_set_block(struct tc_slots *sl, u32 s, u64 block)
{
	WRITE_ONCE(sl->lo[s], (u32)block);
	WRITE_ONCE(sl->hi[s], (u8)(block >> 32));
}

static inline unsigned long *tc_slot_word(const struct tc_slots *sl, u32 s)
{
	return &sl->flags[s / TC_SF_PER_LONG];
}

static inline unsigned int tc_slot_shift(u32 s)
{
	return (s % TC_SF_PER_LONG) * TC_SF_BITS;
}

/* All eight flags of @s at one instant, as a mask of BIT(TC_SF_*). */
static inline unsigned int tc_slot_flags(const struct tc_slots *sl, u32 s)
{
	return (READ_ONCE(*tc_slot_word(sl, s)) >> tc_slot_shift(s)) &
	       TC_SF_MASK;
}

static inline bool tc_slot_test(const struct tc_slots *sl, u32 s,
				enum tc_slot_flag f)
{
	return test_bit(tc_slot_shift(s) + f, tc_slot_word(sl, s));
}

static inline void tc_slot_set(struct tc_slots *sl, u32 s, enum tc_slot_flag f)
{
	set_bit(tc_slot_shift(s) + f, tc_slot_word(sl, s));
}

static inline void tc_slot_clear(struct tc_slots *sl, u32 s,
				 enum tc_slot_flag f)
{
	clear_bit(tc_slot_shift(s) + f, tc_slot_word(sl, s));
}

static inline bool tc_slot_test_and_set(struct tc_slots *sl, u32 s,
					enum tc_slot_flag f)
{
	return test_and_set_bit(tc_slot_shift(s) + f, tc_slot_word(sl, s));
}

static inline bool tc_slot_test_and_clear(struct tc_slots *sl, u32 s,
					  enum tc_slot_flag f)
{
	return test_and_clear_bit(tc_slot_shift(s) + f, tc_slot_word(sl, s));
}

/*
 * Atomically clear the flags in @clear_mask and set those in @set_mask
 * (masks of BIT(TC_SF_*)); returns the flags as they were.
 */
static inline unsigned int tc_slot_update(struct tc_slots *sl, u32 s,
					  unsigned int clear_mask,
					  unsigned int set_mask)
{
	unsigned long *w = tc_slot_word(sl, s);
	unsigned int sh = tc_slot_shift(s);
	unsigned long old = READ_ONCE(*w), new;

	do {
		new = old & ~((unsigned long)clear_mask << sh);
		new |= (unsigned long)set_mask << sh;
	} while (!try_cmpxchg(w, &old, new));
	return (old >> sh) & TC_SF_MASK;
}

/*
 * A slot is owned while it is VALID (in the map), QUEUED (in the dirty
 * order) or in writeback (WB: a request still holds its slot number).  It
 * may take another block only once all three have let go.
 */
#define TC_SF_OWNERS	(BIT(TC_SF_VALID) | BIT(TC_SF_QUEUED) | BIT(TC_SF_WB))

/*
 * Clear the flags in @mask, some of them owners.  Returns true if that let
 * the last owner go: the caller frees the slot.  Of several contexts
 * letting go at once, exactly one sees this.
 */
static inline bool tc_slot_let_go(struct tc_slots *sl, u32 s,
				  unsigned int mask)
{
	unsigned int old = tc_slot_update(sl, s, mask, 0);

	return (old & TC_SF_OWNERS) && !(old & TC_SF_OWNERS & ~mask);
}

/*
 * The slot leaves the map (removed or reclaimed): every flag but QUEUED
 * and WB is cleared at once.  Returns true if the slot is still QUEUED or
 * in writeback: the dirty order (tc_dorder.c) or the writeback request
 * owns it until it lets go, and the last of them frees it; the caller must
 * not reuse it.  Returns false if the caller may free the slot now.
 */
static inline bool tc_slot_retire(struct tc_slots *sl, u32 s)
{
	return !tc_slot_let_go(sl, s, TC_SF_MASK & ~(BIT(TC_SF_QUEUED) |
						      BIT(TC_SF_WB)));
}

#endif /* DM_TIERCACHE_SLOTS_H */
