// SPDX-License-Identifier: GPL-2.0
/*
 * dm-tiercache: the extent of one writeback request.
 *
 * A request starts at a dirty block the caller has already taken; the
 * take() callback records what each further block is.  It grows
 * over origin-adjacent dirty blocks and, when bridging is on, over holes of
 * at most gap_blocks that are followed by another dirty block, until it
 * reaches max_blocks.  A request never ends in a hole, and a block that
 * cannot be locked right now ends the request before it.
 */
#include "tc_plan.h"

static void tc_plan_give_back(const struct tc_plan_ops *ops, void *ctx,
			      u64 from, u32 count)
{
	u32 i;

	for (i = 0; i < count; i++)
		ops->give_back(ctx, from + i);
}

/*
 * Take the @hole blocks starting at @next and the dirty block after them.
 * Returns 0 on success, -1 if one of them was busy (nothing is held then).
 */
static int tc_plan_take_span(const struct tc_plan_ops *ops, void *ctx,
			     u64 next, u32 hole)
{
	enum tc_blk_kind k;
	u32 i;

	for (i = 0; i < hole; i++) {
		k = ops->take(ctx, next + i);
		if (k == TC_BLK_BUSY)
			goto undo;
	}
	k = ops->take(ctx, next + hole);
	if (k == TC_BLK_DIRTY)
		return 0;
	/* cleaned or dropped meanwhile: a request does not end in a hole */
	if (k != TC_BLK_BUSY)
		ops->give_back(ctx, next + hole);
undo:
	tc_plan_give_back(ops, ctx, next, i);
	return -1;
}

u32 tc_plan_extend(const struct tc_plan_ops *ops, void *ctx, u64 first,
		   const struct tc_plan_limits *lim)
{
	u64 next = first + 1;
	u32 nr = 1;

	while (nr < lim->max_blocks && next < lim->end) {
		u64 to = next + lim->gap_blocks;
		u64 nd;
		u32 hole;

		if (to >= lim->end)
			to = lim->end - 1;
		nd = ops->next_dirty(ctx, next, to);
		if (nd == TC_PLAN_NONE)
			break;
		hole = (u32)(nd - next);
		if (nr + hole + 1 > lim->max_blocks)
			break;
		if (tc_plan_take_span(ops, ctx, next, hole))
			break;
		nr += hole + 1;
		next = nd + 1;
	}
	return nr;
}
