#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# `make test-xfstests`: xfstests against tiercache, in one VM boot.
#   1. tests/xfstests/setup.sh: build xfstests from the peer tarball (cached in
#      /opt/tiercache-test/xfstests, never in the repository)
#   2. tests/vm/test_85_fsx.py for TC_FSX_SECONDS (default 600): fsx buffered,
#      O_DIRECT and O_DIRECT+AIO plus fsstress on ext4 over a small cache with
#      background writeback busy and a control thread racing; e2fsck -fn, drain,
#      table swapped to linear, origin compared and e2fsck -fn
#   3. tests/vm/test_xfstests.py: the curated generic list on ext4 over brd and
#      over tiercache; results/<stamp>/xfstests-table.md (copied to
#      results/xfstests-table.md); a test failing on tiercache only fails the run
#
# Environment: TC_KO (module, default the tree's), TC_FSX_SECONDS, TC_FSX_SEED,
# TC_XFSTESTS_LIST ("generic/075 generic/091": a subset), TC_XFSTESTS_TIMEOUT
# (seconds per test, 900), TC_XFS_DISK_MIB (768), TC_XFS_CACHE_MIB (64),
# TC_XFS_ONLY=fsx|generic (one part only), plus what tests/run.sh reads
# (TC_MEMORY defaults to 6G here, TC_VM_TIMEOUT to 3 hours).
set -euo pipefail

main() {
REPO=$(cd "$(dirname "$0")/../.." && pwd)
XFSTESTS_DIR=$("$REPO/tests/xfstests/setup.sh" | tail -n 1)
export XFSTESTS_DIR TC_XFSTESTS=1
export TC_FSX_SECONDS=${TC_FSX_SECONDS:-600}
case "${TC_XFS_ONLY:-}" in
fsx) TESTS="tests/vm/test_85_fsx.py" ;;
generic) TESTS="tests/vm/test_xfstests.py" ;;
"") TESTS="tests/vm/test_85_fsx.py tests/vm/test_xfstests.py" ;;
*) echo "TC_XFS_ONLY: fsx or generic" >&2; exit 2 ;;
esac
export TESTS
export TC_GUEST_ENV="XFSTESTS_DIR TC_XFSTESTS TC_FSX_SECONDS TC_FSX_SEED TC_XFSTESTS_LIST
	TC_XFSTESTS_TIMEOUT TC_XFS_DISK_MIB TC_XFS_CACHE_MIB"
export TC_MEMORY=${TC_MEMORY:-6G}
export TC_VM_TIMEOUT=${TC_VM_TIMEOUT:-10800} TC_PYTEST_TIMEOUT=${TC_PYTEST_TIMEOUT:-10200}
export TC_SKIP_HOST=${TC_SKIP_HOST:-1} TC_SKIP_CRASH=${TC_SKIP_CRASH:-1}
rc=0
out=$(mktemp)
"$REPO/tests/run.sh" | tee "$out" || rc=$?
# this run's directory (results/latest may name another run started since)
stamp=$(grep -a -o -m1 'results: results/[^ ]*' "$out" | sed 's|results: results/||')
rm -f "$out"
t=$REPO/results/$stamp/xfstests-table.md
if [ -f "$t" ]; then
	cp "$t" "$REPO/results/xfstests-table.md"
	echo "xfstests table: results/xfstests-table.md (results/$stamp/)"
fi
return $rc
}

main "$@"; exit $?
