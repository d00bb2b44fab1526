// SPDX-License-Identifier: GPL-2.0-only
//! Everything the command logic needs from the running system apart from
//! device-mapper and LVM: block device sizes and numbers, in-use checks,
//! device nodes, the kernel log, the configuration file.

use serde::Serialize;
use std::fs;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use crate::disk::{Access, Dev, ReadAt, WriteAt};
use crate::error::{failure, not_found, Error, Kind, Result};

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BlockDev {
    /// The path the user gave (or the LV path).
    pub path: String,
    pub devno: (u32, u32),
    pub size_bytes: u64,
}

impl BlockDev {
    pub fn devno_str(&self) -> String {
        format!("{}:{}", self.devno.0, self.devno.1)
    }
}

pub trait Host {
    /// Stat a block device node and read its size.
    fn blockdev(&self, path: &str) -> Result<BlockDev>;
    /// Size in bytes of the block device with this number.
    fn size_of_devno(&self, devno: (u32, u32)) -> Result<u64>;
    /// `Some(description)` if the device is mounted, held by another
    /// device, or opened exclusively by someone.
    fn in_use(&self, bd: &BlockDev) -> Result<Option<String>>;
    /// A readable name for a device number: `/dev/dm-3 (vg-lv)`.
    fn describe_devno(&self, devno: (u32, u32)) -> String;
    /// The last kernel log line device-mapper wrote about `devno`, e.g. the
    /// reason a table was refused.
    fn kernel_error(&self, devno: (u32, u32)) -> Option<String>;
    /// Make /dev/mapper/NAME (if udev did not) and /dev/tiercache/NAME.
    fn make_nodes(&self, name: &str, devno: (u32, u32)) -> Result<()>;
    /// Remove what `make_nodes` made (and udev did not clean up).
    fn remove_nodes(&self, name: &str);
    fn read_file(&self, path: &str) -> Result<Option<String>>;
    /// Replace a file atomically.
    fn write_file(&self, path: &str, text: &str) -> Result<()>;
    /// Load a kernel module (best effort).
    fn modprobe(&self, module: &str) -> bool;
    /// Monotonic seconds.
    fn now(&self) -> f64;
    /// Sleep (the fake host only advances its clock).
    fn sleep(&self, secs: f64);
    /// Whether stderr is a terminal (for the progress bar).
    fn stderr_is_tty(&self) -> bool;
    /// Open a block device for reading its tiercache metadata (bypassing
    /// the page cache, which may hold an older superblock than the one the
    /// module last wrote).
    fn open_read(&self, bd: &BlockDev) -> Result<Box<dyn ReadAt>>;
    /// Zero the superblock area of a cache device (exclusive open, synced):
    /// it reads as never formatted afterwards.
    fn clear_superblock(&self, bd: &BlockDev) -> Result<()>;
    /// Open a device node to write its superblock: read-write, exclusive
    /// (O_EXCL: refused while held or mounted), O_DIRECT; its device
    /// number is the open node's (fstat).  For `disk::mark_failed`.
    fn open_exclusive(&self, path: &str) -> Result<Box<dyn WriteAt + '_>>;
    /// A device node of the block device with this number.
    fn node_of_devno(&self, devno: (u32, u32)) -> Option<String>;
    /// Whether stdin is a terminal (someone to ask for a confirmation).
    fn stdin_is_tty(&self) -> bool;
    /// One line of stdin, without its line end; None at the end of input.
    fn read_line(&self) -> Result<Option<String>>;
}

pub struct RealHost;

pub fn udev_running() -> bool {
    Path::new("/run/udev/control").exists()
}

fn sysfs_dev(devno: (u32, u32)) -> String {
    format!("/sys/dev/block/{}:{}", devno.0, devno.1)
}

fn read_trim(p: &str) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

/// Parse /proc/self/mountinfo: mount points of device `maj:min`.
pub fn mounts_of(mountinfo: &str, devno: (u32, u32)) -> Vec<String> {
    let want = format!("{}:{}", devno.0, devno.1);
    mountinfo
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            if f.len() > 4 && f[2] == want {
                Some(f[4].replace("\\040", " "))
            } else {
                None
            }
        })
        .collect()
}

/// Decode one /dev/kmsg record: returns the message text.
fn kmsg_text(rec: &str) -> Option<&str> {
    let (_, msg) = rec.split_once(';')?;
    Some(msg.lines().next().unwrap_or(""))
}

/// From kernel log messages, the last thing device-mapper said about
/// `devno` ("device-mapper: table: 253:3: tiercache: Invalid ..."), with the
/// target's own more detailed line ("device-mapper: tiercache: Invalid block
/// size: 12 (...)") if it came just before.
pub fn dm_reason<'a>(msgs: impl Iterator<Item = &'a str>, devno: (u32, u32)) -> Option<String> {
    let tag = format!("device-mapper: table: {}:{}: ", devno.0, devno.1);
    let detail_tag = "device-mapper: tiercache: ";
    let ioctl = "device-mapper: ioctl: ";
    let mut last = None;
    let mut detail: Option<(usize, String)> = None;
    for (i, m) in msgs.enumerate() {
        if let Some(p) = m.find(&tag) {
            let mut r = m[p + tag.len()..].trim().to_string();
            if let Some((j, d)) = &detail {
                if i - j <= 3 && !r.contains(d.as_str()) {
                    r = format!("{r} [{d}]");
                }
            }
            last = Some(r);
        } else if let Some(p) = m.find(detail_tag) {
            detail = Some((i, m[p + detail_tag.len()..].trim().to_string()));
        } else if let Some(p) = m.find(ioctl) {
            // e.g. "device-mapper: ioctl: error adding target to table"
            if last.is_none() {
                last = Some(m[p + ioctl.len()..].trim().to_string());
            }
        }
    }
    last
}

impl Host for RealHost {
    fn blockdev(&self, path: &str) -> Result<BlockDev> {
        let md = fs::metadata(path).map_err(|e| {
            not_found(format!(
                "{path}: {}",
                e.to_string().split(" (os error").next().unwrap_or("")
            ))
            .hint("give the path of an existing block device")
        })?;
        if !md.file_type().is_block_device() {
            return Err(Error::new(
                Kind::Usage,
                format!("{path}: not a block device"),
            ));
        }
        let rdev = md.rdev();
        let devno = (libc::major(rdev), libc::minor(rdev));
        let size_bytes = self.size_of_devno(devno)?;
        Ok(BlockDev {
            path: path.to_string(),
            devno,
            size_bytes,
        })
    }

    fn size_of_devno(&self, devno: (u32, u32)) -> Result<u64> {
        let p = format!("{}/size", sysfs_dev(devno));
        let s = read_trim(&p)
            .ok_or_else(|| not_found(format!("block device {}:{} not found", devno.0, devno.1)))?;
        let sectors: u64 = s
            .parse()
            .map_err(|_| failure(format!("{p}: unexpected content '{s}'")))?;
        Ok(sectors * 512)
    }

    fn in_use(&self, bd: &BlockDev) -> Result<Option<String>> {
        let holders = format!("{}/holders", sysfs_dev(bd.devno));
        if let Ok(rd) = fs::read_dir(&holders) {
            let mut hs: Vec<String> = vec![];
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                let dmname = read_trim(&format!("/sys/block/{n}/dm/name"));
                hs.push(match dmname {
                    Some(d) => format!("{n} ({d})"),
                    None => n,
                });
            }
            if !hs.is_empty() {
                hs.sort();
                return Ok(Some(format!("held by {}", hs.join(", "))));
            }
        }
        if let Ok(mi) = fs::read_to_string("/proc/self/mountinfo") {
            let m = mounts_of(&mi, bd.devno);
            if !m.is_empty() {
                return Ok(Some(format!("mounted on {}", m.join(", "))));
            }
        }
        match fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_EXCL)
            .open(&bd.path)
        {
            Ok(_) => Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Ok(Some(
                "open exclusively by another program (swap, RAID, filesystem?)".into(),
            )),
            // No node (no udev): the holder and mount checks above stand.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(failure(format!("{}: cannot open: {e}", bd.path))),
        }
    }

    fn describe_devno(&self, devno: (u32, u32)) -> String {
        let base = sysfs_dev(devno);
        let kname = fs::read_link(&base)
            .ok()
            .and_then(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()));
        let dmname = read_trim(&format!("{base}/dm/name"));
        match (kname, dmname) {
            (Some(k), Some(d)) => format!("/dev/{k} ({d})"),
            (Some(k), None) => format!("/dev/{k}"),
            _ => format!("{}:{}", devno.0, devno.1),
        }
    }

    fn kernel_error(&self, devno: (u32, u32)) -> Option<String> {
        let mut f = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/kmsg")
            .ok()?;
        let mut recs: Vec<String> = vec![];
        let mut buf = vec![0u8; 8192];
        loop {
            match f.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    let rec = String::from_utf8_lossy(&buf[..n]).into_owned();
                    if let Some(t) = kmsg_text(&rec) {
                        if t.contains("device-mapper") {
                            recs.push(t.to_string());
                        }
                    }
                }
                // EPIPE: a record was overwritten; keep reading.
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                Err(_) => break,
            }
        }
        // Only messages of the last few seconds are relevant, but kmsg
        // timestamps are in monotonic time; the caller asks right after the
        // failure, so the last matching line is the one.
        dm_reason(recs.iter().rev().take(20).rev().map(|s| s.as_str()), devno)
    }

    fn make_nodes(&self, name: &str, devno: (u32, u32)) -> Result<()> {
        let node = format!("/dev/mapper/{name}");
        if udev_running() {
            // udev makes the node; give it a moment.
            for _ in 0..50 {
                if Path::new(&node).exists() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(40));
            }
        }
        let want = libc::makedev(devno.0, devno.1);
        match fs::metadata(&node) {
            Ok(md) if md.file_type().is_block_device() && md.rdev() == want => {}
            _ => {
                let _ = fs::remove_file(&node);
                let c = std::ffi::CString::new(node.clone()).unwrap();
                // SAFETY: valid C string.
                let r = unsafe { libc::mknod(c.as_ptr(), libc::S_IFBLK | 0o660, want) };
                if r != 0 {
                    return Err(failure(format!(
                        "{name}: cannot create {node}: {}",
                        std::io::Error::last_os_error()
                    )));
                }
            }
        }
        let dir = "/dev/tiercache";
        let _ = fs::create_dir_all(dir);
        let link = format!("{dir}/{name}");
        let target = format!("../mapper/{name}");
        if fs::read_link(&link)
            .ok()
            .map(|t| t.to_string_lossy().into_owned())
            != Some(target.clone())
        {
            let _ = fs::remove_file(&link);
            std::os::unix::fs::symlink(&target, &link)
                .map_err(|e| failure(format!("{name}: cannot create {link}: {e}")))?;
        }
        Ok(())
    }

    fn remove_nodes(&self, name: &str) {
        let link = format!("/dev/tiercache/{name}");
        let _ = fs::remove_file(&link);
        let node = format!("/dev/mapper/{name}");
        if udev_running() {
            for _ in 0..50 {
                if !Path::new(&node).exists() {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(40));
            }
        }
        let _ = fs::remove_file(&node);
    }

    fn read_file(&self, path: &str) -> Result<Option<String>> {
        match fs::read_to_string(path) {
            Ok(s) => Ok(Some(s)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::new(
                Kind::Config,
                format!("{path}: cannot read: {e}"),
            )),
        }
    }

    fn write_file(&self, path: &str, text: &str) -> Result<()> {
        let tmp = format!("{path}.tmp.{}", std::process::id());
        let cfg_err = |e: std::io::Error| {
            Error::new(Kind::Config, format!("{path}: cannot write: {e}"))
                .hint("use --config PATH to keep the list elsewhere")
        };
        fs::write(&tmp, text).map_err(cfg_err)?;
        fs::rename(&tmp, path).map_err(|e| {
            let _ = fs::remove_file(&tmp);
            cfg_err(e)
        })
    }

    fn modprobe(&self, module: &str) -> bool {
        std::process::Command::new("modprobe")
            .arg("-q")
            .arg(module)
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }

    fn now(&self) -> f64 {
        static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        START
            .get_or_init(std::time::Instant::now)
            .elapsed()
            .as_secs_f64()
    }

    fn sleep(&self, secs: f64) {
        std::thread::sleep(std::time::Duration::from_secs_f64(secs.max(0.0)));
    }

    fn stderr_is_tty(&self) -> bool {
        // SAFETY: isatty on a constant fd.
        unsafe { libc::isatty(2) == 1 }
    }

    fn open_read(&self, bd: &BlockDev) -> Result<Box<dyn ReadAt>> {
        // The node the user named, else the kernel's own (no udev links).
        match Dev::open(&bd.path, Access::Read) {
            Ok(d) => Ok(Box::new(d)),
            Err(e) => {
                let alt = format!("/dev/block/{}:{}", bd.devno.0, bd.devno.1);
                Dev::open(&alt, Access::Read)
                    .map(|d| Box::new(d) as Box<dyn ReadAt>)
                    .map_err(|_| e)
            }
        }
    }

    fn clear_superblock(&self, bd: &BlockDev) -> Result<()> {
        let d = Dev::open(&bd.path, Access::WriteExclusive)?;
        d.write_at(0, &vec![0u8; (crate::disk::SB_SECTORS * 512) as usize])?;
        d.sync()
    }

    fn open_exclusive(&self, path: &str) -> Result<Box<dyn WriteAt + '_>> {
        Ok(Box::new(Dev::open(path, Access::WriteExclusive)?))
    }

    fn node_of_devno(&self, devno: (u32, u32)) -> Option<String> {
        let want = libc::makedev(devno.0, devno.1);
        let is_it = |p: &str| {
            fs::metadata(p).is_ok_and(|m| m.file_type().is_block_device() && m.rdev() == want)
        };
        let by_number = format!("/dev/block/{}:{}", devno.0, devno.1);
        if is_it(&by_number) {
            return Some(by_number);
        }
        // No udev links: the kernel's name for it.
        let uevent = fs::read_to_string(format!("{}/uevent", sysfs_dev(devno))).ok()?;
        let name = uevent.lines().find_map(|l| l.strip_prefix("DEVNAME="))?;
        let node = format!("/dev/{name}");
        is_it(&node).then_some(node)
    }

    fn stdin_is_tty(&self) -> bool {
        // SAFETY: isatty on a constant fd.
        unsafe { libc::isatty(0) == 1 }
    }

    fn read_line(&self) -> Result<Option<String>> {
        let mut line = String::new();
        match std::io::stdin().read_line(&mut line) {
            Ok(0) => Ok(None),
            Ok(_) => Ok(Some(line.trim_end_matches(['\n', '\r']).to_string())),
            Err(e) => Err(failure(format!("cannot read stdin: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo() {
        let mi = "22 1 253:3 / /mnt/my\\040dir rw,relatime shared:1 - ext4 /dev/mapper/x rw\n\
                  23 1 8:1 / / rw - ext4 /dev/sda1 rw\n";
        assert_eq!(mounts_of(mi, (253, 3)), vec!["/mnt/my dir"]);
        assert!(mounts_of(mi, (253, 4)).is_empty());
    }

    #[test]
    fn kmsg_reason() {
        let msgs = [
            "device-mapper: table: 253:1: linear: something old",
            "device-mapper: table: 253:3: tiercache: Invalid block size: 12 (power of two from 8 to 2048 sectors)",
            "device-mapper: ioctl: error adding target to table",
        ];
        assert_eq!(
            dm_reason(msgs.iter().copied(), (253, 3)).unwrap(),
            "tiercache: Invalid block size: 12 (power of two from 8 to 2048 sectors)"
        );
        assert_eq!(
            dm_reason(msgs[2..].iter().copied(), (253, 9)).unwrap(),
            "error adding target to table"
        );
        let msgs = [
            "device-mapper: tiercache: Invalid block size: 12 (power of two from 8 to 2048 sectors)",
            "device-mapper: table: 254:0: tiercache: Invalid block size (power of two from 8 to 2048 sectors) (-EINVAL)",
            "device-mapper: ioctl: error adding target to table",
        ];
        assert_eq!(
            dm_reason(msgs.iter().copied(), (254, 0)).unwrap(),
            "tiercache: Invalid block size (power of two from 8 to 2048 sectors) (-EINVAL) \
             [Invalid block size: 12 (power of two from 8 to 2048 sectors)]"
        );
        assert_eq!(
            kmsg_text("3,123,456,-;device-mapper: x\n SUBSYSTEM=block\n"),
            Some("device-mapper: x")
        );
    }
}
