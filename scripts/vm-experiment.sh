#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# Runs INSIDE the experiment VM (booted by scripts/experiment.sh):
#   vm-experiment.sh OUTDIR TAG [flushbench.py run options...]
# OUTDIR is the only writable host directory.  Leaves OUTDIR/TAG.json
# (results), TAG.dmesg (kernel log) and TAG.rc (exit status, written last).
set -u

OUT=${1:?usage: vm-experiment.sh OUTDIR TAG [options]}
TAG=${2:?usage: vm-experiment.sh OUTDIR TAG [options]}
shift 2
HERE=$(cd "$(dirname "$0")" && pwd)
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export DM_DISABLE_UDEV=1 LC_ALL=C PYTHONDONTWRITEBYTECODE=1

rm -f "$OUT/$TAG.rc"
# A peer's blocking flush (dm-writecache's message) may legitimately take
# minutes: do not report it as a hung task.
echo 900 >/proc/sys/kernel/hung_task_timeout_secs 2>/dev/null || true
dmesg -w >"$OUT/$TAG.dmesg" 2>&1 &
DMESG_PID=$!

echo "[vm] kernel $(uname -r), $(nproc) cpus, $(awk '/MemTotal/ { print $2 " kB" }' /proc/meminfo)"
/usr/bin/python3 "$HERE/flushbench.py" run --out "$OUT" --tag "$TAG" "$@"
rc=$?
"$HERE/stack.sh" remove --all >/dev/null 2>&1 || true
sleep 1
kill "$DMESG_PID" 2>/dev/null
sync
echo "$rc" >"$OUT/$TAG.rc"
sync
exit "$rc"
