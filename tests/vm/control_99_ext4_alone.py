# SPDX-License-Identifier: GPL-2.0
"""The control of test_99's e2fsck oracle: the same workload and the same
replay on ext4 alone, no cache at all (dm-log-writes over a RAM disk).
Every replayed state is then a power cut the device itself could have
had; a state e2fsck finds damaged is the file system's own (or e2fsck's),
not a cache's.  An experiment, not in `make test`:

    TC_VM_LOCK= TESTS=tests/vm/control_99_ext4_alone.py \\
        TC_GUEST_ENV=TC_CONTROL_RUNS TC_CONTROL_RUNS=8 ./tests/run.sh

Each run adds a line to results/<stamp>/control-99.txt (states checked,
those the boot-time check `e2fsck -fp` cannot repair and those it
repairs, with its words); a run fails only if the workload or the replay
does.  Its first runs (2026-11-29, checked with `e2fsck -fn` then): one
of five had 13 states of 396 with `Inode 35, i_blocks is 272, should be
264`, which `-fp` repairs.
"""

import os

import pytest

import tclib
import test_99_ext4_oracle as t
from tclib import MiB

pytestmark = t.pytestmark
RUNS = int(os.environ.get("TC_CONTROL_RUNS", "4"))


class NoCache:
    """What run_workload() asks of a cache: no epochs."""

    def status(self):
        return {"epoch_current": 0, "epoch_oldest": 0}

    def flush(self, timeout=None):
        return {"epoch_current": 0, "wb_requests": 0, "bridged_blocks": 0}


@pytest.mark.parametrize("run", range(RUNS))
def test_ext4_alone(stack, run):
    tclib.run(["modprobe", "dm-log-writes"])
    raw = stack.ram(t.ORIGIN_MIB * MiB)
    logdev = stack.ram(t.LOG_MIB * MiB)
    n = tclib.size_sectors(raw)
    lw = stack.dm(stack._name("lw"), f"0 {n} log-writes {raw} {logdev}")
    tclib.run(["mkfs.ext4", "-q", "-F", "-b", "4096", "-J", "size=4",
               "-E", "lazy_itable_init=0,lazy_journal_init=0", lw.path], timeout=300)
    tclib.run(["sync"])
    lw.message("mark", "mkfs")
    files = t.run_workload(stack, NoCache(), lw, lw, ordered=False)
    states, bad, first, n_other, _, fixed = t.replay_oracle(stack, logdev, files, False)
    line = (f"run {run}: {states} states ({n_other} between flushes), {len(bad)} that "
            f"e2fsck -fp cannot repair, {len(fixed)} it repairs"
            + (f" (the first, log entry {fixed[0][0]}: {fixed[0][1]})" if fixed else ""))
    tclib.log(line)
    res = os.environ.get("TC_RESULTS")
    if res:
        with open(os.path.join(res, "control-99.txt"), "a") as f:
            f.write(line + (f"; the first: {first}\n" if bad else "\n"))
    assert states > 0
