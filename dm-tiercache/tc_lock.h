/* SPDX-License-Identifier: GPL-2.0 */
/*
 * dm-tiercache: per-block locks, shared or exclusive, and range locks.
 */
#ifndef DM_TIERCACHE_LOCK_H
#define DM_TIERCACHE_LOCK_H

#include <linux/bio.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/wait.h>

enum tc_lock_mode {
	TC_LK_READ,		/* shared with reads and writeback */
	TC_LK_WB,		/* shared with reads, one writeback at a time */
	TC_LK_EXCL,
};

struct tc_holder {
	struct hlist_node node;
	u64 block;
	enum tc_lock_mode mode;
	bool granted;		/* handed over while its bio was parked */
	bool queued;		/* a reservation, not yet holding */
};

/* blocks [first, end) that no holder may take while it is held */
struct tc_range {
	struct list_head list;
	u64 first;
	u64 end;
};

struct tc_lock_bucket {
	spinlock_t lock;
	struct hlist_head held;
	struct bio_list waiters;	/* FIFO of parked bios */
};

struct tc_locks {
	unsigned int nr_buckets;		/* power of two */
	struct tc_lock_bucket *buckets;
	wait_queue_head_t wait;		/* sleepers: ranges, writeback */
	spinlock_t range_lock;		/* ranges, range_waiters */
	struct list_head ranges;
	atomic_t nr_ranges;
	struct bio_list range_waiters;
	atomic_t nr_queued;		/* reservations not yet holding */
	struct tc_holder *(*holder_of)(struct bio *bio);
	void (*requeue)(void *ctx, struct bio_list *bios);
	void (*reserved)(void *ctx);	/* a reservation now holds */
	void *ctx;
};

int tc_locks_init(struct tc_locks *l, unsigned int nr_buckets,
		  struct tc_holder *(*holder_of)(struct bio *bio),
		  void (*requeue)(void *ctx, struct bio_list *bios),
		  void (*reserved)(void *ctx), void *ctx);
void tc_locks_exit(struct tc_locks *l);
bool tc_trylock(struct tc_locks *l, struct tc_holder *h, u64 block,
		enum tc_lock_mode mode);
bool tc_lock_or_defer(struct tc_locks *l, struct tc_holder *h, u64 block,
		      enum tc_lock_mode mode, struct bio *bio);
void tc_unlock(struct tc_locks *l, struct tc_holder *h);
void tc_lock_move(struct tc_locks *l, struct tc_holder *from,
		  struct tc_holder *to);
bool tc_lock_or_reserve(struct tc_locks *l, struct tc_holder *h, u64 block,
			enum tc_lock_mode mode);
bool tc_reserve_holds(struct tc_locks *l, struct tc_holder *h);
void tc_reserve_cancel(struct tc_locks *l, struct tc_holder *h);
void tc_range_lock(struct tc_locks *l, struct tc_range *r, u64 first,
		   u64 end);
void tc_range_unlock(struct tc_locks *l, struct tc_range *r);

#endif /* DM_TIERCACHE_LOCK_H */
