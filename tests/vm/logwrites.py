# SPDX-License-Identifier: GPL-2.0
"""Reader and replayer of a dm-log-writes log.

dm-log-writes (Documentation/admin-guide/device-mapper/log-writes.rst)
passes every bio to a device and records each write, flush, discard and
mark on a log device, in the order in which they became durable: a plain
write is logged only when a later flush (REQ_PREFLUSH) completes, just
before that flush; a FUA write as soon as it completes; a mark when the
message arrives.  Replaying the log onto a zeroed copy of the device up to
a FLUSH or FUA entry therefore gives a state the device could hold after a
power cut at that moment (writes that were only in its volatile cache are
lost).

Log format (all little-endian; S is the device's logical sector size, the
log super's `sectorsize`, 512 for the RAM disks of the tests):

    byte 0          super: u64 magic 0x6a736677736872, u64 version 1,
                           u64 nr_entries, u32 sectorsize
    byte S          entry 0, then entry 1, ... each one:
                    a header of S bytes: u64 sector, u64 nr_sectors,
                    u64 flags, u64 data_len, then (marks only) data_len
                    bytes of mark text in the same S bytes;
                    then, for writes, nr_sectors * S bytes of data.

`sector` and `nr_sectors` count S-byte sectors of the logged device.
Flags: FLUSH 1, FUA 2, DISCARD 4 (a range, no data), MARK 8 (no range),
METADATA 16 (REQ_META, informational).  A flush entry may carry data (a
flush with data); an empty flush has nr_sectors 0.  nr_entries in the
super is rewritten after FUA and mark entries and when the target is
removed (which first logs the still unflushed writes, then the mark
"dm-log-writes-end").

Usage:

    log = LogWrites.open("/dev/mapper/log")     # or a file, or bytes
    for e in log.entries: ...                  # Entry: index, sector, ...
    img = bytearray(size); log.replay(img, end=log.mark_index("fsync-1"))
    log.replay("/dev/ram3", end=17)            # onto a device, in place
    log.flush_points(), log.fua_points(), log.marks()

Replay writes each entry's data at sector * S; a DISCARD zeroes its range
(after a discard the content is undefined: zeroes are one possible
content).  Nothing else is written: replay onto a zeroed target to get
the logged device's state, if it started zeroed.

`python3 logwrites.py LOG` prints the entries.
"""

import io
import os
import struct
import sys

MAGIC = 0x6a736677736872
VERSION = 1

FLUSH = 1 << 0
FUA = 1 << 1
DISCARD = 1 << 2
MARK = 1 << 3
METADATA = 1 << 4

_SUPER = struct.Struct("<QQQI")           # magic, version, nr_entries, sectorsize
_HEADER = struct.Struct("<QQQQ")          # sector, nr_sectors, flags, data_len

FLAG_NAMES = [(FLUSH, "FLUSH"), (FUA, "FUA"), (DISCARD, "DISCARD"),
              (MARK, "MARK"), (METADATA, "META")]


class LogError(Exception):
    pass


def flag_str(flags):
    names = [n for bit, n in FLAG_NAMES if flags & bit]
    rest = flags & ~sum(bit for bit, _ in FLAG_NAMES)
    if rest:
        names.append(hex(rest))
    return "|".join(names) or "WRITE"


class Entry:
    """One log entry.  Offsets and lengths are in bytes except `sector` and
    `nr_sectors`, which count the logged device's sectors of `sectorsize`."""

    __slots__ = ("index", "sector", "nr_sectors", "flags", "data_len",
                 "pos", "data_pos", "mark", "sectorsize")

    def __init__(self, index, sector, nr_sectors, flags, data_len, pos,
                 data_pos, mark, sectorsize):
        self.index, self.sector, self.nr_sectors = index, sector, nr_sectors
        self.flags, self.data_len, self.pos = flags, data_len, pos
        self.data_pos, self.mark, self.sectorsize = data_pos, mark, sectorsize

    @property
    def offset(self):
        """Byte offset on the logged device."""
        return self.sector * self.sectorsize

    @property
    def length(self):
        """Bytes written (or discarded) on the logged device."""
        return 0 if self.flags & MARK else self.nr_sectors * self.sectorsize

    @property
    def is_write(self):
        return not self.flags & (MARK | DISCARD) and self.nr_sectors > 0

    def __repr__(self):
        what = f"mark {self.mark!r}" if self.flags & MARK else \
            f"{self.offset}+{self.length}"
        return f"<entry {self.index} {flag_str(self.flags)} {what}>"


class LogWrites:
    """A parsed log.  `f` is a seekable binary file object kept open for
    reading the entries' data (close() it, or use `with`)."""

    def __init__(self, f, strict=True):
        self.f = f
        f.seek(0)
        raw = f.read(_SUPER.size)
        if len(raw) < _SUPER.size:
            raise LogError("log too short for its super block")
        magic, version, nr, ss = _SUPER.unpack(raw)
        if magic != MAGIC:
            raise LogError(f"not a dm-log-writes log (magic {magic:#x})")
        if version != VERSION:
            raise LogError(f"unknown log version {version}")
        if ss < 512 or ss & (ss - 1):
            raise LogError(f"bad sector size {ss}")
        self.sectorsize = ss
        self.nr_entries = nr
        self.entries = []
        pos = ss
        for i in range(nr):
            f.seek(pos)
            hdr = f.read(ss)
            if len(hdr) < ss:
                raise LogError(f"entry {i}: log ends at byte {pos}")
            sector, nr_sectors, flags, data_len = _HEADER.unpack_from(hdr)
            mark = None
            if flags & MARK:
                if data_len > ss - _HEADER.size:
                    raise LogError(f"entry {i}: mark of {data_len} bytes")
                mark = hdr[_HEADER.size:_HEADER.size + data_len].decode(
                    "utf-8", "replace")
                span = 0
            elif data_len:
                # inline data of a non-mark entry: not produced by the
                # 6.1 kernel, and its layout is not fixed by the format
                raise LogError(f"entry {i}: unsupported inline data ({data_len} bytes)")
            elif flags & DISCARD:
                span = 0
            else:
                span = nr_sectors * ss
            if strict and flags & DISCARD and flags & (FLUSH | FUA):
                raise LogError(f"entry {i}: discard with flush/FUA")
            self.entries.append(Entry(i, sector, nr_sectors, flags, data_len,
                                      pos, pos + ss, mark, ss))
            pos += ss + span
        self.end = pos

    @classmethod
    def open(cls, src):
        """A log from a path (file or block device), bytes, or a file."""
        if isinstance(src, (bytes, bytearray, memoryview)):
            return cls(io.BytesIO(bytes(src)))
        if isinstance(src, (str, os.PathLike)):
            return cls(open(src, "rb", buffering=0))
        return cls(src)

    def close(self):
        self.f.close()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()

    def __len__(self):
        return len(self.entries)

    def data(self, e):
        """The bytes an entry wrote (b"" for marks, flushes, discards)."""
        if not e.is_write:
            return b""
        self.f.seek(e.data_pos)
        d = self.f.read(e.length)
        if len(d) != e.length:
            raise LogError(f"entry {e.index}: data cut short")
        return d

    # --- points of interest
    def flush_points(self):
        """Indices of the entries with the FLUSH flag."""
        return [e.index for e in self.entries if e.flags & FLUSH]

    def fua_points(self):
        """Indices of the entries with the FUA flag."""
        return [e.index for e in self.entries if e.flags & FUA]

    def durable_points(self):
        """Indices of FLUSH or FUA entries, in log order."""
        return [e.index for e in self.entries if e.flags & (FLUSH | FUA)]

    def marks(self):
        """[(index, text)] of the mark entries, in log order."""
        return [(e.index, e.mark) for e in self.entries if e.flags & MARK]

    def mark_index(self, text):
        """Index of the (first) mark with this text; KeyError if none."""
        for e in self.entries:
            if e.flags & MARK and e.mark == text:
                return e.index
        raise KeyError(text)

    # --- replay
    def replay(self, target, end, start=0):
        """Apply entries start..end (inclusive) to `target`: a bytearray
        (or writable memoryview), a path (opened for writing in place,
        not truncated) or an object with seek()/write().  Returns the
        number of entries that changed data."""
        if end >= len(self.entries) or start < 0:
            raise IndexError(f"replay {start}..{end} of {len(self.entries)} entries")
        if isinstance(target, (str, os.PathLike)):
            with open(target, "r+b", buffering=0) as f:
                n = self.replay(f, end, start)
                os.fsync(f.fileno())
                return n
        if isinstance(target, (bytearray, memoryview)):
            size = len(target)

            def put(off, data):
                if off + len(data) > size:
                    raise LogError(f"write at {off}+{len(data)} past the "
                                   f"end of the {size}-byte target")
                target[off:off + len(data)] = data
        else:
            def put(off, data):
                target.seek(off)
                target.write(data)
        n = 0
        for e in self.entries[start:end + 1]:
            if e.flags & MARK:
                continue
            if e.flags & DISCARD:
                length = e.nr_sectors * self.sectorsize
                for o in range(0, length, 1 << 20):
                    put(e.offset + o, bytes(min(1 << 20, length - o)))
                n += 1
            elif e.is_write:
                put(e.offset, self.data(e))
                n += 1
        return n

    def summary(self):
        counts = {}
        for e in self.entries:
            k = flag_str(e.flags & ~METADATA)
            counts[k] = counts.get(k, 0) + 1
        return ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))


def main(argv):
    if len(argv) != 2:
        print(f"usage: {argv[0]} LOG", file=sys.stderr)
        return 2
    with LogWrites.open(argv[1]) as log:
        print(f"sectorsize {log.sectorsize}, {log.nr_entries} entries, "
              f"{log.end} bytes used: {log.summary()}")
        for e in log.entries:
            print(f"{e.index:6d} {flag_str(e.flags):18s} "
                  + (repr(e.mark) if e.flags & MARK else
                     f"sector {e.sector} +{e.nr_sectors}"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
