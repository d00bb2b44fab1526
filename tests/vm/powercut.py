# SPDX-License-Identifier: GPL-2.0
"""Which states of a lower device are power-cut states of an upper one?

The ordered policy promises that the origin alone always holds a state the
cached device could have had after a power cut.  With a dm-log-writes log
above tiercache (the upper log: the data of every write the cached device
received) and the issue and completion time of each of its bios (the
block_bio_queue and block_bio_complete trace events of the cached device,
BioTrace), this module decides that promise sector by sector for any state
of the origin, without trusting a file system to notice.

The power-cut model (as tests/vm/test_98_ordered_race.py's): a cut at time
T leaves, in each sector, a version whose write was issued before T and
that no later version of the sector had made durable by T.  A write is
durable once it completed with FUA, or once a flush issued after it
completed has completed itself.  So content v in sector s allows the cuts
[issue(w), durable-by-newer(w)] of each write w that put v there (and of
the sector's content before the log, from the start); a state is legal
when the cuts its sectors allow meet.  A discard leaves its sectors
undefined: from its issue on, they allow any content.

The log gives each write's data, the trace its times: they are matched by
(sector, length, FUA or not), in completion order (dm-log-writes logs a
FUA write as it completes, a plain one at the next flush, in completion
order).  A sector's versions follow each other in the order their writes
were issued.

    trace = BioTrace(dev); trace.start(); ...; events = trace.stop()
    h = History(upper_log, start_index, base_image, events)
    chk = h.checker(base_image)
    chk.update(image, sectors)   # after the lower replay changed them
    chk.legal()                  # a cut time every sector allows, or None
    chk.explain()                # why not, in words

`python3 powercut.py results/*/oracle-HHMMSS [SECTOR...]` judges again
the logs and the trace test_99 keeps when a state is refused or damaged.
"""

import bisect
import os
import re

import logwrites

INF = float("inf")
TRACING = "/sys/kernel/tracing"


class Bio:
    """One bio of the traced device: issue and completion times (s)."""

    __slots__ = ("sector", "nr", "rwbs", "issued", "done")

    def __init__(self, sector, nr, rwbs, issued, done=INF):
        self.sector, self.nr, self.rwbs = sector, nr, rwbs
        self.issued, self.done = issued, done

    @property
    def is_flush(self):
        return self.rwbs.startswith("F")

    @property
    def op(self):
        """R(ead), W(rite), D(iscard), ... (rwbs after the flush flag)."""
        return self.rwbs.lstrip("F")[:1]

    @property
    def is_fua(self):
        """rwbs: [F]lush, then the operation, then [F]UA."""
        op = self.rwbs.lstrip("F")
        return "F" in op[1:]

    def __repr__(self):
        return f"<bio {self.rwbs} {self.sector}+{self.nr} {self.issued:.6f}..{self.done:.6f}>"


_EVENT = re.compile(r"\s(\d+\.\d+): block_bio_(queue|complete): (\d+),(\d+) (\S+) "
                    r"(\d+) \+ (\d+)")


def parse_trace(text, major, minor):
    """Bios of device major:minor from ftrace's text.  A completion is
    matched to its issue by (sector, length): not by rwbs, which may change
    on the way (dm clears REQ_PREFLUSH of a flush with data before it
    sends the data).  When several bios of one (sector, length) are in
    flight at once, which completion is whose is unknown: each of them is
    given the time the last of them completed (later, so never a stricter
    verdict)."""
    bios, flying = [], {}
    for line in text.splitlines():
        m = _EVENT.search(line)
        if not m or (int(m[3]), int(m[4])) != (major, minor):
            continue
        t, kind, rwbs = float(m[1]), m[2], m[5]
        key = (int(m[6]), int(m[7]))
        if kind == "queue":
            b = Bio(key[0], key[1], rwbs, t)
            bios.append(b)
            f = flying.setdefault(key, [[], 0])
            f[0].append(b)
        elif key in flying:
            f = flying[key]
            f[1] += 1
            if f[1] == len(f[0]):
                for b in f[0]:
                    b.done = t
                del flying[key]
    return bios


class BioTrace:
    """ftrace of the bios a block device receives (issue and completion)."""

    EVENTS = ("block/block_bio_queue", "block/block_bio_complete")

    def __init__(self, dev):
        st = os.stat(dev)
        self.major, self.minor = os.major(st.st_rdev), os.minor(st.st_rdev)
        self.saved = None      # the buffer size and clock before start()

    def _w(self, name, value):
        with open(os.path.join(TRACING, name), "w") as f:
            f.write(value)

    def _r(self, name):
        with open(os.path.join(TRACING, name)) as f:
            return f.read()

    def start(self):
        if not os.path.exists(os.path.join(TRACING, "trace")):
            os.makedirs(TRACING, exist_ok=True)
            os.system(f"mount -t tracefs nodev {TRACING}")
        self._w("tracing_on", "0")
        # "7 (expanded: 1408)" before the first use; "[local] global ..."
        size = self._r("buffer_size_kb")
        expanded = re.search(r"expanded: (\d+)", size)
        clock = re.search(r"\[(\w+)\]", self._r("trace_clock"))
        self.saved = (expanded[1] if expanded else size.split()[0],
                      clock[1] if clock else "local")
        self._w("trace_clock", "global")
        self._w("buffer_size_kb", "16384")
        flt = f"dev == {(self.major << 20) | self.minor}"
        for ev in self.EVENTS:
            self._w(f"events/{ev}/filter", flt)
            self._w(f"events/{ev}/enable", "1")
        self._w("trace", "")
        self._w("tracing_on", "1")

    def close(self):
        """Tracing off, the buffer and clock as they were (idempotent; for
        clean-up)."""
        self._w("tracing_on", "0")
        for ev in self.EVENTS:
            self._w(f"events/{ev}/enable", "0")
            self._w(f"events/{ev}/filter", "0")
        if self.saved:
            size, clock = self.saved
            self.saved = None
            self._w("buffer_size_kb", size)
            self._w("trace_clock", clock)

    def stop(self):
        """Tracing off; the bios traced since start()."""
        self._w("tracing_on", "0")
        with open(os.path.join(TRACING, "trace")) as f:
            text = f.read()
        self.text = text
        self.close()
        m = re.search(r"entries-in-buffer/entries-written: (\d+)/(\d+)", text)
        if not m or m[1] != m[2]:
            raise RuntimeError(f"trace lost events: {m and m[0]}")
        return parse_trace(text, self.major, self.minor)


def _union(spans):
    """Sorted, merged [lo, hi] spans (closed: events of one time stamp
    may have come in either order)."""
    out = []
    for lo, hi in sorted(s for s in spans if s[0] <= s[1]):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [tuple(s) for s in out]


def _meet(a, b):
    """Intersection of two sorted span lists."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo <= hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


ALL = [(-INF, INF)]


class Flushes:
    """The flushes of the trace: when does a write that completed at t
    become durable, and which flush logs it (dm-log-writes takes the writes
    completed when a flush is mapped, and logs them when it completes)?"""

    def __init__(self, bios):
        self.f = sorted((b.issued, b.done) for b in bios if b.is_flush)
        self.issued = [q for q, _ in self.f]
        # the earliest completion among the flushes issued from k on
        self.min_done = [INF] * (len(self.f) + 1)
        for k in range(len(self.f) - 1, -1, -1):
            self.min_done[k] = min(self.f[k][1], self.min_done[k + 1])

    def durable(self, done):
        """A write completed at @done is durable once a flush issued after
        it (strictly: a time stamp is a microsecond) has completed."""
        return self.min_done[bisect.bisect_right(self.issued, done)]

    def logged(self, done):
        """When dm-log-writes logs a plain write completed at @done: at the
        completion of the first flush issued after it."""
        k = bisect.bisect_left(self.issued, done)
        return self.f[k][1] if k < len(self.f) else INF


class History:
    """For each sector the versions written after log entry @start: the
    cuts each allows."""

    def __init__(self, log, start, base, bios):
        if log.sectorsize != 512:
            raise ValueError(f"log sector size {log.sectorsize}: the trace counts 512")
        self.ss = log.sectorsize
        self.base = base
        fl = Flushes(bios)
        # the log's order: a FUA write as it completes; a plain one (or a
        # discard) with the writes its flush took, at that flush's
        # completion, in completion order
        by_key = {}
        for b in bios:
            if b.nr and b.op in "WD":
                order = b.done if b.is_fua else (fl.logged(b.done), b.done)
                by_key.setdefault((b.sector, b.nr, b.op, b.is_fua), []).append((order, b))
        for q in by_key.values():
            q.sort(key=lambda ob: ob[0])
        writes = {}             # sector -> [(issued, done, durable, hash, entry)]
        self.wild = {}          # sector -> issue time of its first discard
        self.unmatched = []     # log entries without a bio
        for e in log.entries[start + 1:]:
            if e.flags & logwrites.MARK or not e.nr_sectors:
                continue
            fua = bool(e.flags & logwrites.FUA)
            op = "D" if e.flags & logwrites.DISCARD else "W"
            q = by_key.get((e.sector, e.nr_sectors, op, fua))
            if not q:
                self.unmatched.append(e.index)
                continue
            b = q.pop(0)[1]
            if op == "D":
                for s in range(e.sector, e.sector + e.nr_sectors):
                    self.wild[s] = min(self.wild.get(s, INF), b.issued)
                continue
            durable = b.done if fua else fl.durable(b.done)
            data = log.data(e)
            for n in range(e.nr_sectors):
                writes.setdefault(e.sector + n, []).append(
                    (b.issued, b.done, durable,
                     hash(data[n * self.ss:(n + 1) * self.ss]), e.index))
        # bios the log does not have (it filled up, or was cut short)
        self.unlogged = [b for q in by_key.values() for _, b in q]
        self.versions = {}      # sector -> [(lo, hi, hash, entry)]
        for s, ws in writes.items():
            self.versions[s] = self._spans_of(ws, self.sector_hash(base, s))
        self._spans = {}

    @staticmethod
    def _spans_of(ws, base_hash):
        """A version allows the cuts from its issue until a version issued
        after it completed was durable (two writes in flight together may
        land in either order); the content before the log, until any
        version was durable."""
        ws.sort()
        issued = [w[0] for w in ws]
        later = [INF] * (len(ws) + 1)     # min durable of versions k..
        for k in range(len(ws) - 1, -1, -1):
            later[k] = min(ws[k][2], later[k + 1])
        out = [(-INF, later[0], base_hash, None)]
        for k, (q, done, _, h, i) in enumerate(ws):
            nxt = max(k + 1, bisect.bisect_left(issued, done))
            out.append((q, later[nxt], h, i))
        return out

    def sector_hash(self, image, s):
        return hash(bytes(image[s * self.ss:(s + 1) * self.ss]))

    def spans(self, s, h):
        """The cuts a sector allows when it holds content of hash h."""
        key = (s, h)
        sp = self._spans.get(key)
        if sp is None:
            vs = self.versions.get(s)
            if vs is None:
                vs = [(-INF, INF, self.sector_hash(self.base, s), None)]
            sp = [(lo, hi) for lo, hi, v, _ in vs if v == h]
            if s in self.wild:
                sp.append((self.wild[s], INF))
            sp = _union(sp)
            self._spans[key] = sp
        return sp

    def origin_of(self, s, h):
        """Upper log entries whose write put content h in sector s (None:
        the content before the log)."""
        return [(i, lo, hi) for lo, hi, v, i in self.versions.get(s, ()) if v == h]

    def checker(self, image):
        return Checker(self, image)


class Checker:
    """The cuts a lower device's state allows, kept up to date sector by
    sector (chunks of 512 sectors keep the intersection cheap)."""

    CHUNK = 512

    def __init__(self, hist, image):
        self.h = hist
        self.cur = {}           # sector -> (hash, spans)
        self.chunks = {}        # chunk -> intersection of its sectors' spans
        self.update(image, set(hist.versions) | set(hist.wild))

    def update(self, image, sectors):
        touched = set()
        for s in sectors:
            h = self.h.sector_hash(image, s)
            self.cur[s] = (h, self.h.spans(s, h))
            touched.add(s // self.CHUNK)
        for c in touched:
            sp = ALL
            for s in range(c * self.CHUNK, (c + 1) * self.CHUNK):
                hs = self.cur.get(s)
                if hs is not None:
                    sp = _meet(sp, hs[1])
                    if not sp:
                        break
            self.chunks[c] = sp

    def allowed(self):
        sp = ALL
        for v in self.chunks.values():
            sp = _meet(sp, v)
            if not sp:
                break
        return sp

    def legal(self):
        """The latest cut this state allows (-inf: before the log), or None."""
        sp = self.allowed()
        return sp[-1][0] if sp else None

    def explain(self):
        """Why no cut fits: the sector whose content came latest, and the
        one whose content a newer version had made durable earliest."""
        if self.allowed():
            return "legal"
        never = sorted(s for s, (_, sp) in self.cur.items() if not sp)
        if never:
            return (f"{len(never)} sectors hold content no write put there "
                    f"(first: {never[:4]}, 4 KiB block {never[0] * self.h.ss // 4096})")
        late = max(self.cur.items(), key=lambda kv: kv[1][1][0][0])
        early = min(self.cur.items(), key=lambda kv: kv[1][1][-1][1])
        out = []
        for what, (s, (h, sp)) in (("newest", late), ("oldest", early)):
            src = self.h.origin_of(s, h)
            out.append(f"{what}: sector {s} (4 KiB block {s * self.h.ss // 4096}) "
                       f"allows cuts {sp[0][0]:.6f}..{sp[-1][1]:.6f}, its content from "
                       + (", ".join(f"upper entry {i} (issued {lo:.6f}, replaced "
                                    f"{hi:.6f})" if i is not None else "before the log"
                                    for i, lo, hi in src[:3]) or "nowhere"))
        return "; ".join(out)


def judge_kept(d, sectors=()):
    """Judge again the evidence test_99 kept in @d (lower.log, upper.log,
    trace.txt): print the refused states of the origin, and the versions
    and bios of @sectors."""
    with open(os.path.join(d, "trace.txt")) as f:
        text = f.read()
    devs = re.findall(r"block_bio_queue: (\d+),(\d+) ", text)
    major, minor = max(set(devs), key=devs.count)
    bios = parse_trace(text, int(major), int(minor))
    with logwrites.LogWrites.open(os.path.join(d, "lower.log")) as low, \
            logwrites.LogWrites.open(os.path.join(d, "upper.log")) as up:
        size = max(e.offset + e.length for e in low.entries if e.is_write)
        img = bytearray(size)
        start = low.mark_index("mkfs")
        low.replay(img, end=start)
        h = History(up, up.mark_index("mkfs"), bytes(img), bios)
        print(f"{len(bios)} bios; log entries without a bio: {h.unmatched[:10]}; "
              f"bios without a log entry: {h.unlogged[:10]}")
        chk = h.checker(bytes(img))
        refused = []
        for e in low.entries[start + 1:]:
            if not (e.is_write or e.flags & logwrites.DISCARD):
                continue
            low.replay(img, start=e.index, end=e.index)
            chk.update(img, range(e.sector, e.sector + e.nr_sectors))
            if chk.legal() is None:
                if not refused:
                    print(f"first refused after lower entry {e.index}: {chk.explain()}")
                refused.append(e.index)
        print(f"{len(refused)} refused states: {refused[:30]}")
    for s in sectors:
        print(f"sector {s}: versions (from, until, hash, upper entry):")
        for v in h.versions.get(s, ()):
            print(f"    {v}")
        for b in bios:
            if b.nr and b.sector <= s < b.sector + b.nr:
                print(f"    {b}")


if __name__ == "__main__":
    import sys
    if len(sys.argv) < 2:
        sys.exit("usage: powercut.py RESULTS/oracle-HHMMSS [SECTOR...]")
    judge_kept(sys.argv[1], [int(a) for a in sys.argv[2:]])
