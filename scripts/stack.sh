#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# stack.sh - build and tear down "cache over slow disk" stacks with dmsetup.
#
# A stack is: a slow disk (dm-delay over a RAM disk or a loop file, or an
# HDD-like memory-backed null_blk, or an existing device), a cache device
# (RAM disk, SSD-like loop file, or an existing device) and a cache system on
# top (tiercache, bcache, dm-cache, dm-writecache, Open CAS, or none for the
# bare slow disk).  Every resource is recorded under $TC_STACK_STATE/<name>/ the moment
# it exists, so 'remove' (and the automatic clean-up after a failed 'create')
# removes exactly what was built, in reverse order.
#
# Run 'stack.sh help' for the options.

set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$SCRIPT_DIR/.." && pwd)
TC_PROG=stack.sh
# shellcheck source=lib.sh
. "$SCRIPT_DIR/lib.sh"

STATE_ROOT=${TC_STACK_STATE:-/run/tiercache-stack}
BRD_DIR=$STATE_ROOT/.brd
TIERCACHE_KO=${TIERCACHE_KO:-$REPO_DIR/dm-tiercache/dm-tiercache.ko}
NULLB_CFG=/sys/kernel/config/nullb

usage() {
	cat <<EOF
Usage:
  stack.sh create NAME [options]   build a stack, print KEY=VALUE lines
  stack.sh remove NAME             tear it down (no-op if it does not exist)
  stack.sh remove --all            tear down every stack built by this script
  stack.sh info NAME               print the KEY=VALUE lines of a stack
  stack.sh list                    list the stacks

Cache system:
  --system S         tiercache | bcache | dm-cache | dm-writecache | opencas
                     | none (none = the bare slow disk)     [tiercache]
  --mode M           writeback | writethrough | passthrough (tiercache,
                     dm-cache); writeback | writethrough | writearound
                     (bcache); writeback | writethrough | writearound |
                     passthrough | writeonly (opencas)      [writeback]
  --block-kb N       cache block: tiercache 4-1024 (power of two) [4],
                     dm-cache 32-1048576 (multiple of 32) [32],
                     dm-writecache 1, 2 or 4 [4], bcache 1-64 [4],
                     opencas cache line 4, 8, 16, 32 or 64 [4]
  --opt KEY=VALUE    extra table key: tiercache and dm-writecache optional
                     args, dm-cache policy args (repeatable), for example
                     --opt bridge_gap_kb=64 --opt flush_depth=512
  --meta-size SIZE   dm-cache metadata RAM disk             [16M]
  --bcache-writeback-delay N
                     bcache writeback_delay in seconds, set before the
                     cache attaches                [bcache's default, 30]

Slow disk:
  --slow MODEL       delay | hdd                            [delay]
  --slow-dev DEV     use an existing block device instead (its content is
                     destroyed by bcache and dm-writecache formatting)
  --slow-size SIZE   size of the slow disk (K/M/G suffix, whole MiB) [32M]
  --slow-backing B   delay model: ram (brd RAM disk) | file (loop device
                     over a file in --file-dir)             [ram]
  --read-delay-ms N  delay model: read delay                [0]
  --write-delay-ms N delay model: write delay               [1000]
  --hdd-nsec N       hdd model: service time per request, null_blk
                     completion_nsec                        [8000000]
  --hdd-mbps N       hdd model: bandwidth cap in MB/s, 0 = none [150]
  --hdd-depth N      hdd model: hw_queue_depth              [1]
  --hdd-sched S      hdd model: I/O scheduler (mq-deadline, none, kyber,
                     bfq)                                   [mq-deadline]
  --hdd-max-kb N     hdd model: largest request in KiB (null_blk
                     max_sectors; a SATA disk has 1280)     [1024]
  --slow-fill 0|1    write zeros over the whole slow disk before the cache
                     system is built.  brd and null_blk allocate a page on
                     the first write to it, which a disk does not do: a
                     flush to a fresh RAM-backed disk also times page
                     allocation (ignored with --slow-dev)   [0]

Cache device:
  --cache KIND       ram (brd) | ssd (loop device over a file) [ram]
  --cache-dev DEV    use an existing block device instead
  --cache-size SIZE  size of the cache device              [512M]
  --file-dir DIR     where loop files are created           [/dev/shm]

Environment: TC_STACK_STATE (state directory, default /run/tiercache-stack),
TIERCACHE_KO (module to insmod when the tiercache target is not loaded,
default dm-tiercache/dm-tiercache.ko of this repository), OPENCAS_DIR
(a build of Open CAS by scripts/opencas.sh: cas_cache.ko is insmodded from
there when not loaded, and its casadm is used; without it, casadm from PATH
and 'modprobe cas_cache').

Open CAS: the cache starts with 'casadm --start-cache --cache-mode wb
--cache-line-size 4 --force', the slow disk is added with 'casadm
--add-core' and the exported core device (/dev/casN-1) is the top device.
casadm accepts device paths under /dev/disk/by-id only, so the stack links
its two devices there (tcstack-NAME-cache, tcstack-NAME-core).  'remove'
stops the cache without flushing (--no-data-flush).

'create' is idempotent: the same NAME with the same options reports the
existing stack; different options are refused.  A failed 'create' removes
everything it built.  RAM disks come from one brd module load: all RAM disks
of a stack are planned together; brd is unloaded again by 'remove' when this
script loaded it and no stack uses it any more, which frees the memory.
EOF
}

# ---------------------------------------------------------------------------
# State bookkeeping

SD=""            # state directory of the stack being handled
NAME=""

res_add() { printf '%s\n' "$*" >>"$SD/resources"; }
info_add() { printf '%s=%s\n' "$1" "$2" >>"$SD/info"; }

lock_state() {
	mkdir -p "$STATE_ROOT" "$BRD_DIR"
	exec 9>"$STATE_ROOT/.lock"
	flock 9
}

check_name() {
	[[ $1 =~ ^[A-Za-z][A-Za-z0-9_]{0,23}$ ]] ||
		tc_die "invalid stack name '$1' (a letter, then up to 23 letters, digits or _)"
}

# ---------------------------------------------------------------------------
# brd RAM disks.  Claims live in $BRD_DIR/ramN (content: stack name); the
# file $BRD_DIR/loaded marks a brd load done by this script.

brd_claim_owner() {
	local f=$BRD_DIR/$1 owner
	[ -f "$f" ] || return 1
	owner=$(cat "$f")
	if [ -d "$STATE_ROOT/$owner" ]; then
		echo "$owner"
		return 0
	fi
	rm -f "$f"	# stale: its stack is gone
	return 1
}

brd_free_disks() {	# print unclaimed, unused RAM disks of at least $1 MiB
	local need=$1 d k
	for d in /sys/block/ram*; do
		[ -e "$d" ] || continue
		k=$(basename "$d")
		brd_claim_owner "$k" >/dev/null && continue
		(($(cat "$d/size") >= need * 2048)) || continue
		tc_dev_busy "/dev/$k" quick >/dev/null && continue
		echo "$k"
	done
}

brd_any_busy() {	# print a reason if some RAM disk is claimed or in use
	local d k owner why
	for d in /sys/block/ram*; do
		[ -e "$d" ] || continue
		k=$(basename "$d")
		if owner=$(brd_claim_owner "$k"); then
			echo "$k belongs to stack $owner"
			return 0
		fi
		if why=$(tc_dev_busy "/dev/$k" quick); then
			echo "$why"
			return 0
		fi
	done
	return 1
}

# brd_acquire COUNT SIZE_MIB: claim COUNT RAM disks of at least SIZE_MIB,
# loading (or reloading) brd when needed.  Sets BRD_GOT=(ram0 ram1 ...).
BRD_GOT=()
brd_acquire() {
	local count=$1 size=$2 free why i
	mapfile -t free < <(brd_free_disks "$size")
	if ((${#free[@]} < count)); then
		if tc_module_loaded brd; then
			if why=$(brd_any_busy); then
				tc_die "need $count RAM disk(s) of $size MiB but brd is loaded with" \
					"rd_nr=$(cat /sys/module/brd/parameters/rd_nr)" \
					"rd_size=$(($(cat /sys/module/brd/parameters/rd_size) / 1024)) MiB" \
					"and cannot be reloaded: $why" \
					"(remove that stack, or use --slow-backing file / --cache ssd)"
			fi
			tc_msg "reloading brd for $count RAM disk(s) of $size MiB"
			rmmod brd 2>/dev/null || tc_die "brd is loaded and cannot be unloaded (a RAM disk is open)"
			rm -f "$BRD_DIR/loaded"
		fi
		tc_modprobe brd rd_nr="$count" rd_size=$((size * 1024)) max_part=0
		: >"$BRD_DIR/loaded"
		res_add brdload -	# unload again if this create fails early
		for i in $(seq 0 $((count - 1))); do
			tc_wait_block "ram$i" || tc_die "/dev/ram$i did not appear after loading brd"
		done
		mapfile -t free < <(brd_free_disks "$size")
		((${#free[@]} >= count)) || tc_die "brd loaded but only ${#free[@]} usable RAM disk(s)"
	fi
	BRD_GOT=("${free[@]:0:count}")
	for i in "${BRD_GOT[@]}"; do
		echo "$NAME" >"$BRD_DIR/$i"
		res_add brdclaim "$i"
	done
}

brd_release() {
	local k=$1 owner
	if [ -n "$k" ] && owner=$(brd_claim_owner "$k") && [ "$owner" = "$NAME" ]; then
		rm -f "$BRD_DIR/$k"
	fi
	# Unload brd (frees its memory) if we loaded it and nobody uses it.
	[ -f "$BRD_DIR/loaded" ] || return 0
	tc_module_loaded brd || { rm -f "$BRD_DIR/loaded"; return 0; }
	brd_any_busy >/dev/null && return 0
	if rmmod brd 2>/dev/null; then
		rm -f "$BRD_DIR/loaded"
	else
		tc_warn "could not unload brd (a RAM disk is still open)"
	fi
	return 0
}

# ---------------------------------------------------------------------------
# Loop files

ensure_loop() {
	[ -e /dev/loop-control ] || tc_modprobe loop
	tc_need_cmd losetup mount
}

# loop_create ROLE SIZE_MIB: prints the loop device
LOOP_DEV=""
loop_create() {
	local role=$1 size=$2 file
	file=$FILE_DIR/tcstack-$NAME-$role.img
	if [ -e "$file" ]; then
		if [ -n "$(losetup -j "$file" 2>/dev/null)" ]; then
			tc_die "$file is attached to a loop device (left over from another stack? run: stack.sh remove $NAME)"
		fi
		rm -f "$file"
	fi
	res_add file "$file"
	truncate -s "${size}M" "$file" || tc_die "cannot create $file"
	LOOP_DEV=$(losetup --find --show "$file") || tc_die "losetup failed for $file"
	res_add loop "$LOOP_DEV" "$file"
}

# ---------------------------------------------------------------------------
# null_blk HDD model

ensure_nullb() {
	if ! mountpoint -q /sys/kernel/config; then
		tc_module_loaded configfs || tc_modprobe configfs
		mountpoint -q /sys/kernel/config || mount -t configfs none /sys/kernel/config ||
			tc_die "cannot mount configfs on /sys/kernel/config"
	fi
	if [ ! -d "$NULLB_CFG" ]; then
		tc_module_loaded null_blk && tc_die "null_blk is loaded but $NULLB_CFG is missing"
		tc_modprobe null_blk nr_devices=0
		[ -d "$NULLB_CFG" ] || tc_die "null_blk loaded but $NULLB_CFG is missing"
	fi
}

nullb_set() {	# nullb_set DIR ATTR VALUE
	[ -e "$1/$2" ] || tc_die "null_blk has no '$2' setting on this kernel (features: $(cat "$NULLB_CFG/features" 2>/dev/null))"
	echo "$3" >"$1/$2" || tc_die "null_blk refused $2=$3"
}

NULLB_DEV=""
nullb_create() {	# nullb_create CFGNAME SIZE_MIB
	local cfg=$NULLB_CFG/$1 k
	ensure_nullb
	[ -e "$cfg" ] && tc_die "null_blk device $1 already exists in $NULLB_CFG (in use by someone else?)"
	mkdir "$cfg" || tc_die "cannot create $cfg"
	res_add nullb "$1"
	nullb_set "$cfg" size "$2"
	nullb_set "$cfg" blocksize 512
	nullb_set "$cfg" memory_backed 1
	nullb_set "$cfg" queue_mode 2
	nullb_set "$cfg" irqmode 2
	nullb_set "$cfg" submit_queues 1
	nullb_set "$cfg" completion_nsec "$HDD_NSEC"
	nullb_set "$cfg" hw_queue_depth "$HDD_DEPTH"
	nullb_set "$cfg" max_sectors $((HDD_MAX_KB * 2))
	((HDD_MBPS == 0)) || nullb_set "$cfg" mbps "$HDD_MBPS"
	nullb_set "$cfg" power 1
	# Newer kernels name the disk after the configfs directory.
	if [ -e "/sys/block/$1" ]; then
		k=$1
	else
		k=nullb$(cat "$cfg/index")
	fi
	tc_wait_block "$k" || tc_die "null_blk device $k did not appear"
	if ! grep -qw -- "$HDD_SCHED" "/sys/block/$k/queue/scheduler"; then
		tc_die "I/O scheduler '$HDD_SCHED' not available for $k (have: $(cat "/sys/block/$k/queue/scheduler"))"
	fi
	echo "$HDD_SCHED" >"/sys/block/$k/queue/scheduler"
	NULLB_DEV=/dev/$k
}

nullb_remove() {
	local cfg=$NULLB_CFG/$1
	[ -d "$cfg" ] || return 0
	[ "$(cat "$cfg/power" 2>/dev/null)" = 1 ] && echo 0 >"$cfg/power"
	rmdir "$cfg"
}

# ---------------------------------------------------------------------------
# bcache

bcache_stop() {	# bcache_stop SLOWKNAME CACHEKNAME CSET
	local sk=$1 ck=$2 cset=$3 i
	[ -e "/sys/block/$sk/bcache/stop" ] && echo 1 >"/sys/block/$sk/bcache/stop" 2>/dev/null
	[ -n "$cset" ] && [ -e "/sys/fs/bcache/$cset/stop" ] && echo 1 >"/sys/fs/bcache/$cset/stop" 2>/dev/null
	for i in $(seq 300); do
		if [ ! -e "/sys/block/$sk/bcache" ] && [ ! -e "/sys/block/$ck/bcache" ] &&
			{ [ -z "$cset" ] || [ ! -e "/sys/fs/bcache/$cset" ]; }; then
			return 0
		fi
		sleep 0.1
	done
	tc_warn "bcache on $sk/$ck did not stop within 30 s"
	return 1
}

# ---------------------------------------------------------------------------
# Open CAS (built by scripts/opencas.sh, or installed)

CASADM=""
opencas_tools() {
	if [ -n "${OPENCAS_DIR:-}" ]; then
		[ -x "$OPENCAS_DIR/casadm" ] && [ -f "$OPENCAS_DIR/cas_cache.ko" ] ||
			tc_die "OPENCAS_DIR=$OPENCAS_DIR has no casadm and cas_cache.ko (build them with scripts/opencas.sh build)"
		CASADM=$OPENCAS_DIR/casadm
	else
		CASADM=$(command -v casadm) ||
			tc_die "casadm not found: build Open CAS with scripts/opencas.sh build and set OPENCAS_DIR"
	fi
}

ensure_opencas() {
	local i
	if ! tc_module_loaded cas_cache; then
		if [ -n "${OPENCAS_DIR:-}" ]; then
			insmod "$OPENCAS_DIR/cas_cache.ko" 2>/dev/null ||
				tc_die "insmod $OPENCAS_DIR/cas_cache.ko failed (see dmesg)"
		else
			tc_modprobe cas_cache
		fi
	fi
	for i in $(seq 100); do
		[ -c /dev/cas_ctrl ] && return 0
		sleep 0.1
	done
	tc_die "cas_cache is loaded but /dev/cas_ctrl did not appear"
}

# opencas_link ROLE DEV: a /dev/disk/by-id link to DEV (casadm takes no
# other paths); prints it.
opencas_link() {
	local link=/dev/disk/by-id/tcstack-$NAME-$1
	mkdir -p /dev/disk/by-id
	[ ! -e "$link" ] && [ ! -L "$link" ] || tc_die "$link already exists"
	res_add link "$link"
	ln -s "/dev/$(tc_kname "$2")" "$link"
	echo "$link"
}

opencas_stop() {	# opencas_stop CACHE_ID CASADM
	local casadm=$2
	[ -e "/sys/module/cas_cache" ] || return 0
	"$casadm" --list-caches --output-format csv 2>/dev/null |
		awk -F, -v id="$1" '$1 == "cache" && $2 == id { f = 1 } END { exit !f }' || return 0
	timeout 120 "$casadm" --stop-cache --cache-id "$1" --no-data-flush >/dev/null 2>&1 || {
		tc_warn "casadm --stop-cache --cache-id $1 failed"
		return 1
	}
}

create_opencas() {
	local slow=$1 cache=$2 id used out mode core_link cache_link i
	ensure_opencas
	used=$("$CASADM" --list-caches --output-format csv 2>/dev/null |
		awk -F, '$1 == "cache" { print $2 }')
	id=1
	while grep -qx "$id" <<<"$used"; do id=$((id + 1)); done
	case $MODE in
	writeback) mode=wb ;; writethrough) mode=wt ;; writearound) mode=wa ;;
	passthrough) mode=pt ;; writeonly) mode=wo ;;
	esac
	cache_link=$(opencas_link cache "$cache")
	core_link=$(opencas_link core "$slow")
	tc_zero_head "$cache" 1
	res_add opencas "$id" "$CASADM"
	out=$("$CASADM" --start-cache --cache-device "$cache_link" --cache-id "$id" \
		--cache-mode "$mode" --cache-line-size "$BLOCK_KB" --force 2>&1) ||
		tc_die "casadm --start-cache failed: $out"
	out=$("$CASADM" --add-core --cache-id "$id" --core-id 1 --core-device "$core_link" 2>&1) ||
		tc_die "casadm --add-core failed: $out"
	tc_wait_block "cas$id-1" || tc_die "/dev/cas$id-1 did not appear"
	info_add TOP_DEV "/dev/cas$id-1"
	info_add OPENCAS_CACHE_ID "$id"
	info_add CASADM "$CASADM"
	info_add TABLE "casadm --start-cache --cache-device $cache_link --cache-id $id --cache-mode $mode --cache-line-size $BLOCK_KB --force; casadm --add-core --cache-id $id --core-id 1 --core-device $core_link"
}

# ---------------------------------------------------------------------------
# Teardown

teardown() {	# teardown NAME: remove the resources of a stack, newest first
	local name=$1 sd=$STATE_ROOT/$1 line failed=() kind a b c
	[ -d "$sd" ] || return 0
	SD=$sd
	NAME=$name
	if [ -f "$sd/resources" ]; then
		while read -r kind a b c <&3; do
			line="$kind $a ${b:-} ${c:-}"
			case $kind in
			dm) tc_dm_remove "$a" || failed+=("$line") ;;
			bcache) bcache_stop "$a" "$b" "${c:-}" || failed+=("$line") ;;
			opencas) opencas_stop "$a" "$b" || failed+=("$line") ;;
			link) [ ! -L "$a" ] || rm -f "$a" ;;
			loop)
				if [ "$(losetup -nO BACK-FILE "$a" 2>/dev/null | sed 's/ *(deleted)$//; s/^ *//; s/ *$//')" = "$b" ]; then
					losetup -d "$a" || failed+=("$line")
				fi ;;
			file) rm -f "$a" ;;
			nullb) nullb_remove "$a" || failed+=("$line") ;;
			brdclaim) brd_release "$a" ;;
			brdload) brd_release "" ;;
			*) tc_warn "unknown resource '$line' in $sd/resources" ;;
			esac
		done 3< <(tac "$sd/resources")
	fi
	if ((${#failed[@]})); then
		printf '%s\n' "${failed[@]}" | tac >"$sd/resources"
		rm -f "$sd/complete"
		tc_msg "stack $name: could not remove: ${failed[*]}"
		return 1
	fi
	rm -rf "$sd"
	return 0
}

# Zeros over all of a slow disk's backing device (--slow-fill 1), in
# large writes, before the delay is put over it.
slow_fill() {
	[ "$SLOW_FILL" = 1 ] || return 0
	dd if=/dev/zero of="$1" bs=1M count="$SLOW_MIB" oflag=direct conv=notrunc status=none ||
		tc_die "cannot fill the slow disk $1"
	info_add SLOW_FILLED 1
}

# ---------------------------------------------------------------------------
# create

SYSTEM=tiercache MODE="" BLOCK_KB="" OPTS=() META_MIB=16
SLOW=delay SLOW_DEV_IN="" SLOW_MIB="" SLOW_BACKING=ram RD_MS=0 WR_MS=1000 SLOW_FILL=0
HDD_NSEC=8000000 HDD_MBPS=150 HDD_DEPTH=1 HDD_SCHED=mq-deadline HDD_MAX_KB=1024
CACHE=ram CACHE_DEV_IN="" CACHE_MIB="" FILE_DIR=/dev/shm BC_WB_DELAY=""

parse_create() {
	local a v
	while (($#)); do
		a=$1
		[ $# -ge 2 ] || tc_die "option $a needs a value (see stack.sh help)"
		v=$2
		shift 2
		case $a in
		--system) SYSTEM=$v ;;
		--mode) MODE=$v ;;
		--block-kb) BLOCK_KB=$(tc_parse_uint "block size (--block-kb)" "$v" 1 1048576) ;;
		--opt)
			[[ $v =~ ^[a-z_]+=[A-Za-z0-9_.]+$ ]] || tc_die "invalid --opt '$v' (expected key=value)"
			OPTS+=("${v%%=*}" "${v#*=}") ;;
		--meta-size) META_MIB=$(tc_parse_size "$v") ;;
		--slow) SLOW=$v ;;
		--slow-dev) SLOW_DEV_IN=$v ;;
		--slow-size) SLOW_MIB=$(tc_parse_size "$v") ;;
		--slow-backing) SLOW_BACKING=$v ;;
		--slow-fill) SLOW_FILL=$(tc_parse_uint "--slow-fill" "$v" 0 1) ;;
		--read-delay-ms) RD_MS=$(tc_parse_uint "read delay (--read-delay-ms)" "$v" 0 600000) ;;
		--write-delay-ms) WR_MS=$(tc_parse_uint "write delay (--write-delay-ms)" "$v" 0 600000) ;;
		--hdd-nsec) HDD_NSEC=$(tc_parse_uint "service time (--hdd-nsec)" "$v" 0 10000000000) ;;
		--hdd-mbps) HDD_MBPS=$(tc_parse_uint "bandwidth (--hdd-mbps)" "$v" 0 100000) ;;
		--hdd-depth) HDD_DEPTH=$(tc_parse_uint "queue depth (--hdd-depth)" "$v" 1 4096) ;;
		--hdd-sched) HDD_SCHED=$v ;;
		--hdd-max-kb) HDD_MAX_KB=$(tc_parse_uint "largest request (--hdd-max-kb)" "$v" 4 32767) ;;
		--cache) CACHE=$v ;;
		--cache-dev) CACHE_DEV_IN=$v ;;
		--cache-size) CACHE_MIB=$(tc_parse_size "$v") ;;
		--file-dir) FILE_DIR=$v ;;
		--bcache-writeback-delay) BC_WB_DELAY=$(tc_parse_uint "bcache writeback delay" "$v" 0 3600) ;;
		*) tc_die "unknown option '$a' (see stack.sh help)" ;;
		esac
	done
}

validate_create() {
	local slow_bytes cache_bytes ram_mib=0 mem_mib
	case $SYSTEM in
	tiercache | bcache | dm-cache | dm-writecache | opencas | none) ;;
	*) tc_die "unknown system '$SYSTEM' (tiercache, bcache, dm-cache, dm-writecache, opencas or none)" ;;
	esac
	case $SLOW in
	delay | hdd) ;;
	*) tc_die "unknown slow disk model '$SLOW' (delay or hdd)" ;;
	esac
	case $SLOW_BACKING in
	ram | file) ;;
	*) tc_die "unknown slow disk backing '$SLOW_BACKING' (ram or file)" ;;
	esac
	case $CACHE in
	ram | ssd) ;;
	*) tc_die "unknown cache kind '$CACHE' (ram or ssd)" ;;
	esac
	[[ $HDD_SCHED =~ ^(none|mq-deadline|kyber|bfq)$ ]] ||
		tc_die "unknown I/O scheduler '$HDD_SCHED' (none, mq-deadline, kyber or bfq)"

	# Existing devices
	if [ -n "$SLOW_DEV_IN" ]; then
		[ -b "$SLOW_DEV_IN" ] || tc_die "slow device $SLOW_DEV_IN is not a block device"
		local why
		if why=$(tc_dev_busy "$SLOW_DEV_IN"); then tc_die "slow device in use: $why"; fi
		slow_bytes=$(tc_dev_bytes "$SLOW_DEV_IN")
		if [ -z "$SLOW_MIB" ]; then
			SLOW_MIB=$((slow_bytes / 1048576))
			((SLOW_MIB > 0)) || tc_die "slow device $SLOW_DEV_IN is smaller than 1 MiB"
		elif ((SLOW_MIB * 1048576 > slow_bytes)); then
			tc_die "--slow-size ${SLOW_MIB}M is larger than $SLOW_DEV_IN ($((slow_bytes / 1048576)) MiB)"
		fi
	fi
	SLOW_MIB=${SLOW_MIB:-32}
	if [ -n "$CACHE_DEV_IN" ]; then
		[ -b "$CACHE_DEV_IN" ] || tc_die "cache device $CACHE_DEV_IN is not a block device"
		local why
		if why=$(tc_dev_busy "$CACHE_DEV_IN"); then tc_die "cache device in use: $why"; fi
		cache_bytes=$(tc_dev_bytes "$CACHE_DEV_IN")
		if [ -z "$CACHE_MIB" ]; then
			CACHE_MIB=$((cache_bytes / 1048576))
			((CACHE_MIB > 0)) || tc_die "cache device $CACHE_DEV_IN is smaller than 1 MiB"
		elif ((CACHE_MIB * 1048576 > cache_bytes)); then
			tc_die "--cache-size ${CACHE_MIB}M is larger than $CACHE_DEV_IN ($((cache_bytes / 1048576)) MiB)"
		fi
		if [ -n "$SLOW_DEV_IN" ] && [ "$(tc_kname "$SLOW_DEV_IN")" = "$(tc_kname "$CACHE_DEV_IN")" ]; then
			tc_die "the slow device and the cache device are the same device"
		fi
	fi
	CACHE_MIB=${CACHE_MIB:-512}

	# Per system rules
	[ -z "$BC_WB_DELAY" ] || [ "$SYSTEM" = bcache ] || tc_die "--bcache-writeback-delay applies to bcache only"
	case $SYSTEM in
	tiercache)
		BLOCK_KB=${BLOCK_KB:-4}
		{ tc_is_pow2 "$BLOCK_KB" && ((BLOCK_KB >= 4 && BLOCK_KB <= 1024)); } ||
			tc_die "invalid block size ${BLOCK_KB} KiB for tiercache (power of two from 4 to 1024)"
		# 16 slots, a 4 KiB superblock and the entries, rounded up to a block
		((CACHE_MIB * 1024 >= 17 * BLOCK_KB + 8)) || tc_die "cache too small: tiercache needs at least 16 blocks and its metadata"
		MODE=${MODE:-writeback}
		[[ $MODE =~ ^(writeback|writethrough|passthrough)$ ]] ||
			tc_die "invalid mode '$MODE' for tiercache (writeback, writethrough or passthrough)" ;;
	dm-cache)
		BLOCK_KB=${BLOCK_KB:-32}
		((BLOCK_KB >= 32 && BLOCK_KB % 32 == 0)) ||
			tc_die "invalid block size ${BLOCK_KB} KiB for dm-cache (a multiple of 32 KiB)"
		((CACHE_MIB * 1024 >= 16 * BLOCK_KB)) || tc_die "cache too small: use at least 16 blocks"
		MODE=${MODE:-writeback}
		[[ $MODE =~ ^(writeback|writethrough|passthrough)$ ]] ||
			tc_die "invalid mode '$MODE' for dm-cache (writeback, writethrough or passthrough)" ;;
	dm-writecache)
		BLOCK_KB=${BLOCK_KB:-4}
		[[ $BLOCK_KB =~ ^(1|2|4)$ ]] || tc_die "invalid block size ${BLOCK_KB} KiB for dm-writecache (1, 2 or 4)"
		((CACHE_MIB >= 4)) || tc_die "cache too small: dm-writecache needs at least 4 MiB"
		[ -z "$MODE" ] || tc_die "--mode does not apply to dm-writecache (it is always a write-back cache)" ;;
	bcache)
		BLOCK_KB=${BLOCK_KB:-4}
		{ tc_is_pow2 "$BLOCK_KB" && ((BLOCK_KB <= 64)); } ||
			tc_die "invalid block size ${BLOCK_KB} KiB for bcache (power of two up to 64)"
		# bcache wants more than 512 buckets; buckets of 16 KiB or more.
		((CACHE_MIB >= 16)) || tc_die "cache too small: bcache needs at least 16 MiB"
		MODE=${MODE:-writeback}
		[[ $MODE =~ ^(writeback|writethrough|writearound)$ ]] ||
			tc_die "invalid mode '$MODE' for bcache (writeback, writethrough or writearound)"
		((${#OPTS[@]} == 0)) || tc_die "--opt does not apply to bcache" ;;
	opencas)
		BLOCK_KB=${BLOCK_KB:-4}
		[[ $BLOCK_KB =~ ^(4|8|16|32|64)$ ]] ||
			tc_die "invalid block size ${BLOCK_KB} KiB for opencas (cache line 4, 8, 16, 32 or 64)"
		((CACHE_MIB >= 64)) || tc_die "cache too small: Open CAS needs at least 64 MiB (its metadata)"
		MODE=${MODE:-writeback}
		[[ $MODE =~ ^(writeback|writethrough|writearound|passthrough|writeonly)$ ]] ||
			tc_die "invalid mode '$MODE' for opencas (writeback, writethrough, writearound, passthrough or writeonly)"
		((${#OPTS[@]} == 0)) || tc_die "--opt does not apply to opencas" ;;
	none)
		[ -z "$MODE" ] || tc_die "--mode does not apply to --system none"
		((${#OPTS[@]} == 0)) || tc_die "--opt does not apply to --system none" ;;
	esac

	# Memory for RAM-backed devices: brd and tmpfs only use what is written,
	# but refuse what could never fit.
	[ -n "$SLOW_DEV_IN" ] || ram_mib=$((ram_mib + SLOW_MIB))
	if [ -z "$CACHE_DEV_IN" ] && [ "$SYSTEM" != none ]; then
		ram_mib=$((ram_mib + CACHE_MIB))
	fi
	mem_mib=$(($(awk '/^MemTotal:/ { print $2 }' /proc/meminfo) / 1024))
	((ram_mib < mem_mib)) ||
		tc_die "slow disk plus cache (${ram_mib} MiB) do not fit in memory (${mem_mib} MiB)"

	if { [ -z "$SLOW_DEV_IN" ] && [ "$SLOW" = delay ] && [ "$SLOW_BACKING" = file ]; } ||
		{ [ -z "$CACHE_DEV_IN" ] && [ "$CACHE" = ssd ] && [ "$SYSTEM" != none ]; }; then
		[ -d "$FILE_DIR" ] || tc_die "--file-dir $FILE_DIR is not a directory"
		[ -w "$FILE_DIR" ] || tc_die "--file-dir $FILE_DIR is not writable"
	fi
}

have_target() { dmsetup targets 2>/dev/null | awk -v t="$1" '$1 == t { f = 1 } END { exit !f }'; }

ensure_tiercache() {
	if have_target tiercache; then
		return 0
	fi
	tc_modprobe dm-mod
	if modprobe dm-tiercache 2>/dev/null; then
		return 0
	fi
	[ -f "$TIERCACHE_KO" ] ||
		tc_die "the tiercache target is not loaded and $TIERCACHE_KO does not exist (build it with 'make' at the top of the repository, or set TIERCACHE_KO)"
	local dep
	for dep in $(modinfo -F depends "$TIERCACHE_KO" 2>/dev/null | tr ',' ' '); do
		tc_modprobe "$dep"
	done
	modprobe libcrc32c 2>/dev/null || true	# insmod does not load dependencies
	insmod "$TIERCACHE_KO" 2>/dev/null || tc_die "insmod $TIERCACHE_KO failed (see dmesg)"
	have_target tiercache || tc_die "$TIERCACHE_KO loaded but no tiercache target registered"
}

# canonical parameter list, to recognise a repeated identical create
params_string() {
	printf '%s ' "system=$SYSTEM" "mode=$MODE" "block_kb=$BLOCK_KB" "opts=${OPTS[*]:-}" \
		"meta=$META_MIB" "slow=$SLOW" "slow_dev=$SLOW_DEV_IN" "slow_mib=$SLOW_MIB" "slow_fill=$SLOW_FILL" \
		"backing=$SLOW_BACKING" "rd=$RD_MS" "wr=$WR_MS" "nsec=$HDD_NSEC" "mbps=$HDD_MBPS" \
		"depth=$HDD_DEPTH" "sched=$HDD_SCHED" "max_kb=$HDD_MAX_KB" "cache=$CACHE" "cache_dev=$CACHE_DEV_IN" \
		"cache_mib=$CACHE_MIB" "file_dir=$FILE_DIR" "bc_wb_delay=$BC_WB_DELAY"
	echo
}

create_rollback() {
	local rc=$?
	trap - EXIT
	if ((rc != 0)) && [ -n "$SD" ] && [ -d "$SD" ] && [ ! -f "$SD/complete" ]; then
		tc_msg "create $NAME failed: removing what was built"
		teardown "$NAME" || tc_msg "clean-up incomplete; run: stack.sh remove $NAME"
	fi
	exit "$rc"
}

cmd_create() {
	[ $# -ge 1 ] || tc_die "create needs a stack name (see stack.sh help)"
	NAME=$1
	shift
	check_name "$NAME"
	parse_create "$@"
	tc_need_root
	validate_create
	tc_need_cmd dmsetup dmsetup
	tc_need_cmd blockdev util-linux
	[ "$SYSTEM" != bcache ] || tc_need_cmd make-bcache bcache-tools
	[ "$SYSTEM" != bcache ] || tc_need_cmd bcache-super-show bcache-tools
	[ "$SYSTEM" != opencas ] || opencas_tools

	lock_state
	local params
	params=$(params_string)
	if [ -d "$STATE_ROOT/$NAME" ]; then
		if [ -f "$STATE_ROOT/$NAME/complete" ] && [ "$(cat "$STATE_ROOT/$NAME/params")" = "$params" ]; then
			tc_msg "stack $NAME already exists with these parameters"
			cat "$STATE_ROOT/$NAME/info"
			return 0
		fi
		if [ -f "$STATE_ROOT/$NAME/complete" ]; then
			tc_die "stack $NAME already exists with other parameters (remove it first: stack.sh remove $NAME)"
		fi
		tc_msg "stack $NAME is incomplete (an interrupted create?): removing it first"
		teardown "$NAME" || tc_die "cannot clean up the incomplete stack $NAME"
	fi
	local n
	for n in "$NAME" "$NAME-slow" "$NAME-cache" "$NAME-meta"; do
		tc_dm_exists "$n" && tc_die "a device-mapper device named $n already exists (not built by stack.sh)"
	done
	[ "$SLOW" != hdd ] || [ -n "$SLOW_DEV_IN" ] || [ ! -e "$NULLB_CFG/$NAME-slow" ] ||
		tc_die "a null_blk device $NAME-slow already exists (not built by stack.sh)"
	tc_modprobe dm-mod

	SD=$STATE_ROOT/$NAME
	mkdir -p "$SD"
	echo "$params" >"$SD/params"
	: >"$SD/resources"
	: >"$SD/info"
	trap create_rollback EXIT
	trap 'exit 130' INT TERM HUP	# run the EXIT trap: roll back
	info_add STACK "$NAME"
	info_add SYSTEM "$SYSTEM"

	# Plan the RAM disks of this stack in one go.
	local roles=() sizes=() max=0 i
	if [ -z "$SLOW_DEV_IN" ] && [ "$SLOW" = delay ] && [ "$SLOW_BACKING" = ram ]; then
		roles+=(slow); sizes+=("$SLOW_MIB")
	fi
	if [ "$SYSTEM" != none ] && [ -z "$CACHE_DEV_IN" ] && [ "$CACHE" = ram ]; then
		roles+=(cache); sizes+=("$CACHE_MIB")
	fi
	if [ "$SYSTEM" = dm-cache ]; then
		roles+=(meta); sizes+=("$META_MIB")
	fi
	local -A ram=()
	if ((${#roles[@]})); then
		for i in "${sizes[@]}"; do ((i > max)) && max=$i; done
		brd_acquire "${#roles[@]}" "$max"
		for i in "${!roles[@]}"; do
			ram[${roles[$i]}]=/dev/${BRD_GOT[$i]}
			tc_zero_head "/dev/${BRD_GOT[$i]}" 1
		done
	fi

	# Slow disk
	local slow_dev back sect=$((SLOW_MIB * 2048))
	if [ -n "$SLOW_DEV_IN" ]; then
		slow_dev=$SLOW_DEV_IN
		info_add SLOW_MODEL device
	elif [ "$SLOW" = delay ]; then
		tc_modprobe dm-delay
		if [ "$SLOW_BACKING" = ram ]; then
			back=${ram[slow]}
		else
			ensure_loop
			loop_create slow "$SLOW_MIB"
			back=$LOOP_DEV
		fi
		slow_fill "$back"
		res_add dm "$NAME-slow"
		tc_dm_create "$NAME-slow" "0 $sect delay $back 0 $RD_MS $back 0 $WR_MS"
		slow_dev=/dev/mapper/$NAME-slow
		info_add SLOW_MODEL "delay read_ms=$RD_MS write_ms=$WR_MS backing=$SLOW_BACKING"
		info_add SLOW_BACKING_DEV "$back"
	else
		nullb_create "$NAME-slow" "$SLOW_MIB"
		slow_dev=$NULLB_DEV
		slow_fill "$slow_dev"
		info_add SLOW_MODEL "hdd completion_nsec=$HDD_NSEC mbps=$HDD_MBPS hw_queue_depth=$HDD_DEPTH sched=$HDD_SCHED max_sectors_kb=$HDD_MAX_KB"
	fi
	info_add SLOW_DEV "$slow_dev"
	info_add SLOW_KNAME "$(tc_kname "$slow_dev")"
	info_add SLOW_SECTORS "$sect"

	if [ "$SYSTEM" = none ]; then
		info_add TOP_DEV "$slow_dev"
		touch "$SD/complete"
		trap - EXIT
		cat "$SD/info"
		return 0
	fi

	# Cache device
	local cache_dev
	if [ -n "$CACHE_DEV_IN" ]; then
		cache_dev=$CACHE_DEV_IN
		if [ "$SYSTEM" = dm-writecache ] || [ "$SYSTEM" = bcache ]; then
			tc_zero_head "$cache_dev" 1
		fi
	elif [ "$CACHE" = ram ]; then
		cache_dev=${ram[cache]}
		if (($(blockdev --getsz "$cache_dev") != CACHE_MIB * 2048)); then
			res_add dm "$NAME-cache"
			tc_dm_create "$NAME-cache" "0 $((CACHE_MIB * 2048)) linear $cache_dev 0"
			cache_dev=/dev/mapper/$NAME-cache
		fi
	else
		ensure_loop
		loop_create cache "$CACHE_MIB"
		cache_dev=$LOOP_DEV
	fi
	info_add CACHE_DEV "$cache_dev"
	info_add CACHE_KNAME "$(tc_kname "$cache_dev")"

	local table nfeat
	case $SYSTEM in
	tiercache)
		ensure_tiercache
		# a new cache: "format" lays out the metadata on the cache device
		nfeat=$((2 + ${#OPTS[@]}))
		table="0 $sect tiercache $slow_dev $cache_dev $((BLOCK_KB * 2)) $nfeat format $MODE${OPTS[*]:+ ${OPTS[*]}}"
		res_add dm "$NAME"
		tc_dm_create "$NAME" "$table"
		info_add TOP_DEV "/dev/mapper/$NAME"
		info_add DM_NAME "$NAME"
		info_add TABLE "$table" ;;
	dm-writecache)
		tc_modprobe dm-writecache
		tc_zero_head "$cache_dev" 1
		table="0 $sect writecache s $slow_dev $cache_dev $((BLOCK_KB * 1024)) ${#OPTS[@]}${OPTS[*]:+ ${OPTS[*]}}"
		res_add dm "$NAME"
		tc_dm_create "$NAME" "$table"
		info_add TOP_DEV "/dev/mapper/$NAME"
		info_add DM_NAME "$NAME"
		info_add TABLE "$table" ;;
	dm-cache)
		tc_modprobe dm-cache
		tc_modprobe dm-cache-smq
		local meta_dev=${ram[meta]}
		if (($(blockdev --getsz "$meta_dev") != META_MIB * 2048)); then
			res_add dm "$NAME-meta"
			tc_dm_create "$NAME-meta" "0 $((META_MIB * 2048)) linear $meta_dev 0"
			meta_dev=/dev/mapper/$NAME-meta
		fi
		tc_zero_head "$meta_dev" 1
		info_add META_DEV "$meta_dev"
		table="0 $sect cache $meta_dev $cache_dev $slow_dev $((BLOCK_KB * 2)) 1 $MODE smq ${#OPTS[@]}${OPTS[*]:+ ${OPTS[*]}}"
		res_add dm "$NAME"
		tc_dm_create "$NAME" "$table"
		info_add TOP_DEV "/dev/mapper/$NAME"
		info_add DM_NAME "$NAME"
		info_add TABLE "$table" ;;
	bcache)
		create_bcache "$slow_dev" "$cache_dev" ;;
	opencas)
		create_opencas "$slow_dev" "$cache_dev" ;;
	esac

	touch "$SD/complete"
	trap - EXIT
	cat "$SD/info"
}

bcache_register() {	# bcache_register DEV KNAME
	local i
	[ -e "/sys/block/$2/bcache" ] && return 0
	echo "$1" >/sys/fs/bcache/register 2>/dev/null && return 0
	# "already registered": udev's bcache rule got there first.
	for i in $(seq 50); do
		[ -e "/sys/block/$2/bcache" ] && return 0
		sleep 0.1
	done
	tc_die "registering $1 with bcache failed (see dmesg)"
}

create_bcache() {
	local slow=$1 cache=$2 sk ck bucket cset bdev i h out
	tc_modprobe bcache
	[ -w /sys/fs/bcache/register ] || tc_die "/sys/fs/bcache/register missing after loading bcache"
	sk=$(tc_kname "$slow")
	ck=$(tc_kname "$cache")
	# More than 512 buckets (bcache's minimum), at most 512 KiB each.
	bucket=512
	while ((bucket > 16 && CACHE_MIB * 1024 / bucket <= 512)); do bucket=$((bucket / 2)); done
	((CACHE_MIB * 1024 / bucket > 512)) || tc_die "cache too small for bcache"
	((bucket >= BLOCK_KB)) || tc_die "bcache block size ${BLOCK_KB} KiB exceeds the bucket size ${bucket} KiB"
	tc_zero_head "$cache" 1
	out=$(make-bcache --block "${BLOCK_KB}k" --bucket "${bucket}k" --writeback -C "$cache" -B "$slow" 2>&1) ||
		tc_die "make-bcache failed: $out"
	cset=$(bcache-super-show "$cache" | awk '$1 == "cset.uuid" { print $2 }')
	[ -n "$cset" ] || tc_die "cannot read the cache set uuid of $cache"
	res_add bcache "$sk" "$ck" "$cset"
	# Register both devices ourselves (udev may do it too, or not at all).
	# The backing device first: its writeback thread starts at attach time
	# and sleeps writeback_delay seconds, so that must be set before.
	bcache_register "$slow" "$sk"
	bdev=""
	for i in $(seq 100); do
		for h in "/sys/block/$sk/holders/"bcache*; do
			[ -e "$h" ] && bdev=$(basename "$h")
		done
		[ -n "$bdev" ] && break
		sleep 0.1
	done
	[ -n "$bdev" ] || tc_die "no bcache device appeared over $slow"
	tc_wait_block "$bdev" || tc_die "/dev/$bdev did not appear"
	[ -z "$BC_WB_DELAY" ] || echo "$BC_WB_DELAY" >"/sys/block/$bdev/bcache/writeback_delay"
	bcache_register "$cache" "$ck"
	for i in $(seq 50); do
		[ "$(cat "/sys/block/$bdev/bcache/state")" != "no cache" ] && break
		sleep 0.1
	done
	if [ "$(cat "/sys/block/$bdev/bcache/state")" = "no cache" ]; then
		echo "$cset" >"/sys/block/$bdev/bcache/attach" 2>/dev/null ||
			tc_die "attaching $bdev to cache set $cset failed (see dmesg)"
	fi
	for i in $(seq 100); do
		[ "$(cat "/sys/block/$bdev/bcache/state")" != "no cache" ] && break
		sleep 0.1
	done
	[ "$(cat "/sys/block/$bdev/bcache/state")" != "no cache" ] || tc_die "$bdev is not attached to its cache"
	echo "$MODE" >"/sys/block/$bdev/bcache/cache_mode"
	# Cache every write: no sequential bypass, no congestion bypass.
	echo 0 >"/sys/block/$bdev/bcache/sequential_cutoff"
	echo 0 >"/sys/fs/bcache/$cset/congested_read_threshold_us"
	echo 0 >"/sys/fs/bcache/$cset/congested_write_threshold_us"
	info_add TOP_DEV "/dev/$bdev"
	info_add BCACHE_DEV "$bdev"
	info_add BCACHE_CSET "$cset"
	info_add BCACHE_BUCKET_KB "$bucket"
	# Where the bcache device's sector 0 lies on the slow disk.
	info_add BCACHE_DATA_OFFSET "$(bcache-super-show "$slow" | awk '$1 == "dev.data.first_sector" { print $2 }')"
}

# ---------------------------------------------------------------------------

cmd_remove() {
	[ $# -eq 1 ] || tc_die "remove needs one stack name or --all (see stack.sh help)"
	tc_need_root
	local rc=0 d
	if [ "$1" = --all ]; then
		[ -d "$STATE_ROOT" ] || return 0
		lock_state
		for d in "$STATE_ROOT"/*/; do
			[ -d "$d" ] || continue
			teardown "$(basename "$d")" || rc=1
		done
		return $rc
	fi
	check_name "$1"
	[ -d "$STATE_ROOT/$1" ] || { tc_msg "no stack $1: nothing to remove"; return 0; }
	lock_state
	teardown "$1"
}

cmd_info() {
	[ $# -eq 1 ] || tc_die "info needs one stack name"
	check_name "$1"
	[ -f "$STATE_ROOT/$1/complete" ] || tc_die "no stack $1"
	cat "$STATE_ROOT/$1/info"
}

cmd_list() {
	local d
	[ -d "$STATE_ROOT" ] || return 0
	for d in "$STATE_ROOT"/*/; do
		[ -d "$d" ] || continue
		if [ -f "$d/complete" ]; then
			echo "$(basename "$d") $(grep '^SYSTEM=' "$d/info" | cut -d= -f2) $(grep '^TOP_DEV=' "$d/info" | cut -d= -f2)"
		else
			echo "$(basename "$d") incomplete"
		fi
	done
}

main() {
	local cmd=${1:-help}
	shift || true
	case $cmd in
	create) cmd_create "$@" ;;
	remove) cmd_remove "$@" ;;
	info) cmd_info "$@" ;;
	list) cmd_list ;;
	help | -h | --help) usage ;;
	*) usage >&2; tc_die "unknown command '$cmd'" ;;
	esac
}

main "$@"
