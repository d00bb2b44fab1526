#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# The second kernel of the test matrix: Debian bookworm-backports' 6.12
# (same gcc-12 as 6.1).  Installs it if missing (adds the backports source),
# then runs tests/run.sh for it on the kernel-facing tests: the module,
# table refusals, data integrity, concurrency, errors, persistent metadata,
# epochs and the dirty order's tail.  The tool, LVM, script and experiment
# tests do not depend on the kernel version and run on 6.1 only.
#
# The QEMU-kill crash test (tests/crash/qemu_kill.sh) runs for it too, once
# (TC_CRASH=1, TC_CRASH_COMMIT_MS=1000:ordered; TC_SKIP_CRASH=1 skips it).
#
# Environment: KVER2 (default: newest 6.12 in /lib/modules after install),
# TESTS2 (pytest -k expression), plus everything tests/run.sh reads.
set -euo pipefail

main() {
REPO=$(cd "$(dirname "$0")/.." && pwd)
say() { echo "[kernel2] $*"; }
SUDO=
[ "$(id -u)" -eq 0 ] || SUDO="sudo -E"

# no 6.12 yet is not an error (grep finds nothing: under pipefail and set -e
# the assignment below would end the script without a word)
newest612() { ls /lib/modules 2>/dev/null | grep -E '^6\.12\.' | sort -V | tail -n 1 || true; }

KVER2=${KVER2:-$(newest612)}
if [ -z "$KVER2" ] || [ ! -e "/lib/modules/$KVER2/build" ] || [ ! -e "/boot/vmlinuz-$KVER2" ]; then
	if ! grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
		say "adding bookworm-backports to /etc/apt/sources.list.d/backports.sources"
		printf '%s\n' "Types: deb" "URIs: http://deb.debian.org/debian" \
			"Suites: bookworm-backports" "Components: main" \
			"Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" |
			$SUDO tee /etc/apt/sources.list.d/backports.sources >/dev/null
	fi
	say "apt-get install linux-image-6.12-amd64 linux-headers-6.12-amd64 (bookworm-backports)"
	$SUDO apt-get update -q
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends \
		-t bookworm-backports linux-image-6.12-amd64 linux-headers-6.12-amd64
	KVER2=$(newest612)
fi
[ -n "$KVER2" ] || { echo "kernel2: no 6.12 kernel after install" >&2; exit 1; }

# The tests whose paths lean on what changed between the kernels: the
# harness's oracles (dm-delay, dm-flakey, null_blk stats), bio and
# device-mapper calls (load, tables, integrity, concurrency, errors,
# persistent metadata, epochs, bios trimmed in the map function: test_87)
# and the scheduler (test_94).  Flush request
# counts (test_40, test_flush), discard (test_60), the log replays (test_81)
# and the review regressions (test_90-93, the other test_98 files) test the
# module's own logic, the same on both, and run on 6.1 only: both lanes,
# one after the other, must fit CI's 90 minutes.
TESTS2=${TESTS2:-"test_00 or test_10 or test_20 or test_30 or test_50 or test_70 or test_80 or test_87 or test_88 or test_94 or test_98_epochs"}
# one crash run (the ordered policy, the 1 s commit timer), not the 6.1 lane's two
export TC_CRASH_COMMIT_MS=${TC_CRASH_COMMIT_MS:-1000:ordered}
say "kernel $KVER2: tests $TESTS2"
KVER=$KVER2 TESTS=$TESTS2 TC_SKIP_HOST=1 TC_CRASH=${TC_CRASH:-1} "$REPO/tests/run.sh"
}

main "$@"; exit $?
