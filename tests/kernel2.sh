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
# The QEMU-kill crash test (tests/crash/qemu_kill.sh) runs for it with
# TC_CRASH=1 (once: TC_CRASH_COMMIT_MS=1000:ordered); `make test` runs it
# on 6.1 only, to fit CI's 90 minutes.
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

# The tests whose paths lean on what changed between the kernels, one or
# two of each kind: the harness's oracles (dm-delay, dm-flakey, null_blk
# discard), module load and status, one count per bio in each mode
# (test_10), the data path under the model and fio (test_30: writeback at
# 4 KiB, fio's mixed sizes), suspend and reload under IO (test_50), error
# completion (test_70), metadata IO across remove, module reload and crash
# (test_80), bios trimmed in the map function (one of test_87, test_88),
# the scheduler (test_94) and FUA ordering (test_98_epochs).  Table
# parsing, the other modes' model runs, flush request counts, discard, the
# log replays and the review regressions test the module's own logic, the
# same on both kernels, and run on 6.1 only: both lanes, one after the
# other, must fit CI's 90 minutes (this selection: about 6 minutes in the
# VM).
TESTS2=${TESTS2:-"test_dm_delay_stat_oracle or test_flakey_error_writes or test_nullb_discard_zeroes or test_module_load_unload or (test_status_fresh_device and None) or test_one_bio_one_count or (test_model_integrity and wb-4k]) or (test_fio_verify and mixed) or test_fio_with_flush_suspend_reload or test_70 and (test_origin_write_error_keeps_blocks_dirty or test_cache_write_error) or test_dirty_blocks_survive_remove or test_crash_keeps_exactly or test_run_of_cached_blocks_is_one_cache_read_per_run or test_fua_run_is_one_bio or test_94 or test_ordered_fua_write_ends_its_epoch"}
# with TC_CRASH=1: one crash run (the ordered policy, the 1 s commit timer)
export TC_CRASH_COMMIT_MS=${TC_CRASH_COMMIT_MS:-1000:ordered}
say "kernel $KVER2: tests $TESTS2"
KVER=$KVER2 TESTS=$TESTS2 TC_SKIP_HOST=1 TC_CRASH=${TC_CRASH:-0} "$REPO/tests/run.sh"
}

main "$@"; exit $?
