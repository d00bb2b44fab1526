#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# The dm-tiercache test suite (`make test`):
#   1. tests/install-deps.sh (idempotent)
#   2. build the module; `make C=1 W=1` must print no warning for dm-tiercache/
#   3. host unit tests (tests/host, userspace cargo tests) if present
#   4. boot the Debian 6.1 kernel in QEMU (virtme-ng) and run tests/vm/inside.sh:
#      pytest tests/vm, junit xml + guest dmesg into results/<stamp>/
#   5. fail on any test failure, a guest oops/BUG/WARNING/hung task, or a VM
#      that did not finish
#   6. the QEMU-kill crash test (tests/crash/qemu_kill.sh, two boots per run):
#      full suite only, results/<stamp>/crash/
#
# Environment:
#   TESTS=expr|path   pytest -k expression, or test path(s) (tests/vm/x.py::t)
#   KVER=6.1.0-N-amd64  kernel to build for and boot (default: newest 6.1)
#   TC_SKIP_DEPS=1    do not run install-deps.sh
#   TC_SKIP_BUILD=1   do not build (development only: reported as SKIP)
#   TC_SKIP_HOST=1    skip host unit tests
#   TC_MEMORY=2G TC_CPUS=2  guest size
#   TC_KVM=auto|0|1   use /dev/kvm if usable (auto), never, always
#   TC_VM_TIMEOUT=4800  seconds for the whole VM run; TC_PYTEST_TIMEOUT=4500
#   TC_VM_LOCK=/tmp/tiercache-vm.lock  serialise VM boots (empty: no lock)
#   TC_KO=path        module to test (default dm-tiercache/dm-tiercache.ko)
#   TC_SKIP_CRASH=1   skip the crash test (reported as SKIP)
#   TC_CRASH=1        run the crash test even with TESTS set
#   TC_STRESS_SECONDS, TC_STRESS_SEED, TC_STRESS_THREADS, TC_STRESS_ARGS
#                     the stress test's run (tests/vm/test_95_stress.py, make soak)
#   TC_TEST_TIMEOUT=N a test running longer fails (tests/vm/conftest.py; unset:
#                     no limit but TC_PYTEST_TIMEOUT's; make test sets 1200)
#   TC_KERNEL=path    what vng boots (default /boot/vmlinuz-$KVER): a kernel
#                     image, or a kernel build directory (its modules are used;
#                     tests/debug/run.sh boots the debug kernel this way)
#   TC_GUEST_ENV="A B"  names of host variables exported to the guest's tests
set -euo pipefail

# The body is one function, parsed whole before it runs: editing this file
# while a run is in progress cannot break that run.
main() {
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
T0=$(date +%s)

TESTS=${TESTS:-}
TC_MEMORY=${TC_MEMORY:-2G}
TC_CPUS=${TC_CPUS:-2}
TC_KVM=${TC_KVM:-auto}
TC_VM_TIMEOUT=${TC_VM_TIMEOUT:-4800}
TC_PYTEST_TIMEOUT=${TC_PYTEST_TIMEOUT:-4500}
TC_VM_LOCK=${TC_VM_LOCK-/tmp/tiercache-vm.lock}

STAMP=$(date +%Y%m%d-%H%M%S)-$$
RES=$REPO/results/$STAMP
mkdir -p "$RES"
ln -sfn "$STAMP" "$REPO/results/latest"
exec > >(tee -a "$RES/run.log") 2>&1

hdr() { printf '\n=== %s ===\n' "$*"; }
fmt_t() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

CHECKS=()   # "name|PASS|detail" ...
T_LAST=$T0
check() {   # check NAME STATUS [DETAIL]; the time since the check before
	CHECKS+=("$1|$2|${3:-}")
	printf '[run] %-26s %s %s (+%s)\n' "$1" "$2" "${3:-}" "$(fmt_t $(( $(date +%s) - T_LAST )))"
	T_LAST=$(date +%s)
}

# ------------------------------------------------------------------ deps
hdr "dependencies"
if [ "${TC_SKIP_DEPS:-0}" = 1 ]; then
	echo "skipped (TC_SKIP_DEPS=1)"
elif ! "$REPO/tests/install-deps.sh"; then
	echo "tests/install-deps.sh failed: cannot run the suite" >&2
	echo "0 passed, 1 failed"
	exit 1
fi
KVER=${KVER:-$(ls /lib/modules 2>/dev/null | grep -E '^6\.1\.' | sort -V | tail -n 1)}
export KVER
# a rustup toolchain (install-deps.sh installs one if the distribution's is
# too old for userspace/) lives in ~/.cargo/bin
[ -d "$HOME/.cargo/bin" ] && PATH=$HOME/.cargo/bin:$PATH
echo "KVER=$KVER  results: results/$STAMP"

# ------------------------------------------------------------------ build
hdr "build"
if [ "${TC_SKIP_BUILD:-0}" = 1 ]; then
	check build SKIP "TC_SKIP_BUILD=1"
	check "sparse + W=1" SKIP "TC_SKIP_BUILD=1"
else
	# One build with sparse and W=1, of every file (objects of an earlier
	# build removed first: sparse and W=1 see only what kbuild compiles);
	# the module is the same as a plain build's.  A failed build fails
	# both checks.
	rm -f dm-tiercache/*.o
	set +e
	make KVER="$KVER" C=1 W=1 >"$RES/build-check.log" 2>&1
	crc=$?
	set -e
	grep -E "(^|/)dm-tiercache/[^ :]+:[0-9]+(:[0-9]+)?: (warning|error)|WARNING: modpost: .*dm-tiercache" \
		"$RES/build-check.log" >"$RES/build-warnings.txt" || true
	nw=$(wc -l <"$RES/build-warnings.txt")
	if [ "$crc" -ne 0 ]; then
		tail -n 40 "$RES/build-check.log"
		check build FAIL "make C=1 W=1 failed (results/$STAMP/build-check.log)"
		check "sparse + W=1" FAIL "make C=1 W=1 failed"
	elif [ "$nw" -gt 0 ]; then
		check build PASS
		cat "$RES/build-warnings.txt"
		check "sparse + W=1" FAIL "$nw warning(s) in dm-tiercache/"
	else
		check build PASS
		check "sparse + W=1" PASS
	fi
fi

# The userspace tool: the in-VM tool tests run the binary built here.
if [ "${TC_SKIP_BUILD:-0}" != 1 ] && [ -f userspace/Makefile ]; then
	if make -C userspace >"$RES/userspace-build.log" 2>&1; then
		check "userspace build" PASS
	else
		tail -n 30 "$RES/userspace-build.log"
		check "userspace build" FAIL "make -C userspace (results/$STAMP/userspace-build.log)"
	fi
fi

# ------------------------------------------------------------------ host tests
hdr "host unit tests"
if [ "${TC_SKIP_HOST:-0}" = 1 ]; then
	echo "skipped (TC_SKIP_HOST=1)"
else
	if [ -f tests/host/Makefile ]; then
		if make -C tests/host check 2>&1 | tee "$RES/host-tests.log"; then
			check "host unit tests" PASS
		else
			check "host unit tests" FAIL "make -C tests/host check"
		fi
		# 30 s of libFuzzer on the on-disk metadata decoder (tc_disk.c)
		if make -C tests/host fuzz-short >"$RES/fuzz.log" 2>&1; then
			check "metadata fuzz (30 s)" PASS "$(grep -a -o 'Done [0-9]* runs' "$RES/fuzz.log" | tail -n 1)"
		else
			tail -n 30 "$RES/fuzz.log"
			check "metadata fuzz (30 s)" FAIL "make -C tests/host fuzz-short (results/$STAMP/fuzz.log)"
		fi
	fi
	if [ -f userspace/Cargo.toml ]; then
		if (cd userspace && cargo test) 2>&1 | tee "$RES/cargo-test.log"; then
			check "cargo test" PASS
		else
			check "cargo test" FAIL "cargo test in userspace/"
		fi
	fi
	[ -f tests/host/Makefile ] || [ -f userspace/Cargo.toml ] || echo "none present"
fi

# ------------------------------------------------------------------ VM
hdr "VM tests (kernel $KVER)"
{
	printf 'TESTS=%q\n' "$TESTS"
	printf 'PYTEST_TIMEOUT=%q\n' "$TC_PYTEST_TIMEOUT"
	printf 'KO=%q\n' "${TC_KO:-$REPO/dm-tiercache/dm-tiercache.ko}"
	# the stress test's knobs (tests/vm/test_95_stress.py) and the time limit
	# of one test (tests/vm/conftest.py), exported in the guest
	for v in TC_STRESS_SECONDS TC_STRESS_SEED TC_STRESS_THREADS TC_STRESS_ARGS TC_TEST_TIMEOUT; do
		if [ -n "${!v:-}" ]; then printf 'export %s=%q\n' "$v" "${!v}"; fi
	done
	for v in ${TC_GUEST_ENV:-}; do
		[[ "$v" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || { echo "TC_GUEST_ENV: bad name $v" >&2; exit 1; }
		[ -n "${!v+x}" ] && printf 'export %s=%q\n' "$v" "${!v}"
	done
} >"$RES/env.sh"
# Open CAS, when scripts/opencas.sh has built it for this kernel (make
# experiment does): a copy beside the results, where the VM sees it.  The
# tests that need it skip without it.
oc_dir=$(ls -1td /var/cache/tiercache-peers/*-"$KVER" 2>/dev/null | head -n 1 || true)
if [ -n "${OPENCAS_DIR:-}" ] || { [ -n "$oc_dir" ] && [ -f "$oc_dir/ok" ]; }; then
	oc_dir=${OPENCAS_DIR:-$oc_dir}
	mkdir -p "$RES/opencas"
	cp "$oc_dir/cas_cache.ko" "$oc_dir/casadm" "$RES/opencas/" &&
		printf 'OPENCAS_DIR=%q\n' "$RES/opencas" >>"$RES/env.sh"
fi

vng_args=(--run "${TC_KERNEL:-/boot/vmlinuz-$KVER}" --force-9p --memory "$TC_MEMORY" --cpus "$TC_CPUS"
          --rwdir "$RES" --exec "bash $REPO/tests/vm/inside.sh $RES")
use_kvm=0
case "$TC_KVM" in
1) use_kvm=1 ;;
auto)	# only real hardware KVM: a /dev/kvm from a nested-less variant (e.g.
	# kvm_pvm) cannot run the stock Debian kernel
	if [ -r /dev/kvm ] && [ -w /dev/kvm ] &&
	   { [ -d /sys/module/kvm_intel ] || [ -d /sys/module/kvm_amd ]; }; then
		use_kvm=1
	fi ;;
esac
[ "$use_kvm" = 1 ] || vng_args+=(--disable-kvm)
echo "kvm: $([ "$use_kvm" = 1 ] && echo yes || echo 'no (TCG emulation)')"

# One VM at a time on this machine (other users of the lock boot VMs too).
if [ -n "$TC_VM_LOCK" ] && command -v flock >/dev/null; then
	L0=$(date +%s)
	exec 9>>"$TC_VM_LOCK"
	flock 9
	[ $(( $(date +%s) - L0 )) -gt 1 ] &&
		echo "[run] waited $(fmt_t $(( $(date +%s) - L0 ))) for $TC_VM_LOCK"
fi
VM0=$(date +%s)
set +e
timeout -k 30 "$TC_VM_TIMEOUT" vng "${vng_args[@]}" </dev/null 9>&- 2>&1 |
	tee "$RES/console.log"
vm_rc=${PIPESTATUS[0]}
set -e
VM_T=$(( $(date +%s) - VM0 ))
exec 9>&-
echo "[run] VM exited with $vm_rc after $(fmt_t "$VM_T")"

if [ -f "$RES/done" ]; then
	check "VM ran to completion" PASS
elif [ "$vm_rc" = 124 ]; then
	check "VM ran to completion" FAIL "timed out after ${TC_VM_TIMEOUT}s"
else
	check "VM ran to completion" FAIL "no results/$STAMP/done: guest crashed or hung (rc=$vm_rc)"
fi
[ -f "$RES/timeout" ] && check "pytest time limit" FAIL "$(cat "$RES/timeout")"

# ------------------------------------------------------------------ analysis
# Kernel log: oops, BUG, WARNING, hung tasks, ... (tests/vm/dmesg-*.txt)
: >"$RES/dmesg-bad.txt"
# console.log also holds pytest's output: only its kernel lines count
# (less the emulator's own #DB warning: tests/vm/kernlog.py)
python3 tests/vm/kernlog.py bad "$RES/dmesg.txt" "$RES/dmesg-live.txt" \
	"$RES/console.log" >"$RES/dmesg-bad.txt" ||
	echo "tests/vm/kernlog.py failed: the kernel log was not checked" >>"$RES/dmesg-bad.txt"
if [ -s "$RES/dmesg-bad.txt" ]; then
	sed -E 's/^\[ *[0-9.]+\] //' "$RES/dmesg-bad.txt" | sort -u >"$RES/dmesg-bad.u"
	mv "$RES/dmesg-bad.u" "$RES/dmesg-bad.txt"
	check "kernel log clean" FAIL "$(wc -l <"$RES/dmesg-bad.txt") bad line(s), see below"
elif [ -f "$RES/dmesg.txt" ] || [ -f "$RES/dmesg-live.txt" ]; then
	check "kernel log clean" PASS
else
	check "kernel log clean" FAIL "no guest kernel log saved"
fi

# pytest results from the junit xml
PY_PASS=0 PY_FAIL=0 PY_SKIP=0
if [ -f "$RES/junit.xml" ]; then
	read -r PY_PASS PY_FAIL PY_SKIP < <(python3 - "$RES/junit.xml" "$RES/failed-tests.txt" <<'EOF'
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
p = f = s = 0
failed = []
for tc in root.iter("testcase"):
    kinds = {c.tag for c in tc}
    name = f"{tc.get('classname', '')}::{tc.get('name')}"
    if kinds & {"failure", "error"}:
        f += 1
        msg = next((c.get("message", "") for c in tc if c.tag in ("failure", "error")), "")
        failed.append(f"FAILED {name}: {msg.splitlines()[0][:200] if msg else ''}")
    elif "skipped" in kinds:
        s += 1
    else:
        p += 1
open(sys.argv[2], "w").write("".join(x + "\n" for x in failed))
print(p, f, s)
EOF
	)
fi
PY_RC=$(cat "$RES/pytest-rc" 2>/dev/null || echo none)
if [ ! -f "$RES/junit.xml" ]; then
	check "pytest results" FAIL "no junit.xml (pytest rc=$PY_RC)"
elif [ "$PY_PASS" -eq 0 ]; then
	check "pytest results" FAIL "no test passed: nothing was tested (rc=$PY_RC)"
elif [ "$PY_RC" != 0 ] && [ "$PY_FAIL" -eq 0 ]; then
	check "pytest results" FAIL "pytest rc=$PY_RC without a failed test"
fi

# ------------------------------------------------------------------ crash
# Two more boots (tests/crash/qemu_kill.sh): write, kill QEMU, reload and
# verify.  Part of the full suite only (a TESTS selection is a quick run),
# unless TC_CRASH=1 asks for it.
hdr "QEMU kill crash test"
if [ "${TC_SKIP_CRASH:-0}" = 1 ]; then
	check "QEMU kill crash" SKIP "TC_SKIP_CRASH=1"
elif [ -n "$TESTS" ] && [ "${TC_CRASH:-0}" != 1 ]; then
	check "QEMU kill crash" SKIP "TESTS is set (full suite or TC_CRASH=1 only)"
else
	set +e
	TC_KO=${TC_KO:-$REPO/dm-tiercache/dm-tiercache.ko} TC_KVM=$TC_KVM TC_VM_LOCK=$TC_VM_LOCK \
		"$REPO/tests/crash/qemu_kill.sh" "$RES/crash" 2>&1 | tee "$RES/crash.log"
	crash_rc=${PIPESTATUS[0]}
	set -e
	crash_detail=$(grep -a '^crash test: ' "$RES/crash.log" | tail -n 1 | sed -E 's/^crash test: (PASS|FAIL): //')
	if [ "$crash_rc" = 0 ]; then
		check "QEMU kill crash" PASS "$crash_detail"
	else
		check "QEMU kill crash" FAIL "${crash_detail:-rc=$crash_rc} (results/$STAMP/crash.log)"
	fi
fi

# ------------------------------------------------------------------ summary
T=$(( $(date +%s) - T0 ))
hdr "summary (results/$STAMP)"
c_pass=0 c_fail=0
for c in "${CHECKS[@]}"; do
	IFS='|' read -r n s d <<<"$c"
	printf '  %-26s %-4s %s\n' "$n" "$s" "$d"
	case $s in PASS) c_pass=$((c_pass + 1)) ;; FAIL) c_fail=$((c_fail + 1)) ;; esac
done
if [ -s "$RES/dmesg-bad.txt" ]; then
	echo "  guest kernel log (first 40 bad lines; full log results/$STAMP/dmesg.txt):"
	head -n 40 "$RES/dmesg-bad.txt" | sed 's/^/    /'
fi
echo "  pytest: $PY_PASS passed, $PY_FAIL failed (incl. errors), $PY_SKIP skipped"
[ -s "$RES/failed-tests.txt" ] && sed 's/^/    /' "$RES/failed-tests.txt"
echo "  wall time: $(fmt_t "$T") total, VM $(fmt_t "${VM_T:-0}")"
echo "  (the line below counts pytest tests plus the $((c_pass + c_fail)) harness checks above)"
echo "$((PY_PASS + c_pass)) passed, $((PY_FAIL + c_fail)) failed"
[ "$c_fail" -eq 0 ] && [ "$PY_FAIL" -eq 0 ] && [ "$PY_PASS" -gt 0 ]
}

main "$@"; exit $?   # exit on this line: nothing after it is ever read
