/* SPDX-License-Identifier: GPL-2.0 */
/*
 * dm-tiercache: the extent of one writeback request.
 *
 * Pure logic, free of kernel state, so that it is unit tested on the host
 * (tests/host) with the same source the module is built from.
 */
#ifndef DM_TIERCACHE_PLAN_H
#define DM_TIERCACHE_PLAN_H

#ifdef __KERNEL__
#include <linux/types.h>
#else
#include <stdint.h>
typedef uint64_t u64;
typedef uint32_t u32;
#endif

#define TC_PLAN_NONE	(~0ULL)

/* What a block turned out to be once it was taken (locked). */
enum tc_blk_kind {
	TC_BLK_BUSY,	/* could not be locked now; nothing is held */
	TC_BLK_DIRTY,	/* cached and dirty: its slot is written back */
	TC_BLK_HOLE,	/* not dirty: its current data fills a bridge */
};

struct tc_plan_ops {
	/* Try to lock block @b and classify it. */
	enum tc_blk_kind (*take)(void *ctx, u64 b);
	/* Unlock a block taken by take(). */
	void (*give_back)(void *ctx, u64 b);
	/* The smallest dirty block in [@from, @to], or TC_PLAN_NONE. */
	u64 (*next_dirty)(void *ctx, u64 from, u64 to);
};

struct tc_plan_limits {
	u64 end;		/* blocks from here on are never written back */
	u32 max_blocks;		/* largest request, in blocks (>= 1) */
	u32 gap_blocks;		/* largest hole bridged, in blocks (0: off) */
};

/*
 * Grow a request that starts at dirty block @first (already taken) and
 * return its length in blocks.  Every block of it is taken on return.
 */
u32 tc_plan_extend(const struct tc_plan_ops *ops, void *ctx, u64 first,
		   const struct tc_plan_limits *lim);

#endif /* DM_TIERCACHE_PLAN_H */
