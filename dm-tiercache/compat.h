/* SPDX-License-Identifier: GPL-2.0 */
/*
 * dm-tiercache: the kernel interfaces that differ between the kernels it
 * builds for.  The only place with version checks.
 */
#ifndef DM_TIERCACHE_COMPAT_H
#define DM_TIERCACHE_COMPAT_H

#include <linux/blkdev.h>
#include <linux/device-mapper.h>

/* Slot flags are changed 8 slots at a time in an unsigned long (tc_slots.h). */
#if BITS_PER_LONG < 64
#error "dm-tiercache needs a 64-bit kernel"
#endif

/* Was the table loaded for writing?  (fmode_t became blk_mode_t in 6.5.) */
static inline bool tc_table_writable(struct dm_table *t)
{
#ifdef BLK_OPEN_WRITE
	return dm_table_get_mode(t) & BLK_OPEN_WRITE;
#else
	return dm_table_get_mode(t) & FMODE_WRITE;
#endif
}

#endif /* DM_TIERCACHE_COMPAT_H */
