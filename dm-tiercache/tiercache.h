/* SPDX-License-Identifier: GPL-2.0 */
/*
 * dm-tiercache: a block cache whose writeback sends dirty blocks to the
 * origin as few, large, ascending writes.
 *
 * Structures and prototypes, grouped by the file that implements them.
 */
#ifndef DM_TIERCACHE_H
#define DM_TIERCACHE_H

#include <linux/device-mapper.h>
#include <linux/bio.h>
#include <linux/blkdev.h>
#include <linux/workqueue.h>
#include <linux/wait.h>
#include <linux/list.h>
#include <linux/refcount.h>
#include <linux/mutex.h>

#include "tc_plan.h"
#include "tc_lock.h"
#include "compat.h"
#include "tc_disk.h"
#include "tc_index.h"

#define DM_MSG_PREFIX "tiercache"

#define TC_MIN_BLOCK_SECTORS	8
#define TC_MAX_BLOCK_SECTORS	2048
#define TC_MIN_SLOTS		16
#define TC_MAX_FLUSH_KB		16384
#define TC_DEFAULT_FLUSH_KB	1024

enum tc_mode {
	TC_MODE_WRITEBACK,
	TC_MODE_WRITETHROUGH,
	TC_MODE_PASSTHROUGH,
};

/* Tunable keys, in the order they are re-emitted in the table line. */
enum tc_key {
	TC_KEY_FLUSH_DEPTH,
	TC_KEY_MAX_FLUSH_KB,
	TC_KEY_BRIDGE_GAP_KB,
	TC_KEY_HIGH_WATERMARK,
	TC_KEY_LOW_WATERMARK,
	TC_KEY_FLUSH_ON_SUSPEND,
	TC_KEY_COMMIT_MS,
	TC_KEY_ORDERED,
	TC_NR_KEYS,
};

/* ---- tc_args.c: table line and "set" message parsing ---- */

struct tc_args {
	const char *origin_path;
	const char *cache_path;
	unsigned int block_sectors;
	enum tc_mode mode;
	bool mode_given;
	bool format;			/* "format": not re-emitted */
	unsigned int val[TC_NR_KEYS];
	unsigned long given;		/* bit per enum tc_key */
};

int tc_args_parse(struct tc_args *a, unsigned int argc, char **argv,
		  char **error);
int tc_args_set(struct tc_args *a, const char *key, const char *value,
		char **error);
int tc_args_finalise(const struct tc_args *a, unsigned int origin_max_kb,
		     unsigned int *val, char **error);
const char *tc_key_name(enum tc_key k);
const char *tc_mode_name(enum tc_mode m);
void tc_args_emit(const struct tc_args *a, char *result, unsigned int maxlen,
		  unsigned int *sz);

/* per-bio counters: per CPU, summed when the status is read */
enum tc_io_stat {
	TC_S_READ_HIT,
	TC_S_READ_MISS,
	TC_S_WRITE_HIT,
	TC_S_WRITE_MISS,
	TC_S_WRITE_BYPASS,
	TC_NR_IO_STATS,
};

struct tc_io_stats {
	u64 n[TC_NR_IO_STATS];
};

/* writeback counters: one update per request, shared */
struct tc_stats {
	struct tc_io_stats __percpu *io;
	atomic64_t wb_blocks;
	atomic64_t wb_requests;
	atomic64_t wb_sectors;
	atomic64_t bridged_blocks;
	atomic_t inflight_max;
};

/* ---- tc_io.c: page buffers (functions below) ---- */

struct tc_buf {
	unsigned int nr_chunks;
	unsigned int chunk_bytes;
	struct page **chunks;
};

/* ---- tc_pool.c: ready buffer chunks for the engine ---- */

#define TC_BUF_MAX_ORDER	4

struct tc_pool {
	spinlock_t lock;		/* chunks, nr, target, wq */
	struct list_head chunks;	/* free chunks, linked by page->lru */
	unsigned int nr;
	unsigned int target;		/* chunks to keep; 0: stopped */
	struct workqueue_struct *wq;
	struct work_struct refill;
};

void tc_pool_init(struct tc_pool *p);
void tc_pool_start(struct tc_pool *p, struct workqueue_struct *wq,
		   unsigned int target);
void tc_pool_stop(struct tc_pool *p);
struct page *tc_pool_get(struct tc_pool *p);
bool tc_pool_put(struct tc_pool *p, struct page *pg);

/* ---- tc_flush.c: the neighbour-merging writeback engine ---- */

struct tc_wb_req;

enum tc_flush_bits {
	TC_FL_FULL_REQ,		/* a full flush was asked for */
	TC_FL_FULL,		/* a full flush is running */
	TC_FL_BACKGROUND,	/* watermark writeback is running */
	TC_FL_STOPPED,		/* suspended: issue nothing */
	TC_FL_PAUSED,		/* background paused after an error */
	TC_FL_PASS_END,		/* pass over: waiting for its requests */
	TC_FL_RESV_READY,	/* the reservation holds its block */
	TC_FL_EPOCH_WAIT,	/* writes or flushes wait for an epoch */
	TC_FL_FLOOR_WAIT,	/* a pass waits for a commit (floor) */
	TC_FL_MERGE_NOMEM,	/* a merge of this pass found no memory */
};

struct tc_flush {
	struct work_struct work;	/* the engine: gathers and issues */
	struct work_struct done_work;	/* completions in process context */
	unsigned long bits;		/* enum tc_flush_bits */
	u64 cursor;			/* next origin block of the sweep */
	u64 pass_epoch;			/* the epoch this pass writes back */
	u64 full_epoch;			/* the newest a full flush owes */
	u32 full_gen;			/* full flushes begun */
	bool pass_skipped;		/* a dirty block was busy this pass */
	bool pass_issued;		/* a request was issued this pass */
	int pass_error;
	spinlock_t lock;		/* protects the lists below */
	struct list_head completed;	/* requests with a finished stage */
	struct list_head flushed;	/* batches whose origin flush ended */
	struct list_head done;		/* written, waiting for an origin flush */
	unsigned int nr_done;
	atomic_t inflight;		/* requests not yet written */
	atomic_t outstanding;		/* requests still holding locks */
	wait_queue_head_t wait;
	int error;			/* latched first error */
	unsigned long flushes;		/* full flushes completed */
	struct tc_pool pool;		/* buffer chunks, while running */
	struct delayed_work retry_work;	/* ends a pause after an error */
	struct delayed_work later_work;	/* the engine again, a little later */
	unsigned int backoff_ms;	/* the next pause */
	struct tc_wb_req *scratch;	/* gathers a request before sizing it */
	u32 scratch_blocks;
	struct tc_holder resv;		/* a busy block a flush must write */
};

/* ---- tc_meta.c: persistent metadata ---- */

/* What one entry should say, taken for a commit. */
struct tc_meta_want {
	u64 block;
	u64 seq;
	bool valid;
	bool dirty;
	u16 epoch;			/* a dirty version's, low bits */
};

struct tc_meta {
	struct tc_layout layout;
	void *bounce;			/* the running commit's copies */
	u64 bounce_blocks;		/* metadata blocks it holds */
	unsigned long *want_valid;	/* slots whose entry names a block */
	unsigned long *want_dirty;	/* ... as dirty */
	unsigned long *late;		/* changed in the open sequence */
	u64 *late_seq;			/* per block: the sequence of late */
	struct tc_meta_want *want_buf;	/* one block's, for the commit */
	unsigned long *changed;		/* metadata blocks changed */
	unsigned long *snap;		/* blocks of the running commit */
	unsigned long *disk_dirty;	/* slots maybe dirty on disk */
	atomic64_t nr_disk_dirty;	/* bits set in disk_dirty */
	atomic_t nr_stale;		/* disk_dirty without want_valid */
	spinlock_t lock;		/* wanted state, changed, bitmaps, PARKED, waiting */
	struct mutex commit_lock;
	u64 open_seq;			/* the commit new changes go to */
	u64 committed_seq;
	u32 gen;			/* format generation (tc_disk.h) */
	u32 version;			/* the format version loaded */
	u64 commit_epoch;		/* the superblock's epoch (tc_disk.h) */
	u64 committed_epoch;		/* ... of the last complete commit */
	u32 sb_flags;			/* TC_SB_* the superblock gets */
	bool force_sb;			/* commit even if nothing changed */
	bool any_changed;		/* a block is marked in changed */
	bool suspended;			/* no timer commits */
	bool read_only;			/* the table is read-only: no writes */
	int error;			/* first commit error */
	atomic64_t commits;
	u64 origin_sectors;
	char uuid[TC_UUID_BYTES + 1];
	struct tc_disk_sb *sb;		/* one page */
	enum tc_sb_result sb_res;	/* the superblock found at open */
	struct tc_sb_info sb_info;	/* ... decoded */
	unsigned long *sum;		/* v4: metadata blocks marked on disk */
	unsigned long *sum_clear;	/* marked, last written with no dirty */
	unsigned long *sum_nodirty;	/* the commit writes them with none */
	unsigned long *sum_write;	/* summary blocks to write */
	bool sum_pending;		/* bits in sum_clear */
	struct bio_list waiting;	/* flushes and FUA writes */
	struct work_struct commit_work;
	struct delayed_work timer_work;
};

/* A request for an origin flush (tc_oflush.c). */
struct tc_oflush_req {
	struct list_head list;
	void (*done)(struct tc_oflush_req *req, blk_status_t status);
};

/* Origin flushes, one in flight at a time. */
struct tc_oflush {
	spinlock_t lock;		/* the lists, running */
	struct list_head next;		/* requests for the next flush */
	struct list_head cur;		/* requests of the flush in flight */
	bool running;			/* a flush in flight or queued */
	struct work_struct work;	/* issues the next flush */
};

/* ---- the shared cache state (tc_target.c owns its life) ---- */

struct tc_cache {
	struct list_head list;		/* in the registry */
	refcount_t ref;
	struct mapped_device *md;
	char name[32];			/* the mapped device, for messages */
	struct mutex ctl_lock;		/* messages and resume */
	dev_t origin_dev;
	dev_t cache_dev;
	struct block_device *origin_bdev;
	struct block_device *cache_bdev;
	struct dm_target *owner;	/* the active target, for events */
	sector_t target_len;

	unsigned int block_sectors;
	unsigned int block_shift;	/* log2(block_sectors) */
	u64 nr_blocks;			/* whole origin blocks in the target */
	u32 nr_slots;
	sector_t data_start;		/* first data sector on the cache dev */

	struct tc_index ix;		/* tc_index.h */

	struct tc_locks locks;

	/* live settings */
	enum tc_mode mode;
	bool cleaner;
	bool read_only;			/* no writeback, no metadata writes */
	atomic_t no_dirty;		/* tables loaded that keep writes clean */
	int replace_error;		/* this cache was to replace one that
					 * kept dirty blocks: no resume
					 */
	unsigned int val[TC_NR_KEYS];

	/* deferred bio processing */
	struct workqueue_struct *wq;
	spinlock_t defer_lock;
	struct bio_list deferred;
	struct bio_list discards;
	struct work_struct io_work;
	struct work_struct discard_work;
	struct workqueue_struct *discard_wq;	/* waits for locks: own queue */
	struct bio_set bs;

	/* the cache device failed (tc_cache_fail()) */
	int failed;			/* 0, or the error that latched it */
	struct work_struct fail_work;	/* raises the dm event of the latch */
	struct bio_list wb_wait;	/* writes waiting for their slot's
					 * writeback request, or for a free
					 * slot (defer_lock)
					 */
	atomic_t slot_wakes;		/* tc_wake_wb_waiters() calls: a write
					 * that found no slot parks only if
					 * none came since it looked
					 */
	struct bio_list ep_wait;	/* writes waiting for an epoch */
	struct bio_list order_wait;	/* writes waiting for a merge of the
					 * dirty order's full tail
					 */
	struct bio_list ep_flushes;	/* flushes waiting for an epoch */

	struct tc_stats stats;
	struct tc_flush fl;
	struct tc_oflush oflush;
	struct tc_meta meta;
	bool meta_loaded;		/* formatted or loaded: commit at the end */
	bool creating;			/* in the registry, not yet set up */
	bool destroying;		/* in the registry, being torn down */
};

/* one table's target: arguments and device references */
struct tc_target {
	struct dm_target *ti;
	struct dm_dev *origin;
	struct dm_dev *cache_dev;
	struct tc_args args;		/* as given (and set since) */
	unsigned int val[TC_NR_KEYS];	/* resolved values in force */
	unsigned int origin_max_kb;	/* the origin's max_sectors_kb */
	bool read_only;			/* the table was loaded read-only */
	bool passthrough_failed;	/* resumed writethrough: still dirty */
	struct tc_cache *c;
	/*
	 * From load to resume, writes to @hold (this device's state, or the
	 * state of the cache device this table replaces) stay clean, so the
	 * resume has nothing, or little, to write back.
	 */
	struct tc_cache *hold;
};

/* ---- tc_cache.c: the state shared by the tables of one device ---- */

struct tc_cache *tc_cache_get(struct tc_target *t, char **error);
void tc_cache_put(struct tc_cache *c);
void tc_cache_release_hold(struct tc_target *t);
void tc_cache_fail(struct tc_cache *c, int err, const char *what);

/* Has the cache device failed?  Nothing new goes to it then. */
static inline bool tc_failed(struct tc_cache *c)
{
	return READ_ONCE(c->failed);
}

/* per-bio data */
enum tc_stage {
	TC_ST_NEW,		/* not yet locked: run the dispatcher */
	TC_ST_BOTH,		/* locked: write cache and origin */
	TC_ST_BOTH_DONE,	/* both writes ended */
	TC_ST_PROMOTE,		/* locked: read origin, then fill a slot */
	TC_ST_PROMOTE_WRITE,	/* origin read ended: write the slot */
	TC_ST_PROMOTE_DONE,	/* slot write ended: index it */
	TC_ST_FUA,		/* locked: write the slot, then commit */
	TC_ST_FUA_DONE,		/* slot write ended: wait for a commit */
	TC_ST_TO_ORIGIN,	/* cache failed: to the origin instead */
	TC_ST_AROUND_FUA,	/* locked: commit, then to the origin */
	TC_ST_AGAIN,		/* locked: through the dispatcher again */
	TC_ST_RMW,		/* failed cache, partial write to a dirty
				 * block: read the block from its slot
				 */
	TC_ST_DROP_WRITE,	/* failed cache, dirty block: the whole
				 * block to the origin (FUA)
				 */
	TC_ST_DROP_DONE,	/* origin write ended: drop the slot */
	TC_ST_COW_READ,		/* partial write to an older epoch's
				 * version: read it for the new slot
				 */
	TC_ST_COW_WRITE,	/* merged: write the new slot */
	TC_ST_COW_DONE,		/* new slot written: record it */
	TC_ST_RUN_FAILED,	/* the cache failed a write run: drop its
				 * fresh slots, write it to the origin
				 */
	TC_ST_RUN_DROP,		/* the run's origin write (FUA) in flight */
	TC_ST_RUN_DROP_DONE,	/* origin write ended: drop the copies */
};

/* most blocks one run sends at once: 1 MiB of 4 KiB blocks */
#define TC_RUN_MAX	256

/* the locks of a run's blocks after its first (tc_run.c, tc_miss.c) */
struct tc_run {
	unsigned int nr;		/* blocks after the first */
	bool full;			/* TC_RUN_MAX blocks: from tc_run_cache */
	DECLARE_BITMAP(record, TC_RUN_MAX);	/* bit i: a write run's block i
						 * (0: the first) is recorded
						 * dirty at end_io
						 */
	struct tc_holder h[];
};

struct tc_bio {
	struct tc_cache *c;
	struct tc_holder holder;
	struct tc_run *run;		/* a bio of several blocks (tc_run.c,
					 * tc_miss.c)
					 */
	bool locked;
	bool to_cache;			/* remapped to its slot */
	bool was_clean;			/* a write hit on a clean copy */
	bool discard;			/* holds @range */
	bool fua;			/* REQ_FUA as mapped (kept: a device
					 * without a write cache drops it)
					 */
	enum tc_stage stage;
	u32 slot;			/* its (first) slot */
	u32 cow_from;			/* copy on write: the older version */
	u64 block;
	bool meta_new;			/* record the new dirty slot at end_io */
	atomic_t pending;		/* clones in flight */
	blk_status_t status;
	blk_status_t cache_status;
	struct bvec_iter iter;		/* as mapped, to send it again */
	/*
	 * As sent to the cache device: a bio it completed (and may have
	 * split, which leaves its remaining count at 0) is sent again only
	 * with these restored (tc_bio_restore() in tc_map.c).
	 */
	bio_end_io_t *end_io;
	unsigned long bi_flags;
	int remaining;
	struct tc_buf buf;		/* promotion, merge of a partial write:
					 * the target's own copy of a block
					 */
	struct tc_range range;
	bool again;			/* dispatched again: counted once */
	u8 order_waits;			/* merges of a full tail waited for */
	int slot_wakes;			/* c->slot_wakes before it looked for a
					 * slot (TC_WAIT_SLOT)
					 */
	u64 epoch;			/* a write: the epoch open at its map */
	struct tc_oflush_req oflush;	/* bio 1 of a flush: waits in tc_oflush.c */
};

static inline void tc_count(struct tc_cache *c, enum tc_io_stat s)
{
	this_cpu_inc(c->stats.io->n[s]);
}

static inline struct bio *tc_bio_of(struct tc_bio *pb)
{
	return dm_bio_from_per_bio_data(pb, sizeof(struct tc_bio));
}

static inline sector_t tc_slot_sector(struct tc_cache *c, u32 slot)
{
	return c->data_start + ((sector_t)slot << c->block_shift);
}

static inline unsigned int tc_block_bytes(struct tc_cache *c)
{
	return c->block_sectors << SECTOR_SHIFT;
}

/* ---- tc_meta.c ---- */

void tc_meta_init(struct tc_cache *c);
int tc_meta_read_sb(struct tc_cache *c, struct tc_target *t, char **error);
int tc_meta_open(struct tc_cache *c, struct tc_target *t, char **error);
unsigned long *tc_bitmap_alloc(u64 bits);
int tc_meta_rw(struct tc_cache *c, void *buf, sector_t sector,
	       size_t bytes, blk_opf_t opf);

/* tc_msum.c: the metadata summary (format version 4) */
int tc_msum_alloc(struct tc_meta *m);
void tc_msum_free(struct tc_meta *m);
bool tc_msum_marked(struct tc_meta *m, u64 mb);
int tc_msum_prepare(struct tc_cache *c);
void tc_msum_note(struct tc_meta *m, u64 mb, bool dirty);
void tc_msum_written(struct tc_meta *m, u64 mb);
bool tc_msum_pending(struct tc_meta *m);
int tc_msum_load(struct tc_cache *c, u32 gen);
u64 tc_msum_next_run(struct tc_meta *m, u64 mb, u64 max, u64 *start);
void tc_msum_loaded(struct tc_meta *m, u64 mb, bool may_dirty);
void tc_msum_reset(struct tc_meta *m);
int tc_msum_format(struct tc_cache *c);
int tc_meta_close(struct tc_cache *c);
void tc_meta_free(struct tc_cache *c);
void tc_meta_set(struct tc_cache *c, u32 slot, bool dirty);
void tc_meta_clear(struct tc_cache *c, u32 slot);
bool tc_meta_disk_dirty(struct tc_cache *c, u32 slot);
bool tc_meta_any_disk_dirty(struct tc_cache *c);
bool tc_meta_defer_free(struct tc_cache *c, u32 slot);
bool tc_meta_stale(struct tc_cache *c);
void tc_meta_queue_bio(struct tc_cache *c, struct bio *bio);
void tc_meta_kick(struct tc_cache *c);
int tc_meta_commit(struct tc_cache *c);
void tc_meta_commit_floor(struct tc_cache *c);
void tc_meta_commit_ms_changed(struct tc_cache *c);
void tc_meta_suspend(struct tc_cache *c);
void tc_meta_resume(struct tc_cache *c);

/* ---- tc_map.c: bio dispatch ---- */

int tc_map(struct dm_target *ti, struct bio *bio);
int tc_end_io(struct dm_target *ti, struct bio *bio, blk_status_t *error);
void tc_io_work(struct work_struct *w);
void tc_discard_work(struct work_struct *w);
void tc_requeue(void *ctx, struct bio_list *bios);
struct tc_holder *tc_holder_of(struct bio *bio);
void tc_queue_io(struct tc_cache *c, struct bio *bio);
bool tc_origin_behind(struct tc_cache *c);
void tc_wake_wb_waiters(struct tc_cache *c);
void tc_wake_order_waiters(struct tc_cache *c);
void tc_epoch_waiters_go(struct tc_cache *c);
void tc_epoch_waiters_fail(struct tc_cache *c, int err);
bool tc_writes_dirty(struct tc_cache *c);
bool tc_stale_clean(struct tc_cache *c, u32 slot);
bool tc_around_waits(struct tc_cache *c, u64 epoch);
bool tc_around_needs_commit(struct tc_cache *c, struct tc_bio *pb);
void tc_remap_cache(struct tc_cache *c, struct bio *bio, struct tc_bio *pb);
void tc_submit_clone(struct tc_cache *c, struct bio *bio,
		     struct block_device *bdev, sector_t sector, blk_opf_t opf);

/* ---- tc_run.c: bios that go to the cache device whole ---- */

bool tc_spans_blocks(struct tc_cache *c, struct bio *bio);
void tc_trim_blocks(struct tc_cache *c, struct bio *bio, u64 n);
bool tc_map_run(struct tc_cache *c, struct bio *bio, struct tc_bio *pb,
		int *r);
int tc_run_cache_init(void);
void tc_run_cache_exit(void);
struct tc_run *tc_run_alloc(unsigned int n);
void tc_run_free(struct tc_run *run);
unsigned int tc_run_limit(struct tc_cache *c, u64 first, u32 slot, u64 n);
void tc_run_start(struct tc_cache *c, struct bio *bio, struct tc_bio *pb,
		  u32 slot, unsigned int n);
void tc_run_unlock(struct tc_cache *c, struct tc_bio *pb);
bool tc_run_dirty(struct tc_cache *c, struct tc_bio *pb);
void tc_run_record(struct tc_cache *c, struct tc_bio *pb);
void tc_wrun_failed(struct tc_cache *c, struct bio *bio, struct tc_bio *pb);
void tc_wrun_drop_done(struct tc_cache *c, struct bio *bio,
		       struct tc_bio *pb);

/* ---- tc_miss.c: runs of blocks that are not cached ---- */

bool tc_map_miss(struct tc_cache *c, struct bio *bio, struct tc_bio *pb,
		 int *r);

/* ---- tc_oflush.c: origin flushes ---- */

void tc_oflush_init(struct tc_cache *c);
void tc_oflush(struct tc_cache *c, struct tc_oflush_req *req);
void tc_oflush_bio(struct tc_cache *c, struct bio *bio);

/* ---- tc_flush.c ---- */

void tc_flush_init(struct tc_cache *c);
void tc_flush_start_full(struct tc_cache *c);
void tc_flush_kick(struct tc_cache *c);
void tc_flush_reserved(void *ctx);
void tc_flush_check_watermark(struct tc_cache *c);
void tc_flush_stop(struct tc_cache *c);
void tc_flush_resume(struct tc_cache *c);
int tc_flush_sync(struct tc_cache *c);
int tc_flush_drain(struct tc_cache *c);
void tc_flush_exit(struct tc_cache *c);
const char *tc_flush_state(struct tc_cache *c);
void tc_flush_event(struct tc_cache *c);

/* ---- tc_io.c: page buffers and bio helpers ---- */

int tc_buf_alloc(struct tc_pool *p, struct tc_buf *b, size_t bytes);
void tc_buf_free(struct tc_pool *p, struct tc_buf *b);
struct bio *tc_buf_bio(struct tc_cache *c, struct tc_buf *b, size_t off,
		       size_t *len, struct block_device *bdev, sector_t sector,
		       blk_opf_t opf);
void tc_buf_copy_to_bio(struct tc_buf *b, struct bio *bio);
void tc_buf_copy_from_bio(struct tc_buf *b, size_t off, struct bio *bio);

#endif /* DM_TIERCACHE_H */
