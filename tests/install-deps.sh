#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# Install what `make test` needs on Debian 12 (bookworm).  Idempotent:
# installs only what is missing, runs `apt-get update` at most once.
#
#   tests/install-deps.sh          # as root (or with sudo available)
#
# Needs: the Debian 6.1 kernel image + headers (the VM boots the host's
# kernel), compiler + sparse for the module, QEMU + virtme-ng for the VM,
# fio/dmsetup/kmod/util-linux/python3-pytest used inside the VM (the VM
# shares the host's root file system), busybox-static for virtme's initramfs.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
export DEBIAN_FRONTEND=noninteractive

SUDO=
if [ "$(id -u)" -ne 0 ]; then
	command -v sudo >/dev/null || { echo "install-deps: need root or sudo" >&2; exit 1; }
	SUDO="sudo -E"
fi

say() { echo "[install-deps] $*"; }

PKGS=(
	# module build
	make gcc libc6-dev bc sparse linux-image-amd64 linux-headers-amd64
	# VM
	qemu-system-x86 busybox-static
	# in-VM tools (the guest sees the host's root file system)
	fio libaio1 dmsetup kmod udev util-linux procps coreutils lvm2
	python3 python3-pytest python3-pip
	# peers the script tests build (test_scripts, test_experiment_short):
	# make-bcache; scripts/experiment.sh installs the same
	bcache-tools
	# the metadata decoder's fuzzer (libFuzzer: clang's runtime libraries are
	# only a recommendation of clang, which --no-install-recommends skips)
	clang libclang-rt-14-dev
)

# The Rust userspace tool (userspace/): bindgen needs libclang and
# libdevmapper's headers; the toolchain is checked below.
if [ -f "$REPO/userspace/Cargo.toml" ]; then
	PKGS+=(libclang-dev libdevmapper-dev pkg-config curl ca-certificates)
fi

missing=()
for p in "${PKGS[@]}"; do
	st=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
	[ "$st" = installed ] || missing+=("$p")
done

updated=
apt_update() {
	[ -n "$updated" ] && return 0
	say "apt-get update"
	$SUDO apt-get update -q
	updated=1
}

if [ ${#missing[@]} -gt 0 ]; then
	apt_update
	say "apt-get install ${missing[*]}"
	$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
else
	say "all Debian packages present"
fi

# The kernel the VM boots: the newest installed 6.1 kernel (same rule as the
# top-level Makefile).  Its headers must match it.
KVER=${KVER:-$(ls /lib/modules 2>/dev/null | grep -E '^6\.1\.' | sort -V | tail -n 1)}
if [ -z "$KVER" ]; then
	echo "install-deps: no 6.1 kernel in /lib/modules" >&2
	exit 1
fi
if [ ! -e "/lib/modules/$KVER/build" ] || [ ! -e "/boot/vmlinuz-$KVER" ]; then
	apt_update
	say "apt-get install linux-image-$KVER linux-headers-$KVER"
	$SUDO apt-get install -y -q --no-install-recommends \
		"linux-image-$KVER" "linux-headers-$KVER"
fi

# Rust: the crate's rust-version is newer than bookworm's rustc (1.63), so
# unless a recent enough toolchain is present, install rustup's stable one
# (minimal profile) into ~/.cargo.
ver_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]; }
if [ -f "$REPO/userspace/Cargo.toml" ]; then
	need=$(sed -n 's/^rust-version *= *"\([0-9.]*\)".*/\1/p' "$REPO/userspace/Cargo.toml")
	need=${need:-1.70}
	PATH=$HOME/.cargo/bin:$PATH
	have=$(rustc --version 2>/dev/null | awk '{print $2}')
	if [ -z "$have" ] || ! ver_ge "$have" "$need" || ! command -v cargo >/dev/null; then
		say "rustc ${have:-missing} < $need: installing the stable toolchain with rustup"
		if command -v rustup >/dev/null; then
			rustup toolchain install stable --profile minimal
			rustup default stable
		else
			curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs |
				sh -s -- -y --profile minimal --default-toolchain stable --no-modify-path
		fi
		hash -r
	fi
	say "rust: $(rustc --version 2>/dev/null || echo missing)"
fi

# virtme-ng (vng): not packaged in bookworm, installed from PyPI.
if ! command -v vng >/dev/null; then
	say "pip install virtme-ng"
	# bookworm's pip refuses system-wide installs without this (PEP 668)
	$SUDO python3 -m pip install -q --break-system-packages --no-warn-script-location virtme-ng
	hash -r
fi
if ! command -v vng >/dev/null; then
	for d in /usr/local/bin "$HOME/.local/bin"; do
		[ -x "$d/vng" ] && { say "vng is in $d (add it to PATH)"; break; }
	done
fi

# xfstests (fsx, fsstress; tests/vm/test_85_fsx.py, tests/xfstests/run.sh):
# built from the peer tarball into /opt/tiercache-test/xfstests, once
"$REPO/tests/xfstests/setup.sh" >/dev/null

say "ok: KVER=$KVER, vng $(vng --version 2>/dev/null || echo '?'), $(fio --version), $(qemu-system-x86_64 --version | head -n1)"
