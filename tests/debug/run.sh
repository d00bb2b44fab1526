#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# `make test-debug`: the kernel-facing suite on a debug kernel (not in CI:
# the kernel build takes about an hour on two cores the first time).
#   1. tests/debug/kernel.sh: Debian's 6.1 source with a small virtme-ng config
#      plus KASAN, PROVE_LOCKING, DEBUG_ATOMIC_SLEEP, KMEMLEAK, DEBUG_OBJECTS,
#      cached in /opt/tiercache-test/debug-kernel (rebuilt when the source
#      package or the config changes)
#   2. the module built against it, from a copy of the sources outside the
#      repository: TC_DEBUG_SRC=dir (default dm-tiercache/) or TC_DEBUG_REV=
#      <git revision> of TC_DEBUG_GIT (default this repository)
#   3. tests/run.sh booting that kernel (TC_KERNEL) on the kernel-facing tests
#      (TESTS overrides), then a kmemleak scan (tests/vm/inside.sh); a guest
#      whose kernel reported before the module was loaded (a boot-time
#      fault of its own under emulation, which turns lock debugging off)
#      runs no test and is booted again, up to TC_DEBUG_BOOTS (3) times
#   4. fail on any KASAN, lockdep, DEBUG_OBJECTS, might_sleep or kmemleak
#      report in the guest's kernel log (tests/debug/dmesg-debug.txt) or in
#      kmemleak.txt; results/<stamp>/debug-report.txt
# The whole list takes hours under emulation: `touch results/<stamp>/stop`
# ends the run after the test in progress, with the kmemleak scan and the
# report (pytest then says "Interrupted", and the run fails as incomplete).
# Each boot with a clean report adds the tests that passed to a ledger
# (tests/debug/ledger.py, in tests/debug/ledger/: commit it) of this module
# source on this kernel build (TC_DEBUG_LEDGER_DIR overrides the folder);
# TC_DEBUG_RESUME=1 runs only what the ledger lacks, and every run ends
# with "N of M tests of the list passed with a clean report".
set -euo pipefail

main() {
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
say() { echo "[test-debug] $*"; }
T0=$(date +%s)

[ "${TC_SKIP_DEPS:-0}" = 1 ] || (unset KVER; "$REPO/tests/install-deps.sh")
KDIR=$("$REPO/tests/debug/kernel.sh" | tail -n 1)
# the real path: the guest sees the host's / but not /var/cache (tmpfs)
KDIR=$(readlink -f "$KDIR")
KREL=$(cat "$KDIR/include/config/kernel.release")
say "kernel $KREL in $KDIR"

MB=$KDIR/tiercache-module/$(date +%Y%m%d-%H%M%S)-$$
mkdir -p "$MB"
if [ -n "${TC_DEBUG_REV:-}" ]; then
	git -C "${TC_DEBUG_GIT:-$REPO}" archive "$TC_DEBUG_REV" dm-tiercache | tar -C "$MB" -x
	src="${TC_DEBUG_GIT:-$REPO} $TC_DEBUG_REV"
else
	cp -r "${TC_DEBUG_SRC:-$REPO/dm-tiercache}" "$MB/dm-tiercache"
	src=${TC_DEBUG_SRC:-$REPO/dm-tiercache}
fi
find "$MB/dm-tiercache" \( -name '*.o' -o -name '*.ko' -o -name '.*.cmd' -o -name '*.mod*' \) -delete
say "building the module from $src against $KDIR"
if ! make -C "$KDIR" M="$MB/dm-tiercache" modules >"$MB/build.log" 2>&1; then
	tail -n 40 "$MB/build.log"
	say "module build FAILED ($MB/build.log)"
	exit 1
fi
KO=$MB/dm-tiercache/dm-tiercache.ko
# the tool the in-VM tests run (tests/run.sh builds it only without
# TC_SKIP_BUILD; a fresh worktree has none)
say "building the userspace tool"
if ! make -C "$REPO/userspace" >"$MB/userspace-build.log" 2>&1; then
	tail -n 40 "$MB/userspace-build.log"
	say "userspace build FAILED ($MB/userspace-build.log)"
	exit 1
fi
# the ledger of this module source on this kernel build (tests/debug/ledger.py),
# kept in the repository: a machine and its kernel cache do not outlive a
# session, the record of what ran must (commit it after a run)
LDIR=${TC_DEBUG_LEDGER_DIR:-$REPO/tests/debug/ledger}
LEDGER=$LDIR/$(basename "$KDIR")-$("$REPO/tests/debug/ledger.py" key "$MB/dm-tiercache").txt
say "ledger $LEDGER"

export TC_KERNEL=$KDIR KVER=$KREL TC_KO=$KO TC_SKIP_DEPS=1 TC_SKIP_BUILD=1 TC_SKIP_HOST=1
export TC_SKIP_CRASH=1
# the kernel-facing files; not test_96_scale (its budget of 16 B per slot
# is measured as MemAvailable's drop, which KASAN's shadow and kmemleak's
# records inflate on this kernel), nor test_00 (the harness, on dm-linear
# and friends: no tiercache)
export TESTS=${TESTS:-"test_10 or test_20 or test_30 or test_40 or test_50 or test_60 or test_70 or test_flush or test_80 or test_81 or test_82 or test_85 or test_87 or test_88 or test_89 or test_90 or test_91 or test_92 or test_93 or test_94 or test_95 or test_97 or test_98 or test_99"}
export TC_MEMORY=${TC_MEMORY:-4G}
# one test's limit (tests/vm/conftest.py): a hang costs an hour, not the
# rest of the list's four
export TC_TEST_TIMEOUT=${TC_TEST_TIMEOUT:-3600}
export TC_VM_TIMEOUT=${TC_VM_TIMEOUT:-14400} TC_PYTEST_TIMEOUT=${TC_PYTEST_TIMEOUT:-13800}
rc=0
# a guest kernel tainted at boot, before the module (inside.sh), runs no
# test: boot again, up to TC_DEBUG_BOOTS times
export TC_GUEST_ENV="${TC_GUEST_ENV:-} TC_BOOT_CLEAN TC_ORACLE_FSCK_EVERY TC_BADTABLE_ROUNDS TC_RACE_D TC_HOLD_MS TC_ORDER_SECONDS TC_FIO_START_S"
export TC_BOOT_CLEAN=1
# TC_DEBUG_RESUME=1: skip the tests the ledger holds (a list longer than
# one sitting runs in parts; the report of each part must be clean)
if [ "${TC_DEBUG_RESUME:-0}" = 1 ]; then
	export TC_SKIP_IDS_FILE=$MB/skip-ids.txt
	"$REPO/tests/debug/ledger.py" skip "$LEDGER" >"$TC_SKIP_IDS_FILE"
	TC_GUEST_ENV="$TC_GUEST_ENV TC_SKIP_IDS_FILE"
	say "resuming: $(wc -l <"$TC_SKIP_IDS_FILE") tests of the ledger skipped"
fi
# test_99: e2fsck of every 8th origin state (each takes seconds on this
# kernel); its sector rule still judges all of them
export TC_ORACLE_FSCK_EVERY=${TC_ORACLE_FSCK_EVERY:-8}
# test_90 case 2: 2 rounds of refused creates, not 5 (about 10 s each here)
export TC_BADTABLE_ROUNDS=${TC_BADTABLE_ROUNDS:-2}
# test_91's cleaner race: the origin holds writes 5 s, not 2 (the write
# that must meet the held writeback was issued 2.08 s late here)
export TC_RACE_D=${TC_RACE_D:-5}
# test_89's full cache: the origin holds writeback 15 s, not 3 (with 3 s
# writeback had cleaned most slots before the test could read the status)
export TC_HOLD_MS=${TC_HOLD_MS:-15000}
# test_98_ordered_race: 120 s of writes, not 60 (its premise of 1000
# writes was missed with 807 in 60 s here, beside two other VMs)
export TC_ORDER_SECONDS=${TC_ORDER_SECONDS:-120}
# test_91's read-hot writer and test_93's same-block writers: fio's jobs may
# take 300 s, not 30-45, to get going (both timed out here beside a VM)
export TC_FIO_START_S=${TC_FIO_START_S:-300}
for boot in $(seq 1 "${TC_DEBUG_BOOTS:-3}"); do
	rc=0
	out=$(mktemp)
	"$REPO/tests/run.sh" | tee "$out" || rc=$?
	# this run's directory (results/latest may name another run since)
	stamp=$(grep -a -o -m1 'results: results/[^ ]*' "$out" | sed 's|results: results/||')
	rm -f "$out"
	[ -n "$stamp" ] || { say "no results directory in run.sh's output"; return 1; }
	RES=$REPO/results/$stamp
	[ -f "$RES/boot-report.txt" ] || break
	say "boot $boot: the guest kernel was tainted before the module was loaded (a fault of its own, $RES/boot-report.txt): lock debugging off, no test run"
done
if [ -f "$RES/boot-report.txt" ]; then
	say "every boot was tainted before the module was loaded: no result"
	return 1
fi
rep=$RES/debug-report.txt
{
	echo "debug kernel $KREL ($KDIR), module from $src"
	{ python3 "$REPO/tests/vm/kernlog.py" bad --patterns "$REPO/tests/debug/dmesg-debug.txt" \
		"$RES/dmesg.txt" "$RES/dmesg-live.txt" "$RES/console.log" ||
		echo "tests/vm/kernlog.py failed: the kernel log was not checked"; } |
		sed -E 's/^\[ *[0-9.]+\] //' | sort -u | sed 's/^/dmesg: /'
	if [ -s "$RES/kmemleak.txt" ]; then
		sed 's/^/kmemleak: /' "$RES/kmemleak.txt"
	fi
} >"$rep"
nbad=$(grep -c -E '^(dmesg|kmemleak): ' "$rep" || true)
if [ ! -f "$RES/kmemleak.txt" ]; then
	say "no kmemleak.txt: the scan did not run (guest died?)"
	rc=1
fi
if [ "$nbad" -gt 0 ]; then
	say "debug kernel reports ($nbad lines, $rep):"
	head -n 80 "$rep"
	rc=1
else
	say "no KASAN, lockdep, DEBUG_OBJECTS, might_sleep or kmemleak report"
	if [ -f "$RES/kmemleak.txt" ] && [ -f "$RES/junit.xml" ]; then
		say "$("$REPO/tests/debug/ledger.py" record "$LEDGER" "$RES/junit.xml" "$stamp")"
	fi
fi
if [[ "$TESTS" != */* && "$TESTS" != *::* ]]; then
	"$REPO/tests/debug/ledger.py" cover "$LEDGER" "$TESTS" | sed 's/^/[test-debug] /'
fi
say "total $(( ($(date +%s) - T0) / 60 )) min; run.sh and reports: rc=$rc"
return $rc
}

main "$@"; exit $?
