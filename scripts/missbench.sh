#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# missbench.sh - IO the cache does not hold: how many requests reach the
# slow disk, and how fast, when a sequential stream reads data that is not
# cached, or writes where the cache keeps nothing dirty (a benchmark, not a
# test).
#
#   scripts/missbench.sh            boots the test VM and runs it there
#   scripts/missbench.sh --inside   the benchmark itself (root, inside the VM)
#
# Each system gets a stack of its own (scripts/stack.sh): a dm-delay slow
# disk over RAM (DELAY_MS per request, default 2) under a RAM cache (a
# memory-backed null_blk, formatted anew for each system).  Two
# jobs, one after the other on a fresh stack: a sequential read of
# SIZE_MIB (64) in 1 MiB O_DIRECT reads that nothing has cached, and a
# sequential write of the next SIZE_MIB the same way.  For each, the slow
# disk's requests (/sys/block/dm-N/stat: what one 1 MiB bio costs it),
# their mean size, MiB/s, and the cache device's requests.
#
# Systems (SYSTEMS, a comma-separated list): tiercache in writeback (tc-wb),
# writethrough (tc-wt) and passthrough (tc-pt), dm-writecache, bcache and
# Open CAS in writeback mode with their defaults (bcache sends sequential
# IO of 4 MiB and more around the cache: sequential_cutoff), and the bare
# slow disk.  Open CAS is built from its release tarball first
# (scripts/opencas.sh, about 3 min the first time); if that fails it is
# left out, with the reason.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
TC_PROG=missbench.sh
DELAY_MS=${DELAY_MS:-2}
SIZE_MIB=${SIZE_MIB:-64}
SYSTEMS=${SYSTEMS:-bare,tc-wb,tc-wt,tc-pt,dm-writecache,bcache,opencas}

# shellcheck source=lib.sh
. "$REPO/scripts/lib.sh"

if [ "${1:-}" != "--inside" ]; then
	env="DELAY_MS=$DELAY_MS SIZE_MIB=$SIZE_MIB"
	if [[ ,$SYSTEMS, == *,opencas,* ]]; then
		kver=${KVER:-$(ls /lib/modules | grep -E '^6\.1\.' | sort -V | tail -n 1)}
		if out=$("$REPO/scripts/opencas.sh" build "$kver" 2>/tmp/missbench-opencas.txt); then
			# the guest sees no /var/cache (virtme-ng's tmpfs): copy
			oc=$REPO/results/missbench-opencas
			mkdir -p "$oc"
			dir=$(sed -n 's/^OPENCAS_DIR=//p' <<<"$out")
			cp "$dir/cas_cache.ko" "$dir/casadm" "$dir/ok" "$oc/"
			env+=" OPENCAS_DIR=$oc"
		else
			echo "Open CAS left out: $(tail -n 1 /tmp/missbench-opencas.txt)"
			SYSTEMS=$(tr ',' '\n' <<<"$SYSTEMS" | grep -vx opencas | paste -sd, -)
		fi
	fi
	tc_bench_vm 3G "$env SYSTEMS=$SYSTEMS${TIERCACHE_KO:+ TIERCACHE_KO=$TIERCACHE_KO}" "$0"
	exit 0
fi

export DM_DISABLE_UDEV=1
STACK=$REPO/scripts/stack.sh
# the cache device: a memory-backed null_blk, which counts its requests
# (a brd RAM disk does not)
cleanup() {
	"$STACK" remove --all >/dev/null 2>&1 || true
	tc_nullb_rm mbcache
}
trap cleanup EXIT
modprobe dm-delay
modprobe dm-writecache
modprobe null_blk nr_devices=0
tc_nullb_mem mbcache $((SIZE_MIB * 4))
CACHE_NB=/dev/mbcache

# stat FIELD of the device node DEV (sectors for the *_sectors fields)
stat_of() {
	local k
	k=$(tc_kname "$1")
	awk -v f="$2" '{ print $f }' "/sys/block/$k/stat"
}

# job TOP SLOW CACHE RW OFFSET_MIB: one row of the table
job() {
	local top=$1 slow=$2 cache=$3 rw=$4 off=$5 f req0 sec0 creq0 req sec creq t0 t1
	[ "$rw" = read ] && f=1 || f=5
	sync
	req0=$(stat_of "$slow" $f) sec0=$(stat_of "$slow" $((f + 2)))
	creq0=0
	[ -z "$cache" ] || creq0=$(( $(stat_of "$cache" 1) + $(stat_of "$cache" 5) ))
	t0=$(date +%s.%N)
	fio --name=mb --filename="$top" --bs=1M --direct=1 --ioengine=psync \
	    --rw="$rw" --offset=${off}M --size=${SIZE_MIB}M --output=/dev/null
	t1=$(date +%s.%N)
	req=$(( $(stat_of "$slow" $f) - req0 ))
	sec=$(( $(stat_of "$slow" $((f + 2))) - sec0 ))
	creq=-
	[ -z "$cache" ] || creq=$(( $(stat_of "$cache" 1) + $(stat_of "$cache" 5) - creq0 ))
	awk -v s="$SYS" -v rw="$rw" -v r="$req" -v sec="$sec" -v c="$creq" \
	    -v t0="$t0" -v t1="$t1" -v mib="$SIZE_MIB" 'BEGIN {
		printf "%-14s %-6s %10d %12.0f %10.1f %14s\n", s, rw, r,
			r ? sec / 2 / r : 0, mib / (t1 - t0), c }'
}

# system SYS: build its stack, run both jobs, tear it down
system() {
	local opts info top slow cache
	case $SYS in
	bare) opts=(--system none) ;;
	tc-wb) opts=(--system tiercache --mode writeback) ;;
	tc-wt) opts=(--system tiercache --mode writethrough) ;;
	tc-pt) opts=(--system tiercache --mode passthrough) ;;
	dm-writecache) opts=(--system dm-writecache) ;;
	bcache) opts=(--system bcache --mode writeback) ;;
	opencas) opts=(--system opencas --mode writeback) ;;
	*) tc_die "unknown system $SYS" ;;
	esac
	# the previous system left its data there (tiercache writeback: dirty
	# blocks, which a tiercache 'format' refuses to destroy, EBUSY)
	tc_zero_head "$CACHE_NB" 1
	info=$("$STACK" create mb "${opts[@]}" --slow delay \
		--slow-size $((SIZE_MIB * 2 + 16))M --read-delay-ms "$DELAY_MS" \
		--write-delay-ms "$DELAY_MS" --cache-dev "$CACHE_NB" 2>/tmp/missbench-create.txt) || {
		echo "$SYS: stack.sh create failed: $(tail -n 3 /tmp/missbench-create.txt | tr '\n' ' ')"
		return 0
	}
	top=$(sed -n 's/^TOP_DEV=//p' <<<"$info")
	slow=$(sed -n 's/^SLOW_DEV=//p' <<<"$info")
	cache=$(sed -n 's/^CACHE_DEV=//p' <<<"$info")
	[ "$SYS" != bare ] || cache=
	job "$top" "$slow" "$cache" read 0
	job "$top" "$slow" "$cache" write "$SIZE_MIB"
	"$STACK" remove mb >/dev/null
}

printf '%-14s %-6s %10s %12s %10s %14s\n' system job "slow reqs" "KiB per req" "MiB/s" "cache reqs"
for SYS in ${SYSTEMS//,/ }; do
	system
done
echo "slow disk: dm-delay over RAM, ${DELAY_MS} ms per request; cache: RAM; fio 1 MiB O_DIRECT, sequential, ${SIZE_MIB} MiB per job, nothing cached before; kernel $(uname -r)"
