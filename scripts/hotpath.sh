#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# hotpath.sh - foreground IO of cached data: the raw cache device,
# dm-linear over it (what any device-mapper target costs), tiercache and
# dm-writecache side by side in one boot (a benchmark, not a test).
#
#   scripts/hotpath.sh            boots the test VM and runs it there
#   scripts/hotpath.sh --inside   the benchmark itself (root, inside the VM)
#
# The cache is a RAM disk (brd), the origin a null_blk (its speed does not
# matter: every IO below hits the cache).  For each device and each job
# (random writes, then random reads of the data just written, of each
# size in BS (default 4k; "4k 64k" also shows reads that span blocks), at
# iodepth 1 and 8, RUNTIME seconds each, over REGION_MIB) fio prints IOPS,
# mean, p99 and max completion latency; ROUNDS rounds alternate the
# devices so drift under emulation hits all of them alike.  The last
# columns divide by the raw device of the same round, the very last by
# dm-linear's.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
RUNTIME=${RUNTIME:-10}
ROUNDS=${ROUNDS:-2}
REGION_MIB=${REGION_MIB:-256}
BS=${BS:-4k}

# shellcheck source=lib.sh
. "$REPO/scripts/lib.sh"

if [ "${1:-}" != "--inside" ]; then
	tc_bench_vm 2G "RUNTIME=$RUNTIME ROUNDS=$ROUNDS REGION_MIB=$REGION_MIB BS='$BS'${TIERCACHE_KO:+ TIERCACHE_KO=$TIERCACHE_KO}" "$0"
	exit 0
fi

export DM_DISABLE_UDEV=1
cleanup() {
	dmsetup remove hp-tc 2>/dev/null || true
	dmsetup remove hp-wc 2>/dev/null || true
	dmsetup remove hp-lin 2>/dev/null || true
	tc_nullb_rm hpo
	rmmod brd 2>/dev/null || true
}
trap cleanup EXIT

CACHE_MIB=$((REGION_MIB * 2 + 64))
modprobe brd rd_nr=4 rd_size=$((CACHE_MIB * 1024))
modprobe null_blk nr_devices=0
modprobe dm-writecache
modprobe libcrc32c 2>/dev/null || true
grep -q dm_tiercache /proc/modules ||
	insmod "${TIERCACHE_KO:-$REPO/dm-tiercache/dm-tiercache.ko}"
tc_nullb_mem hpo $((REGION_MIB * 4))
origin=/dev/hpo
len=$(blockdev --getsz $origin)
# no writeback while measuring: the cache holds everything written
dmsetup create hp-tc --table \
	"0 $len tiercache $origin /dev/ram1 8 5 format high_watermark 100 low_watermark 0"
dmsetup create hp-wc --table \
	"0 $len writecache s $origin /dev/ram2 4096 4 high_watermark 100 low_watermark 99"
dmsetup create hp-lin --table "0 $(blockdev --getsz /dev/ram3) linear /dev/ram3 0"
dmsetup mknodes

# job DEV RW DEPTH BS: "iops mean_us p99_us max_us"
job() {
	fio --name=hp --filename="$1" --bs="$4" --direct=1 --ioengine=libaio \
	    --iodepth="$3" --rw="$2" --size=${REGION_MIB}M --time_based \
	    --runtime="$RUNTIME" --randseed=5 --output-format=json |
	python3 -c '
import json, sys
j = json.load(sys.stdin)["jobs"][0]
d = j["write"] if j["write"]["io_bytes"] else j["read"]
c = d["clat_ns"]
p99 = c.get("percentile", {}).get("99.000000", 0)
print("%.0f %.1f %.1f %.1f" % (d["iops"], c["mean"] / 1e3, p99 / 1e3, c["max"] / 1e3))'
}

# every device gets its region written once: reads then hit cached data
for dev in /dev/ram0 /dev/mapper/hp-lin /dev/mapper/hp-tc /dev/mapper/hp-wc; do
	fio --name=warm --filename=$dev --bs=1M --direct=1 --rw=write \
	    --size=${REGION_MIB}M --output=/dev/null
done

# a write that found the dirty order's tail full went around the cache
echo "tiercache after warming: $(dmsetup status hp-tc | awk '{ print "used/slots " $6 ", dirty " $7 ", write bypass " $12 }')"
printf '%-5s %-15s %5s %-10s %9s %9s %9s %10s %7s %7s %7s\n' round job depth device \
	iops "mean us" "p99 us" "max us" "x iops" "x p99" "x lin"
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b ? a / b : 0 }'; }
# one job on the four devices; $raw and $lin: the raw device's and
# dm-linear's figures, for the ratios
row() {
	local round=$1 rw=$2 depth=$3 bs=$4 dev r iops mean p99 max riops rp99 liops
	for dev in ram0 dm-linear tiercache writecache; do
		case $dev in
		ram0) r=$raw ;;
		dm-linear) r=$lin ;;
		tiercache) r=$(job /dev/mapper/hp-tc "$rw" "$depth" "$bs") ;;
		writecache) r=$(job /dev/mapper/hp-wc "$rw" "$depth" "$bs") ;;
		esac
		read -r iops mean p99 max <<<"$r"
		read -r riops _ rp99 _ <<<"$raw"
		read -r liops _ _ _ <<<"$lin"
		printf '%-5s %-15s %5s %-10s %9s %9s %9s %10s %7s %7s %7s\n' \
			"$round" "$rw-$bs" "$depth" $dev "$iops" "$mean" "$p99" "$max" \
			"$(ratio "$iops" "$riops")" "$(ratio "$p99" "$rp99")" \
			"$(ratio "$iops" "$liops")"
	done
}

for round in $(seq 1 "$ROUNDS"); do
	for bs in $BS; do
		for rw in randwrite randread; do
			for depth in 1 8; do
				raw=$(job /dev/ram0 $rw $depth "$bs")
				lin=$(job /dev/mapper/hp-lin $rw $depth "$bs")
				row "$round" $rw $depth "$bs"
			done
		done
	done
done
echo "cache: brd RAM disk; fio $BS, libaio, O_DIRECT, ${RUNTIME} s per job over ${REGION_MIB} MiB; kernel $(uname -r)"
