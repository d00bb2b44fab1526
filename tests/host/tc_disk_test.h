/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Helpers of the host programs that build or spoil on-disk structures
 * (test_disk.c, mkseeds.c): recompute a checksum after a field changed.
 */
#ifndef TC_DISK_TEST_H
#define TC_DISK_TEST_H

#include "tc_disk.h"

static inline void sb_resum(struct tc_disk_sb *sb)
{
	sb->csum = 0;
	sb->csum = cpu_to_le32(tc_disk_crc(sb, sizeof(*sb)));
}

static inline void de_resum(struct tc_disk_entry *d)
{
	d->csum = 0;
	d->csum = cpu_to_le32(tc_disk_crc(d, sizeof(*d)));
}

#endif /* TC_DISK_TEST_H */
