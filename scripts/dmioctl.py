# SPDX-License-Identifier: GPL-2.0
"""dmioctl.py - device-mapper target messages and event waits by ioctl.

`dmsetup message` and `dmsetup wait` start a process each; under QEMU's
software emulation that alone costs about 0.1 s, a tenth of the flush the
experiment times.  These two calls talk to /dev/mapper/control directly
(include/uapi/linux/dm-ioctl.h), so a timed flush starts and ends where
the kernel does.
"""

import fcntl
import os
import struct

DM_IOCTL = 0xFD
DM_DEV_STATUS_CMD = 7
DM_DEV_WAIT_CMD = 8
DM_TARGET_MSG_CMD = 14
DM_VERSION = (4, 0, 0)
DM_BUFFER_FULL_FLAG = 1 << 8
DM_NAME_LEN = 128
DM_UUID_LEN = 129

# struct dm_ioctl: version[3], data_size, data_start, target_count,
# open_count, flags, event_nr, padding, dev, name, uuid, data[7]
HDR = struct.Struct(f"=3IIIIiIII Q{DM_NAME_LEN}s{DM_UUID_LEN}s7s")
assert HDR.size == 312


def _iowr(nr):
    return (3 << 30) | (HDR.size << 16) | (DM_IOCTL << 8) | nr


def _call(cmd, name, payload=b"", event_nr=0, space=0):
    """One ioctl on the control device; returns the output buffer."""
    if len(name.encode()) >= DM_NAME_LEN:
        raise ValueError(f"device name too long: {name}")
    size = HDR.size + len(payload) + space
    buf = bytearray(size)
    HDR.pack_into(buf, 0, *DM_VERSION, size, HDR.size, 0, 0, 0, event_nr, 0, 0,
                  name.encode(), b"", b"")
    buf[HDR.size:HDR.size + len(payload)] = payload
    fd = os.open("/dev/mapper/control", os.O_RDWR)
    try:
        fcntl.ioctl(fd, _iowr(cmd), buf, True)
    finally:
        os.close(fd)
    return buf


def message(name, text, sector=0):
    """Send `text` to the target at `sector` (dmsetup message NAME SECTOR TEXT).

    Raises OSError with the target's errno if it refuses the message.
    """
    payload = struct.pack("=Q", sector) + text.encode() + b"\0"
    payload += b"\0" * (-len(payload) % 8)
    _call(DM_TARGET_MSG_CMD, name, payload, space=4096)


def event_nr(name):
    """The device's event counter now (DM_DEV_STATUS)."""
    return HDR.unpack_from(_call(DM_DEV_STATUS_CMD, name), 0)[8]


# struct dm_target_spec: sector_start, length, status, next, target_type
SPEC = struct.Struct("=QQiI16s")


def wait(name, event):
    """Block until the device's event counter moves past `event` (dmsetup
    wait NAME EVENT).  Returns (new counter, status text of the first
    target as the kernel had it when the wait ended)."""
    buf = _call(DM_DEV_WAIT_CMD, name, event_nr=event, space=16384)
    hdr = HDR.unpack_from(buf, 0)
    data_size, data_start, target_count, flags, new_event = \
        hdr[3], hdr[4], hdr[5], hdr[7], hdr[8]
    if flags & DM_BUFFER_FULL_FLAG:
        raise OSError(f"{name}: status did not fit the ioctl buffer")
    text = ""
    if target_count:
        start = data_start + SPEC.size
        end = buf.index(b"\0", start, data_size)
        text = buf[start:end].decode()
    return new_event, text
