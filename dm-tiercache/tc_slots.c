// SPDX-License-Identifier: GPL-2.0
/*
 * dm-tiercache: the slot words (tc_slots.h): allocation.
 */
#ifdef __KERNEL__
#include <linux/slab.h>
#include <linux/vmalloc.h>
#include <linux/overflow.h>
#include <linux/limits.h>
#endif

#include "tc_slots.h"

/*
 * An array of @n elements of @size bytes.  kvmalloc() refuses more than
 * INT_MAX bytes; the arrays of a large cache are bigger (16 GiB for the low
 * block words of 2^32 slots), so those come from vmalloc.  NULL on
 * overflow.  Freed with kvfree().
 */
void *tc_bigalloc(size_t n, size_t size, gfp_t gfp)
{
	size_t bytes = array_size(n, size);

	if (bytes == SIZE_MAX)
		return NULL;
	/*
	 * No backtrace for a huge cache that does not fit.  An array kmalloc
	 * cannot serve goes to vmalloc, asked to fail rather than call the
	 * OOM killer: best effort only (vmalloc takes its page tables with
	 * GFP_KERNEL); a cache too large for memory is refused before its
	 * state is allocated (tc_cache.c).  Smaller arrays keep kvmalloc's
	 * cheap first try of kmalloc.
	 */
	gfp |= __GFP_NOWARN;
	if (bytes > KMALLOC_MAX_SIZE && !(gfp & __GFP_NORETRY))
		gfp |= __GFP_RETRY_MAYFAIL;
	if (bytes <= INT_MAX)
		return kvmalloc(bytes, gfp);
	return __vmalloc(bytes, gfp);
}

static size_t tc_slots_flag_longs(u32 nr)
{
	return DIV_ROUND_UP((size_t)nr, TC_SF_PER_LONG);
}

/* RAM of the slot words of @nr slots, in bytes. */
size_t tc_slots_bytes(u32 nr)
{
	return (size_t)nr * (sizeof(u32) + sizeof(u8)) +
	       tc_slots_flag_longs(nr) * sizeof(unsigned long);
}

/* @nr slots, all empty: block 0, no flags. */
int tc_slots_create(struct tc_slots *sl, u32 nr)
{
	sl->nr = nr;
	sl->lo = tc_bigalloc(nr, sizeof(u32), GFP_KERNEL | __GFP_ZERO);
	sl->hi = tc_bigalloc(nr, sizeof(u8), GFP_KERNEL | __GFP_ZERO);
	sl->flags = tc_bigalloc(tc_slots_flag_longs(nr), sizeof(unsigned long),
				GFP_KERNEL | __GFP_ZERO);
	if (!sl->lo || !sl->hi || !sl->flags) {
		tc_slots_destroy(sl);
		return -ENOMEM;
	}
	return 0;
}

void tc_slots_destroy(struct tc_slots *sl)
{
	kvfree(sl->lo);
	kvfree(sl->hi);
	kvfree(sl->flags);
	sl->lo = NULL;
	sl->hi = NULL;
	sl->flags = NULL;
}
