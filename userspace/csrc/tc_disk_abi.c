// SPDX-License-Identifier: GPL-2.0-only
/*
 * Values of dm-tiercache/tc_disk.h that bindgen cannot take from macros
 * (they are built on sizeof), and the sizes and offsets the C compiler
 * gives the on-disk structures.  build.rs hands this file to bindgen, which
 * has clang evaluate the initialisers: the Rust side gets them as
 * constants, and a unit test compares them with the generated structures.
 * It also compiles it with tc_disk.c, for the wrappers of the header's
 * inline functions (bindgen binds no inline function).
 */
#include <stddef.h>
#include "tc_disk.h"

const u64 tc_abi_entries_per_mblock = TC_ENTRIES_PER_MBLOCK;
const u64 tc_abi_sb_size = sizeof(struct tc_disk_sb);
const u64 tc_abi_entry_size = sizeof(struct tc_disk_entry);
const u64 tc_abi_sb_uuid_offset = offsetof(struct tc_disk_sb, uuid);
const u64 tc_abi_entry_csum_offset = offsetof(struct tc_disk_entry, csum);
const u64 tc_abi_sb_gen_offset = offsetof(struct tc_disk_sb, gen);
const u64 tc_abi_entry_gen_offset = offsetof(struct tc_disk_entry, gen);
const u64 tc_abi_sb_epoch_offset = offsetof(struct tc_disk_sb, epoch);
const u64 tc_abi_entry_flags_offset = offsetof(struct tc_disk_entry, flags);
const u64 tc_abi_sum_size = sizeof(struct tc_disk_sum);
const u64 tc_abi_sum_bits_offset = offsetof(struct tc_disk_sum, bits);

u64 tc_abi_disk_epoch(u64 sb_epoch, u16 e);
bool tc_abi_sum_test(const struct tc_disk_sum *s, u32 j);
void tc_abi_sum_set(struct tc_disk_sum *s, u32 j);

/* tc_disk_epoch(), for the tool */
u64 tc_abi_disk_epoch(u64 sb_epoch, u16 e)
{
	return tc_disk_epoch(sb_epoch, e);
}

/* tc_sum_test(): is metadata block @j of summary block @s marked? */
bool tc_abi_sum_test(const struct tc_disk_sum *s, u32 j)
{
	return tc_sum_test(s, j);
}

/* tc_sum_set(), for the tool's tests (the tool writes no summary) */
void tc_abi_sum_set(struct tc_disk_sum *s, u32 j)
{
	tc_sum_set(s, j);
}
