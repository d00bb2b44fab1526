#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# membench.sh - kernel memory per cache slot, create and load time, for
# tiercache and dm-writecache at real cache sizes (a benchmark, not a test).
#
#   scripts/membench.sh            boots the test VM (6 GiB) and runs it there
#   scripts/membench.sh --inside   the benchmark itself (root, inside the VM)
#
# For each cache size (SIZES_GIB, default "16 256 1024") and each target:
#   create   a cache device and a 16 times larger origin, both null_blk
#            without backing memory (any size, data not kept); the drop of
#            MemAvailable over the create, divided by the slots, is the
#            memory per slot of an empty cache, and the create's seconds
#            are printed;
#   fill     FILL_BLOCKS random 4 KiB writes spread over the whole origin
#            (16 times the cache): what a used (dirty) slot costs on top,
#            from the growth of vmalloc and slab memory (MemAvailable moves
#            by tens of MiB with fio itself: too coarse for this); "full"
#            adds the two: the memory of a cache with every slot used.
#            Caches of at most FULL_GIB (default 16) are filled for real
#            instead: 1.1 writes per slot, until (nearly) every slot holds
#            a dirty block ("used" says how many), so the dirty order's
#            growth is measured, not extrapolated from a sample;
#   load     a cache device on a sparse file in the guest's tmpfs (real
#            metadata, read back): created, N random 4 KiB writes made
#            dirty (for each N of LOAD_DIRTY), removed, and created again
#            from its metadata (without "format"): the seconds of that
#            second create, and for tiercache the metadata blocks its load
#            read (format version 4 reads only those its summary marks).
# A target that cannot be built at a size prints why (the kernel's last
# line).  Figures are of one boot under emulation: compare the columns.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
SIZES_GIB=${SIZES_GIB:-16 256 1024}
FILL_BLOCKS=${FILL_BLOCKS:-262144}
FULL_GIB=${FULL_GIB:-16}
# dm-writecache allocates about 56 B per block at create (lvmcache(7): 2 GiB
# per 100 GiB) and may wake the OOM killer: not tried above this size
WC_MAX_GIB=${WC_MAX_GIB:-256}
# PARTS: "mem load" (both tables), or one of them
PARTS=${PARTS:-mem load}
LOAD_DIRTY=${LOAD_DIRTY:-0 65536 262144}
# TARGETS: "tiercache writecache" (both), or one of them
TARGETS=${TARGETS:-tiercache writecache}
MEMORY=${MEMORY:-6G}

# shellcheck source=lib.sh
. "$REPO/scripts/lib.sh"

if [ "${1:-}" != "--inside" ]; then
	tc_bench_vm "$MEMORY" "SIZES_GIB='$SIZES_GIB' FILL_BLOCKS=$FILL_BLOCKS LOAD_DIRTY='$LOAD_DIRTY' FULL_GIB=$FULL_GIB WC_MAX_GIB=$WC_MAX_GIB PARTS='$PARTS' TARGETS='$TARGETS' TIERCACHE_KO='${TIERCACHE_KO:-}'" "$0"
	exit 0
fi

export DM_DISABLE_UDEV=1
NB=/sys/kernel/config/nullb
TMP=/tmp/membench
cleanup() {
	dmsetup remove mb-tc 2>/dev/null || true
	losetup -D 2>/dev/null || true
	for d in "$NB"/mb*; do
		[ -d "$d" ] || continue
		echo 0 >"$d/power" 2>/dev/null || true
		rmdir "$d" 2>/dev/null || true
	done
	umount "$TMP" 2>/dev/null || true
}
trap cleanup EXIT

modprobe null_blk nr_devices=0
modprobe loop
modprobe dm-writecache
modprobe libcrc32c 2>/dev/null || true
grep -q dm_tiercache /proc/modules ||
	insmod "${TIERCACHE_KO:-$REPO/dm-tiercache/dm-tiercache.ko}"
mountpoint -q /sys/kernel/config || mount -t configfs none /sys/kernel/config
mkdir -p "$TMP"
mount -t tmpfs -o size=90% none "$TMP"

# nullb NAME MIB: a null_blk without backing memory; prints its device
nullb() {
	local d=$NB/$1
	mkdir "$d"
	echo "$2" >"$d/size"
	echo 0 >"$d/memory_backed"
	echo 4096 >"$d/blocksize"
	echo 1 >"$d/power"
	udevadm settle 2>/dev/null || true
	echo "/dev/$1"
}

nullb_del() {
	echo 0 >"$NB/$1/power"
	rmdir "$NB/$1"
}

# vmalloc'd and slab memory, KiB: what a cache's per-slot state grows in
kmem_kib() {
	awk '/^(VmallocUsed|Slab):/ { n += $2 } END { print n }' /proc/meminfo
}

avail_kib() {
	sync
	echo 3 >/proc/sys/vm/drop_caches
	awk '/^MemAvailable:/ { print $2 }' /proc/meminfo
}

sectors() { blockdev --getsz "$1"; }

# remove mb-tc; a device just written may be held a moment (udev, a
# writecache still settling): try for a while
remove_tc() {
	local i
	for i in $(seq 1 50); do
		dmsetup remove mb-tc 2>/dev/null && return 0
		sleep 0.2
	done
	dmsetup remove mb-tc
}

# table TARGET ORIGIN CACHE [load]: the table line of the target
table() {
	local len
	len=$(sectors "$2")
	case $1 in
	tiercache)
		if [ "${4:-}" = load ]; then
			echo "0 $len tiercache $2 $3 8 2 high_watermark 100"
		else
			echo "0 $len tiercache $2 $3 8 3 format high_watermark 100"
		fi ;;
	writecache)
		echo "0 $len writecache s $2 $3 4096 2 high_watermark 100" ;;
	esac
}

# counts TARGET: "slots-in-use slots" of mb-tc
counts() {
	local st
	st=$(dmsetup status mb-tc)
	case $1 in
	tiercache) echo "$st" | awk '{ split($6, u, "/"); print u[1], u[2] }' ;;
	writecache) echo "$st" | awk '{ print $5 - $6, $5 }' ;;
	esac
}

used() { counts "$1" | awk '{ print $1 }'; }
slots() { counts "$1" | awk '{ print $2 }'; }

# timed_create TABLE: create mb-tc; prints the seconds, or fails
timed_create() {
	local t0 t1
	t0=$(date +%s.%N)
	dmsetup create mb-tc --table "$1" 2>/dev/null || return 1
	t1=$(date +%s.%N)
	awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }'
}

why() { dmesg | grep -E 'tiercache|writecache' | tail -n 1 | sed 's/^\[[^]]*\] //'; }

random_writes() {	# DEV COUNT SEED
	fio --name=fill --filename="$1" --bs=4k --direct=1 --ioengine=libaio \
	    --iodepth=32 --rw=randwrite --norandommap --randrepeat=0 \
	    --randseed="$3" --number_ios="$2" --size=100% \
	    --output=/dev/null
}

# memory and create time on null_blk
mem_row() {	# TARGET GIB
	local t=$1 gib=$2 o c a0 a1 k1 k2 secs n u per_create per_used fill
	if [ "$t" = writecache ] && [ "$gib" -gt "$WC_MAX_GIB" ]; then
		printf '%-10s %6s %s\n' "$t" "${gib}G" "not tried (WC_MAX_GIB=$WC_MAX_GIB: about 56 B per block would not fit)"
		return
	fi
	o=$(nullb mbo $((gib * 16 * 1024)))
	c=$(nullb mbc $((gib * 1024)))
	a0=$(avail_kib)
	if ! secs=$(timed_create "$(table "$t" "$o" "$c")"); then
		printf '%-10s %6s %s\n' "$t" "${gib}G" "create refused: $(why)"
		nullb_del mbo
		nullb_del mbc
		return
	fi
	a1=$(avail_kib)
	k1=$(kmem_kib)
	n=$(slots "$t")
	fill=$FILL_BLOCKS
	[ "$gib" -gt "$FULL_GIB" ] || fill=$((n + n / 10))
	random_writes /dev/mapper/mb-tc "$fill" 7
	k2=$(kmem_kib)
	u=$(used "$t")
	per_create=$(awk -v a="$a0" -v b="$a1" -v n="$n" 'BEGIN { printf "%.1f", (a - b) * 1024 / n }')
	per_used=$(awk -v a="$k1" -v b="$k2" -v n="$u" 'BEGIN { printf "%.1f", n ? (b - a) * 1024 / n : 0 }')
	printf '%-10s %6s %12s %7s%% %10s %12s %12s %10s\n' "$t" "${gib}G" "$n" \
		"$(awk -v u="$u" -v n="$n" 'BEGIN { printf "%.1f", u * 100 / n }')" \
		"$per_create" "$per_used" \
		"$(awk -v a="$per_create" -v b="$per_used" 'BEGIN { printf "%.1f", a + b }')" \
		"$secs"
	remove_tc
	nullb_del mbo
	nullb_del mbc
}

# "K/N": the metadata blocks the last tiercache load read, of all
blocks_read() {
	{ dmesg | grep -o 'read [0-9]* of [0-9]* metadata blocks' || true; } |
		tail -n 1 | awk '{ print $2 "/" $4 }'
}

# load time from real (sparse) metadata
load_row() {	# TARGET GIB DIRTY
	local t=$1 gib=$2 n=$3 o c f secs dirty nread=-
	if [ "$t" = writecache ] && [ "$gib" -gt "$WC_MAX_GIB" ]; then
		printf '%-10s %6s %s\n' "$t" "${gib}G" "not tried (WC_MAX_GIB)"
		return
	fi
	o=$(nullb mbo $((gib * 16 * 1024)))
	f=$TMP/cache-$t
	truncate -s "${gib}G" "$f"
	c=$(losetup --show -f "$f")
	if ! timed_create "$(table "$t" "$o" "$c")" >/dev/null; then
		printf '%-10s %6s %s\n' "$t" "${gib}G" "create refused: $(why)"
	else
		[ "$n" -eq 0 ] || random_writes /dev/mapper/mb-tc "$n" 11
		case $t in
		tiercache) dirty=$(dmsetup status mb-tc | awk '{ print $7 }') ;;
		writecache) dirty=$(used "$t") ;;
		esac
		remove_tc
		if secs=$(timed_create "$(table "$t" "$o" "$c" load)"); then
			if [ "$t" = tiercache ]; then
				nread=$(blocks_read)
			fi
			printf '%-10s %6s %10s %12s %22s\n' "$t" "${gib}G" "$secs" \
				"$dirty" "$nread"
			remove_tc
		else
			printf '%-10s %6s %s\n' "$t" "${gib}G" "load refused: $(why)"
		fi
	fi
	losetup -d "$c"
	rm -f "$f"
	nullb_del mbo
}

if [[ " $PARTS " == *" mem "* ]]; then
	echo "memory per slot (4 KiB slots; origin 16x the cache; $FILL_BLOCKS random writes fill, caches of at most $FULL_GIB GiB filled)"
	printf '%-10s %6s %12s %8s %10s %12s %12s %10s\n' target cache slots used "B/slot" "B/used slot" "B/slot full" "create s"
	for gib in $SIZES_GIB; do
		for t in $TARGETS; do
			mem_row "$t" "$gib"
		done
	done
	echo
fi
if [[ " $PARTS " == *" load "* ]]; then
	echo "load from the cache device's metadata (sparse file in tmpfs; random writes before: $LOAD_DIRTY)"
	printf '%-10s %6s %10s %12s %22s\n' target cache "load s" "dirty" "metadata blocks read"
	for gib in $SIZES_GIB; do
		for n in $LOAD_DIRTY; do
			for t in $TARGETS; do
				load_row "$t" "$gib" "$n"
			done
		done
	done
fi
echo "guest: $(awk '/^MemTotal:/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo), kernel $(uname -r)"
