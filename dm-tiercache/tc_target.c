// SPDX-License-Identifier: GPL-2.0
/*
 * dm-tiercache: the device-mapper target.
 *
 * Constructor and destructor, status, messages, suspend and resume.  The
 * work is done elsewhere: tc_args.c parses, tc_cache.c owns the state,
 * tc_map.c dispatches bios, tc_flush.c writes back.
 */
#include <linux/module.h>
#include <linux/slab.h>

#include "tiercache.h"

static void tc_dtr(struct dm_target *ti)
{
	struct tc_target *t = ti->private;

	if (!t)
		return;
	tc_cache_release_hold(t);
	if (t->c) {
		cmpxchg(&t->c->owner, ti, NULL);
		/* an event of the failed state may still be raising on @ti */
		flush_work(&t->c->fail_work);
		tc_cache_put(t->c);
	}
	if (t->cache_dev)
		dm_put_device(ti, t->cache_dev);
	if (t->origin)
		dm_put_device(ti, t->origin);
	kfree(t);
	ti->private = NULL;
}

static int tc_get_dev(struct dm_target *ti, const char *path,
		      const char *what, struct dm_dev **dev)
{
	int r = dm_get_device(ti, path, dm_table_get_mode(ti->table), dev);

	if (r)
		DMERR("Cannot open the %s device %s: %d", what, path, r);
	return r;
}

/* Opens both devices; a failure to open one returns its error (EBUSY...). */
static int tc_get_devices(struct dm_target *ti, struct tc_target *t)
{
	int r;

	r = tc_get_dev(ti, t->args.origin_path, "origin", &t->origin);
	if (r) {
		ti->error = "Cannot open the origin device";
		return r;
	}
	r = tc_get_dev(ti, t->args.cache_path, "cache", &t->cache_dev);
	if (r) {
		ti->error = "Cannot open the cache device";
		return r;
	}
	if (t->origin->bdev->bd_dev == t->cache_dev->bdev->bd_dev) {
		ti->error = "The origin and the cache must be different devices";
		DMERR("Cache device %s is the origin device", t->args.cache_path);
		return -EINVAL;
	}
	return 0;
}

/*
 * Sizes: the origin must cover the target, the cache device hold the
 * metadata and enough slots.
 */
static int tc_check_sizes(struct dm_target *ti, struct tc_target *t)
{
	sector_t origin_size = bdev_nr_sectors(t->origin->bdev);
	sector_t cache_size = bdev_nr_sectors(t->cache_dev->bdev);
	struct tc_layout l;
	u64 slots = 0;

	if (ti->len > origin_size) {
		ti->error = "The origin device is smaller than the target";
		DMERR("Origin device too small: %llu sectors, the target needs %llu",
		      (unsigned long long)origin_size,
		      (unsigned long long)ti->len);
		return -EINVAL;
	}
	/* the index keeps 40 bits of an origin block (4 PiB of 4 KiB) */
	if ((ti->len >> ilog2(t->args.block_sectors)) > TC_SLOT_MAX_BLOCK + 1) {
		ti->error = "The target is too large for its block size";
		DMERR("Target too large: %llu sectors are more than 2^%u blocks of %u sectors",
		      (unsigned long long)ti->len, TC_SLOT_BLOCK_BITS,
		      t->args.block_sectors);
		return -EINVAL;
	}
	/* the layout with the most slots (version 3): a cache may have it */
	if (!tc_disk_layout_v(cache_size, t->args.block_sectors,
			      TC_DISK_VERSION_V3, &l))
		slots = l.nr_slots;
	if (slots < TC_MIN_SLOTS) {
		ti->error = "The cache device is too small";
		DMERR("Cache device too small: %llu sectors hold %llu blocks of %u sectors and their metadata, at least %u needed",
		      (unsigned long long)cache_size, slots,
		      t->args.block_sectors, TC_MIN_SLOTS);
		return -EINVAL;
	}
	return 0;
}

static int tc_ctr(struct dm_target *ti, unsigned int argc, char **argv)
{
	struct tc_target *t;
	struct tc_cache *c;
	int r;

	t = kzalloc(sizeof(*t), GFP_KERNEL);
	if (!t) {
		ti->error = "Cannot allocate the target";
		return -ENOMEM;
	}
	ti->private = t;
	t->ti = ti;
	t->read_only = !tc_table_writable(ti->table);

	r = tc_args_parse(&t->args, argc, argv, &ti->error);
	if (r)
		goto bad;
	r = tc_get_devices(ti, t);
	if (r)
		goto bad;
	r = tc_check_sizes(ti, t);
	if (r)
		goto bad;
	t->origin_max_kb = queue_max_sectors(bdev_get_queue(t->origin->bdev)) / 2;
	r = tc_args_finalise(&t->args, t->origin_max_kb, t->val, &ti->error);
	if (r)
		goto bad;
	c = tc_cache_get(t, &ti->error);
	if (IS_ERR(c)) {
		r = PTR_ERR(c);
		goto bad;
	}
	t->c = c;
	/*
	 * The ordered policy needs the epoch tags before it is switched on: a
	 * new state has them (tc_cache_create()), one this table attaches to
	 * may not.
	 */
	r = t->val[TC_KEY_ORDERED] ? tc_epoch_need_tags(&c->ix.ep) : 0;
	if (r) {
		ti->error = "Cannot allocate the epoch tags (ordered 1)";
		goto bad;
	}

	ti->num_flush_bios = 2;
	ti->flush_supported = true;
	ti->num_discard_bios = 1;
	ti->discards_supported = true;
	ti->per_io_data_size = sizeof(struct tc_bio);
	return 0;
bad:
	tc_dtr(ti);
	return r;
}

static u64 tc_stat_sum(struct tc_cache *c, enum tc_io_stat k)
{
	u64 sum = 0;
	int cpu;

	for_each_possible_cpu(cpu)
		sum += per_cpu_ptr(c->stats.io, cpu)->n[k];
	return sum;
}

static void tc_emit_info(struct tc_cache *c, char *result, unsigned int maxlen,
			 unsigned int *sz_ptr)
{
	struct tc_stats *s = &c->stats;
	u64 reqs = atomic64_read(&s->wb_requests);
	u64 blocks = atomic64_read(&s->wb_blocks);
	u64 sectors = atomic64_read(&s->wb_sectors);
	u64 ratio = reqs ? div64_u64(blocks * 100, reqs) : 0;
	/* the oldest first: it never passes the open one */
	u64 ep_oldest = tc_epoch_oldest(&c->ix.ep);
	u64 ep_cur;
	unsigned int sz = *sz_ptr;

	smp_rmb();	/* the oldest read first */
	ep_cur = tc_epoch_cur(&c->ix.ep);

	DMEMIT("%s %u %u/%u %u %llu %llu %llu %llu %llu %s %llu %llu %llu %llu %llu.%02llu %lld %d %d %lu %d %lld %d %d %llu %llu",
	       tc_mode_name(c->mode), c->block_sectors, tc_nr_used(c),
	       c->nr_slots, tc_nr_dirty(c),
	       tc_stat_sum(c, TC_S_READ_HIT), tc_stat_sum(c, TC_S_READ_MISS),
	       tc_stat_sum(c, TC_S_WRITE_HIT), tc_stat_sum(c, TC_S_WRITE_MISS),
	       tc_stat_sum(c, TC_S_WRITE_BYPASS), tc_flush_state(c),
	       blocks, reqs, sectors,
	       reqs ? div64_u64(sectors / 2, reqs) : 0,
	       div64_u64(ratio, 100), ratio % 100,
	       atomic64_read(&s->bridged_blocks),
	       atomic_read(&s->inflight_max), READ_ONCE(c->fl.error),
	       READ_ONCE(c->fl.flushes), READ_ONCE(c->cleaner) ? 1 : 0,
	       atomic64_read(&c->meta.commits), READ_ONCE(c->meta.error),
	       READ_ONCE(c->failed), ep_oldest, ep_cur);
	*sz_ptr = sz;
}

static void tc_status(struct dm_target *ti, status_type_t type,
		      unsigned int status_flags, char *result,
		      unsigned int maxlen)
{
	struct tc_target *t = ti->private;
	unsigned int sz = 0;

	switch (type) {
	case STATUSTYPE_INFO:
		tc_emit_info(t->c, result, maxlen, &sz);
		break;
	case STATUSTYPE_TABLE:
		DMEMIT("%s %s %u", t->origin->name, t->cache_dev->name,
		       t->args.block_sectors);
		tc_args_emit(&t->args, result, maxlen, &sz);
		break;
	case STATUSTYPE_IMA:
		DMEMIT("%s,mode=%s;", ti->type->name, tc_mode_name(t->c->mode));
		break;
	}
}

static void tc_stats_reset(struct tc_cache *c)
{
	struct tc_stats *s = &c->stats;
	int cpu;

	for_each_possible_cpu(cpu)
		memset(per_cpu_ptr(s->io, cpu), 0, sizeof(struct tc_io_stats));
	atomic64_set(&s->wb_blocks, 0);
	atomic64_set(&s->wb_requests, 0);
	atomic64_set(&s->wb_sectors, 0);
	atomic64_set(&s->bridged_blocks, 0);
	atomic_set(&s->inflight_max, 0);
}

/* "set <key> <value>": the same rules as the table line. */
static int tc_set(struct tc_target *t, const char *key, const char *value)
{
	struct tc_cache *c = t->c;
	struct tc_args a = t->args;
	unsigned int val[TC_NR_KEYS];
	char *error;
	int k;

	if (tc_args_set(&a, key, value, &error) ||
	    tc_args_finalise(&a, t->origin_max_kb, val, &error))
		return -EINVAL;
	if (val[TC_KEY_ORDERED] && tc_epoch_need_tags(&c->ix.ep)) {
		DMERR("%s: ordered 1 refused: no memory for the epoch tags (%u bytes)",
		      c->name, c->nr_slots);
		return -ENOMEM;
	}
	t->args = a;
	memcpy(t->val, val, sizeof(val));
	for (k = 0; k < TC_NR_KEYS; k++)
		WRITE_ONCE(c->val[k], val[k]);
	tc_meta_commit_ms_changed(c);
	tc_flush_check_watermark(c);
	tc_flush_kick(c);
	/* writes parked for older versions may go now (ordered 0, say) */
	tc_epoch_waiters_go(c);
	return 0;
}

/* "flush": a read-only table writes nothing back. */
static int tc_flush_message(struct tc_cache *c)
{
	if (READ_ONCE(c->read_only)) {
		DMERR("%s: flush refused: the table is read-only", c->name);
		return -EROFS;
	}
	tc_flush_start_full(c);
	return 0;
}

static int tc_cleaner(struct tc_cache *c, const char *arg)
{
	if (!strcasecmp(arg, "on") && READ_ONCE(c->read_only)) {
		DMERR("%s: cleaner refused: the table is read-only", c->name);
		return -EROFS;
	}
	if (!strcasecmp(arg, "on")) {
		WRITE_ONCE(c->cleaner, true);
		clear_bit(TC_FL_PAUSED, &c->fl.bits);
	} else if (!strcasecmp(arg, "off")) {
		WRITE_ONCE(c->cleaner, false);
	} else {
		DMERR("%s: cleaner takes on or off, not %s", c->name, arg);
		return -EINVAL;
	}
	tc_flush_kick(c);
	return 0;
}

static int tc_message(struct dm_target *ti, unsigned int argc, char **argv,
		      char *result, unsigned int maxlen)
{
	struct tc_target *t = ti->private;
	struct tc_cache *c = t->c;
	int r = -EINVAL;

	mutex_lock(&c->ctl_lock);
	if (argc == 1 && !strcasecmp(argv[0], "flush")) {
		r = tc_flush_message(c);
	} else if (argc == 2 && !strcasecmp(argv[0], "cleaner")) {
		r = tc_cleaner(c, argv[1]);
	} else if (argc == 3 && !strcasecmp(argv[0], "set")) {
		r = tc_set(t, argv[1], argv[2]);
	} else if (argc == 2 && !strcasecmp(argv[0], "stats") &&
		   !strcasecmp(argv[1], "reset")) {
		tc_stats_reset(c);
		r = 0;
	} else {
		DMERR("%s: unrecognised message %s (flush, cleaner on|off, set <key> <value>, stats reset)",
		      c->name, argc ? argv[0] : "");
	}
	mutex_unlock(&c->ctl_lock);
	return r;
}

static void tc_postsuspend(struct dm_target *ti)
{
	struct tc_target *t = ti->private;
	struct tc_cache *c = t->c;
	int r;

	if (READ_ONCE(c->val[TC_KEY_FLUSH_ON_SUSPEND]) &&
	    !READ_ONCE(c->read_only)) {
		r = tc_flush_sync(c);
		if (r)
			DMERR("%s: flush on suspend failed (%d): %u dirty blocks remain",
			      c->name, r, tc_nr_dirty(c));
	}
	tc_flush_stop(c);
	tc_meta_suspend(c);
}

/*
 * This table replaces the live one's cache device: the old cache must be
 * clean before it goes.  Writes have been kept clean since the load, so
 * there is little or nothing to write back.  Once nothing is dirty, every
 * acknowledged write is on the origin and the resume goes on, even if the
 * old cache's metadata could not record it (then that cache device must
 * be formatted before it is used again).  If dirty blocks remain, the
 * resume is refused, and every later resume of a table over this new
 * cache state too: the old state is let go while the old table still
 * holds its devices, so its last commit keeps the dirty blocks in the old
 * cache device's metadata, and a table with the old cache device loads
 * them.
 */
static int tc_preresume_replace(struct tc_target *t)
{
	struct tc_cache *old = t->hold;
	u32 dirty;
	int r;

	if (t->c->replace_error)
		return t->c->replace_error;
	if (!old || old == t->c)
		return 0;
	r = tc_flush_drain(old);
	dirty = tc_nr_dirty(old);
	if (!r)
		return 0;
	if (!dirty) {
		DMERR("%s: the replaced cache device's metadata could not be updated (%d): format that device before using it again",
		      old->name, r);
		return 0;
	}
	DMERR("%s: the cache device this table replaces keeps %u dirty blocks (writeback failed: %d): resume refused; load a table with the old cache device to reach them",
	      old->name, dirty, r);
	t->c->replace_error = r;
	tc_cache_release_hold(t);
	return r;
}

/*
 * Passthrough needs a clean cache.  It was clean at the load and writes
 * have stayed clean since, but writes in flight then may have dirtied a
 * few blocks: write them back.  If that fails the table runs writethrough
 * (status field 1 says so) rather than serve stale data or stay suspended.
 */
static void tc_preresume_passthrough(struct tc_target *t)
{
	struct tc_cache *c = t->c;
	int r;

	t->passthrough_failed = false;
	if (t->args.mode != TC_MODE_PASSTHROUGH || !tc_nr_dirty(c))
		return;
	/* a read-only table writes nothing back: it serves the dirty copies */
	r = t->read_only ? -EROFS : tc_flush_drain(c);
	if (!r)
		return;
	t->passthrough_failed = true;
	DMERR("%s: passthrough postponed: %u dirty blocks could not be written back (%d): running writethrough",
	      c->name, tc_nr_dirty(c), r);
}

static int tc_preresume(struct dm_target *ti)
{
	struct tc_target *t = ti->private;
	int r;

	r = tc_preresume_replace(t);
	if (r)
		return r;
	tc_preresume_passthrough(t);
	return 0;
}

static void tc_resume(struct dm_target *ti)
{
	struct tc_target *t = ti->private;
	struct tc_cache *c = t->c;
	int k;

	mutex_lock(&c->ctl_lock);
	c->mode = t->passthrough_failed ? TC_MODE_WRITETHROUGH : t->args.mode;
	WRITE_ONCE(c->read_only, t->read_only);
	for (k = 0; k < TC_NR_KEYS; k++)
		WRITE_ONCE(c->val[k], t->val[k]);
	WRITE_ONCE(c->owner, ti);
	mutex_unlock(&c->ctl_lock);
	tc_cache_release_hold(t);
	tc_meta_resume(c);
	tc_flush_resume(c);
	tc_flush_check_watermark(c);
}

static void tc_io_hints(struct dm_target *ti, struct queue_limits *limits)
{
	struct tc_target *t = ti->private;
	unsigned int bytes = t->args.block_sectors << SECTOR_SHIFT;

	/* whole blocks, and never finer than the origin discards */
	limits->discard_granularity = max(limits->discard_granularity, bytes);
	limits->max_discard_sectors = UINT_MAX >> SECTOR_SHIFT;
	limits->max_hw_discard_sectors = UINT_MAX >> SECTOR_SHIFT;
	if (limits->io_min < bytes)
		limits->io_min = bytes;
}

static int tc_iterate_devices(struct dm_target *ti,
			      iterate_devices_callout_fn fn, void *data)
{
	struct tc_target *t = ti->private;
	int r;

	r = fn(ti, t->origin, 0, ti->len, data);
	if (!r)
		r = fn(ti, t->cache_dev, 0, t->c->data_start +
		       ((sector_t)t->c->nr_slots << t->c->block_shift), data);
	return r;
}

static struct target_type tc_target_type = {
	.name = "tiercache",
	.version = { 1, 0, 0 },
	/* one cache state per mapped device (tc_cache.c's registry) */
	.features = DM_TARGET_SINGLETON,
	.module = THIS_MODULE,
	.ctr = tc_ctr,
	.dtr = tc_dtr,
	.map = tc_map,
	.end_io = tc_end_io,
	.postsuspend = tc_postsuspend,
	.preresume = tc_preresume,
	.resume = tc_resume,
	.status = tc_status,
	.message = tc_message,
	.io_hints = tc_io_hints,
	.iterate_devices = tc_iterate_devices,
};

static int __init dm_tiercache_init(void)
{
	int r = tc_run_cache_init();

	if (r) {
		DMERR("no slab cache for runs: %d", r);
		return r;
	}
	r = dm_register_target(&tc_target_type);
	if (r) {
		DMERR("register failed: %d", r);
		tc_run_cache_exit();
	}
	return r;
}

static void __exit dm_tiercache_exit(void)
{
	dm_unregister_target(&tc_target_type);
	tc_run_cache_exit();
}

module_init(dm_tiercache_init);
module_exit(dm_tiercache_exit);

MODULE_DESCRIPTION(DM_NAME " tiercache: a cache whose writeback merges neighbours");
MODULE_LICENSE("GPL");
