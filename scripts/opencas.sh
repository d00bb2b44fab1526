#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# opencas.sh - build the Open CAS peer of the experiment at run time.
#
#   opencas.sh build [KVER]    build Open CAS (kernel module cas_cache.ko and
#                              casadm) for KVER (default: the newest Debian
#                              6.1 kernel in /lib/modules) from a release
#                              tarball; print OPENCAS_DIR=<dir> on success
#   opencas.sh find            print the tarball that would be used
#
# Nothing of Open CAS is kept in this repository: the tarball (Open CAS
# Linux with its ocf submodule, BSD-3-Clause) is unpacked and built in a
# cache directory outside it, and the experiment insmods the module and
# runs casadm from there inside the VM (which sees the host's files).
#
# Environment:
#   OPENCAS_SRC=FILE     the tarball (default: the newest
#                        open-cas-linux-*.tar.xz in ../shared/peers next to
#                        this checkout, next to the main checkout of its
#                        git worktree, or next to the local checkout it was
#                        cloned from)
#   OPENCAS_CACHE=DIR    where builds are kept [/var/cache/tiercache-peers]
#   OPENCAS_REBUILD=1    build again even if a finished build is cached
#
# On failure it exits non-zero and the last line on stderr says why
# (missing tarball, configure or make failure with the log's path).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
TC_PROG=opencas.sh
# shellcheck source=lib.sh
. "$REPO/scripts/lib.sh"

CACHE_ROOT=${OPENCAS_CACHE:-/var/cache/tiercache-peers}

# Directories whose ../shared/peers may hold the tarball.
candidate_roots() {
	local common origin
	echo "$REPO"
	if common=$(git -C "$REPO" rev-parse --path-format=absolute --git-common-dir 2>/dev/null); then
		dirname "$common"
	fi
	origin=$(git -C "$REPO" config --get remote.origin.url 2>/dev/null || true)
	if [ -n "$origin" ] && [ -d "$origin" ]; then
		(cd "$origin" && pwd)
		if common=$(git -C "$origin" rev-parse --path-format=absolute --git-common-dir 2>/dev/null); then
			dirname "$common"
		fi
	fi
}

find_tarball() {
	local root f
	if [ -n "${OPENCAS_SRC:-}" ]; then
		[ -f "$OPENCAS_SRC" ] || tc_die "OPENCAS_SRC=$OPENCAS_SRC: no such file"
		echo "$OPENCAS_SRC"
		return 0
	fi
	while read -r root; do
		f=$(ls -1 "$root"/../shared/peers/open-cas-linux-*.tar.* 2>/dev/null | sort -V | tail -n 1 || true)
		if [ -n "$f" ]; then
			readlink -f "$f"
			return 0
		fi
	done < <(candidate_roots)
	tc_die "no Open CAS tarball (open-cas-linux-*.tar.xz) in ../shared/peers next to $REPO or the checkout it came from; set OPENCAS_SRC=/path/to/open-cas-linux-VERSION.tar.xz"
}

cmd_build() {
	local kver=${1:-} src sum base dir work kdir t0 log
	[ -n "$kver" ] || kver=$(ls /lib/modules 2>/dev/null | grep -E '^6\.1\.' | sort -V | tail -n 1 || true)
	[ -n "$kver" ] || tc_die "no Debian 6.1 kernel in /lib/modules"
	kdir=/lib/modules/$kver/build
	[ -f "$kdir/Makefile" ] || tc_die "no kernel headers for $kver ($kdir): apt-get install linux-headers-$kver"
	src=$(find_tarball)
	sum=$(sha256sum "$src" | cut -c1-12)
	base=$(basename "$src")
	base=${base%.tar.*}
	dir=$CACHE_ROOT/$base-$sum-$kver
	if [ "${OPENCAS_REBUILD:-0}" != 1 ] && [ -f "$dir/ok" ] &&
		[ -f "$dir/cas_cache.ko" ] && [ -x "$dir/casadm" ]; then
		tc_msg "$base for $kver: already built in $dir"
		echo "OPENCAS_DIR=$dir"
		return 0
	fi
	rm -rf "$dir"
	mkdir -p "$dir"
	work=$dir/src
	log=$dir/build.log
	mkdir -p "$work"
	t0=$(date +%s)
	tc_msg "building $base for $kver in $dir (configure about 2 min, make about 1 min on 2 cores; log $log)"
	tar -xf "$src" -C "$work" --strip-components=1 >"$log" 2>&1 ||
		tc_die "cannot unpack $src (see $log)"
	[ -x "$work/configure" ] || tc_die "$src has no configure script"
	[ -n "$(ls -A "$work/ocf" 2>/dev/null)" ] || tc_die "$src has no ocf submodule (ocf/ is empty)"
	# configure compiles small test modules against the headers; make needs
	# KERNEL_VERSION and KERNEL_DIR for a kernel other than the running one.
	if ! (cd "$work" && KERNEL_DIR=$kdir nice ./configure) >>"$log" 2>&1; then
		tc_die "Open CAS configure failed for $kver (last lines of $log: $(tail -n 3 "$log" | tr '\n' ' '))"
	fi
	if ! (cd "$work" && nice make -j"$(nproc)" KERNEL_DIR="$kdir" KERNEL_VERSION="$kver") >>"$log" 2>&1; then
		tc_die "Open CAS make failed for $kver (last lines of $log: $(tail -n 3 "$log" | tr '\n' ' '))"
	fi
	[ -f "$work/modules/cas_cache/cas_cache.ko" ] || tc_die "Open CAS built no cas_cache.ko (see $log)"
	[ -x "$work/casadm/casadm" ] || tc_die "Open CAS built no casadm (see $log)"
	[ "$(modinfo -F vermagic "$work/modules/cas_cache/cas_cache.ko" | cut -d' ' -f1)" = "$kver" ] ||
		tc_die "cas_cache.ko was built for another kernel than $kver (see $log)"
	# The module without its debug information: 28 MiB less for the VM to
	# read over 9p.
	strip --strip-debug -o "$dir/cas_cache.ko" "$work/modules/cas_cache/cas_cache.ko"
	cp "$work/casadm/casadm" "$dir/casadm"
	{
		echo "source: $src"
		echo "sha256: $(sha256sum "$src" | cut -d' ' -f1)"
		echo "kernel: $kver"
		echo "version: $(modinfo -F version "$dir/cas_cache.ko")"
		echo "built: $(date -Iseconds) in $(($(date +%s) - t0)) s"
	} >"$dir/ok"
	rm -rf "$work"
	tc_msg "$base built for $kver in $(($(date +%s) - t0)) s"
	echo "OPENCAS_DIR=$dir"
}

case ${1:-} in
build) shift; cmd_build "$@" ;;
find) find_tarball ;;
*) echo "usage: opencas.sh build [KVER] | find" >&2; exit 2 ;;
esac
