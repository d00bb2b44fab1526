#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# Runs INSIDE the test VM (booted by tests/run.sh through virtme-ng).
#   inside.sh <results dir>
# The results dir is the only writable host directory.  It holds env.sh
# (TESTS, PYTEST_TIMEOUT, KO) written by run.sh; this script leaves:
#   junit.xml, pytest.log, pytest-rc, dmesg.txt (final), dmesg-live.txt,
#   modules.txt, done (written last: its absence means the VM died).
# A file named `stop` created in the results dir (from the host) ends
# pytest after the test in progress (conftest.py), and what follows it
# here still runs: the module unload and, on the debug kernel, the
# kmemleak scan.
set -u

RES=${1:?usage: inside.sh RESULTS_DIR}
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export DM_DISABLE_UDEV=1 PYTHONDONTWRITEBYTECODE=1 LC_ALL=C
TESTS=
PYTEST_TIMEOUT=2700
KO=$REPO/dm-tiercache/dm-tiercache.ko
# shellcheck disable=SC1091
[ -f "$RES/env.sh" ] && . "$RES/env.sh"
export TIERCACHE_KO=$KO
export TC_RESULTS=$RES   # where a test may leave files for the host
# a build of Open CAS copied by run.sh (its tests skip without it)
[ -z "${OPENCAS_DIR:-}" ] || export OPENCAS_DIR

say() { echo "[inside] $*"; }

# Kernel log streamed to the host as it happens: survives a guest crash.
dmesg -w >"$RES/dmesg-live.txt" 2>&1 &
DMESG_PID=$!

say "kernel $(uname -r), $(nproc) cpus, $(awk '/MemTotal/ {print $2 " kB"}' /proc/meminfo)"

# The debug lane (TC_BOOT_CLEAN=1, tests/debug/run.sh): a kernel that
# reported before the module was loaded had a fault of its own at boot
# (seen under emulation: a KASAN report in an early interrupt), and the
# taint turned lock debugging off for the whole run.  No test runs; the
# host boots again.
if [ "${TC_BOOT_CLEAN:-0}" = 1 ] &&
   dmesg | grep -a -E -f "$REPO/tests/debug/dmesg-debug.txt" |
	   grep -a -q -v -F -f "$REPO/tests/vm/dmesg-ok.txt"; then
	say "the kernel reported before the module was loaded: no test run (boot-report.txt)"
	dmesg >"$RES/boot-report.txt" 2>&1
	dmesg >"$RES/dmesg.txt" 2>&1
	kill "$DMESG_PID" 2>/dev/null
	echo 1 >"$RES/pytest-rc"
	sync
	echo ok >"$RES/done"
	sync
	exit 1
fi
# console: warnings and worse, so an oops or panic reaches the host's
# console.log even if the guest dies before the streamed log catches up
echo 5 >/proc/sys/kernel/printk 2>/dev/null || true
# a hung task is reported after 60 s instead of 120 s
echo 60 >/proc/sys/kernel/hung_task_timeout_secs 2>/dev/null || true

mountpoint -q /sys/kernel/config || mount -t configfs none /sys/kernel/config 2>/dev/null || true
for m in dm-mod dm-delay dm-flakey; do
	modprobe "$m" 2>/dev/null || say "modprobe $m failed (may be built in)"
done
modprobe null_blk nr_devices=0 || say "modprobe null_blk failed"
# nothing in the guest (no systemd, no kmod static-nodes) loads loop on demand (losetup needs
# /dev/loop-control)
modprobe loop 2>/dev/null || say "modprobe loop failed"
modprobe libcrc32c 2>/dev/null || say "modprobe libcrc32c failed"	# insmod does not load it
if [ -f "$KO" ]; then
	if insmod "$KO"; then
		say "loaded $KO"
	else
		say "insmod $KO FAILED (tests that need it will fail)"
	fi
else
	say "$KO not found (tests that need it will fail)"
fi
{ lsmod; echo; dmsetup targets; } >"$RES/modules.txt" 2>&1

args=(-v -rfE -p no:cacheprovider --junitxml="$RES/junit.xml" -o junit_family=xunit2
      -o console_output_style=classic --durations=15 -o junit_logging=system-err)
sel=()
if [ -n "$TESTS" ]; then
	# a path (tests/vm/x.py, x.py::test) is passed as is, anything else is -k
	if [[ "$TESTS" == */* || "$TESTS" == *.py* || "$TESTS" == *::* ]]; then
		read -r -a sel <<<"$TESTS"
	else
		args+=(-k "$TESTS")
	fi
fi
[ ${#sel[@]} -eq 0 ] && sel=("$HERE")

cd "$REPO" || exit 1
say "python3 -m pytest ${args[*]} ${sel[*]}"
start=$(date +%s)
rm -f "$RES/.rc"
( python3 -m pytest "${args[@]}" "${sel[@]}"; echo $? >"$RES/.rc" ) 2>&1 | tee "$RES/pytest.log" &
PYPID=$!
rc=
while kill -0 "$PYPID" 2>/dev/null; do
	if [ $(( $(date +%s) - start )) -gt "$PYTEST_TIMEOUT" ]; then
		say "pytest still running after ${PYTEST_TIMEOUT}s: dumping blocked tasks, giving up"
		echo w >/proc/sysrq-trigger 2>/dev/null
		echo "TIMEOUT after ${PYTEST_TIMEOUT}s" >"$RES/timeout"
		rc=124
		break
	fi
	sleep 2
done
if [ -z "$rc" ]; then
	wait "$PYPID"
	rc=$(cat "$RES/.rc" 2>/dev/null)
fi
say "pytest finished (rc=${rc:-?}) after $(( $(date +%s) - start ))s"

# unload the module at the end (exercises module exit after the whole suite)
if [ -d /sys/module/dm_tiercache ] && [ "$(dmsetup ls 2>&1)" = "No devices found" ]; then
	rmmod dm_tiercache || say "rmmod dm_tiercache failed"
fi
sleep 1
# a kernel with kmemleak (the debug kernel of tests/debug/run.sh): scan twice
# (an object must stay unreferenced across scans), keep the report
mountpoint -q /sys/kernel/debug || mount -t debugfs none /sys/kernel/debug 2>/dev/null
if [ -w /sys/kernel/debug/kmemleak ]; then
	for _ in 1 2; do
		timeout 900 sh -c 'echo scan >/sys/kernel/debug/kmemleak' || say "kmemleak scan failed or timed out"
		sleep 6
	done
	cat /sys/kernel/debug/kmemleak >"$RES/kmemleak.txt" 2>&1
	say "kmemleak: $(grep -c '^unreferenced object' "$RES/kmemleak.txt") unreferenced object(s) (kmemleak.txt)"
fi
dmesg >"$RES/dmesg.txt" 2>&1
kill "$DMESG_PID" 2>/dev/null
echo "${rc:-1}" >"$RES/pytest-rc"
sync
echo ok >"$RES/done"
sync
exit "${rc:-1}"
