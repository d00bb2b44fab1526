// SPDX-License-Identifier: GPL-2.0-only
//! The device-mapper layer, behind a small trait so that everything above it
//! can be tested on the host without a kernel.  The real implementation
//! talks to /dev/mapper/control through the `devicemapper` crate (ioctls,
//! no dmsetup text scraping).

use serde::Serialize;
use std::time::Duration;

use crate::error::{busy, errno_name, failure, not_found, Error, Kind, Result};

/// Wait (30 s at most) until udev has handled the events it has queued;
/// nothing to do where udevadm is missing or udev does not run.
fn settle_udev() {
    let _ = std::process::Command::new("udevadm")
        .args(["settle", "--timeout=30"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DevInfo {
    pub name: String,
    pub uuid: Option<String>,
    pub devno: (u32, u32),
    pub open_count: i32,
    pub event_nr: u32,
    pub suspended: bool,
    pub read_only: bool,
    pub active_table: bool,
    pub inactive_table: bool,
}

/// One target of a table or status: `<start> <len> <type> <params>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Target {
    pub start: u64,
    pub len: u64,
    pub ttype: String,
    pub params: String,
}

impl Target {
    pub fn new(start: u64, len: u64, ttype: &str, params: String) -> Target {
        Target {
            start,
            len,
            ttype: ttype.into(),
            params,
        }
    }
}

pub trait Dm {
    /// Names of all device-mapper devices.
    fn list(&self) -> Result<Vec<String>>;
    /// `None` if there is no device of that name.
    fn info(&self, name: &str) -> Result<Option<DevInfo>>;
    /// The active table.
    fn table(&self, name: &str) -> Result<Vec<Target>>;
    /// The status of the active table.
    fn status(&self, name: &str) -> Result<Vec<Target>>;
    /// Create a device without a table.
    fn create(&self, name: &str, uuid: Option<&str>) -> Result<DevInfo>;
    /// Load a table into the inactive slot.
    fn load(&self, name: &str, targets: &[Target]) -> Result<()>;
    fn clear_inactive(&self, name: &str) -> Result<()>;
    /// Suspend; `flush` = wait for in-flight IO (no DM_NOFLUSH).
    fn suspend(&self, name: &str, flush: bool) -> Result<()>;
    /// Suspend waiting for in-flight IO, without freezing a file system on
    /// the device (DM_SKIP_LOCKFS): its sync would write dirty pages to a
    /// device that fails them, and the suspend would fail with their error.
    fn suspend_nolockfs(&self, name: &str) -> Result<()> {
        self.suspend(name, true)
    }
    /// Resume (swapping in the inactive table if there is one).
    fn resume(&self, name: &str) -> Result<()>;
    fn remove(&self, name: &str) -> Result<()>;
    /// Send a target message to sector 0.
    fn message(&self, name: &str, msg: &str) -> Result<Option<String>>;
    /// Block until some device-mapper event happens or `timeout` passes.
    fn wait_event(&self, timeout: Duration) -> Result<()>;
    /// Names of the registered target types.
    fn target_types(&self) -> Result<Vec<String>>;
}

/// errno of a failed ioctl, if that is what the crate returned.
fn ioctl_errno(e: &devicemapper::DmError) -> Option<i32> {
    match e {
        devicemapper::DmError::Core(devicemapper::errors::Error::Ioctl(_, _, _, errno)) => {
            Some(**errno as i32)
        }
        _ => None,
    }
}

/// Map a crate error to ours, naming the device and the operation.
fn map_err(e: devicemapper::DmError, name: &str, op: &str) -> Error {
    match ioctl_errno(&e) {
        // the target could not open a device its table names
        Some(n @ (libc::ENXIO | libc::ENODEV)) if op == "table load" => not_found(format!(
            "{name}: {op} failed: a device the table names does not exist ({})",
            errno_name(n)
        ))
        .hint("check the origin and cache device paths ('lsblk')"),
        Some(libc::ENXIO) | Some(libc::ENODEV) => {
            not_found(format!("{name}: no such device-mapper device"))
                .hint("'tiercache list' shows the cached devices")
        }
        Some(libc::EBUSY) => busy(format!("{name}: {op}: device or resource busy")),
        Some(libc::EEXIST) => busy(format!(
            "{name}: a device-mapper device of that name already exists"
        ))
        .hint("choose another name, or remove the existing device first"),
        Some(libc::EACCES) | Some(libc::EPERM) => {
            failure(format!("{name}: {op}: permission denied")).hint("run as root")
        }
        Some(n) => Error::new(
            Kind::Failure,
            format!("{name}: {op} failed: {}", errno_name(n)),
        ),
        None => failure(format!("{name}: {op} failed: {e}")),
    }
}

pub struct KernelDm {
    dm: devicemapper::DM,
}

impl KernelDm {
    pub fn open() -> Result<KernelDm> {
        let dm = devicemapper::DM::new().map_err(|e| {
            failure(format!("cannot open /dev/mapper/control: {e}"))
                .hint("run as root, with the dm-mod module loaded ('modprobe dm-mod')")
        })?;
        Ok(KernelDm { dm })
    }
}

fn dm_name(name: &str) -> Result<&devicemapper::DmName> {
    devicemapper::DmName::new(name)
        .map_err(|_| crate::error::usage(format!("'{name}' is not a valid device-mapper name")))
}

fn to_info(i: &devicemapper::DeviceInfo, fallback_name: &str) -> DevInfo {
    use devicemapper::DmFlags;
    let f = i.flags();
    let d = i.device();
    DevInfo {
        name: i
            .name()
            .map(|n| n.to_string())
            .unwrap_or_else(|| fallback_name.to_string()),
        uuid: i.uuid().map(|u| u.to_string()).filter(|u| !u.is_empty()),
        devno: (d.major, d.minor),
        open_count: i.open_count(),
        event_nr: i.event_nr(),
        suspended: f.contains(DmFlags::DM_SUSPEND),
        read_only: f.contains(DmFlags::DM_READONLY),
        active_table: f.contains(DmFlags::DM_ACTIVE_PRESENT),
        inactive_table: f.contains(DmFlags::DM_INACTIVE_PRESENT),
    }
}

fn to_targets(v: Vec<(u64, u64, String, String)>) -> Vec<Target> {
    v.into_iter()
        .map(|(start, len, ttype, params)| Target {
            start,
            len,
            ttype,
            params,
        })
        .collect()
}

impl Dm for KernelDm {
    fn list(&self) -> Result<Vec<String>> {
        let v = self
            .dm
            .list_devices()
            .map_err(|e| map_err(e, "device-mapper", "list"))?;
        let mut names: Vec<String> = v.into_iter().map(|(n, _, _)| n.to_string()).collect();
        names.sort();
        Ok(names)
    }

    fn info(&self, name: &str) -> Result<Option<DevInfo>> {
        let id = devicemapper::DevId::Name(dm_name(name)?);
        match self.dm.device_info(&id) {
            Ok(i) => Ok(Some(to_info(&i, name))),
            Err(e) if matches!(ioctl_errno(&e), Some(libc::ENXIO) | Some(libc::ENODEV)) => Ok(None),
            Err(e) => Err(map_err(e, name, "info")),
        }
    }

    fn table(&self, name: &str) -> Result<Vec<Target>> {
        let id = devicemapper::DevId::Name(dm_name(name)?);
        let opts =
            devicemapper::DmOptions::default().set_flags(devicemapper::DmFlags::DM_STATUS_TABLE);
        let (_, t) = self
            .dm
            .table_status(&id, opts)
            .map_err(|e| map_err(e, name, "table"))?;
        Ok(to_targets(t))
    }

    fn status(&self, name: &str) -> Result<Vec<Target>> {
        let id = devicemapper::DevId::Name(dm_name(name)?);
        let opts = devicemapper::DmOptions::default().set_flags(devicemapper::DmFlags::DM_NOFLUSH);
        let (_, t) = self
            .dm
            .table_status(&id, opts)
            .map_err(|e| map_err(e, name, "status"))?;
        Ok(to_targets(t))
    }

    fn create(&self, name: &str, uuid: Option<&str>) -> Result<DevInfo> {
        let n = dm_name(name)?;
        let u = match uuid {
            Some(u) => Some(devicemapper::DmUuid::new(u).map_err(|_| {
                crate::error::usage(format!("'{u}' is not a valid device-mapper uuid"))
            })?),
            None => None,
        };
        let i = self
            .dm
            .device_create(n, u, devicemapper::DmOptions::default())
            .map_err(|e| map_err(e, name, "create"))?;
        Ok(to_info(&i, name))
    }

    fn load(&self, name: &str, targets: &[Target]) -> Result<()> {
        let id = devicemapper::DevId::Name(dm_name(name)?);
        let t: Vec<(u64, u64, String, String)> = targets
            .iter()
            .map(|t| (t.start, t.len, t.ttype.clone(), t.params.clone()))
            .collect();
        self.dm
            .table_load(&id, &t, devicemapper::DmOptions::default())
            .map_err(|e| map_err(e, name, "table load"))?;
        Ok(())
    }

    fn clear_inactive(&self, name: &str) -> Result<()> {
        let id = devicemapper::DevId::Name(dm_name(name)?);
        self.dm
            .table_clear(&id)
            .map_err(|e| map_err(e, name, "table clear"))?;
        Ok(())
    }

    fn suspend(&self, name: &str, flush: bool) -> Result<()> {
        use devicemapper::DmFlags;
        let id = devicemapper::DevId::Name(dm_name(name)?);
        let mut f = DmFlags::DM_SUSPEND;
        if !flush {
            f |= DmFlags::DM_NOFLUSH;
        }
        self.dm
            .device_suspend(&id, devicemapper::DmOptions::default().set_flags(f))
            .map_err(|e| map_err(e, name, "suspend"))?;
        Ok(())
    }

    fn suspend_nolockfs(&self, name: &str) -> Result<()> {
        use devicemapper::DmFlags;
        let id = devicemapper::DevId::Name(dm_name(name)?);
        let f = DmFlags::DM_SUSPEND | DmFlags::DM_SKIP_LOCKFS;
        self.dm
            .device_suspend(&id, devicemapper::DmOptions::default().set_flags(f))
            .map_err(|e| map_err(e, name, "suspend"))?;
        Ok(())
    }

    fn resume(&self, name: &str) -> Result<()> {
        let id = devicemapper::DevId::Name(dm_name(name)?);
        self.dm
            .device_suspend(&id, devicemapper::DmOptions::default())
            .map_err(|e| map_err(e, name, "resume"))?;
        Ok(())
    }

    fn remove(&self, name: &str) -> Result<()> {
        let id = devicemapper::DevId::Name(dm_name(name)?);
        // A uevent (a resume, closing the device after writing it) makes
        // udev open the device for a moment: retry EBUSY for a while, as
        // `dmsetup remove --retry` does.  A busy udev gets to such an event
        // late, after a backlog (LVM's rules scan every new device): wait
        // for its queue to drain first.
        let mut tries = 0;
        loop {
            match self
                .dm
                .device_remove(&id, devicemapper::DmOptions::default())
            {
                Ok(_) => return Ok(()),
                Err(e) if ioctl_errno(&e) == Some(libc::EBUSY) && tries < 50 => {
                    if tries == 0 {
                        settle_udev();
                    }
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => return Err(map_err(e, name, "remove")),
            }
        }
    }

    fn message(&self, name: &str, msg: &str) -> Result<Option<String>> {
        let id = devicemapper::DevId::Name(dm_name(name)?);
        let (_, out) = self
            .dm
            .target_msg(&id, None, msg)
            .map_err(|e| map_err(e, name, &format!("message '{msg}'")))?;
        Ok(out)
    }

    fn wait_event(&self, timeout: Duration) -> Result<()> {
        use std::os::unix::io::AsRawFd;
        let mut pfd = libc::pollfd {
            fd: self.dm.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        if r > 0 {
            // Re-arm: the control device stays readable until told otherwise.
            let _ = self.dm.arm_poll();
        }
        Ok(())
    }

    fn target_types(&self) -> Result<Vec<String>> {
        let v = self
            .dm
            .list_versions()
            .map_err(|e| map_err(e, "device-mapper", "list versions"))?;
        Ok(v.into_iter().map(|(n, _, _, _)| n).collect())
    }
}
