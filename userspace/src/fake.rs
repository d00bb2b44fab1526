// SPDX-License-Identifier: GPL-2.0-only
//! In-memory fakes of device-mapper (with a simulated tiercache target),
//! LVM and the host, for the command tests.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::time::Duration;

use crate::disk::{ReadAt, WriteAt};
use crate::dm::{DevInfo, Dm, Target};
use crate::error::{busy, failure, not_found, Error, Kind, Result};
use crate::host::{BlockDev, Host};
use crate::lvm::{LvInfo, Lvm};
use crate::status::TARGET_TYPE;
use crate::table::TableSpec;

/// Simulated state of a tiercache target.
#[derive(Clone, Debug)]
pub struct Sim {
    pub mode: String,
    pub block_size: u32,
    pub used: u64,
    pub total: u64,
    pub dirty: u64,
    pub state: &'static str,
    pub wb_blocks: u64,
    pub wb_requests: u64,
    pub wb_sectors: u64,
    pub error: i32,
    pub flushes: u64,
    pub cleaner: bool,
    /// Blocks written back per status query while flushing/cleaning.
    pub step: u64,
    /// The next flush fails with this errno after one step.
    pub fail_with: Option<i32>,
    /// New dirty blocks appearing at each status query (foreground load).
    pub incoming: u64,
    /// Field 22: the latched metadata commit error.
    pub meta_error: i32,
    /// Field 23: the cache device error that latched the failed state.
    pub cache_failed: i32,
    /// Fields 24 and 25: the oldest live epoch and the current one (None:
    /// a module without epochs, 23 fields).
    pub epochs: Option<(u64, u64)>,
    /// Print only the first this many status fields (an older module).
    pub nr_fields: Option<usize>,
    pub msgs: Vec<String>,
    /// A full flush already running ends (and counts) once dirty is down to
    /// this many (0: when nothing is dirty).
    pub end_at_dirty: u64,
    /// A flush was asked for while one ran: the target starts it after.
    pub pending_full: bool,
}

impl Sim {
    pub fn new(block_size: u32, total: u64) -> Sim {
        Sim {
            mode: "writeback".into(),
            block_size,
            used: 0,
            total,
            dirty: 0,
            state: "idle",
            wb_blocks: 0,
            wb_requests: 0,
            wb_sectors: 0,
            error: 0,
            flushes: 0,
            cleaner: false,
            step: 100,
            fail_with: None,
            incoming: 0,
            meta_error: 0,
            cache_failed: 0,
            epochs: None,
            nr_fields: None,
            msgs: vec![],
            end_at_dirty: 0,
            pending_full: false,
        }
    }

    fn line(&self) -> String {
        let avg = (self.wb_sectors / 2)
            .checked_div(self.wb_requests)
            .unwrap_or(0);
        let ratio = if self.wb_requests > 0 {
            self.wb_blocks as f64 / self.wb_requests as f64
        } else {
            0.0
        };
        let line = format!(
            "{} {} {}/{} {} 0 0 0 0 0 {} {} {} {} {} {:.2} 0 4 {} {} {} {} {} {}",
            self.mode,
            self.block_size,
            self.used,
            self.total,
            self.dirty,
            self.state,
            self.wb_blocks,
            self.wb_requests,
            self.wb_sectors,
            avg,
            ratio,
            self.error,
            self.flushes,
            if self.cleaner { 1 } else { 0 },
            self.flushes + 2,
            self.meta_error,
            self.cache_failed
        );
        let line = match self.epochs {
            Some((oldest, current)) => format!("{line} {oldest} {current}"),
            None => line,
        };
        match self.nr_fields {
            Some(n) => line.split(' ').take(n).collect::<Vec<_>>().join(" "),
            None => line,
        }
    }

    /// One step of simulated time; returns true if an event is raised.
    fn tick(&mut self) -> bool {
        if !self.cleaner && self.state != "flushing" {
            self.dirty += self.incoming;
            self.used = self.used.max(self.dirty);
        }
        if self.state == "flushing" || (self.cleaner && self.dirty > 0) {
            if let Some(e) = self.fail_with.take() {
                self.error = e;
                self.state = "idle";
                return true;
            }
            let n = self.step.min(self.dirty);
            self.dirty -= n;
            self.wb_blocks += n;
            self.wb_requests += n.div_ceil(256).max(if n > 0 { 1 } else { 0 });
            self.wb_sectors += n * self.block_size as u64;
            if self.state == "flushing" && self.end_at_dirty > 0 && self.dirty <= self.end_at_dirty
            {
                self.flushes += 1;
                self.end_at_dirty = 0;
                if !self.pending_full {
                    self.state = "idle";
                }
                self.pending_full = false;
                return true;
            }
            if self.dirty == 0 && self.state == "flushing" {
                self.state = "idle";
                self.flushes += 1;
                self.error = 0;
                return true;
            }
        }
        false
    }
}

#[derive(Clone, Debug)]
pub struct FakeDev {
    pub info: DevInfo,
    pub table: Vec<Target>,
    pub inactive: Option<Vec<Target>>,
    pub sim: Option<Sim>,
}

/// Something done to the fake device-mapper at a given moment.
pub type DmHook = Box<dyn FnOnce(&FakeDm)>;

#[derive(Default)]
pub struct FakeDm {
    pub devs: RefCell<BTreeMap<String, FakeDev>>,
    pub log: RefCell<Vec<String>>,
    pub next_minor: Cell<u32>,
    pub have_target: Cell<bool>,
    /// Table loads of tiercache tables fail with EINVAL.
    pub reject_tiercache: Cell<bool>,
    /// A status line override (to test the parser's error path).
    pub bad_status: RefCell<Option<String>>,
    /// This many removes fail with EBUSY (a udev probe holding the device).
    pub busy_removes: Cell<u32>,
    /// The next table load fails (whatever the table).
    pub fail_load: Cell<bool>,
    /// The next suspend fails (the device stays as it was).
    pub fail_suspend: Cell<bool>,
    /// This many resumes fail: after swapping in the inactive table if
    /// `fail_resume_after_swap` (the device stays suspended with it, as
    /// when the kernel's dm_resume fails), else before (the swap failed:
    /// the inactive table is dropped, the device stays suspended with its
    /// old table).
    pub fail_resumes: Cell<u32>,
    pub fail_resume_after_swap: Cell<bool>,
    /// Status reads of a suspended device fail.
    pub fail_status_suspended: Cell<bool>,
    /// Run at the next suspend, before the device is suspended: what
    /// changes while the administrator is asked, say.
    pub before_suspend: RefCell<Option<DmHook>>,
}

impl FakeDm {
    pub fn new() -> FakeDm {
        let d = FakeDm::default();
        d.have_target.set(true);
        d.next_minor.set(10);
        d
    }

    /// Add a running tiercache device.
    pub fn add_cached(&self, name: &str, origin: &str, cache: &str, sim: Sim, len: u64) {
        let m = self.next_minor.get();
        self.next_minor.set(m + 1);
        let spec = TableSpec::new(origin, cache, sim.block_size);
        self.devs.borrow_mut().insert(
            name.into(),
            FakeDev {
                info: DevInfo {
                    name: name.into(),
                    uuid: Some(format!("TIERCACHE-{name}")),
                    devno: (253, m),
                    open_count: 0,
                    event_nr: 0,
                    suspended: false,
                    read_only: false,
                    active_table: true,
                    inactive_table: false,
                },
                table: vec![Target::new(0, len, TARGET_TYPE, spec.to_params())],
                inactive: None,
                sim: Some(sim),
            },
        );
    }

    pub fn with<R>(&self, name: &str, f: impl FnOnce(&mut FakeDev) -> R) -> R {
        f(self.devs.borrow_mut().get_mut(name).expect("fake device"))
    }

    fn log(&self, s: String) {
        self.log.borrow_mut().push(s);
    }

    fn nodev(name: &str) -> Error {
        not_found(format!("{name}: no such device-mapper device"))
    }
}

impl Dm for FakeDm {
    fn list(&self) -> Result<Vec<String>> {
        Ok(self.devs.borrow().keys().cloned().collect())
    }
    fn info(&self, name: &str) -> Result<Option<DevInfo>> {
        Ok(self.devs.borrow().get(name).map(|d| {
            let mut i = d.info.clone();
            i.inactive_table = d.inactive.is_some();
            i.active_table = !d.table.is_empty();
            i
        }))
    }
    fn table(&self, name: &str) -> Result<Vec<Target>> {
        let devs = self.devs.borrow();
        let d = devs.get(name).ok_or_else(|| Self::nodev(name))?;
        let mut t = d.table.clone();
        if let (Some(sim), Some(t0)) = (&d.sim, t.first_mut()) {
            if t0.ttype == TARGET_TYPE {
                let mut spec = TableSpec::parse_params(&t0.params).unwrap();
                // Like the kernel: 'format' is not printed back.
                spec.format = false;
                if sim.mode != "writeback" {
                    spec.mode = Some(sim.mode.parse().unwrap());
                }
                t0.params = spec.to_params();
            }
        }
        Ok(t)
    }
    fn status(&self, name: &str) -> Result<Vec<Target>> {
        let mut devs = self.devs.borrow_mut();
        let d = devs.get_mut(name).ok_or_else(|| Self::nodev(name))?;
        if d.info.suspended && self.fail_status_suspended.get() {
            return Err(failure(format!("{name}: status: Input/output error")));
        }
        let Some(t) = d.table.first().cloned() else {
            return Ok(vec![]);
        };
        if t.ttype != TARGET_TYPE {
            return Ok(vec![Target::new(t.start, t.len, &t.ttype, String::new())]);
        }
        let sim = d.sim.as_mut().unwrap();
        if !d.info.suspended && sim.tick() {
            d.info.event_nr += 1;
        }
        let line = self
            .bad_status
            .borrow()
            .clone()
            .unwrap_or_else(|| sim.line());
        Ok(vec![Target::new(t.start, t.len, TARGET_TYPE, line)])
    }
    fn create(&self, name: &str, uuid: Option<&str>) -> Result<DevInfo> {
        if self.devs.borrow().contains_key(name) {
            return Err(busy(format!("{name}: exists")));
        }
        let m = self.next_minor.get();
        self.next_minor.set(m + 1);
        let info = DevInfo {
            name: name.into(),
            uuid: uuid.map(String::from),
            devno: (253, m),
            open_count: 0,
            event_nr: 0,
            suspended: true,
            read_only: false,
            active_table: false,
            inactive_table: false,
        };
        self.devs.borrow_mut().insert(
            name.into(),
            FakeDev {
                info: info.clone(),
                table: vec![],
                inactive: None,
                sim: None,
            },
        );
        self.log(format!("create {name}"));
        Ok(info)
    }
    fn load(&self, name: &str, targets: &[Target]) -> Result<()> {
        self.log(format!(
            "load {name} {}",
            targets
                .iter()
                .map(|t| format!("{} {} {} {}", t.start, t.len, t.ttype, t.params))
                .collect::<Vec<_>>()
                .join(";")
        ));
        if self.fail_load.replace(false) {
            return Err(failure(format!("{name}: table load failed: ENOMEM")));
        }
        if targets.iter().any(|t| t.ttype == TARGET_TYPE) && self.reject_tiercache.get() {
            return Err(Error::new(
                Kind::Failure,
                format!("{name}: table load failed: EINVAL"),
            ));
        }
        let mut devs = self.devs.borrow_mut();
        let d = devs.get_mut(name).ok_or_else(|| Self::nodev(name))?;
        d.inactive = Some(targets.to_vec());
        Ok(())
    }
    fn clear_inactive(&self, name: &str) -> Result<()> {
        self.log(format!("clear {name}"));
        let mut devs = self.devs.borrow_mut();
        devs.get_mut(name)
            .ok_or_else(|| Self::nodev(name))?
            .inactive = None;
        Ok(())
    }
    fn suspend(&self, name: &str, flush: bool) -> Result<()> {
        self.log(format!(
            "suspend {name}{}",
            if flush { "" } else { " noflush" }
        ));
        let hook = self.before_suspend.borrow_mut().take();
        if let Some(f) = hook {
            f(self);
        }
        if self.fail_suspend.replace(false) {
            return Err(failure(format!("{name}: suspend: Input/output error")));
        }
        let mut devs = self.devs.borrow_mut();
        devs.get_mut(name)
            .ok_or_else(|| Self::nodev(name))?
            .info
            .suspended = true;
        Ok(())
    }
    fn resume(&self, name: &str) -> Result<()> {
        self.log(format!("resume {name}"));
        let mut devs = self.devs.borrow_mut();
        let d = devs.get_mut(name).ok_or_else(|| Self::nodev(name))?;
        let fail = self.fail_resumes.get() > 0;
        if fail {
            self.fail_resumes.set(self.fail_resumes.get() - 1);
        }
        if fail && !self.fail_resume_after_swap.get() {
            d.inactive = None;
            return Err(failure(format!("{name}: resume: Invalid argument")));
        }
        if let Some(t) = d.inactive.take() {
            if let Some(first) = t.first() {
                if first.ttype == TARGET_TYPE {
                    let spec = TableSpec::parse_params(&first.params).unwrap();
                    let sim = d.sim.get_or_insert_with(|| Sim::new(spec.block_size, 1024));
                    sim.mode = spec
                        .mode
                        .map(|m| m.as_str().to_string())
                        .unwrap_or("writeback".into());
                } else {
                    d.sim = None;
                }
            }
            d.table = t;
        }
        if fail {
            return Err(failure(format!("{name}: resume: Input/output error")));
        }
        d.info.suspended = false;
        Ok(())
    }
    fn remove(&self, name: &str) -> Result<()> {
        self.log(format!("remove {name}"));
        let mut devs = self.devs.borrow_mut();
        let d = devs.get(name).ok_or_else(|| Self::nodev(name))?;
        if self.busy_removes.get() > 0 {
            self.busy_removes.set(self.busy_removes.get() - 1);
            return Err(busy(format!("{name}: remove: device or resource busy")));
        }
        if d.info.open_count > 0 {
            return Err(busy(format!("{name}: remove: device or resource busy")));
        }
        devs.remove(name);
        Ok(())
    }
    fn message(&self, name: &str, msg: &str) -> Result<Option<String>> {
        self.log(format!("message {name} {msg}"));
        let mut devs = self.devs.borrow_mut();
        let d = devs.get_mut(name).ok_or_else(|| Self::nodev(name))?;
        let sim = d.sim.as_mut().ok_or_else(|| failure("not tiercache"))?;
        sim.msgs.push(msg.into());
        match msg {
            "flush" => {
                if sim.state == "flushing" {
                    sim.pending_full = true;
                }
                sim.state = "flushing";
            }
            "cleaner on" => sim.cleaner = true,
            "cleaner off" => sim.cleaner = false,
            _ => {}
        }
        Ok(None)
    }
    fn wait_event(&self, _timeout: Duration) -> Result<()> {
        Ok(())
    }
    fn target_types(&self) -> Result<Vec<String>> {
        let mut v = vec!["linear".to_string(), "striped".into()];
        if self.have_target.get() {
            v.push(TARGET_TYPE.into());
        }
        Ok(v)
    }
}

#[derive(Default)]
pub struct FakeHost {
    pub devs: RefCell<BTreeMap<String, BlockDev>>,
    pub sizes: RefCell<BTreeMap<(u32, u32), u64>>,
    pub users: RefCell<BTreeMap<(u32, u32), String>>,
    pub files: RefCell<BTreeMap<String, String>>,
    pub nodes: RefCell<Vec<String>>,
    pub clock: Cell<f64>,
    pub kmsg: RefCell<Option<String>>,
    pub readonly_files: Cell<bool>,
    /// Content of block devices by path (the start of it: the rest reads
    /// as zeros).  A device without an image is blank.
    pub images: RefCell<BTreeMap<String, Vec<u8>>>,
    /// Devices whose superblock was cleared.
    pub cleared: RefCell<Vec<String>>,
    /// Devices whose superblock was written (marked failed) through
    /// `open_exclusive`.
    pub marked: RefCell<Vec<String>>,
    /// Writes to the superblock fail (a cache device that failed).
    pub sb_write_error: Cell<bool>,
    /// Reads through `open_exclusive` fail (a cache device that failed).
    pub sb_read_error: Cell<bool>,
    /// The device number a node opened by `open_exclusive` has, if not
    /// the one `devs` gives (the node now names another device).
    pub node_devno: RefCell<BTreeMap<String, (u32, u32)>>,
    pub stdin_tty: Cell<bool>,
    /// What stdin holds, line by line.
    pub stdin: RefCell<std::collections::VecDeque<String>>,
}

/// A device image opened by `open_exclusive`: reads and writes go to
/// `FakeHost::images`.
struct FakeWriteDev<'h> {
    host: &'h FakeHost,
    path: String,
    devno: Option<(u32, u32)>,
    size: u64,
}

impl ReadAt for FakeWriteDev<'_> {
    fn name(&self) -> &str {
        &self.path
    }
    fn size_bytes(&self) -> u64 {
        self.size
    }
    fn read_at(&self, off: u64, len: usize) -> Result<Vec<u8>> {
        if self.host.sb_read_error.get() {
            return Err(Error::new(
                Kind::Unreadable,
                format!(
                    "{}: read error at byte {off}: Input/output error",
                    self.path
                ),
            ));
        }
        let img = self.host.images.borrow()[&self.path].clone();
        SparseImage {
            name: self.path.clone(),
            size: self.size,
            data: img,
        }
        .read_at(off, len)
    }
}

impl WriteAt for FakeWriteDev<'_> {
    fn write_at(&self, off: u64, data: &[u8]) -> Result<()> {
        if self.host.sb_write_error.get() {
            return Err(Error::new(
                Kind::Unreadable,
                format!(
                    "{}: write error at byte {off}: Input/output error",
                    self.path
                ),
            ));
        }
        let mut images = self.host.images.borrow_mut();
        let img = images.get_mut(&self.path).unwrap();
        let end = off as usize + data.len();
        if img.len() < end {
            img.resize(end, 0);
        }
        img[off as usize..end].copy_from_slice(data);
        if off == 0 {
            self.host.marked.borrow_mut().push(self.path.clone());
        }
        Ok(())
    }
    fn sync(&self) -> Result<()> {
        Ok(())
    }
    fn devno(&self) -> Option<(u32, u32)> {
        self.devno
    }
}

/// A device image: `data`, then zeros up to `size`.
struct SparseImage {
    name: String,
    size: u64,
    data: Vec<u8>,
}

impl ReadAt for SparseImage {
    fn name(&self) -> &str {
        &self.name
    }
    fn size_bytes(&self) -> u64 {
        self.size
    }
    fn read_at(&self, off: u64, len: usize) -> Result<Vec<u8>> {
        if off + len as u64 > self.size {
            return Err(Error::new(
                Kind::Unreadable,
                format!("{}: read beyond the end", self.name),
            ));
        }
        let mut v = vec![0u8; len];
        let o = off as usize;
        if o < self.data.len() {
            let n = len.min(self.data.len() - o);
            v[..n].copy_from_slice(&self.data[o..o + n]);
        }
        Ok(v)
    }
}

impl FakeHost {
    pub fn add_dev(&self, path: &str, devno: (u32, u32), size: u64) {
        self.devs.borrow_mut().insert(
            path.into(),
            BlockDev {
                path: path.into(),
                devno,
                size_bytes: size,
            },
        );
        self.sizes.borrow_mut().insert(devno, size);
    }
}

impl Host for FakeHost {
    fn blockdev(&self, path: &str) -> Result<BlockDev> {
        self.devs
            .borrow()
            .get(path)
            .cloned()
            .ok_or_else(|| not_found(format!("{path}: No such file or directory")))
    }
    fn size_of_devno(&self, devno: (u32, u32)) -> Result<u64> {
        self.sizes
            .borrow()
            .get(&devno)
            .copied()
            .ok_or_else(|| not_found("no such devno"))
    }
    fn in_use(&self, bd: &BlockDev) -> Result<Option<String>> {
        Ok(self.users.borrow().get(&bd.devno).cloned())
    }
    fn describe_devno(&self, devno: (u32, u32)) -> String {
        format!("dev{}:{}", devno.0, devno.1)
    }
    fn kernel_error(&self, _devno: (u32, u32)) -> Option<String> {
        self.kmsg.borrow().clone()
    }
    fn make_nodes(&self, name: &str, _devno: (u32, u32)) -> Result<()> {
        self.nodes.borrow_mut().push(name.into());
        Ok(())
    }
    fn remove_nodes(&self, name: &str) {
        self.nodes.borrow_mut().retain(|n| n != name);
    }
    fn read_file(&self, path: &str) -> Result<Option<String>> {
        Ok(self.files.borrow().get(path).cloned())
    }
    fn write_file(&self, path: &str, text: &str) -> Result<()> {
        if self.readonly_files.get() {
            return Err(Error::new(
                Kind::Config,
                format!("{path}: cannot write: Read-only file system"),
            ));
        }
        self.files.borrow_mut().insert(path.into(), text.into());
        Ok(())
    }
    fn modprobe(&self, _module: &str) -> bool {
        false
    }
    fn now(&self) -> f64 {
        self.clock.get()
    }
    fn sleep(&self, secs: f64) {
        self.clock.set(self.clock.get() + secs.max(0.05));
    }
    fn stderr_is_tty(&self) -> bool {
        false
    }
    fn clear_superblock(&self, bd: &BlockDev) -> Result<()> {
        self.cleared.borrow_mut().push(bd.path.clone());
        if let Some(img) = self.images.borrow_mut().get_mut(&bd.path) {
            let n = img.len().min(4096);
            img[..n].fill(0);
        }
        Ok(())
    }
    fn open_exclusive(&self, path: &str) -> Result<Box<dyn WriteAt + '_>> {
        if !self.images.borrow().contains_key(path) {
            return Err(Error::new(
                Kind::Unreadable,
                format!("{path}: cannot open: No such file or directory"),
            ));
        }
        let devno = self
            .node_devno
            .borrow()
            .get(path)
            .copied()
            .or_else(|| self.devs.borrow().get(path).map(|d| d.devno));
        if let Some(how) = devno.and_then(|d| self.users.borrow().get(&d).cloned()) {
            return Err(busy(format!("{path}: in use ({how})")));
        }
        let size = devno
            .and_then(|d| self.sizes.borrow().get(&d).copied())
            .unwrap_or_else(|| self.images.borrow()[path].len() as u64);
        Ok(Box::new(FakeWriteDev {
            host: self,
            path: path.into(),
            devno,
            size,
        }))
    }
    fn node_of_devno(&self, devno: (u32, u32)) -> Option<String> {
        self.devs
            .borrow()
            .values()
            .find(|d| d.devno == devno)
            .map(|d| d.path.clone())
    }
    fn stdin_is_tty(&self) -> bool {
        self.stdin_tty.get()
    }
    fn read_line(&self) -> Result<Option<String>> {
        Ok(self.stdin.borrow_mut().pop_front())
    }
    fn open_read(&self, bd: &BlockDev) -> Result<Box<dyn ReadAt>> {
        Ok(Box::new(SparseImage {
            name: bd.path.clone(),
            size: bd.size_bytes,
            data: self
                .images
                .borrow()
                .get(&bd.path)
                .cloned()
                .unwrap_or_default(),
        }))
    }
}

#[derive(Default)]
pub struct FakeLvm {
    /// The process dies (panics) at the first unmark of a tag.
    pub die_on_unmark: Cell<bool>,
    /// `lvs` fails (a lock timeout, say).
    pub fail_all: Cell<bool>,
    pub lvs: RefCell<Vec<LvInfo>>,
    pub log: RefCell<Vec<String>>,
    /// Device number an LV gets when activated.
    pub planned: RefCell<BTreeMap<String, (u32, u32)>>,
}

impl FakeLvm {
    /// Add an LV with the device number it has while active.
    pub fn add(&self, host: &FakeHost, vg: &str, lv: &str, size: u64, d: (u32, u32), active: bool) {
        host.add_dev(&format!("/dev/{vg}/{lv}"), d, size);
        self.planned.borrow_mut().insert(format!("{vg}/{lv}"), d);
        let devno = if active { Some(d) } else { None };
        self.lvs.borrow_mut().push(LvInfo {
            vg: vg.into(),
            lv: lv.into(),
            path: format!("/dev/{vg}/{lv}"),
            dm_path: format!("/dev/mapper/{vg}-{lv}"),
            size_bytes: size,
            attr: "-wi-a-----".into(),
            active: devno.is_some(),
            devno,
            tags: vec![],
            skip_activation: false,
        });
    }
    pub fn get(&self, vg: &str, lv: &str) -> LvInfo {
        self.lvs
            .borrow()
            .iter()
            .find(|l| l.vg == vg && l.lv == lv)
            .unwrap()
            .clone()
    }
}

impl Lvm for FakeLvm {
    fn lv(&self, vg: &str, lv: &str) -> Result<Option<LvInfo>> {
        Ok(self
            .lvs
            .borrow()
            .iter()
            .find(|l| l.vg == vg && l.lv == lv)
            .cloned())
    }
    fn all(&self) -> Result<Vec<LvInfo>> {
        if self.fail_all.get() {
            return Err(failure("lvs: lock timeout"));
        }
        Ok(self.lvs.borrow().clone())
    }
    fn activate(&self, vg: &str, lv: &str) -> Result<()> {
        self.log.borrow_mut().push(format!("activate {vg}/{lv}"));
        let mut lvs = self.lvs.borrow_mut();
        let l = lvs
            .iter_mut()
            .find(|l| l.vg == vg && l.lv == lv)
            .ok_or_else(|| not_found("lv"))?;
        l.devno = self.planned.borrow().get(&format!("{vg}/{lv}")).copied();
        l.active = true;
        Ok(())
    }
    fn deactivate(&self, vg: &str, lv: &str) -> Result<()> {
        self.log.borrow_mut().push(format!("deactivate {vg}/{lv}"));
        let mut lvs = self.lvs.borrow_mut();
        let l = lvs
            .iter_mut()
            .find(|l| l.vg == vg && l.lv == lv)
            .ok_or_else(|| not_found("lv"))?;
        l.active = false;
        l.devno = None;
        Ok(())
    }
    fn mark(&self, vg: &str, lv: &str, tag: &str, on: bool) -> Result<()> {
        self.log
            .borrow_mut()
            .push(format!("mark {vg}/{lv} {tag} {on}"));
        if !on && self.die_on_unmark.get() {
            panic!("killed");
        }
        let mut lvs = self.lvs.borrow_mut();
        let l = lvs
            .iter_mut()
            .find(|l| l.vg == vg && l.lv == lv)
            .ok_or_else(|| not_found("lv"))?;
        l.tags.retain(|t| t != tag);
        if on {
            l.tags.push(tag.into());
        }
        l.skip_activation = on;
        Ok(())
    }
    fn remove(&self, vg: &str, lv: &str) -> Result<()> {
        self.log.borrow_mut().push(format!("remove {vg}/{lv}"));
        self.lvs
            .borrow_mut()
            .retain(|l| !(l.vg == vg && l.lv == lv));
        Ok(())
    }
}
