#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# The second kernel of the test matrix: Debian bookworm-backports' 6.12
# (same gcc-12 as 6.1).  Installs it if missing (adds the backports source),
# then runs tests/run.sh for it on one kernel-facing test of each kind (the
# list below).  The tool, LVM, script and experiment tests do not depend on
# the kernel version and run on 6.1 only.
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

# The tests whose paths lean on what changed between the kernels, one of
# each kind: the dm-delay oracle of the harness, module load and one count
# per bio (test_10), the data path under the model and fio (test_30:
# writeback at 4 KiB, fio's mixed sizes), suspend and reload under IO
# (test_50), a cache write error's completion (test_70), metadata IO
# across remove, module reload and crash (test_80), a bio trimmed in the
# map function (a FUA write run, test_88), a bio split below, failed and
# sent again (test_93_review_e: the block layer's chain count) and FUA
# ordering (test_98_epochs).  Everything else tests the module's own logic, the
# same on both kernels, and runs on 6.1 only: both lanes, one after the
# other, must fit CI's 90 minutes (this selection: about 4 minutes in the
# VM).
TESTS2=${TESTS2:-"test_dm_delay_stat_oracle or test_module_load_unload or (test_one_bio_one_count and writeback) or (test_model_integrity and wb-4k]) or (test_fio_verify and mixed) or test_fio_with_flush_suspend_reload or (test_70 and test_cache_write_error) or test_dirty_blocks_survive_remove or test_crash_keeps_exactly or test_fua_run_is_one_bio or test_split_read_run_taken_back_ends_once or test_ordered_fua_write_ends_its_epoch"}
# with TC_CRASH=1: one crash run (the ordered policy, the 1 s commit timer)
export TC_CRASH_COMMIT_MS=${TC_CRASH_COMMIT_MS:-1000:ordered}
say "kernel $KVER2: tests $TESTS2"
KVER=$KVER2 TESTS=$TESTS2 TC_SKIP_HOST=1 TC_CRASH=${TC_CRASH:-0} "$REPO/tests/run.sh"
}

main "$@"; exit $?
