# SPDX-License-Identifier: GPL-2.0
"""Which states of a lower device are power-cut states of an upper one?

The ordered policy promises that the origin alone always holds a state the
cached device could have had after a power cut.  With a dm-log-writes log
above tiercache (the upper log: the writes and flushes the cached device
received) and one below it (the origin's writes), this module decides that
promise sector by sector for every replayed state of the origin, without
trusting a file system to notice.

The upper log is cut into intervals at its FLUSH entries: interval 0 runs
from the start mark to the first flush, interval k from flush k to flush
k + 1 (a flush with data puts its data in the interval it opens).  A power
cut in interval k leaves every write of the intervals before k (their last
version of each sector) and any subset of the writes of interval k (any of
the versions written in it).  So a sector holding content v allows the
intervals k where v is the last version before k, or one written in k; a
state is legal when one interval is allowed by every sector.

This is permissive: it allows every write of interval k at any cut in it,
including the writes issued after the cut.  With `fua_ends=True` a FUA
write also ends its interval (nothing logged after it may be on the
device without it): stricter, but dm-log-writes logs a plain write only at
the next flush, so a plain write logged after a FUA one may have completed
before it, and the strict rule can refuse a legal state.  A state the
permissive rule refuses is illegal for certain.

dm-log-writes logs a write when it completes, so a write logged in
interval k may have been issued before flush k came, and a power cut in
interval k - 1 may leave it: `slack=1` lets each version stand in the
interval before its own too.  That is the rule that refuses only illegal
states (but for a write in flight across two flushes); it also lets a
reordering by one interval pass.

A discard leaves its sectors undefined: from its interval on, they allow
any content.

    h = History(upper_log, start_index, base_image)
    chk = h.checker(base_image)
    chk.update(image, sectors)   # after the lower replay changed them
    chk.legal()                  # an interval every sector allows, or None
    chk.explain()                # why not, in words
"""

import logwrites


def _bits(lo, hi):
    """Mask of intervals lo..hi inclusive."""
    return ((1 << (hi - lo + 1)) - 1) << lo if hi >= lo else 0


class History:
    """The versions each sector had in each interval of an upper log."""

    def __init__(self, log, start, base, fua_ends=False, slack=0):
        self.ss = log.sectorsize
        self.slack = slack
        self.base = base
        self.versions = {}      # sector -> [(interval, hash, entry index)]
        self.wild = {}          # sector -> interval of its first discard
        self.starts = [start]   # interval -> index of the entry opening it
        k = 0
        for e in log.entries[start + 1:]:
            if e.flags & logwrites.MARK:
                continue
            if e.flags & logwrites.FLUSH:
                k += 1
                self.starts.append(e.index)
            if e.flags & logwrites.DISCARD:
                for s in range(e.sector, e.sector + e.nr_sectors):
                    self.wild.setdefault(s, k)
            elif e.is_write:
                data = log.data(e)
                for n in range(e.nr_sectors):
                    self.versions.setdefault(e.sector + n, []).append(
                        (k, hash(data[n * self.ss:(n + 1) * self.ss]), e.index))
            if fua_ends and e.flags & logwrites.FUA:
                k += 1
                self.starts.append(e.index)
        self.last = k
        self.all = _bits(0, k)
        self._masks = {}

    def sector_hash(self, image, s):
        return hash(bytes(image[s * self.ss:(s + 1) * self.ss]))

    def mask(self, s, h):
        """Intervals a sector allows when it holds content of hash h."""
        key = (s, h)
        m = self._masks.get(key)
        if m is None:
            m = self._mask(s, h)
            self._masks[key] = m
        return m

    def _mask(self, s, h):
        cur, cur_from, m = self.sector_hash(self.base, s), 0, 0
        for k, v, _ in self.versions.get(s, ()):
            if cur_from <= k:
                # the last version before interval k: cur, from cur_from on
                if cur == h:
                    m |= _bits(cur_from, k)
                cur_from = k + 1
            if v == h:
                m |= _bits(max(0, k - self.slack), k)
            cur = v
        if cur == h:
            m |= _bits(cur_from, self.last)
        if s in self.wild:
            m |= _bits(self.wild[s], self.last)
        return m

    def origin_of(self, s, h):
        """Upper entries whose write put content h in sector s."""
        return [(k, i) for k, v, i in self.versions.get(s, ()) if v == h]

    def checker(self, image):
        return Checker(self, image)


class Checker:
    """The allowed intervals of a lower device's state, kept up to date
    sector by sector (chunks of 512 sectors keep the AND cheap)."""

    CHUNK = 512

    def __init__(self, hist, image):
        self.h = hist
        self.base = {}          # sector -> hash of its base content
        self.cur = {}           # sector -> (hash, mask), sectors that differ
        self.chunks = {}        # chunk -> AND of its sectors' masks
        sectors = set(hist.versions) | set(hist.wild)
        self.update(image, sectors)

    def update(self, image, sectors):
        touched = set()
        for s in sectors:
            h = self.h.sector_hash(image, s)
            self.cur[s] = (h, self.h.mask(s, h))
            touched.add(s // self.CHUNK)
        for c in touched:
            m = self.h.all
            lo = c * self.CHUNK
            for s in range(lo, lo + self.CHUNK):
                hm = self.cur.get(s)
                if hm is not None:
                    m &= hm[1]
            self.chunks[c] = m

    def allowed(self):
        m = self.h.all
        for v in self.chunks.values():
            m &= v
        return m

    def legal(self):
        """The latest interval this state is a power cut of, or None."""
        m = self.allowed()
        return m.bit_length() - 1 if m else None

    def explain(self, limit=4):
        """Why no interval fits: the sectors furthest behind and ahead."""
        if self.allowed():
            return "legal"
        never, rows = [], []
        for s, (h, m) in self.cur.items():
            if not m:
                never.append(s)
            else:
                rows.append((m.bit_length() - 1, (m & -m).bit_length() - 1, s, h))
        out = []
        if never:
            out.append(f"{len(never)} sectors hold content no write put there "
                       f"(first: {sorted(never)[:limit]})")
        if rows:
            behind = min(rows)
            ahead = max(rows, key=lambda r: r[1])
            for what, (hi, lo, s, h) in (("behind", behind), ("ahead", ahead)):
                src = self.h.origin_of(s, h)
                out.append(
                    f"{what}: sector {s} (4 KiB block {s * self.h.ss // 4096}) "
                    f"allows intervals {lo}..{hi} (upper entries "
                    f"{self.h.starts[lo]}..{self.h.starts[hi]}), its content "
                    f"from upper {'entries ' + str(src[:3]) if src else 'base'}")
        return "; ".join(out)
