// SPDX-License-Identifier: GPL-2.0
/*
 * dm-tiercache: the table line and the "set" message.
 *
 *   <origin> <cache> <block size> <#feature args>
 *       [writeback|writethrough|passthrough] [<key> <value>]...
 *
 * Arguments are parsed into struct tc_args before anything is built, and
 * every refusal names the argument and the rule it broke.
 */
#include <linux/kernel.h>
#include <linux/log2.h>
#include <linux/string.h>
#include <linux/ctype.h>

#include "tiercache.h"

struct tc_key_rule {
	const char *name;
	unsigned int min;
	unsigned int max;
	unsigned int def;
	/* ti->error strings: they outlive the failed target */
	char *bad_value;
	char *missing;
	char *twice;
};

#define TC_KEY(nm, lo, hi, d) {						\
	.name = nm, .min = lo, .max = hi, .def = d,			\
	.bad_value = "Invalid " nm " (a number from " #lo " to " #hi ")", \
	.missing = "Missing value for " nm,				\
	.twice = nm " given twice",					\
}

static const struct tc_key_rule tc_keys[TC_NR_KEYS] = {
	[TC_KEY_FLUSH_DEPTH]	  = TC_KEY("flush_depth", 1, 4096, 128),
	[TC_KEY_MAX_FLUSH_KB]	  = TC_KEY("max_flush_kb", 4, 16384, 0),
	[TC_KEY_BRIDGE_GAP_KB]	  = TC_KEY("bridge_gap_kb", 0, 16384, 0),
	[TC_KEY_HIGH_WATERMARK]	  = TC_KEY("high_watermark", 1, 100, 50),
	[TC_KEY_LOW_WATERMARK]	  = TC_KEY("low_watermark", 0, 100, 10),
	[TC_KEY_FLUSH_ON_SUSPEND] = TC_KEY("flush_on_suspend", 0, 1, 0),
	[TC_KEY_COMMIT_MS]	  = TC_KEY("commit_ms", 1, 600000, 1000),
	[TC_KEY_ORDERED]	  = TC_KEY("ordered", 0, 1, 0),
};

static const char * const tc_modes[] = {
	[TC_MODE_WRITEBACK]	= "writeback",
	[TC_MODE_WRITETHROUGH]	= "writethrough",
	[TC_MODE_PASSTHROUGH]	= "passthrough",
};

const char *tc_key_name(enum tc_key k)
{
	return tc_keys[k].name;
}

const char *tc_mode_name(enum tc_mode m)
{
	return tc_modes[m];
}

/*
 * A whole decimal number: no sign, no trailing junk, and no wrap: a value
 * past U32_MAX is refused (sscanf's %u wrapped 4294967304 to 8).
 */
static int tc_parse_uint(const char *s, unsigned int *v)
{
	if (!s || !isdigit(*s))
		return -EINVAL;
	return kstrtouint(s, 10, v) ? -EINVAL : 0;
}

static int tc_find_key(const char *name)
{
	int k;

	for (k = 0; k < TC_NR_KEYS; k++)
		if (!strcmp(name, tc_keys[k].name))
			return k;
	return -ENOENT;
}

static int tc_find_mode(const char *name)
{
	int m;

	for (m = 0; m < ARRAY_SIZE(tc_modes); m++)
		if (!strcmp(name, tc_modes[m]))
			return m;
	return -ENOENT;
}

static void tc_args_defaults(struct tc_args *a)
{
	int k;

	memset(a, 0, sizeof(*a));
	a->mode = TC_MODE_WRITEBACK;
	for (k = 0; k < TC_NR_KEYS; k++)
		a->val[k] = tc_keys[k].def;
}

static int tc_parse_block_size(struct tc_args *a, const char *s, char **error)
{
	if (tc_parse_uint(s, &a->block_sectors) ||
	    !is_power_of_2(a->block_sectors) ||
	    a->block_sectors < TC_MIN_BLOCK_SECTORS ||
	    a->block_sectors > TC_MAX_BLOCK_SECTORS) {
		*error = "Invalid block size (power of two from 8 to 2048 sectors)";
		DMERR("Invalid block size: %s (power of two from %u to %u sectors)",
		      s, TC_MIN_BLOCK_SECTORS, TC_MAX_BLOCK_SECTORS);
		return -EINVAL;
	}
	return 0;
}

/* Check and store one "key value" pair. */
int tc_args_set(struct tc_args *a, const char *key, const char *value,
		char **error)
{
	const struct tc_key_rule *rule;
	unsigned int v;
	int k = tc_find_key(key);

	if (k < 0) {
		*error = "Unknown key (flush_depth, max_flush_kb, bridge_gap_kb, high_watermark, low_watermark, flush_on_suspend, commit_ms, ordered)";
		DMERR("Unknown key: %s", key);
		return -EINVAL;
	}
	rule = &tc_keys[k];
	if (!value) {
		*error = rule->missing;
		DMERR("Missing value for %s", key);
		return -EINVAL;
	}
	if (tc_parse_uint(value, &v) || v < rule->min || v > rule->max) {
		*error = rule->bad_value;
		DMERR("Invalid value for %s: %s (a number from %u to %u)",
		      key, value, rule->min, rule->max);
		return -EINVAL;
	}
	a->val[k] = v;
	a->given |= BIT(k);
	return 0;
}

static int tc_parse_features(struct tc_args *a, unsigned int argc, char **argv,
			     char **error)
{
	unsigned int i = 0;

	while (i < argc) {
		int m = tc_find_mode(argv[i]);
		int k;

		if (!strcmp(argv[i], "format")) {
			if (a->format) {
				*error = "format given twice";
				DMERR("Feature argument given twice: format");
				return -EINVAL;
			}
			a->format = true;
			i++;
			continue;
		}
		if (m >= 0) {
			if (a->mode_given) {
				*error = "Mode given twice";
				DMERR("Mode given twice: %s", argv[i]);
				return -EINVAL;
			}
			a->mode = m;
			a->mode_given = true;
			i++;
			continue;
		}
		k = tc_find_key(argv[i]);
		if (k >= 0 && (a->given & BIT(k))) {
			*error = tc_keys[k].twice;
			DMERR("Key given twice: %s", argv[i]);
			return -EINVAL;
		}
		if (k < 0) {
			*error = "Unknown feature argument (not a mode or key)";
			DMERR("Unknown feature argument: %s (modes: writeback, writethrough, passthrough; format; or a key)",
			      argv[i]);
			return -EINVAL;
		}
		if (tc_args_set(a, argv[i], i + 1 < argc ? argv[i + 1] : NULL,
				error))
			return -EINVAL;
		i += 2;
	}
	return 0;
}

int tc_args_parse(struct tc_args *a, unsigned int argc, char **argv,
		  char **error)
{
	unsigned int nr_features;

	tc_args_defaults(a);
	if (argc < 4) {
		*error = "Not enough arguments (<origin> <cache> <block size> <#feature args>)";
		DMERR("Not enough arguments: %u given, at least 4 needed", argc);
		return -EINVAL;
	}
	a->origin_path = argv[0];
	a->cache_path = argv[1];
	if (tc_parse_block_size(a, argv[2], error))
		return -EINVAL;
	if (tc_parse_uint(argv[3], &nr_features)) {
		*error = "Invalid number of feature arguments";
		DMERR("Invalid number of feature arguments: %s", argv[3]);
		return -EINVAL;
	}
	if (nr_features != argc - 4) {
		*error = "Number of feature arguments does not match the words that follow";
		DMERR("Number of feature arguments is %u but %u words follow",
		      nr_features, argc - 4);
		return -EINVAL;
	}
	return tc_parse_features(a, argc - 4, argv + 4, error);
}

/*
 * Resolve the values in force: the origin's limit for max_flush_kb unless
 * given, rounded down to whole blocks, then the rules between keys.
 */
int tc_args_finalise(const struct tc_args *a, unsigned int origin_max_kb,
		     unsigned int *v, char **error)
{
	unsigned int block_kb = a->block_sectors / 2;

	memcpy(v, a->val, sizeof(a->val));
	if (!(a->given & BIT(TC_KEY_MAX_FLUSH_KB)))
		v[TC_KEY_MAX_FLUSH_KB] = clamp(origin_max_kb,
					       (unsigned int)TC_DEFAULT_FLUSH_KB,
					       (unsigned int)TC_MAX_FLUSH_KB);
	if (v[TC_KEY_MAX_FLUSH_KB] < block_kb) {
		*error = "Invalid max_flush_kb (smaller than the block size)";
		DMERR("Invalid max_flush_kb: %u KiB is smaller than the block size (%u KiB)",
		      v[TC_KEY_MAX_FLUSH_KB], block_kb);
		return -EINVAL;
	}
	v[TC_KEY_MAX_FLUSH_KB] = rounddown(v[TC_KEY_MAX_FLUSH_KB], block_kb);
	if (v[TC_KEY_BRIDGE_GAP_KB] > v[TC_KEY_MAX_FLUSH_KB]) {
		*error = "Invalid bridge_gap_kb (larger than max_flush_kb)";
		DMERR("Invalid bridge_gap_kb: %u KiB is larger than max_flush_kb (%u KiB)",
		      v[TC_KEY_BRIDGE_GAP_KB], v[TC_KEY_MAX_FLUSH_KB]);
		return -EINVAL;
	}
	if (v[TC_KEY_LOW_WATERMARK] > v[TC_KEY_HIGH_WATERMARK]) {
		*error = "Invalid low_watermark (above high_watermark)";
		DMERR("Invalid low_watermark: %u is above high_watermark %u",
		      v[TC_KEY_LOW_WATERMARK], v[TC_KEY_HIGH_WATERMARK]);
		return -EINVAL;
	}
	return 0;
}

/* The feature arguments as the user gave them (or set them since). */
void tc_args_emit(const struct tc_args *a, char *result, unsigned int maxlen,
		  unsigned int *sz_ptr)
{
	unsigned int sz = *sz_ptr;
	unsigned int n = (a->mode_given ? 1 : 0) + 2 * hweight_long(a->given);
	int k;

	DMEMIT(" %u", n);
	if (a->mode_given)
		DMEMIT(" %s", tc_modes[a->mode]);
	for (k = 0; k < TC_NR_KEYS; k++)
		if (a->given & BIT(k))
			DMEMIT(" %s %u", tc_keys[k].name, a->val[k]);
	*sz_ptr = sz;
}
