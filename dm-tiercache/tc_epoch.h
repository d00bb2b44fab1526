/* SPDX-License-Identifier: GPL-2.0 */
/*
 * dm-tiercache: epochs, the writes between two flushes.
 *
 * An epoch is the set of writes the cached device received between two
 * REQ_PREFLUSH.  Under the `ordered` policy each flush that follows a
 * write opens a new epoch, and writeback sends the epochs to the origin
 * one at a time, oldest first, with an origin flush between them: the
 * origin alone then always holds a state the cached device could have
 * had after a power cut.  Under the default policy no flush opens an
 * epoch, and writeback only drains the epochs it finds (after a reload of
 * an ordered cache) in order.
 *
 * Each dirty slot carries the 8-bit tag of its epoch (absolute epoch
 * mod 256), and each tag a count of the dirty slots that carry it.  The
 * live epochs are oldest .. cur: cur is the open one (writes go to it),
 * oldest the one writeback drains.  At most TC_EPOCH_SPAN + 1 epochs are
 * live, counted from the lower of oldest and @floor (the epoch the last
 * committed superblock names, below which no dirty entry on disk lies):
 * so tags never alias, and a 16-bit epoch on disk decodes against the
 * superblock's.  A flush that would open one more waits (tc_epoch_open()
 * fails) until writeback retires the oldest.
 *
 * The tags cost a byte per slot, and they are needed only once a second
 * epoch can be live: until then (the default policy, a load that found
 * dirty slots of one epoch at most) @tag is NULL, every dirty slot
 * belongs to cur, and cur does not move (tc_epoch_open() opens nothing).
 * tc_epoch_need_tags() allocates them, each set to cur, and publishes
 * them: the ordered policy calls it before it is switched on, a load
 * before it loads a second epoch.  The opener of an epoch reads the
 * pointer, then moves cur with a release; a reader of a tag reads cur,
 * then the pointer (tc_epoch_tags()): if it finds none, cur was still
 * the one epoch.
 *
 * Concurrency: tc_epoch_enter() and tc_epoch_leave() are lockless (any
 * context but hard interrupts); opening and retiring, rare, take the
 * lock.  A writer that read cur and counts itself in races a retirement
 * of that epoch: both sides write, then read the other's word (Dekker),
 * so either the retirement sees the count and backs off, or the writer
 * sees the epoch gone and counts itself in a later one (a write still in
 * flight when a flush came may belong to either side of it).
 */
#ifndef DM_TIERCACHE_EPOCH_H
#define DM_TIERCACHE_EPOCH_H

#ifdef __KERNEL__
#include <linux/types.h>
#include <linux/atomic.h>
#include <linux/spinlock.h>
#else
#include "tc_host.h"
#endif

#define TC_EPOCH_TAGS		256
/* cur - min(oldest, floor) stays at most this */
#define TC_EPOCH_SPAN		254
/* a write's epoch before it is known: later than any (tc_map_epoch()) */
#define TC_EPOCH_NEXT		U64_MAX

struct tc_epochs {
	u8 *tag;			/* per slot: the epoch of a dirty one */
	u32 nr_slots;			/* the size of @tag */
	atomic_t nr[TC_EPOCH_TAGS];	/* dirty slots per tag */
	u64 oldest;			/* the oldest live epoch */
	u64 cur;			/* the open epoch */
	u64 floor;			/* the last committed superblock's */
	u64 retiring;			/* the epoch being retired, or U64_MAX */
	bool must_open;			/* loaded with no room for a new epoch */
	spinlock_t lock;		/* opening and retiring */
	/* loading */
	u64 load_min;
	u64 load_max;
	bool loaded_any;
};

int tc_epochs_create(struct tc_epochs *e, u32 nr_slots);
void tc_epochs_destroy(struct tc_epochs *e);
int tc_epoch_need_tags(struct tc_epochs *e);

u8 tc_epoch_enter(struct tc_epochs *e, u32 slot);
void tc_epoch_leave(struct tc_epochs *e, u32 slot);
bool tc_epoch_open(struct tc_epochs *e);
bool tc_epoch_can_open(struct tc_epochs *e);
bool tc_epoch_must_open(struct tc_epochs *e);
bool tc_epoch_retire(struct tc_epochs *e);
void tc_epoch_set_floor(struct tc_epochs *e, u64 floor);
u64 tc_epoch_of(struct tc_epochs *e, u32 slot, u64 base);
u32 tc_epoch_nr(struct tc_epochs *e, u64 epoch);

void tc_epoch_load_begin(struct tc_epochs *e, u64 floor);
int tc_epoch_load(struct tc_epochs *e, u32 slot, u64 epoch);
int tc_epoch_load_end(struct tc_epochs *e, bool open_new);

static inline u64 tc_epoch_oldest(struct tc_epochs *e)
{
	return READ_ONCE(e->oldest);
}

static inline u64 tc_epoch_cur(struct tc_epochs *e)
{
	return READ_ONCE(e->cur);
}

/*
 * The tags, or NULL while every dirty slot is in @*single, the open epoch
 * (see above: cur is read first).
 */
static inline const u8 *tc_epoch_tags(struct tc_epochs *e, u64 *single)
{
	*single = READ_ONCE(e->cur);
	smp_rmb();	/* cur, then the tags: see tc_epoch_need_tags() */
	return smp_load_acquire(&e->tag);
}

static inline u8 tc_epoch_tag(struct tc_epochs *e, u32 slot)
{
	u64 single;
	const u8 *tag = tc_epoch_tags(e, &single);

	return tag ? READ_ONCE(tag[slot]) : (u8)single;
}

/* Is dirty @slot a version of an epoch older than the open one? */
static inline bool tc_epoch_older(struct tc_epochs *e, u32 slot)
{
	return tc_epoch_tag(e, slot) != (u8)tc_epoch_cur(e);
}

/* Does dirty @slot belong to @epoch (a live one)? */
static inline bool tc_epoch_in(struct tc_epochs *e, u32 slot, u64 epoch)
{
	return tc_epoch_tag(e, slot) == (u8)epoch;
}

#endif /* DM_TIERCACHE_EPOCH_H */
