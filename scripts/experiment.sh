#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# experiment.sh - the flush-linearisation experiment (`make experiment`).
#
# From a fresh Debian 12 host: installs what is missing, builds the module
# and the Open CAS peer (scripts/opencas.sh, from its release tarball),
# boots the Debian 6.1 kernel in QEMU (virtme-ng) once, runs every cache
# system inside (scripts/flushbench.py), then prints the tables and writes
# results/experiment/{results.json,results.csv,tables.txt,tables.md,
# flush.png}.  See docs/experiments.md.
#
# By default it runs the seed's recipe: dm-delay 1000 ms, the 32 MiB and
# 64 MiB cases, every system's fio capped at 15 s (it ends then or when all
# is written), so the table says how much each system took in that time.
#
# Parameters (environment):
#   FULL=1              every system writes everything (no fio cap), on
#                       both slow-disk models and the three cases below:
#                       the long run (hours without KVM)
#   FIO_RUNTIME=15      the fio cap in seconds (0 = none; FULL=1 sets 0)
#   FSIZE RSIZE FIOSIZE [REGION]  one case: slow disk, cache, MiB written,
#                       MiB written over (default REGION=FIOSIZE); without
#                       them the reference cases run: full32 32/512/32,
#                       first64 256/512/64 (and with FULL=1 sparse64
#                       256/512/64 over 256)
#   CASES=NAME:F:R:IO[:REGION],...   several custom cases
#   DELAYMS=1000        dm-delay write delay (READ_DELAYMS=0)
#   MODELS=delay        slow-disk models (FULL=1: delay,hdd)
#   HDD_NSEC=8000000 HDD_MBPS=150 HDD_DEPTH=1 HDD_MAX_KB=1024 HDD_SCHED=mq-deadline
#   SYSTEMS=bare,tiercache,dm-writecache,dm-cache,bcache,opencas
#   OPENCAS_SRC=FILE    the Open CAS release tarball (default: found in
#                       ../shared/peers, see scripts/opencas.sh); without
#                       it, or if it does not build, Open CAS is skipped
#                       and the run says why
#   BRIDGES=0,64,128    tiercache bridge_gap_kb values (one run each)
#   SPARSE_FLUSH_DEPTH=4096  tiercache flush_depth in sparse cases
#   CACHE=ram|ssd       cache device: brd RAM disk or loop file     [ram]
#   SEED=20240229       fio --randseed
#   EXTRA="..."         more flushbench.py run options
#   OUT=results/experiment   VM_MEMORY=3G VM_CPUS=2 KVM=auto|0|1
#   VM_LOCK=/tmp/tiercache-vm.lock   serialise VM boots (empty: none)
#   VM_TIMEOUT=14400    seconds per VM boot
#   ONE_BOOT=0          one boot per model and case (default: all in one)
#   RESUME=1            keep finished boots of an earlier run in OUT
#   SKIP_DEPS=1 SKIP_BUILD=1   PUBLISH=1 (copy the chart to docs/img/)
set -euo pipefail

main() {
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
TC_PROG=experiment.sh
# shellcheck source=lib.sh
. "$REPO/scripts/lib.sh"
T_START=${EXPERIMENT_T0:-$(date +%s)}
export EXPERIMENT_T0=$T_START	# kept across the sudo below
say() {
	local t=$(($(date +%s) - T_START))
	printf '[experiment] %d:%02d %s\n' $((t / 60)) $((t % 60)) "$*"
}

if [ "$(id -u)" -ne 0 ]; then
	command -v sudo >/dev/null || tc_die "run as root (or install sudo)"
	exec sudo -E "$0" "$@"
fi

OUT=${OUT:-$REPO/results/experiment}
case $OUT in /*) ;; *) OUT=$REPO/$OUT ;; esac
FULL=${FULL:-0}
if [ "$FULL" = 1 ]; then
	MODELS=${MODELS:-delay,hdd}
	FIO_RUNTIME=${FIO_RUNTIME:-0}
	default_cases=full32:32:512:32,first64:256:512:64,sparse64:256:512:64:256
else
	MODELS=${MODELS:-delay}
	FIO_RUNTIME=${FIO_RUNTIME:-15}
	default_cases=full32:32:512:32,first64:256:512:64
fi
[[ $FIO_RUNTIME =~ ^[0-9]+$ ]] || tc_die "FIO_RUNTIME must be a whole number of seconds (0 = no cap)"
SYSTEMS=${SYSTEMS:-bare,tiercache,dm-writecache,dm-cache,bcache,opencas}
VM_MEMORY=${VM_MEMORY:-3G}
VM_CPUS=${VM_CPUS:-2}
VM_TIMEOUT=${VM_TIMEOUT:-14400}
VM_LOCK=${VM_LOCK-/tmp/tiercache-vm.lock}
KVM=${KVM:-auto}

# ------------------------------------------------------------- cases
if [ -n "${FSIZE:-}${RSIZE:-}${FIOSIZE:-}" ]; then
	[ -n "${FSIZE:-}" ] && [ -n "${RSIZE:-}" ] && [ -n "${FIOSIZE:-}" ] ||
		tc_die "set all of FSIZE, RSIZE and FIOSIZE (MiB), or none"
	CASES="custom:$FSIZE:$RSIZE:$FIOSIZE${REGION:+:$REGION}"
fi
CASES=${CASES:-$default_cases}
RUN_ARGS=(--delay-ms "${DELAYMS:-1000}" --fio-runtime "$FIO_RUNTIME"
          --read-delay-ms "${READ_DELAYMS:-0}" --hdd-nsec "${HDD_NSEC:-8000000}"
          --hdd-mbps "${HDD_MBPS:-150}" --hdd-depth "${HDD_DEPTH:-1}"
          --hdd-max-kb "${HDD_MAX_KB:-1024}" --hdd-sched "${HDD_SCHED:-mq-deadline}"
          --tc-bridges "${BRIDGES:-0,64,128}" --sparse-flush-depth "${SPARSE_FLUSH_DEPTH:-4096}"
          --cache "${CACHE:-ram}" --seed "${SEED:-20240229}")
# shellcheck disable=SC2206
[ -z "${EXTRA:-}" ] || RUN_ARGS+=($EXTRA)
# Check the parameters on the host before anything is installed or booted.
/usr/bin/python3 - "$CASES" "$MODELS" <<'EOF' || exit 1
import re, sys
for spec in sys.argv[1].split(","):
    p = spec.split(":")
    if len(p) not in (4, 5) or not re.match(r"^[A-Za-z][A-Za-z0-9_]*$", p[0]) or \
            not all(re.match(r"^[1-9][0-9]*$", x) for x in p[1:]):
        sys.exit(f"experiment.sh: error: bad case '{spec}' (NAME:FSIZE:RSIZE:FIOSIZE[:REGION], whole MiB)")
    f, r, io = map(int, p[1:4])
    reg = int(p[4]) if len(p) == 5 else io
    if reg > f or io > reg:
        sys.exit(f"experiment.sh: error: case '{spec}': need FIOSIZE <= REGION <= FSIZE")
    if io * 2 > r:
        sys.exit(f"experiment.sh: error: case '{spec}': FIOSIZE must be at most half of RSIZE")
for m in sys.argv[2].split(","):
    if m not in ("delay", "hdd"):
        sys.exit(f"experiment.sh: error: unknown model '{m}' (delay, hdd)")
EOF

# ------------------------------------------------------------- host deps
if [ "${SKIP_DEPS:-0}" != 1 ]; then
	pkgs=(make gcc libc6-dev bc linux-image-amd64 linux-headers-amd64 qemu-system-x86
	      busybox-static fio libaio1 dmsetup kmod udev util-linux procps python3
	      python3-pip python3-matplotlib bcache-tools)
	missing=()
	for p in "${pkgs[@]}"; do
		[ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)" = installed ] ||
			missing+=("$p")
	done
	if ((${#missing[@]})); then
		say "installing ${missing[*]}"
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -q
		apt-get install -y -q --no-install-recommends "${missing[@]}"
	fi
	if ! command -v vng >/dev/null; then
		say "installing virtme-ng (pip)"
		python3 -m pip install -q --break-system-packages --no-warn-script-location virtme-ng
		hash -r
	fi
fi
command -v vng >/dev/null || tc_die "vng (virtme-ng) not found: pip install --break-system-packages virtme-ng"
KVER=${KVER:-$(ls /lib/modules 2>/dev/null | grep -E '^6\.1\.' | sort -V | tail -n 1)}
[ -n "$KVER" ] || tc_die "no Debian 6.1 kernel in /lib/modules: apt-get install linux-image-amd64 linux-headers-amd64"
[ -r "/boot/vmlinuz-$KVER" ] || tc_die "/boot/vmlinuz-$KVER missing: apt-get install linux-image-$KVER"

# ------------------------------------------------------------- build
if [[ ,$SYSTEMS, == *,tiercache,* ]]; then
	if [ "${SKIP_BUILD:-0}" != 1 ]; then
		say "building dm-tiercache for $KVER"
		make KVER="$KVER" >/dev/null || tc_die "module build failed (run make KVER=$KVER to see why)"
	fi
	[ -f "$REPO/dm-tiercache/dm-tiercache.ko" ] || tc_die "dm-tiercache/dm-tiercache.ko missing"
fi

# Open CAS: built from its release tarball outside the repository (cached
# per tarball and kernel).  Missing or failing: skipped, and said so.
mkdir -p "$OUT"
rm -f "$OUT/notes.txt"
if [[ ,$SYSTEMS, == *,opencas,* ]]; then
	say "Open CAS: building it from its tarball (about 3 min on 2 cores), or taking the cached build (scripts/opencas.sh)"
	if oc_out=$("$REPO/scripts/opencas.sh" build "$KVER" 2>"$OUT/opencas-build.txt") &&
		OPENCAS_DIR=$(sed -n 's/^OPENCAS_DIR=//p' <<<"$oc_out") && [ -n "$OPENCAS_DIR" ]; then
		say "Open CAS: $(tail -n 1 "$OUT/opencas-build.txt" | sed 's/^opencas.sh: //'); $(grep -E '^version:' "$OPENCAS_DIR/ok")"
		# The VM is given a copy beside the results: it did not find the
		# files in the host's cache directory (virtme-ng mounts an overlay
		# on /var).
		rm -rf "$OUT/opencas"
		mkdir -p "$OUT/opencas"
		cp "$OPENCAS_DIR/cas_cache.ko" "$OPENCAS_DIR/casadm" "$OPENCAS_DIR/ok" "$OUT/opencas/"
		RUN_ARGS+=(--opencas-dir "$OUT/opencas")
	else
		why=$(grep -E 'error:' "$OUT/opencas-build.txt" | tail -n 1 | sed 's/^opencas.sh: error: //')
		SYSTEMS=$(tr ',' '\n' <<<"$SYSTEMS" | grep -vx opencas | paste -sd, -)
		echo "Open CAS skipped: ${why:-its build failed (see $OUT/opencas-build.txt)}" >"$OUT/notes.txt"
		say "$(cat "$OUT/notes.txt")"
	fi
fi
RUN_ARGS+=(--systems "$SYSTEMS")

# ------------------------------------------------------------- boots
if [ "${RESUME:-0}" != 1 ]; then
	rm -f "$OUT"/*.json "$OUT"/*.rc "$OUT"/*.dmesg "$OUT"/*.log "$OUT"/*.tmp
fi
{
	echo "date: $(date -Iseconds)"
	echo "git: $(git -C "$REPO" describe --always --dirty 2>/dev/null || echo unknown)"
	echo "module srcversion: $(modinfo -F srcversion "$REPO/dm-tiercache/dm-tiercache.ko" 2>/dev/null || echo none)"
	echo "kernel: $KVER"
} >>"$OUT/build.txt"
vng_args=(--run "/boot/vmlinuz-$KVER" --force-9p --memory "$VM_MEMORY" --cpus "$VM_CPUS" --rwdir "$OUT")
use_kvm=0
case $KVM in
1) use_kvm=1 ;;
auto) if [ -r /dev/kvm ] && [ -w /dev/kvm ] &&
	{ [ -d /sys/module/kvm_intel ] || [ -d /sys/module/kvm_amd ]; }; then use_kvm=1; fi ;;
esac
[ "$use_kvm" = 1 ] || vng_args+=(--disable-kvm)
lock=()
[ -n "$VM_LOCK" ] && command -v flock >/dev/null && lock=(flock "$VM_LOCK")

boots=()	# "TAG MODELS CASES"
IFS=, read -r -a model_list <<<"$MODELS"
IFS=, read -r -a case_list <<<"$CASES"
if [ "${ONE_BOOT:-1}" = 1 ]; then
	boots=("all $MODELS $CASES")
else
	for m in "${model_list[@]}"; do
		for c in "${case_list[@]}"; do
			boots+=("$m-${c%%:*} $m $c")
		done
	done
fi
say "kernel $KVER, kvm: $([ "$use_kvm" = 1 ] && echo yes || echo 'no (TCG emulation: compare within a boot)')"
say "${#boots[@]} VM boot(s); systems: $SYSTEMS; results: $OUT"
# Estimated seconds of each boot (flushbench.py plan, plus about a minute
# to boot and load), so that every boot can print an ETA for the whole run.
BOOT_S=70
est=()
for b in "${boots[@]}"; do
	read -r tag models cases <<<"$b"
	e=$(/usr/bin/python3 "$REPO/scripts/flushbench.py" plan --models "$models" --cases "$cases" "${RUN_ARGS[@]}") ||
		tc_die "flushbench.py plan failed"
	est+=($((e + BOOT_S)))
done
total=0
for e in "${est[@]}"; do total=$((total + e)); done
say "plan: about $(( (total + 59) / 60 )) min of VM time for ${#boots[@]} boot(s) (fio $([ "$FIO_RUNTIME" = 0 ] && echo 'not capped' || echo "at most $FIO_RUNTIME s") per system); every step prints the elapsed time and an ETA"
T0=$(date +%s)
failed=()
bi=0
for b in "${boots[@]}"; do
	read -r tag models cases <<<"$b"
	after=0
	for e in "${est[@]:bi+1}"; do after=$((after + e)); done
	bi=$((bi + 1))
	if [ "${RESUME:-0}" = 1 ] && [ "$(cat "$OUT/$tag.rc" 2>/dev/null)" = 0 ]; then
		say "$tag: kept from the earlier run"
		continue
	fi
	if ((${#lock[@]})) && ! flock -n "$VM_LOCK" true; then
		say "waiting for $VM_LOCK: another VM boot holds it (VM_LOCK= to not wait)"
	fi
	say "boot $tag (models $models, cases $cases)"
	rm -f "$OUT/$tag.rc"
	set +e
	"${lock[@]}" timeout -k 30 "$VM_TIMEOUT" vng "${vng_args[@]}" --exec \
		"bash $REPO/scripts/vm-experiment.sh $OUT $tag --models $models --cases $cases ${RUN_ARGS[*]} --t0-epoch $T_START --eta-after $after" \
		</dev/null 2>&1 | tee "$OUT/$tag.log"
	set -e
	rc=$(cat "$OUT/$tag.rc" 2>/dev/null || echo "none (VM died or timed out)")
	[ "$rc" = 0 ] || failed+=("$tag: exit $rc")
	if [ -f "$OUT/$tag.dmesg" ] &&
		grep -a -E 'BUG:|WARNING:|Oops|Call Trace|general protection|blocked for more than' "$OUT/$tag.dmesg" >"$OUT/$tag.dmesg-bad"; then
		say "$tag: kernel log problems (first lines; all in $OUT/$tag.dmesg):"
		head -n 20 "$OUT/$tag.dmesg-bad"
		failed+=("$tag: kernel log problems")
	else
		rm -f "$OUT/$tag.dmesg-bad"
	fi
done
say "VM time $(( ($(date +%s) - T0) / 60 )) min"
if [ -f "$OUT/notes.txt" ]; then
	say "$(cat "$OUT/notes.txt")"
fi

# ------------------------------------------------------------- report
/usr/bin/python3 "$REPO/scripts/flushbench.py" report "$OUT" ||
	tc_die "no results to report (see $OUT/*.log)"
if [ "${PUBLISH:-0}" = 1 ] && [ -f "$OUT/flush.png" ]; then
	mkdir -p "$REPO/docs/img"
	cp "$OUT/flush.png" "$REPO/docs/img/experiment.png"
	say "chart copied to docs/img/experiment.png"
fi
say "done in $(( ($(date +%s) - T_START) / 60 )) min $(( ($(date +%s) - T_START) % 60 )) s (wall time of this run)"
if ((${#failed[@]})); then
	say "problems:"
	printf '  %s\n' "${failed[@]}"
	exit 1
fi
}

main "$@"
