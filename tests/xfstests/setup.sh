#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# Build xfstests (GPL-2.0) from the peer tarball into a cache outside the
# repository, installing its build dependencies with apt.  Prints the build
# directory (holding ./check, ltp/fsx, ltp/fsstress) on its last line.
#
# Environment:
#   XFSTESTS_TARBALL  default: the newest /work/shared/peers/xfstests-*.tar.xz
#                     (or ../shared/peers relative to the repository)
#   XFSTESTS_CACHE    default: /opt/tiercache-test/xfstests (the guest must see
#                     it: virtme-ng hides /var/cache behind a tmpfs)
set -euo pipefail

main() {
REPO=$(cd "$(dirname "$0")/../.." && pwd)
say() { echo "[xfstests-setup] $*" >&2; }
SUDO=
[ "$(id -u)" -eq 0 ] || SUDO=sudo
CACHE=${XFSTESTS_CACHE:-/opt/tiercache-test/xfstests}

TARBALL=${XFSTESTS_TARBALL:-}
if [ -z "$TARBALL" ]; then
	for d in /work/shared/peers "$REPO/../shared/peers" "$REPO/../../shared/peers"; do
		t=$(ls "$d"/xfstests-*.tar.xz 2>/dev/null | sort -V | tail -n 1 || true)
		[ -n "$t" ] && { TARBALL=$t; break; }
	done
fi
[ -n "$TARBALL" ] && [ -f "$TARBALL" ] || { say "no xfstests-*.tar.xz found (set XFSTESTS_TARBALL)"; exit 1; }

# build and run-time dependencies (run time: the guest shares the host's /)
pkgs=(xfslibs-dev uuid-dev libtool-bin automake autoconf gcc make pkg-config
      libuuid1 quota attr acl libattr1-dev libacl1-dev libaio-dev libgdbm-dev
      xfsprogs liburing-dev e2fsprogs bc psmisc fio)
need=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
	say "apt-get install ${need[*]}"
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${need[@]}" >&2
fi

HASH=$(sha256sum "$TARBALL" | cut -c1-12)
OUT=$CACHE/$(basename "$TARBALL" .tar.xz)-$HASH
if [ -f "$OUT/.done" ]; then
	say "reusing $OUT"
else
	$SUDO mkdir -p "$CACHE"
	rm -rf "$OUT" "$OUT.tmp"
	mkdir -p "$OUT.tmp"
	say "unpacking $TARBALL and building (log $OUT/build.log)"
	tar -C "$OUT.tmp" -xf "$TARBALL" --strip-components=1
	if ! (cd "$OUT.tmp" && nice -n 10 make -j"${XFSTESTS_JOBS:-2}") >"$OUT.tmp/build.log" 2>&1; then
		tail -n 40 "$OUT.tmp/build.log" >&2
		say "xfstests build FAILED (log $OUT.tmp/build.log)"
		exit 1
	fi
	for b in ltp/fsx ltp/fsstress check; do
		[ -x "$OUT.tmp/$b" ] || { say "$b missing after the build"; exit 1; }
	done
	touch "$OUT.tmp/.done"
	mv "$OUT.tmp" "$OUT"
	say "built $OUT"
fi
echo "$OUT"
}

main "$@"; exit $?
