// SPDX-License-Identifier: GPL-2.0
/*
 * dm-tiercache: life of the cache state.
 *
 * The state of a cache (index, dirty blocks, engine) belongs to the pair
 * (mapped device, cache device), not to one table: a table reload that
 * keeps the cache device, origin, block size and length attaches to the
 * same state, so changing the mode or a tunable by reload keeps every
 * cached and dirty block.  The last table to let go frees it.
 *
 * A new state is entered in the registry before its metadata is read (the
 * reading, and the first commit, happen outside the registry's mutex); a
 * table that meets a state still being created is refused with EBUSY.
 *
 * A table that changes the cache device of a live device, or switches it
 * to passthrough, needs a clean cache at its resume: from its load on,
 * writes to the live state no longer make blocks dirty (tc_cache_hold()),
 * and the resume writes back what is left.
 */
#include <linux/slab.h>
#include <linux/log2.h>
#include <linux/mutex.h>
#include <linux/mm.h>
#include <linux/sizes.h>

#include "tiercache.h"

#define TC_LOCK_BUCKETS		4096
#define TC_BIOSET_SIZE		256

static LIST_HEAD(tc_registry);
static DEFINE_MUTEX(tc_registry_lock);

/*
 * Tear a state down, then take it out of the registry: until its last
 * metadata commit is written, a new table over the same cache device would
 * read the metadata from before it (it is refused with EBUSY meanwhile).
 */
static void tc_cache_destroy(struct tc_cache *c)
{
	u32 dirty;

	if (c->wq) {
		tc_flush_stop(c);
		if (c->meta_loaded && tc_meta_close(c))
			DMERR("%s: the last metadata commit failed", c->name);
		destroy_workqueue(c->wq);
	}
	if (c->discard_wq)
		destroy_workqueue(c->discard_wq);
	flush_work(&c->fail_work);
	tc_flush_exit(c);
	dirty = tc_nr_dirty(c);
	if (dirty)
		DMINFO("%s: %u dirty blocks stay in the cache device's metadata",
		       c->name, dirty);
	tc_meta_free(c);
	free_percpu(c->stats.io);
	bioset_exit(&c->bs);
	tc_locks_exit(&c->locks);
	tc_index_exit(c);
	mutex_lock(&tc_registry_lock);
	list_del(&c->list);
	mutex_unlock(&tc_registry_lock);
	kfree(c);
}

/* The failed state was latched: tell whoever waits for the device's events. */
static void tc_cache_fail_work(struct work_struct *w)
{
	struct tc_cache *c = container_of(w, struct tc_cache, fail_work);

	/* writes and flushes that waited for an epoch go the failed way */
	tc_epoch_waiters_go(c);
	tc_flush_event(c);
}

static int tc_cache_setup(struct tc_cache *c)
{
	int r;

	r = tc_index_init(c);
	if (r)
		return r;
	r = tc_locks_init(&c->locks, TC_LOCK_BUCKETS, tc_holder_of, tc_requeue,
			  tc_flush_reserved, c);
	if (r)
		return r;
	r = bioset_init(&c->bs, TC_BIOSET_SIZE, 0, BIOSET_NEED_BVECS);
	if (r)
		return r;
	c->stats.io = alloc_percpu(struct tc_io_stats);
	if (!c->stats.io)
		return -ENOMEM;
	spin_lock_init(&c->defer_lock);
	bio_list_init(&c->deferred);
	bio_list_init(&c->discards);
	bio_list_init(&c->wb_wait);
	bio_list_init(&c->ep_wait);
	bio_list_init(&c->order_wait);
	bio_list_init(&c->ep_flushes);
	INIT_WORK(&c->io_work, tc_io_work);
	INIT_WORK(&c->discard_work, tc_discard_work);
	mutex_init(&c->ctl_lock);
	tc_flush_init(c);
	tc_oflush_init(c);
	tc_meta_init(c);
	atomic_set(&c->no_dirty, 0);
	atomic_set(&c->slot_wakes, 0);
	c->wq = alloc_workqueue("tiercache-%s", WQ_MEM_RECLAIM | WQ_UNBOUND, 0,
				c->name);
	/* discards sleep on block locks: a queue (and rescuer) of their own */
	c->discard_wq = alloc_ordered_workqueue("tiercache-discard-%s",
						WQ_MEM_RECLAIM, c->name);
	return c->wq && c->discard_wq ? 0 : -ENOMEM;
}

/* A new state, entered in the registry as being created. */
static struct tc_cache *tc_cache_alloc(struct tc_target *t,
				       struct mapped_device *md)
{
	struct tc_cache *c = kzalloc(sizeof(*c), GFP_KERNEL);

	if (!c)
		return NULL;
	refcount_set(&c->ref, 1);
	/* before anything can fail: tc_cache_destroy() flushes it */
	INIT_WORK(&c->fail_work, tc_cache_fail_work);
	c->creating = true;
	c->md = md;
	strscpy(c->name, dm_device_name(md), sizeof(c->name));
	c->origin_bdev = t->origin->bdev;
	c->cache_bdev = t->cache_dev->bdev;
	c->origin_dev = t->origin->bdev->bd_dev;
	c->cache_dev = t->cache_dev->bdev->bd_dev;
	c->target_len = t->ti->len;
	c->block_sectors = t->args.block_sectors;
	c->block_shift = ilog2(c->block_sectors);
	c->nr_blocks = t->ti->len >> c->block_shift;
	c->nr_slots = 0;	/* set by tc_meta_read_sb() */
	c->data_start = 0;	/* set by tc_meta_open() */
	c->mode = t->args.mode;
	c->read_only = t->read_only;
	memcpy(c->val, t->val, sizeof(c->val));
	return c;
}

/*
 * A new state whose index, dirty order and metadata state would take more
 * memory than is available is refused up front, with the figures.  The
 * dirty order is counted at its peak: 4 B per slot with every slot dirty
 * (as a load may find them), twice while it grows; the metadata has 4
 * bitmaps of one bit per slot, 8 B per 128 slots and its 1 MiB buffer.  A
 * table that attaches to a live state allocates none of it.
 */
static int tc_cache_check_memory(struct tc_cache *c, char **error)
{
	u64 n = c->nr_slots;
	u64 need = tc_index_bytes(n) + n * 8 + n / 2 + n / 16 + SZ_1M;
	u64 avail = (u64)si_mem_available() << PAGE_SHIFT;

	if (need <= avail)
		return 0;
	*error = "Not enough memory for a cache of this size";
	DMERR("%s: a cache of %u slots needs up to %llu MiB of kernel memory, %llu MiB available",
	      c->name, c->nr_slots, need >> 20, avail >> 20);
	return -ENOMEM;
}

/* Set up a state from tc_cache_alloc(): memory, then format or load. */
static int tc_cache_create(struct tc_cache *c, struct tc_target *t,
			   char **error)
{
	int r;

	r = tc_meta_read_sb(c, t, error);
	if (r)
		return r;
	r = tc_cache_check_memory(c, error);
	if (r)
		return r;
	r = tc_cache_setup(c);
	if (r) {
		*error = "Cannot allocate the cache state";
		return r;
	}
	/* before a format or a load writes to the cache device */
	if (t->val[TC_KEY_ORDERED] && tc_epoch_need_tags(&c->ix.ep)) {
		*error = "Cannot allocate the epoch tags (ordered 1)";
		return -ENOMEM;
	}
	r = tc_meta_open(c, t, error);
	if (r)
		return r;
	c->data_start = c->meta.layout.data_start;
	c->meta_loaded = true;
	return 0;
}

/* Does @t's cache device hold as many slots as @c, in @c's layout? */
static bool tc_cache_same_size(struct tc_cache *c, struct tc_target *t)
{
	struct tc_layout l;

	return !tc_disk_layout_v(bdev_nr_sectors(t->cache_dev->bdev),
				 c->block_sectors,
				 tc_disk_layout_version(&c->meta.layout), &l) &&
	       l.nr_slots == c->nr_slots;
}

/* May table @t attach to the existing state @c of its device? */
static int tc_cache_check_reload(struct tc_cache *c, struct tc_target *t,
				 char **error)
{
	if (c->origin_dev != t->origin->bdev->bd_dev ||
	    c->block_sectors != t->args.block_sectors ||
	    c->target_len != t->ti->len || !tc_cache_same_size(c, t)) {
		*error = "A reload must keep the origin, block size, length and cache size (remove the device to change them)";
		DMERR("%s: %s", c->name, *error);
		return -EINVAL;
	}
	return 0;
}

/* From now until @t resumes, writes to @c stay clean. */
static void tc_cache_hold(struct tc_target *t, struct tc_cache *c)
{
	refcount_inc(&c->ref);
	atomic_inc(&c->no_dirty);
	t->hold = c;
}

void tc_cache_release_hold(struct tc_target *t)
{
	struct tc_cache *c = t->hold;

	if (!c)
		return;
	t->hold = NULL;
	atomic_dec(&c->no_dirty);
	tc_cache_put(c);
}

/*
 * Another state of the same device (the live one, whose cache device @t
 * replaces): refused while it holds dirty blocks, else held clean.
 */
static int tc_cache_other(struct tc_target *t, struct tc_cache *c,
			  char **error)
{
	if (tc_nr_dirty(c)) {
		*error = "The current cache device still holds dirty blocks: flush before changing it";
		return -EBUSY;
	}
	if (READ_ONCE(c->owner) && !t->hold)
		tc_cache_hold(t, c);
	return 0;
}

/*
 * Table @t attaches to @c, its device's state over the same cache device
 * (a reload).  Called under tc_registry_lock.
 */
static int tc_cache_reuse(struct tc_target *t, struct tc_cache *c,
			  char **error)
{
	int r = tc_cache_check_reload(c, t, error);

	if (r)
		return r;
	if (t->args.mode == TC_MODE_PASSTHROUGH && tc_nr_dirty(c)) {
		/* refused at load, so the live table keeps running */
		*error = "Passthrough refused while blocks are dirty: flush first";
		return -EBUSY;
	}
	refcount_inc(&c->ref);
	/* passthrough resumes only over a clean cache: keep it so */
	if (t->args.mode == TC_MODE_PASSTHROUGH && !t->hold)
		tc_cache_hold(t, c);
	return 0;
}

/*
 * Look through every state for table @t: refuse what it may not share,
 * hold the live state of its device if @t replaces that one's cache
 * device (tc_cache_other()), and set @found to its device's state over
 * the same cache device, if there is one.  Every state is seen, whatever
 * the list's order: a state an inactive table created sits before the
 * live one, and @t must hold the live one even if it reuses that state.
 */
static int tc_cache_scan(struct tc_target *t, struct mapped_device *md,
			 dev_t cdev, struct tc_cache **found, char **error)
{
	struct tc_cache *c;
	int r;

	*found = NULL;
	list_for_each_entry(c, &tc_registry, list) {
		if (c->destroying) {
			if (c->cache_dev != cdev)
				continue;
			*error = "The cache device is still being released by its previous table: try again";
			return -EBUSY;
		}
		if (c->creating && (c->md == md || c->cache_dev == cdev)) {
			*error = "Another table of this device or cache device is being loaded";
			return -EBUSY;
		}
		if (c->md == md && c->cache_dev != cdev) {
			r = tc_cache_other(t, c, error);
			if (r)
				return r;
			continue;
		}
		if (c->cache_dev != cdev)
			continue;
		if (c->md != md) {
			*error = "Cache device is in use by another tiercache device";
			return -EBUSY;
		}
		*found = c;
	}
	return 0;
}

/* The state for table @t: the device's existing one, or a new one. */
struct tc_cache *tc_cache_get(struct tc_target *t, char **error)
{
	struct mapped_device *md = dm_table_get_md(t->ti->table);
	dev_t cdev = t->cache_dev->bdev->bd_dev;
	struct tc_cache *c;
	int r;

	mutex_lock(&tc_registry_lock);
	r = tc_cache_scan(t, md, cdev, &c, error);
	if (!r && c)
		r = tc_cache_reuse(t, c, error);
	if (r)
		goto out;
	if (c) {
		mutex_unlock(&tc_registry_lock);
		return c;
	}
	c = tc_cache_alloc(t, md);
	if (!c) {
		*error = "Cannot allocate the cache state";
		r = -ENOMEM;
		goto out;
	}
	list_add(&c->list, &tc_registry);
	mutex_unlock(&tc_registry_lock);

	r = tc_cache_create(c, t, error);	/* metadata I/O: not locked */

	if (r) {
		tc_cache_destroy(c);	/* refused as "creating" meanwhile */
		return ERR_PTR(r);
	}
	mutex_lock(&tc_registry_lock);
	c->creating = false;
	mutex_unlock(&tc_registry_lock);
	return c;
out:
	mutex_unlock(&tc_registry_lock);
	if (t->hold)
		tc_cache_release_hold(t);
	return ERR_PTR(r);
}

/*
 * The cache device failed @what with @err: latch the failed state
 * (docs/tiercache.rst, "Failure handling").  Until the cache is set up
 * again nothing new goes to the cache device: reads of clean or uncached
 * blocks go to the origin, reads of dirty blocks still try their only
 * copy, writes go around the cache (dropping the cached copy: the commits
 * that go on record that, as long as the device takes them; a failed
 * commit marks the superblock).  A flush succeeds only if the cache holds
 * nothing dirty, or if the device takes a commit (tc_map_flush()).  May
 * be called from a bio's completion.
 */
void tc_cache_fail(struct tc_cache *c, int err, const char *what)
{
	if (!err || cmpxchg(&c->failed, 0, err))
		return;
	DMERR("%s: the cache device failed (%s: %d): until the cache is set up again, writes go around it and reads of its %u dirty blocks depend on it ('tiercache status'; 'tiercache detach --abandon' gives them up)",
	      c->name, what, err, tc_nr_dirty(c));
	schedule_work(&c->fail_work);
}

void tc_cache_put(struct tc_cache *c)
{
	mutex_lock(&tc_registry_lock);
	if (!refcount_dec_and_test(&c->ref)) {
		mutex_unlock(&tc_registry_lock);
		return;
	}
	c->destroying = true;
	mutex_unlock(&tc_registry_lock);
	tc_cache_destroy(c);
}
