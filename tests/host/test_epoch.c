// SPDX-License-Identifier: GPL-2.0
/*
 * Unit tests of the epoch bookkeeping (dm-tiercache/tc_epoch.c), built on
 * the host through tc_host.h.
 *
 *  1  a random sequence of enter (a slot becomes dirty), leave (clean or
 *     dropped), open (a flush), retire (writeback emptied the oldest) and
 *     commit (the floor moves) against a model that keeps each dirty
 *     slot's absolute epoch: counts per epoch, oldest and cur, the span
 *     rule (never more than TC_EPOCH_SPAN + 1 live epochs from the lower
 *     of oldest and the floor), tc_epoch_of() against the model's epoch;
 *  2  the edges: a flush with nothing written opens no epoch, the open
 *     epoch is never retired, empty epochs retire in a row, a flush that
 *     would exceed the span fails until the oldest retires (and the floor
 *     follows a commit), tags wrap past 255;
 *  3  loading: live epochs from the entries, a new open epoch (ordered),
 *     and a load with the span full (no write joins the newest epoch)
 *     or the newest one (default), out-of-range epochs refused;
 *  4  the race of a writer counting itself in with the retirement of its
 *     epoch: threads enter and leave while another opens and retires;
 *     no slot may ever be tagged with an epoch that is already retired;
 *     and the tags allocated while the writers run (no writer's slot may
 *     then read another epoch than the one it entered);
 *  5  the tags are allocated only when a second epoch can be live: none
 *     under the default policy (a flush opens nothing), every dirty slot
 *     in cur when they come (also in the middle of the random run of 1),
 *     a load of one epoch allocates none, of two or for the ordered
 *     policy it does, and a failed allocation changes nothing.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sched.h>

#include "tc_epoch.h"

unsigned int tc_host_fail_allocs;

static int failures;

#define CHECK(cond)							\
	do {								\
		if (!(cond)) {						\
			fprintf(stderr, "%s:%d: CHECK(%s) failed\n",	\
				__FILE__, __LINE__, #cond);		\
			failures++;					\
		}							\
	} while (0)

#define NSLOTS 4096

/* the model: the absolute epoch of each dirty slot, or -1 */
static long long model[NSLOTS];

static bool has_tags(struct tc_epochs *e)
{
	return e->tag != NULL;
}

static unsigned int rnd(unsigned int *s)
{
	*s = *s * 1103515245u + 12345u;
	return *s >> 8;
}

static u32 model_count(u64 ep)
{
	u32 n = 0;
	int i;

	for (i = 0; i < NSLOTS; i++)
		n += model[i] == (long long)ep;
	return n;
}

static void check_against_model(struct tc_epochs *e)
{
	u64 ep, low = min(e->oldest, e->floor);
	int i;

	CHECK(e->oldest <= e->cur);
	CHECK(e->cur <= low + TC_EPOCH_SPAN);
	for (ep = e->oldest; ep <= e->cur; ep++)
		CHECK(tc_epoch_nr(e, ep) == model_count(ep));
	for (i = 0; i < NSLOTS; i++) {
		if (model[i] < 0)
			continue;
		CHECK((u64)model[i] >= e->oldest && (u64)model[i] <= e->cur);
		CHECK(tc_epoch_of(e, i, low) == (u64)model[i]);
		CHECK(tc_epoch_older(e, i) == ((u64)model[i] != e->cur));
	}
}

/* The tags are allocated at step @tags_at (0: at once), 200,000 after. */
static void test_random(int tags_at)
{
	struct tc_epochs e;
	unsigned int seed = 1;
	u64 opened = 0, retired = 0, refused = 0;
	int step, i;

	CHECK(!tc_epochs_create(&e, NSLOTS));
	for (i = 0; i < NSLOTS; i++)
		model[i] = -1;
	for (step = 0; step < tags_at + 200000; step++) {
		unsigned int op = rnd(&seed) % 100;
		u32 s = rnd(&seed) % NSLOTS;

		if (step == tags_at) {
			CHECK(e.cur == 0 && !has_tags(&e));
			CHECK(!tc_epoch_need_tags(&e));
			CHECK(has_tags(&e));
			check_against_model(&e);
		}

		if (op < 45) {
			if (model[s] < 0) {
				tc_epoch_enter(&e, s);
				model[s] = e.cur;
			}
		} else if (op < 75) {
			/* writeback cleans the oldest epoch's slots first */
			if (model[s] >= 0 && (rnd(&seed) % 4 ||
					      (u64)model[s] == e.oldest)) {
				tc_epoch_leave(&e, s);
				model[s] = -1;
			}
		} else if (op < 90) {
			u64 before = e.cur;
			bool had = model_count(e.cur) > 0;
			bool ok = tc_epoch_open(&e);

			if (!ok) {
				refused++;
				CHECK(had && e.cur == before);
				CHECK(before + 1 > min(e.oldest, e.floor) +
				      TC_EPOCH_SPAN);
			} else if (step < tags_at) {
				CHECK(e.cur == before);	/* no tags: one epoch */
			} else {
				CHECK(e.cur == before + had);
				opened += had;
			}
		} else if (op < 97) {
			u64 before = e.oldest;
			bool done = tc_epoch_retire(&e);

			CHECK(done == (before < e.cur && !model_count(before)));
			CHECK(e.oldest == before + done);
			retired += done;
		} else {
			tc_epoch_set_floor(&e, e.oldest);
		}
		if (!(step % 997))
			check_against_model(&e);
	}
	check_against_model(&e);
	printf("random (tags from step %d): %llu epochs opened, %llu retired, %llu flushes refused, cur %llu\n",
	       tags_at, (unsigned long long)opened, (unsigned long long)retired,
	       (unsigned long long)refused, (unsigned long long)e.cur);
	CHECK(opened > 300 && retired > 200 && refused > 0);
	CHECK(e.cur > 300);	/* the tags wrapped */
	tc_epochs_destroy(&e);
}

static void test_edges(void)
{
	struct tc_epochs e;
	int i;

	CHECK(!tc_epochs_create(&e, NSLOTS));
	CHECK(!tc_epoch_need_tags(&e));
	/* nothing written: a flush opens nothing */
	CHECK(tc_epoch_open(&e) && e.cur == 0);
	CHECK(!tc_epoch_retire(&e));		/* the open epoch stays */
	tc_epoch_enter(&e, 0);
	CHECK(tc_epoch_open(&e) && e.cur == 1);
	CHECK(!tc_epoch_retire(&e));		/* epoch 0 holds slot 0 */
	tc_epoch_enter(&e, 1);
	CHECK(tc_epoch_open(&e) && e.cur == 2);
	tc_epoch_leave(&e, 1);			/* epoch 1 empty, 0 not */
	CHECK(!tc_epoch_retire(&e) && e.oldest == 0);
	tc_epoch_leave(&e, 0);
	CHECK(tc_epoch_retire(&e) && e.oldest == 1);
	CHECK(tc_epoch_retire(&e) && e.oldest == 2);
	CHECK(!tc_epoch_retire(&e) && e.oldest == 2);
	/* the span: slot 100 is epoch 2's, 100 + i epoch 2 + i's */
	for (i = 0; i < TC_EPOCH_SPAN; i++) {
		tc_epoch_enter(&e, 100 + i);
		if (!tc_epoch_open(&e))
			break;
	}
	/* the floor (0: nothing committed yet) is the limit */
	CHECK(e.cur == TC_EPOCH_SPAN);
	tc_epoch_set_floor(&e, e.oldest);	/* a commit: 2 */
	CHECK(tc_epoch_open(&e) && e.cur == TC_EPOCH_SPAN + 1);
	tc_epoch_enter(&e, 99);
	CHECK(tc_epoch_open(&e) && e.cur == TC_EPOCH_SPAN + 2);
	tc_epoch_enter(&e, 98);
	CHECK(!tc_epoch_open(&e));		/* 2 + 254 reached */
	tc_epoch_leave(&e, 100);
	CHECK(tc_epoch_retire(&e) && e.oldest == 3);
	CHECK(!tc_epoch_open(&e));		/* the floor holds it */
	tc_epoch_set_floor(&e, 3);
	CHECK(tc_epoch_open(&e) && e.cur == TC_EPOCH_SPAN + 3);
	/* the tags of live epochs never alias, though they wrapped */
	CHECK(tc_epoch_of(&e, 101, e.oldest) == 3);
	CHECK(tc_epoch_of(&e, 98, e.oldest) == TC_EPOCH_SPAN + 2);
	CHECK(tc_epoch_nr(&e, 3) == 1 && tc_epoch_nr(&e, TC_EPOCH_SPAN + 2) == 1);
	tc_epochs_destroy(&e);
}

static void test_load(void)
{
	struct tc_epochs e;

	CHECK(!tc_epochs_create(&e, NSLOTS));
	tc_epoch_load_begin(&e, 1000);
	CHECK(!tc_epoch_load(&e, 7, 1003));
	CHECK(!tc_epoch_load(&e, 8, 1001));
	CHECK(!tc_epoch_load(&e, 9, 1003));
	CHECK(tc_epoch_load(&e, 10, 999) == -ERANGE);
	CHECK(tc_epoch_load(&e, 10, 1000 + TC_EPOCH_SPAN + 1) == -ERANGE);
	tc_epoch_load_end(&e, true);
	CHECK(e.oldest == 1001 && e.cur == 1004);
	CHECK(tc_epoch_nr(&e, 1003) == 2 && tc_epoch_nr(&e, 1001) == 1);
	CHECK(tc_epoch_of(&e, 8, e.floor) == 1001);
	CHECK(tc_epoch_older(&e, 7));
	tc_epochs_destroy(&e);

	CHECK(!tc_epochs_create(&e, NSLOTS));
	tc_epoch_load_begin(&e, 0);
	CHECK(!tc_epoch_load(&e, 1, 0));
	tc_epoch_load_end(&e, false);		/* default policy */
	CHECK(e.oldest == 0 && e.cur == 0 && !tc_epoch_older(&e, 1));
	tc_epochs_destroy(&e);

	/* nothing dirty: the superblock's epoch */
	CHECK(!tc_epochs_create(&e, NSLOTS));
	tc_epoch_load_begin(&e, 77);
	tc_epoch_load_end(&e, true);
	CHECK(e.oldest == 77 && e.cur == 77 && !tc_epoch_must_open(&e));
	tc_epochs_destroy(&e);

	/*
	 * The span counts from the oldest loaded epoch (the load's commit
	 * makes it the floor): room for a new one though the superblock's
	 * epoch is older.
	 */
	CHECK(!tc_epochs_create(&e, NSLOTS));
	tc_epoch_load_begin(&e, 500);
	CHECK(!tc_epoch_load(&e, 1, 502));
	CHECK(!tc_epoch_load(&e, 2, 500 + TC_EPOCH_SPAN));
	tc_epoch_load_end(&e, true);
	CHECK(e.oldest == 502 && e.cur == 500 + TC_EPOCH_SPAN + 1);
	CHECK(!tc_epoch_must_open(&e));
	tc_epochs_destroy(&e);

	/*
	 * The span full: the newest loaded epoch stays open, but no write may
	 * join it until writeback retired the oldest and a commit moved the
	 * floor; then the new epoch opens.
	 */
	CHECK(!tc_epochs_create(&e, NSLOTS));
	tc_epoch_load_begin(&e, 500);
	CHECK(!tc_epoch_load(&e, 1, 500));
	CHECK(!tc_epoch_load(&e, 2, 500 + TC_EPOCH_SPAN));
	tc_epoch_load_end(&e, true);
	CHECK(e.oldest == 500 && e.cur == 500 + TC_EPOCH_SPAN);
	CHECK(tc_epoch_must_open(&e) && tc_epoch_must_open(&e));
	CHECK(!tc_epoch_open(&e));		/* a flush waits too */
	tc_epoch_leave(&e, 1);			/* slot 1 written back */
	CHECK(tc_epoch_retire(&e) && e.oldest == 501);
	CHECK(tc_epoch_must_open(&e));		/* the floor is still 500 */
	tc_epoch_set_floor(&e, 501);
	CHECK(!tc_epoch_must_open(&e) && e.cur == 500 + TC_EPOCH_SPAN + 1);
	CHECK(!tc_epoch_must_open(&e));
	tc_epochs_destroy(&e);

	/* the span full, but the newest loaded epoch drains first */
	CHECK(!tc_epochs_create(&e, NSLOTS));
	tc_epoch_load_begin(&e, 500);
	CHECK(!tc_epoch_load(&e, 1, 500));
	CHECK(!tc_epoch_load(&e, 2, 500 + TC_EPOCH_SPAN));
	tc_epoch_load_end(&e, true);
	tc_epoch_leave(&e, 2);
	CHECK(!tc_epoch_must_open(&e) && e.cur == 500 + TC_EPOCH_SPAN);
	tc_epochs_destroy(&e);
}

/* ---- the race ---- */

#define WRITERS 3
#define RACE_SLOTS 64

static struct tc_epochs race;
static int race_stop;
static int race_bad;
static int race_mistag;

static void *race_writer(void *arg)
{
	u32 base = (u32)(long)arg * RACE_SLOTS;
	u32 i;

	while (!__atomic_load_n(&race_stop, __ATOMIC_RELAXED)) {
		for (i = 0; i < RACE_SLOTS; i++) {
			u8 tag = tc_epoch_enter(&race, base + i);
			/*
			 * cur, then oldest: cur - oldest stays within the
			 * span (read the other way round, a writer preempted
			 * between the two reads sees cur run 256 past the
			 * oldest it read, a false alarm)
			 */
			u64 cur = tc_epoch_cur(&race);
			u64 old;

			smp_rmb();
			old = tc_epoch_oldest(&race);

			/* its own slot: nobody else tags it, the fill neither */
			if (tc_epoch_tag(&race, base + i) != tag)
				__atomic_fetch_add(&race_mistag, 1,
						   __ATOMIC_RELAXED);

			/* counted in: its epoch cannot be retired now */
			if ((u8)(tag - (u8)old) > (u8)(cur - old))
				__atomic_fetch_add(&race_bad, 1,
						   __ATOMIC_RELAXED);
		}
		for (i = 0; i < RACE_SLOTS; i++)
			tc_epoch_leave(&race, base + i);
	}
	return NULL;
}

static void test_race(void)
{
	pthread_t t[WRITERS];
	long i;
	long n;
	time_t t0;

	CHECK(!tc_epochs_create(&race, WRITERS * RACE_SLOTS));
	for (i = 0; i < WRITERS; i++)
		pthread_create(&t[i], NULL, race_writer, (void *)i);
	/*
	 * Until the tags wrapped twice, or 60 s on a loaded machine (the
	 * writers must get the CPU: the opener yields now and then).
	 */
	t0 = time(NULL);
	for (n = 0; tc_epoch_cur(&race) < 600 && time(NULL) < t0 + 60; n++) {
		/* the writers run a while on one epoch, without tags */
		if (n == 20000)
			CHECK(!tc_epoch_need_tags(&race));
		tc_epoch_open(&race);
		tc_epoch_retire(&race);
		if (!(n % 64))
			tc_epoch_set_floor(&race, tc_epoch_oldest(&race));
		if (!(n % 1024))
			sched_yield();
	}
	__atomic_store_n(&race_stop, 1, __ATOMIC_RELAXED);
	for (i = 0; i < WRITERS; i++)
		pthread_join(t[i], NULL);
	/* all left: every epoch but the open one retires */
	while (tc_epoch_retire(&race))
		;
	printf("race: cur %llu oldest %llu, %d writers counted in a retired epoch, %d read another tag\n",
	       (unsigned long long)race.cur, (unsigned long long)race.oldest,
	       race_bad, race_mistag);
	CHECK(race_bad == 0);
	CHECK(race_mistag == 0);
	CHECK(race.oldest == race.cur);
	CHECK(tc_epoch_nr(&race, race.cur) == 0);
	CHECK(race.cur > 256);	/* the tags wrapped */
	tc_epochs_destroy(&race);
}

/* ---- 5: the tags only when a second epoch can be live ---- */

static void test_lazy_tags(void)
{
	struct tc_epochs e;

	/* the default policy: flushes open nothing, all is cur's */
	CHECK(!tc_epochs_create(&e, NSLOTS));
	CHECK(!has_tags(&e));
	tc_epoch_enter(&e, 5);
	CHECK(tc_epoch_open(&e) && e.cur == 0);
	tc_epoch_enter(&e, 6);
	CHECK(!tc_epoch_older(&e, 5) && tc_epoch_nr(&e, 0) == 2);
	CHECK(!tc_epoch_retire(&e));
	/* no memory: nothing changes, and a later try works */
	tc_host_fail_allocs = 1;
	CHECK(tc_epoch_need_tags(&e) == -ENOMEM && !has_tags(&e));
	CHECK(!tc_epoch_need_tags(&e) && has_tags(&e));
	CHECK(!tc_epoch_need_tags(&e));		/* once */
	CHECK(tc_epoch_tag(&e, 5) == 0 && tc_epoch_tag(&e, 6) == 0);
	CHECK(tc_epoch_open(&e) && e.cur == 1);
	CHECK(tc_epoch_older(&e, 5) && tc_epoch_older(&e, 6));
	tc_epoch_leave(&e, 5);
	tc_epoch_leave(&e, 6);
	CHECK(tc_epoch_retire(&e) && e.oldest == 1);
	tc_epochs_destroy(&e);

	/* a load of one epoch: no tags, cur is that epoch */
	CHECK(!tc_epochs_create(&e, NSLOTS));
	tc_epoch_load_begin(&e, 40);
	CHECK(!tc_epoch_load(&e, 1, 42) && !tc_epoch_load(&e, 2, 42));
	CHECK(e.cur == 42 && tc_epoch_of(&e, 1, 40) == 42);
	CHECK(!tc_epoch_load_end(&e, false));
	CHECK(!has_tags(&e) && e.oldest == 42 && e.cur == 42);
	CHECK(tc_epoch_nr(&e, 42) == 2 && !tc_epoch_older(&e, 2));
	tc_epochs_destroy(&e);

	/* ... for the ordered policy: the new epoch needs them */
	CHECK(!tc_epochs_create(&e, NSLOTS));
	tc_epoch_load_begin(&e, 40);
	CHECK(!tc_epoch_load(&e, 1, 42));
	tc_host_fail_allocs = 1;
	CHECK(tc_epoch_load_end(&e, true) == -ENOMEM);
	tc_epochs_destroy(&e);
	CHECK(!tc_epochs_create(&e, NSLOTS));
	tc_epoch_load_begin(&e, 40);
	CHECK(!tc_epoch_load(&e, 1, 42));
	CHECK(!tc_epoch_load_end(&e, true) && has_tags(&e));
	CHECK(e.cur == 43 && tc_epoch_older(&e, 1));
	CHECK(tc_epoch_of(&e, 1, e.oldest) == 42);
	tc_epochs_destroy(&e);

	/* two epochs: the tags come with the second, the first kept */
	CHECK(!tc_epochs_create(&e, NSLOTS));
	tc_epoch_load_begin(&e, 40);
	CHECK(!tc_epoch_load(&e, 1, 44) && !has_tags(&e));
	tc_host_fail_allocs = 1;
	CHECK(tc_epoch_load(&e, 2, 41) == -ENOMEM);
	CHECK(!tc_epoch_load(&e, 2, 41) && has_tags(&e));
	CHECK(!tc_epoch_load_end(&e, false));
	CHECK(e.oldest == 41 && e.cur == 44);
	CHECK(tc_epoch_of(&e, 1, 40) == 44 && tc_epoch_of(&e, 2, 40) == 41);
	CHECK(tc_epoch_nr(&e, 44) == 1 && tc_epoch_nr(&e, 41) == 1);
	tc_epochs_destroy(&e);
}

int main(void)
{
	test_edges();
	test_load();
	test_random(0);
	test_random(100000);
	test_lazy_tags();
	test_race();
	if (failures) {
		fprintf(stderr, "test_epoch: %d checks failed\n", failures);
		return 1;
	}
	printf("test_epoch: all checks passed\n");
	return 0;
}
