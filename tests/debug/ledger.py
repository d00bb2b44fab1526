#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""The debug lane's ledger: which tests passed, with a clean debug report,
on one module source and one debug kernel.

The whole kernel-facing list takes over three hours on the debug kernel
under emulation, longer than one sitting.  tests/debug/run.sh records each
boot whose report is clean here; with TC_DEBUG_RESUME=1 the next run skips
what the ledger already holds, and every run says how much of the list is
covered.  An entry names the test and the hash of its test file: a test
whose file changed since counts as not run.  The ledger is keyed by the
hash of the module's sources and the debug kernel's build (source package
version and .config hash), so a change to the module starts a new one.  The
ledgers live in the repository (tests/debug/ledger/), not beside the kernel
build: a machine does not outlive its session, and a list that takes several
sittings is only covered if each part's record is committed.

  ledger.py key SRCDIR                  hash of the module sources
  ledger.py skip LEDGER                 ids that still count (for TC_SKIP_IDS_FILE)
  ledger.py record LEDGER JUNIT STAMP   add the tests JUNIT says passed
  ledger.py cover LEDGER TESTS          "covered N of M" for the -k expression TESTS
"""

import hashlib
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def file_hash(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def source_key(srcdir):
    built = (".o", ".ko", ".cmd", ".mod", ".order", ".symvers", ".dwo")
    h = hashlib.sha256()
    for p in sorted(Path(srcdir).rglob("*")):
        if not p.is_file() or p.name.startswith(".") or p.suffix in built \
           or p.name.endswith(".mod.c"):
            continue
        h.update(str(p.relative_to(srcdir)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def test_file(nodeid):
    return REPO / nodeid.split("::", 1)[0]


def valid_entries(ledger):
    """{nodeid: stamp} of the entries whose test file is unchanged."""
    out = {}
    if not Path(ledger).exists():
        return out
    hashes = {}
    for ln in Path(ledger).read_text().splitlines():
        w = ln.split()
        if len(w) != 3:
            continue
        nodeid, fh, stamp = w
        f = test_file(nodeid)
        if f not in hashes:
            hashes[f] = file_hash(f) if f.exists() else None
        if hashes[f] == fh:
            out[nodeid] = stamp
    return out


def passed_ids(junit):
    root = ET.parse(junit).getroot()
    ids = []
    for tc in root.iter("testcase"):
        if {c.tag for c in tc} & {"failure", "error", "skipped"}:
            continue
        path = tc.get("classname", "").replace(".", "/") + ".py"
        ids.append(f"{path}::{tc.get('name')}")
    return ids


def listed(tests):
    p = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                        "-p", "no:cacheprovider", "-k", tests, "tests/vm"],
                       cwd=REPO, capture_output=True, text=True, check=False)
    ids = [ln for ln in p.stdout.splitlines() if "::" in ln]
    if not ids:
        raise SystemExit(f"ledger: no test collected for {tests!r}:\n{p.stdout}{p.stderr}")
    return ids


def main(argv):
    if len(argv) == 3 and argv[1] == "key":
        print(source_key(argv[2]))
    elif len(argv) == 3 and argv[1] == "skip":
        print("".join(i + "\n" for i in sorted(valid_entries(argv[2]))), end="")
    elif len(argv) == 5 and argv[1] == "record":
        ledger, junit, stamp = argv[2:]
        have = valid_entries(ledger)
        new = [i for i in passed_ids(junit) if i not in have and test_file(i).exists()]
        Path(ledger).parent.mkdir(parents=True, exist_ok=True)
        with open(ledger, "a") as f:
            for i in new:
                f.write(f"{i} {file_hash(test_file(i))} {stamp}\n")
        print(f"ledger: {len(new)} tests added")
    elif len(argv) == 4 and argv[1] == "cover":
        have = valid_entries(argv[2])
        want = listed(argv[3])
        missing = [i for i in want if i not in have]
        stamps = sorted({have[i] for i in want if i in have})
        print(f"ledger: {len(want) - len(missing)} of {len(want)} tests of the list passed "
              f"with a clean report on this module and kernel"
              + (f" (runs {', '.join(stamps)})" if stamps else ""))
        if missing:
            print(f"ledger: {len(missing)} not yet, first: {' '.join(missing[:5])}")
        else:
            print("ledger: the whole list is covered")
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
