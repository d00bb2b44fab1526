#!/bin/sh
# Install what building the tiercache tool needs on Debian/Ubuntu:
# the devicemapper crate generates its ioctl bindings with bindgen
# (libclang) from libdevmapper's headers, found through pkg-config.
set -e
need=""
dpkg -s libclang-dev >/dev/null 2>&1 || need="$need libclang-dev"
dpkg -s libdevmapper-dev >/dev/null 2>&1 || need="$need libdevmapper-dev"
command -v pkg-config >/dev/null 2>&1 || need="$need pkg-config"
command -v cargo >/dev/null 2>&1 || need="$need cargo"
[ -z "$need" ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
	echo "build-deps: installing$need"
	DEBIAN_FRONTEND=noninteractive apt-get install -y $need >/dev/null ||
	{ apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y $need >/dev/null; }
else
	echo "build-deps: missing$need; install them (as root: apt-get install -y$need)" >&2
	exit 1
fi
