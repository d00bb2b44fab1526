// SPDX-License-Identifier: GPL-2.0
/*
 * Unit tests of tc_plan_extend(): the extent of one writeback request.
 * A model device is a string, one character per origin block:
 *   'D' dirty, '.' not dirty, 'B' dirty but locked by someone else,
 *   'b' not dirty and locked by someone else,
 *   'c' looked dirty but was cleaned before it could be taken.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tc_plan.h"

struct model {
	const char *map;
	u64 len;
	int held[4096];		/* taken by the planner */
	int takes;
};

static enum tc_blk_kind m_take(void *ctx, u64 b)
{
	struct model *m = ctx;
	char ch = m->map[b];

	if (ch == 'B' || ch == 'b')
		return TC_BLK_BUSY;
	if (m->held[b]) {
		fprintf(stderr, "block %llu taken twice\n", (unsigned long long)b);
		exit(1);
	}
	m->held[b] = 1;
	m->takes++;
	return ch == 'D' ? TC_BLK_DIRTY : TC_BLK_HOLE;
}

static void m_give_back(void *ctx, u64 b)
{
	struct model *m = ctx;

	if (!m->held[b]) {
		fprintf(stderr, "block %llu given back but not held\n",
			(unsigned long long)b);
		exit(1);
	}
	m->held[b] = 0;
}

static u64 m_next_dirty(void *ctx, u64 from, u64 to)
{
	struct model *m = ctx;
	u64 b;

	for (b = from; b <= to && b < m->len; b++)
		if (m->map[b] == 'D' || m->map[b] == 'B' || m->map[b] == 'c')
			return b;
	return TC_PLAN_NONE;
}

static const struct tc_plan_ops ops = {
	.take = m_take,
	.give_back = m_give_back,
	.next_dirty = m_next_dirty,
};

static int failures, passes;

/*
 * Plan a request from @first and check its length, that exactly its blocks
 * are held, and that it starts and ends on a dirty block.
 */
static void check(const char *name, const char *map, u64 first, u32 max,
		  u32 gap, u32 want)
{
	struct model m = { .map = map, .len = strlen(map) };
	struct tc_plan_limits lim = { .end = m.len, .max_blocks = max,
				      .gap_blocks = gap };
	u32 nr, i;
	int ok = 1;

	m.held[first] = 1;	/* the caller took the first block */
	nr = tc_plan_extend(&ops, &m, first, &lim);
	if (nr != want)
		ok = 0;
	for (i = 0; i < m.len; i++)
		if (m.held[i] != (i >= first && i < first + nr))
			ok = 0;
	if (map[first + nr - 1] != 'D')
		ok = 0;
	if (ok) {
		passes++;
		return;
	}
	failures++;
	fprintf(stderr, "FAIL %s: map %s first %llu max %u gap %u: got %u, want %u\n",
		name, map, (unsigned long long)first, max, gap, nr, want);
}

/*
 * The obvious definition: keep adding the next block while the request
 * stays within max_blocks, every hole before the next dirty block is at most
 * gap long, and every block of the step can be taken.
 */
static u32 reference(const char *map, u64 len, u64 first, u32 max, u32 gap)
{
	u64 end = first + 1;

	for (;;) {
		u64 nd = end;

		while (nd < len && map[nd] != 'D' && map[nd] != 'B' &&
		       map[nd] != 'c')
			nd++;
		if (nd >= len || nd - end > gap || nd + 1 - first > max)
			break;
		for (u64 b = end; b <= nd; b++)
			if (map[b] == 'B' || map[b] == 'b')
				return end - first;
		if (map[nd] != 'D')
			break;
		end = nd + 1;
	}
	return end - first;
}

static void random_against_reference(void)
{
	static const char alphabet[] = "DDDD....Bbc";
	char map[200];
	int round;

	srand(1);
	for (round = 0; round < 20000; round++) {
		u64 len = 1 + rand() % 150;
		u64 first, i;
		u32 max = 1 + rand() % 40, gap = rand() % 8;
		char name[64];

		for (i = 0; i < len; i++)
			map[i] = alphabet[rand() % (sizeof(alphabet) - 1)];
		map[len] = 0;
		first = rand() % len;
		map[first] = 'D';
		snprintf(name, sizeof(name), "random round %d", round);
		check(name, map, first, max, gap,
		      reference(map, len, first, max, gap));
	}
}

int main(void)
{
	/* merging of neighbours */
	check("single block", "D", 0, 256, 0, 1);
	check("contiguous run", "DDDD", 0, 256, 0, 4);
	check("run stops at a hole", "DDD.DD", 0, 256, 0, 3);
	check("run from the middle", "..DDD.", 2, 256, 0, 3);
	check("max_blocks caps a run", "DDDDDDDD", 0, 3, 0, 3);
	check("max_blocks of one", "DDDD", 0, 1, 0, 1);
	check("end of device", "DDDD", 2, 256, 4, 2);

	/* gap bridging */
	check("hole of 1 bridged", "DD.DD", 0, 256, 1, 5);
	check("hole of 2 not bridged at gap 1", "DD..DD", 0, 256, 1, 2);
	check("hole of 2 bridged at gap 2", "DD..DD", 0, 256, 2, 6);
	check("several holes", "D.D..D...D", 0, 256, 3, 10);
	check("bridge stops at a wide hole", "D.D....D", 0, 256, 2, 3);
	check("no trailing hole", "DD...", 0, 256, 8, 2);
	check("bridge must fit max_blocks", "DD..DD", 0, 4, 2, 2);
	check("bridge exactly fills max_blocks", "DD..DD", 0, 6, 2, 6);
	check("gap larger than device", "D..D", 0, 256, 100, 4);

	/* blocks held by others */
	check("busy dirty block ends run", "DDBDD", 0, 256, 0, 2);
	check("busy hole block: no bridge", "DDb.DD", 0, 256, 2, 2);
	check("busy dirty after hole: no bridge", "DD.BD", 0, 256, 2, 2);
	check("busy later, earlier bridge kept", "D.D.B", 0, 256, 1, 3);

	check("dirty block cleaned meanwhile", "DD.cD", 0, 256, 1, 2);
	check("dirty block cleaned, gap 0", "DDcD", 0, 256, 0, 2);

	random_against_reference();

	printf("%d passed, %d failed\n", passes, failures);
	return failures ? 1 : 0;
}
