#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# The QEMU-kill crash test (issue 6): a real crash of a whole VM, not a
# simulated power cut inside one boot (tests/vm/test_80_persist.py).
#
#   qemu_kill.sh [RESULTS_DIR]     (default results/crash-<stamp>)
#
# 1. The host makes two disk files: a blank 32 MiB cache and a 64 MiB
#    origin filled with a seeded pattern (phase.py base()).
# 2. Boot 1 (tests/crash/phase.py write): format a tiercache over them,
#    write rounds of 4 KiB blocks, each round ended by an fsync of the dm
#    device (REQ_PREFLUSH) or made of O_DSYNC (FUA) writes; after each
#    round the acknowledged blocks go to journal.jsonl in RESULTS_DIR.
#    Then unflushed writes run until the guest is killed.
# 3. The host waits for the guest's "ready" file, lets the unflushed
#    writes run 2 s more and kills QEMU with SIGKILL: no shutdown, no
#    flush, no target removal.
# 4. Boot 2 (phase.py check) loads the cache without `format`, checks the
#    entries, `tiercache check`, the dirty count and every block through
#    the target, flushes and checks every block of the origin; verdict.json.
# 5. Both boots' kernel logs must be free of oops/BUG/WARNING
#    (tests/vm/dmesg-bad.txt minus tests/vm/dmesg-ok.txt).
#
# It runs twice (TC_CRASH_COMMIT_MS, default "600000 1000:ordered"), each
# run in RESULTS_DIR/commit_ms-N: with the commit timer out of the way
# (600000 ms) the flush points are the only metadata commits, so a flush
# that does not commit is caught; with the default 1 s timer (under the
# ordered policy), commits run while the unflushed writes do and the kill
# can cut one short.  "1000" alone runs the 1 s timer under the default
# policy.
#
# Exit status 0 on PASS; the last line is "crash test: PASS|FAIL: detail".
# The disk images are deleted after a PASS and kept after a FAIL.
#
# Environment: KVER (default: newest 6.1), TC_KO (module, default
# dm-tiercache/dm-tiercache.ko, built for KVER), TC_TOOL (the tiercache
# tool; check skipped if missing), TC_KVM=auto|0|1, TC_VM_LOCK (default
# /tmp/tiercache-vm.lock, empty: no lock), TC_CRASH_SEED, TC_CRASH_TIMEOUT
# (seconds per boot, default 900), TC_CRASH_COMMIT_MS (commit_ms values,
# one run each).
set -euo pipefail

main() {
REPO=$(cd "$(dirname "$0")/../.." && pwd)
KVER=${KVER:-$(ls /lib/modules 2>/dev/null | grep -E '^6\.1\.' | sort -V | tail -n 1)}
KO=${TC_KO:-$REPO/dm-tiercache/dm-tiercache.ko}
TOOL=${TC_TOOL:-$REPO/userspace/target/release/tiercache}
TC_KVM=${TC_KVM:-auto}
TC_VM_LOCK=${TC_VM_LOCK-/tmp/tiercache-vm.lock}
SEED=${TC_CRASH_SEED:-$(( $(date +%s) % 1000000 ))}
TIMEOUT=${TC_CRASH_TIMEOUT:-900}
COMMIT_MS=${TC_CRASH_COMMIT_MS:-600000 1000:ordered}
TOP=${1:-$REPO/results/crash-$(date +%Y%m%d-%H%M%S)-$$}
mkdir -p "$TOP"
TOP=$(cd "$TOP" && pwd)

say() { echo "[crash] $*"; }
result() {	# result PASS|FAIL DETAIL: the last line, and the exit status
	echo "crash test: $1: $2"
	[ "$1" = PASS ]
}
say "kernel $KVER, module $KO, seed $SEED, results $TOP"
[ -f "/boot/vmlinuz-$KVER" ] || { result FAIL "no /boot/vmlinuz-$KVER"; return; }
[ -f "$KO" ] || { result FAIL "$KO not built"; return; }
case "$TOP" in *[=,]*) result FAIL "results path contains '=' or ','"; return ;; esac

use_kvm=0
case "$TC_KVM" in
1) use_kvm=1 ;;
auto)	# as tests/run.sh: only real hardware KVM
	if [ -r /dev/kvm ] && [ -w /dev/kvm ] &&
	   { [ -d /sys/module/kvm_intel ] || [ -d /sys/module/kvm_amd ]; }; then
		use_kvm=1
	fi ;;
esac

lock() {	# one VM at a time on this machine; held only while a VM runs
	if [ -n "$TC_VM_LOCK" ] && command -v flock >/dev/null; then
		exec 9>>"$TC_VM_LOCK"
		flock 9
	fi
}
unlock() { exec 9>&-; }

pass=() fail=()
for cm in $COMMIT_MS; do
	say "=== commit_ms $cm"
	# a job, not a command substitution: set -e holds inside it
	# "N:ordered": commit_ms N with the ordered policy
	dir=$TOP/commit_ms-${cm/:/-}
	rm -f "$dir/result"
	run_one "$dir" "${cm%%:*}" "$([ "${cm#*:}" = ordered ] && echo 1 || echo 0)" &
	wait $! || true
	line=$(cat "$dir/result" 2>/dev/null || true)
	case "$line" in
	"run: PASS: "*) pass+=("commit_ms $cm: ${line#run: PASS: }") ;;
	"run: FAIL: "*) fail+=("commit_ms $cm: ${line#run: FAIL: }") ;;
	*) fail+=("commit_ms $cm: no result") ;;
	esac
done
if [ ${#fail[@]} -gt 0 ]; then
	result FAIL "$(IFS=';'; echo "${fail[*]}")"
elif [ ${#pass[@]} -eq 0 ]; then
	result FAIL "nothing ran (TC_CRASH_COMMIT_MS empty)"
else
	result PASS "$(IFS=';'; echo "${pass[*]}"); seed $SEED"
fi
}

# One write-kill-check cycle in RES with commit_ms CM; leaves
# "run: PASS|FAIL: detail" in RES/result.
run_one() {
local RES=$1 CM=$2 ORDERED=${3:-0}
mkdir -p "$RES"
rm -f "$RES"/{ready,not-killed,journal.jsonl,verdict.json,params.json} \
	"$RES"/dmesg-boot{1,2}.txt "$RES"/console-boot{1,2}.log "$RES"/dmesg-bad.txt
run_result() { echo "run: $1: $2" | tee "$RES/result"; }

# The disks.  virtme-ng refuses file names with '=' or ','.
local CACHE=$RES/cache.img ORIGIN=$RES/origin.img
rm -f "$CACHE" "$ORIGIN"
truncate -s 32M "$CACHE"
CRASH_DIR=$REPO/tests/crash python3 -c '
import os, sys
sys.path.insert(0, os.environ["CRASH_DIR"])
from phase import base, B
path, seed = sys.argv[1], int(sys.argv[2])
with open(path, "wb") as f:
    for b in range(64 * 1024 * 1024 // B):
        f.write(base(seed, b))
' "$ORIGIN" "$SEED"
python3 - "$RES/params.json" <<EOF
import json, sys
json.dump({"seed": $SEED, "cache_bytes": 32 << 20, "origin_bytes": 64 << 20,
           "ko": "$KO", "tool": "$TOOL", "commit_ms": $CM, "ordered": $ORDERED,
           "rounds": 6, "round_writes": 250, "rewrite_blocks": 300,
           "new_blocks": 300, "ready_after": 200, "unflushed_max_s": 600},
          open(sys.argv[1], "w"), indent=1)
EOF

local vng_args=(--run "/boot/vmlinuz-$KVER" --force-9p --memory 1G --cpus 2
                --disk "$CACHE" --disk "$ORIGIN" --rwdir "$RES")
[ "$use_kvm" = 1 ] || vng_args+=(--disable-kvm)

# ---------------------------------------------------------------- boot 1
local B0 VNG killed=0 why= qpid p todo rc1 rc2 fails errs e f
lock
say "boot 1: write, then kill QEMU"
B0=$(date +%s)
timeout -k 30 "$TIMEOUT" vng "${vng_args[@]}" \
	--exec "python3 $REPO/tests/crash/phase.py write $RES" \
	</dev/null >"$RES/console-boot1.log" 2>&1 9>&- &
VNG=$!
while :; do
	if [ -f "$RES/ready" ]; then
		sleep 2		# unflushed writes in flight when the axe falls
		# QEMU is a descendant of the vng process started above: kill
		# it by its pid, found through the process tree
		qpid=
		todo=("$VNG")
		while [ ${#todo[@]} -gt 0 ]; do
			p=${todo[0]} todo=("${todo[@]:1}")
			case "$(cat "/proc/$p/comm" 2>/dev/null)" in
			qemu-system*) qpid=$p; break ;;
			esac
			mapfile -t -O ${#todo[@]} todo < <(pgrep -P "$p" || true)
		done
		if [ -n "$qpid" ] && grep -qaF "$CACHE" "/proc/$qpid/cmdline" &&
		   kill -9 "$qpid"; then
			killed=1
			say "killed QEMU (pid $qpid) $(( $(date +%s) - B0 )) s after boot 1 started"
		else
			why="no QEMU process with $CACHE below pid $VNG"
		fi
		break
	fi
	if ! kill -0 "$VNG" 2>/dev/null; then
		why="boot 1 ended before the guest was ready (see console-boot1.log)"
		[ -f "$RES/not-killed" ] && why="guest finished: $(cat "$RES/not-killed")"
		break
	fi
	if [ $(( $(date +%s) - B0 )) -gt "$TIMEOUT" ]; then
		why="no ready marker within ${TIMEOUT}s"
		break
	fi
	sleep 0.5
done
set +e
[ "$killed" = 1 ] || kill -- "$VNG" 2>/dev/null
wait "$VNG"
rc1=$?
set -e
unlock
say "boot 1 ended (rc $rc1)"
if [ "$killed" != 1 ]; then
	tail -n 30 "$RES/console-boot1.log"
	run_result FAIL "the kill did not happen: $why"
	return
fi
say "journal: $(grep -c '"round"' "$RES/journal.jsonl") rounds, unflushed steps bound $(
	grep -o '"steps":[0-9]*' "$RES/journal.jsonl" | tail -n 1 | cut -d: -f2)"

# ---------------------------------------------------------------- boot 2
lock
say "boot 2: load, verify, flush, verify the origin"
set +e
timeout -k 30 "$TIMEOUT" vng "${vng_args[@]}" \
	--exec "python3 $REPO/tests/crash/phase.py check $RES" \
	</dev/null >"$RES/console-boot2.log" 2>&1 9>&-
rc2=$?
set -e
unlock
say "boot 2 ended (rc $rc2) after $(( $(date +%s) - B0 )) s in all"
grep -a '^\[phase\]' "$RES/console-boot2.log" | grep -v MISMATCH | sed 's/^/  /' || true

# ---------------------------------------------------------------- verdict
fails=()
if [ ! -f "$RES/verdict.json" ]; then
	tail -n 40 "$RES/console-boot2.log"
	fails+=("boot 2 left no verdict (rc $rc2)")
else
	mapfile -t errs < <(python3 -c '
import json, sys
v = json.load(open(sys.argv[1]))
for e in v["errors"]:
    print(e)
if not v["ok"] and not v["errors"]:
    print("verdict not ok")
' "$RES/verdict.json")
	for e in "${errs[@]}"; do echo "  FAIL: $e"; done
	[ ${#errs[@]} -eq 0 ] || fails+=("${#errs[@]} error(s): ${errs[0]}")
fi

# Kernel logs, filtered as tests/run.sh does
: >"$RES/dmesg-bad.txt"
logs=()
for f in dmesg-boot1.txt dmesg-boot2.txt console-boot1.log console-boot2.log; do
	[ -f "$RES/$f" ] || { fails+=("no $f"); continue; }
	logs+=("$RES/$f")
done
if [ ${#logs[@]} -gt 0 ] &&
   ! python3 "$REPO/tests/vm/kernlog.py" bad "${logs[@]}" >"$RES/dmesg-bad.txt"; then
	fails+=("tests/vm/kernlog.py failed: the kernel logs were not checked")
fi
for f in dmesg-boot1.txt dmesg-boot2.txt; do
	[ -s "$RES/$f" ] || fails+=("$f is empty: no kernel log saved")
done
if [ -s "$RES/dmesg-bad.txt" ]; then
	sort -u "$RES/dmesg-bad.txt" | head -n 20 | sed 's/^/  kernel: /'
	fails+=("$(wc -l <"$RES/dmesg-bad.txt") bad kernel log line(s) (dmesg-bad.txt)")
fi

if [ ${#fails[@]} -gt 0 ]; then
	run_result FAIL "$(IFS=';'; echo "${fails[*]}") (results $RES, seed $SEED)"
	return
fi
rm -f "$CACHE" "$ORIGIN"
run_result PASS "$(python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))["checks"]
j, s, t = c["journal"], c["status_dirty"], c["through_target"]
late = t["late_survived"] + t["acked_later"]
print("%d acked blocks intact (%d rewritten later), dirty %d in [%d,%d], "
      "%d unflushed writes survived, origin verified"
      % (j["acked_blocks"], t["acked_later"], s["dirty"], s["min"], s["max"], late))
' "$RES/verdict.json")"
}

main "$@"; exit $?
