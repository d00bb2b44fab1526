#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# fgbench.sh - foreground IO while tiercache writes back.
#
#   scripts/fgbench.sh            boots the test VM and runs the benchmark in it
#   scripts/fgbench.sh --inside   the benchmark itself (root, inside the VM)
#
# A slow origin (dm-delay, DELAYMS write delay) cached on a RAM disk.  For
# each foreground workload (4 KiB random writes, 4 KiB random reads), fio
# runs RUNTIME seconds twice in the same boot: once with writeback idle
# (high_watermark 100), once while background writeback drains a cache that
# was filled with dirty blocks first (high_watermark 1, low_watermark 0).
# It prints the IOPS of both runs, their ratio, and how many blocks the
# writeback wrote during the second run: writeback must progress under load
# and foreground IO must keep being served.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
DELAYMS=${DELAYMS:-100}
RUNTIME=${RUNTIME:-10}
SLOW_MIB=${SLOW_MIB:-128}
CACHE_MIB=${CACHE_MIB:-256}
REGION_MIB=${REGION_MIB:-64}

# shellcheck source=lib.sh
. "$REPO/scripts/lib.sh"

if [ "${1:-}" != "--inside" ]; then
	tc_bench_vm 2G "DELAYMS=$DELAYMS RUNTIME=$RUNTIME" "$0"
	exit 0
fi

export DM_DISABLE_UDEV=1
cleanup() {
	dmsetup remove fg-tc 2>/dev/null || true
	dmsetup remove fg-slow 2>/dev/null || true
	rmmod brd 2>/dev/null || true
}
trap cleanup EXIT

modprobe dm-delay
modprobe brd rd_nr=2 rd_size=$((CACHE_MIB * 1024))
modprobe libcrc32c 2>/dev/null || true
grep -q dm_tiercache /proc/modules || insmod "${TIERCACHE_KO:-$REPO/dm-tiercache/dm-tiercache.ko}"
slow_sz=$((SLOW_MIB * 2048))
dmsetup create fg-slow --table "0 $slow_sz delay /dev/ram0 0 0 /dev/ram0 0 $DELAYMS"
dmsetup create fg-tc --table \
	"0 $slow_sz tiercache /dev/mapper/fg-slow /dev/ram1 8 7 format high_watermark 100 low_watermark 0 flush_depth 64"
dmsetup mknodes
dev=/dev/mapper/fg-tc

field() { dmsetup status fg-tc | awk -v f="$1" '{print $(3 + f)}'; }

fio_iops() {	# $1 = randwrite|randread
	fio --name=fg --filename=$dev --bs=4k --direct=1 --ioengine=libaio \
	    --iodepth=8 --rw="$1" --size=${REGION_MIB}M --time_based \
	    --runtime="$RUNTIME" --randseed=9 --output-format=terse \
	    --terse-version=3 | awk -F';' -v rw="$1" \
	    '{ print (rw == "randread") ? $8 : $49 }'
}

fill_dirty() {
	fio --name=fill --filename=$dev --bs=4k --direct=1 --ioengine=libaio \
	    --iodepth=8 --rw=randwrite --size=${REGION_MIB}M --randseed=3 \
	    --output=/dev/null
}

printf '%-10s %12s %16s %8s %22s\n' workload "iops idle" "iops writeback" ratio "blocks written back"
for rw in randwrite randread; do
	fill_dirty
	idle=$(fio_iops $rw)
	dmsetup message fg-tc 0 stats reset
	dmsetup message fg-tc 0 set low_watermark 0
	dmsetup message fg-tc 0 set high_watermark 1
	busy=$(fio_iops $rw)
	wrote=$(field 11)
	printf '%-10s %12s %16s %8s %22s\n' $rw "$idle" "$busy" \
		"$(awk -v a="$busy" -v b="$idle" 'BEGIN { printf "%.2f", b ? a / b : 0 }')" "$wrote"
	dmsetup message fg-tc 0 set high_watermark 100
	ev=$(dmsetup info -c --noheadings -o events fg-tc)
	dmsetup message fg-tc 0 flush
	dmsetup wait fg-tc "$ev" >/dev/null
done
echo "slow disk: dm-delay ${DELAYMS} ms writes; cache: RAM; fio 4 KiB iodepth 8 over ${REGION_MIB} MiB, ${RUNTIME} s each"
