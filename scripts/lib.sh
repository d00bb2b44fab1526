# shellcheck shell=bash
# Common helpers for the dm-tiercache scripts.  Sourced, never executed.
#
# Conventions: messages go to stderr, prefixed with the calling script's name;
# machine-readable output (KEY=VALUE lines) goes to stdout.

TC_PROG=${TC_PROG:-$(basename "$0")}

tc_msg()  { printf '%s: %s\n' "$TC_PROG" "$*" >&2; }
tc_warn() { printf '%s: warning: %s\n' "$TC_PROG" "$*" >&2; }
tc_die()  { printf '%s: error: %s\n' "$TC_PROG" "$*" >&2; exit 1; }

tc_need_root() {
	[ "$(id -u)" -eq 0 ] || tc_die "must run as root (device-mapper, modules and sysfs need it)"
}

# tc_need_cmd CMD PACKAGE
tc_need_cmd() {
	command -v "$1" >/dev/null 2>&1 ||
		tc_die "command '$1' not found: install the Debian package '$2' (apt-get install $2)"
}

# tc_modprobe MODULE [PARAM=VALUE...]: load a module, explain a failure.
tc_modprobe() {
	local mod=$1
	shift
	# already loaded (modprobe is slow under emulation)
	[ $# -eq 0 ] && [ -d "/sys/module/${mod//-/_}" ] && return 0
	if ! modprobe "$mod" "$@" 2>/dev/null; then
		tc_die "kernel module '$mod' cannot be loaded for kernel $(uname -r)" \
			"(missing from /lib/modules/$(uname -r)? the kernel needs its CONFIG option as =m or =y)"
	fi
}

tc_module_loaded() { [ -d "/sys/module/$1" ]; }

# tc_parse_size VALUE: print VALUE in MiB.  Accepts 32, 32M, 32MiB, 1G,
# 1GiB, 65536K, 65536KiB (no suffix = MiB).  Only whole MiB, more than 0.
tc_parse_size() {
	local v=$1 num unit mib
	if [[ ! $v =~ ^([0-9]+)([KkMmGg]?)(i?B)?$ ]]; then
		tc_die "invalid size '$v' (expected a number with an optional K, M or G suffix, for example 32M)"
	fi
	num=$((10#${BASH_REMATCH[1]}))
	unit=${BASH_REMATCH[2]^^}
	case $unit in
	K) ((num % 1024 == 0)) || tc_die "invalid size '$v': sizes must be whole MiB"
	   mib=$((num / 1024)) ;;
	G) mib=$((num * 1024)) ;;
	*) mib=$num ;;
	esac
	((mib > 0)) || tc_die "invalid size '$v': must be at least 1 MiB"
	((mib <= 1048576)) || tc_die "invalid size '$v': larger than 1 TiB"
	echo "$mib"
}

# tc_parse_uint NAME VALUE MIN MAX: check an integer range, print it.
tc_parse_uint() {
	local name=$1 v=$2 min=$3 max=$4
	[[ $v =~ ^[0-9]+$ ]] || tc_die "invalid $name '$v' (expected a whole number from $min to $max)"
	((${#v} <= 12)) || tc_die "invalid $name '$v' (expected a whole number from $min to $max)"
	v=$((10#$v))
	((v >= min && v <= max)) || tc_die "invalid $name '$v' (expected a whole number from $min to $max)"
	echo "$v"
}

tc_is_pow2() { local v=$1; ((v > 0 && (v & (v - 1)) == 0)); }

# tc_kname DEV: kernel name of a block device (dm-3, ram0, nullb0, loop2).
tc_kname() {
	local dev=$1 mm
	mm=$(stat -Lc '%t %T' "$dev") || return 1
	# shellcheck disable=SC2086
	set -- $mm
	basename "$(readlink -f "/sys/dev/block/$((16#$1)):$((16#$2))")"
}

# tc_dev_bytes DEV
tc_dev_bytes() { blockdev --getsize64 "$1"; }

# tc_dev_busy DEV [quick]: print why DEV is in use and return 0, or return 1
# if free.  "quick" skips the exclusive-open test (a python start-up).
tc_dev_busy() {
	local dev=$1 quick=${2:-} kname mm h
	kname=$(tc_kname "$dev") || { echo "cannot resolve $dev"; return 0; }
	mm=$(cat "/sys/class/block/$kname/dev")
	if awk -v d="$mm" '$3 == d { f = 1 } END { exit !f }' /proc/self/mountinfo; then
		echo "$dev is mounted"
		return 0
	fi
	if awk -v k="/dev/$kname" 'NR > 1 && $1 == k { f = 1 } END { exit !f }' /proc/swaps; then
		echo "$dev is an active swap device"
		return 0
	fi
	for h in "/sys/class/block/$kname/holders/"*; do
		if [ -e "$h" ]; then
			echo "$dev is held by $(basename "$h")"
			return 0
		fi
	done
	if [ -d "/sys/class/block/$kname/bcache" ]; then
		echo "$dev is registered with bcache"
		return 0
	fi
	# The kernel's own test: an exclusive open fails while anything claims
	# the device.
	if [ -z "$quick" ] && command -v python3 >/dev/null 2>&1 &&
		! python3 -c 'import os, sys
try:
    os.close(os.open(sys.argv[1], os.O_RDONLY | os.O_EXCL))
except OSError:
    sys.exit(1)' "$dev" 2>/dev/null; then
		echo "$dev is opened exclusively by another user"
		return 0
	fi
	return 1
}

# tc_udev_flags: dmsetup flags.  We never rely on udev (the test VM has
# none for device-mapper): create nodes ourselves with 'dmsetup mknodes'.
TC_DMSETUP=(dmsetup --noudevsync)

tc_dm_exists() { dmsetup info "$1" >/dev/null 2>&1; }

# tc_dm_create NAME TABLE
tc_dm_create() {
	local name=$1 table=$2 err
	if ! err=$("${TC_DMSETUP[@]}" create "$name" --table "$table" 2>&1); then
		tc_die "dmsetup create $name failed: ${err:-no message} (table: $table; see dmesg for the target's reason)"
	fi
	dmsetup mknodes "$name" >/dev/null 2>&1 || true
	local i
	for i in $(seq 50); do
		[ -b "/dev/mapper/$name" ] && return 0
		sleep 0.1
	done
	tc_die "/dev/mapper/$name did not appear"
}

# tc_dm_remove NAME: remove if present, retrying while it is busy.
tc_dm_remove() {
	local name=$1 i
	tc_dm_exists "$name" || return 0
	for i in $(seq 20); do
		if "${TC_DMSETUP[@]}" remove "$name" >/dev/null 2>&1; then
			dmsetup mknodes >/dev/null 2>&1 || true
			return 0
		fi
		sleep 0.5
	done
	tc_warn "cannot remove device-mapper device $name (still open?)"
	return 1
}

# tc_wait_block KNAME: wait for /sys/block/KNAME and /dev/KNAME.
tc_wait_block() {
	local k=$1 i mm
	for i in $(seq 100); do
		if [ -e "/sys/block/$k/dev" ]; then
			if [ ! -b "/dev/$k" ]; then
				mm=$(cat "/sys/block/$k/dev")
				mknod "/dev/$k" b "${mm%%:*}" "${mm##*:}" 2>/dev/null || true
			fi
			[ -b "/dev/$k" ] && return 0
		fi
		sleep 0.1
	done
	return 1
}

# tc_nullb_mem NAME MIB: a memory-backed null_blk /dev/NAME of MIB MiB
# (configfs; null_blk loaded with nr_devices=0).  Remove it with
# tc_nullb_rm NAME.
tc_nullb_mem() {
	local nb=/sys/kernel/config/nullb/$1
	mountpoint -q /sys/kernel/config || mount -t configfs none /sys/kernel/config
	mkdir "$nb"
	echo "$2" >"$nb/size"
	echo 1 >"$nb/memory_backed"
	echo 1 >"$nb/power"
	sleep 0.5
}

tc_nullb_rm() {
	local nb=/sys/kernel/config/nullb/$1
	if [ -d "$nb" ]; then
		echo 0 >"$nb/power" || true
		rmdir "$nb" || true
	fi
}

# tc_zero_head DEV MIB: overwrite the first MIB MiB (stale superblocks).
tc_zero_head() {
	dd if=/dev/zero of="$1" bs=1M count="$2" oflag=direct conv=notrunc status=none
}

# tc_bench_vm MEMORY ENV SCRIPT: build the module, boot the test VM (the
# newest 6.1 kernel, or $KVER) and run "SCRIPT --inside" in it with ENV (a
# string of VAR=value words); print what it printed.  For the benchmark
# scripts, which run the same file outside (to boot) and inside the VM.
tc_bench_vm() {
	local mem=$1 env=$2 script=$3 repo kver out
	repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
	kver=${KVER:-$(ls /lib/modules | grep -E '^6\.1\.' | sort -V | tail -n 1)}
	[ -n "$kver" ] || tc_die "no 6.1 kernel installed (make test installs one)"
	command -v vng >/dev/null || tc_die "vng missing (make test installs virtme-ng)"
	make -C "$repo" KVER="$kver" >/dev/null
	out=$(mktemp -d)
	vng --run "/boot/vmlinuz-$kver" --disable-kvm --force-9p --memory "$mem" \
	    --cpus 2 --rwdir "$out" \
	    --exec "$env $script --inside >$out/log 2>&1" >/dev/null 2>&1 || true
	if [ ! -s "$out/log" ]; then
		rm -rf "$out"
		tc_die "the VM produced no output"
	fi
	grep -v "^Udev is running and DM_DISABLE_UDEV" "$out/log" || true
	rm -rf "$out"
}
