#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# Build (or reuse) the debug kernel for `make test-debug`: Debian's 6.1 source
# (package linux-source-6.1) with x86_64 defconfig + tests/debug/config.fragment
# (a small virtme-ng guest plus KASAN, lockdep, DEBUG_ATOMIC_SLEEP, kmemleak,
# DEBUG_OBJECTS).  The build tree serves as KDIR for external modules and as
# the kernel directory for `vng --run`.
#
#   tests/debug/kernel.sh          prints the build directory on its last line
#
# Cache: $TC_DEBUG_CACHE (default /opt/tiercache-test/debug-kernel: the guest
# must see the modules, and virtme-ng hides /var/cache behind a tmpfs)
#   src-<package version>/                 the unpacked source (shared)
#   <package version>-<config hash>/       one build per resulting .config
# A build is reused when its .done exists; it is redone when the source
# package version or the resulting .config changes.  The build runs with
# nice -n 19 and -j$TC_DEBUG_JOBS (default 2).
set -euo pipefail

main() {
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${TC_DEBUG_CACHE:-/opt/tiercache-test/debug-kernel}
JOBS=${TC_DEBUG_JOBS:-2}
say() { echo "[debug-kernel] $*" >&2; }
SUDO=
[ "$(id -u)" -eq 0 ] || SUDO=sudo

if ! dpkg-query -W -f '${Status}' linux-source-6.1 2>/dev/null | grep -q 'ok installed'; then
	say "apt-get install linux-source-6.1 (and the build tools)"
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends \
		linux-source-6.1 build-essential bc bison flex libelf-dev libssl-dev xz-utils >&2
fi
VER=$(dpkg-query -W -f '${Version}' linux-source-6.1)
TARBALL=/usr/src/linux-source-6.1.tar.xz
[ -f "$TARBALL" ] || { say "$TARBALL missing"; exit 1; }
$SUDO mkdir -p "$CACHE"

SRC=$CACHE/src-$VER
if [ ! -f "$SRC/.unpacked" ]; then
	say "unpacking $TARBALL into $SRC"
	rm -rf "$SRC" "$SRC.tmp"
	mkdir -p "$SRC.tmp"
	tar -C "$SRC.tmp" -xf "$TARBALL" --strip-components=1
	touch "$SRC.tmp/.unpacked"
	mv "$SRC.tmp" "$SRC"
fi

# The resulting .config decides the build directory.
CFG=$(mktemp -d "$CACHE/cfg.XXXXXX")
trap 'rm -rf "$CFG"' EXIT
make -s -C "$SRC" O="$CFG" defconfig >&2
"$SRC/scripts/kconfig/merge_config.sh" -m -O "$CFG" "$CFG/.config" "$HERE/config.fragment" >/dev/null
make -s -C "$SRC" O="$CFG" olddefconfig >&2
# every requested option must have survived olddefconfig (a missing
# dependency silently drops it)
missing=$(grep -E '^CONFIG_[A-Z0-9_]+=' "$HERE/config.fragment" | while IFS= read -r l; do
	grep -qxF "$l" "$CFG/.config" || echo "$l"
done)
if [ -n "$missing" ]; then
	say "options the merged .config lost (dependencies unmet):"
	echo "$missing" >&2
	[ "${TC_DEBUG_ALLOW_MISSING:-0}" = 1 ] || exit 1
fi
# what the installed tools report (pahole: BTF is off) does not make
# another kernel
HASH=$(grep -v -E '^#|^CONFIG_PAHOLE_VERSION=' "$CFG/.config" | grep . | sort | sha256sum | cut -c1-12)
OUT=$CACHE/$VER-$HASH

if [ -f "$OUT/.done" ]; then
	say "reusing $OUT"
else
	# an interrupted build of the same .config resumes (make is incremental)
	if ! cmp -s <(grep -v '^CONFIG_PAHOLE_VERSION=' "$CFG/.config") \
		    <(grep -v '^CONFIG_PAHOLE_VERSION=' "$OUT/.config" 2>/dev/null); then
		rm -rf "$OUT"
		mkdir -p "$OUT"
		cp "$CFG/.config" "$OUT/.config"
	fi
	say "building $OUT (nice -n 19, -j$JOBS; log $OUT/build.log)"
	t0=$(date +%s)
	if ! nice -n 19 make -C "$SRC" O="$OUT" -j"$JOBS" bzImage modules >"$OUT/build.log" 2>&1; then
		tail -n 40 "$OUT/build.log" >&2
		say "kernel build FAILED"
		exit 1
	fi
	# external module builds need Module.symvers and the prepared tree
	touch "$OUT/.done"
	say "built in $(( $(date +%s) - t0 ))s"
fi
echo "$OUT"
}

main "$@"; exit $?
