// SPDX-License-Identifier: GPL-2.0-only
//! The commands.  Everything here goes through the `Dm`, `Host` and `Lvm`
//! traits, so it runs against fakes in `cargo test`.

use serde::Serialize;
use std::cell::RefCell;
use std::io::Write;

use crate::config::{self, DevRef, Entry, Options};
use crate::disk::{self, SbRead, SbState, Survey};
use crate::dm::{DevInfo, Dm, Target};
use crate::error::{busy, failure, not_found, usage, Error, Kind, Result};
use crate::host::{BlockDev, Host};
use crate::lvm::{self, LvInfo, Lvm};
use crate::progress::{self, Meter, ProgressMode};
use crate::status::{FlushState, Mode, Status, TARGET_TYPE};
use crate::table::{self, Key, TableSpec};
use crate::units::{fmt_bytes, fmt_duration, fmt_pct};

/// Devices made by this tool carry a DM uuid with this prefix; it survives
/// `detach` (which swaps in a linear table) and lets `list` find them.
pub const UUID_PREFIX: &str = "TIERCACHE-";

pub struct Ctx<'a> {
    pub dm: &'a dyn Dm,
    pub host: &'a dyn Host,
    pub lvm: &'a dyn Lvm,
    pub config_path: String,
    pub out: RefCell<Box<dyn Write + 'a>>,
    pub err: RefCell<Box<dyn Write + 'a>>,
}

macro_rules! outln {
    ($c:expr, $($a:tt)*) => {{ let _ = writeln!($c.out.borrow_mut(), $($a)*); }};
}
macro_rules! errln {
    ($c:expr, $($a:tt)*) => {{ let _ = writeln!($c.err.borrow_mut(), $($a)*); }};
}

/// A device with an active tiercache table.
#[derive(Clone, Debug, Serialize)]
pub struct CacheDev {
    pub info: DevInfo,
    pub start: u64,
    pub len: u64,
    pub table: TableSpec,
    pub status: Status,
}

#[derive(Clone, Debug)]
pub enum DevKind {
    Cached(Box<CacheDev>),
    /// Made by this tool, now a linear mapping of its origin (after detach).
    Detached {
        info: DevInfo,
        table: Vec<Target>,
    },
    /// Some other device-mapper device.
    Other {
        info: DevInfo,
        table: Vec<Target>,
    },
}

/// What `create`, `attach` and `activate` need to build a device.
#[derive(Clone, Debug)]
pub struct Setup {
    pub name: String,
    pub origin: DevRef,
    pub cache: DevRef,
    pub options: Options,
}

/// Whether setting a device up may format its cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FormatPolicy {
    /// `create`, `attach`: a blank cache is formatted, a valid and
    /// matching one is loaded, anything else is refused.
    Auto,
    /// `activate` (boot): a blank cache is refused too.
    Never,
    /// `--format`: a fresh format, refused while dirty data exists.
    Force,
}

impl FormatPolicy {
    pub fn auto_or_force(format: bool) -> FormatPolicy {
        if format {
            FormatPolicy::Force
        } else {
            FormatPolicy::Auto
        }
    }
}

/// What the table does with the cache's metadata.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetaAction {
    /// Load it (no `format` argument).
    Load { commit_seq: u64 },
    /// Format the cache (`format` argument); `clear`: zero its superblock
    /// first (one of another geometry, which the module does not format
    /// over; the geometry of a superblock is its own version's layout).
    Format { clear: bool },
}

/// A device set up by `Ctx::setup`.
#[derive(Clone, Debug)]
pub struct SetupDone {
    pub info: DevInfo,
    pub origin_lv: Option<LvInfo>,
    pub cache_lv: Option<LvInfo>,
    /// "cache X formatted" or "cache X loaded ...: N dirty".
    pub meta_note: String,
}

#[derive(Clone, Copy, Debug)]
pub struct FlushOpts {
    /// Seconds; `None` waits for ever.
    pub timeout: Option<f64>,
    pub progress: ProgressMode,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct FlushSummary {
    pub dirty_bytes_at_start: u64,
    pub seconds: f64,
    pub wb_blocks: u64,
    pub wb_requests: u64,
    pub wb_sectors: u64,
    pub bridged_blocks: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DetachCache {
    /// Keep the cache LV (the default, like --split).
    Split,
    /// Remove the cache LV.
    Uncache,
}

fn uuid_for(name: &str) -> String {
    format!("{UUID_PREFIX}{name}")
}

/// The offline command that marks the superblock of the cache device
/// `dev` failed, for the device of dm uuid `uuid` and length
/// `origin_sectors`.
fn mark_failed_command(uuid: Option<&str>, origin_sectors: u64, dev: &str) -> String {
    let u = uuid.unwrap_or("");
    let plain = !u.is_empty()
        && u.chars()
            .all(|c| c.is_ascii_alphanumeric() || "._+-:#".contains(c));
    let u = if plain {
        u.to_string()
    } else {
        format!("'{u}'")
    };
    format!("tiercache check --mark-failed --uuid {u} --origin-sectors {origin_sectors} {dev}")
}

/// The linear mapping of the origin of `cd`, over the same range.
/// `e`, from a step after which `name` could not be resumed (`r`): the
/// hint says it is left suspended.
fn left_suspended(name: &str, e: Error, r: &Error) -> Error {
    e.hint(format!(
        "resuming it failed too ({}): it is left suspended, and IO to it waits; try 'dmsetup resume {name}'",
        r.msg
    ))
}

fn linear_of(cd: &CacheDev) -> [Target; 1] {
    [Target::new(
        cd.start,
        cd.len,
        "linear",
        table::linear_params(&cd.table.origin),
    )]
}

fn parse_devno(s: &str) -> Option<(u32, u32)> {
    let (a, b) = s.split_once(':')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

impl<'a> Ctx<'a> {
    // ----------------------------------------------------------------
    // Looking devices up
    // ----------------------------------------------------------------

    pub fn classify(&self, name: &str) -> Result<Option<DevKind>> {
        let Some(info) = self.dm.info(name)? else {
            return Ok(None);
        };
        if !info.active_table {
            return Ok(Some(DevKind::Other {
                info,
                table: vec![],
            }));
        }
        let table = self.dm.table(name)?;
        if table.len() == 1 && table[0].ttype == TARGET_TYPE {
            let t = &table[0];
            let spec = TableSpec::parse_params(&t.params).map_err(|e| e.context(name))?;
            let st = self.dm.status(name)?;
            if st.len() != 1 || st[0].ttype != TARGET_TYPE {
                return Err(Error::new(
                    Kind::Kernel,
                    format!("{name}: unexpected status layout"),
                ));
            }
            let status = Status::parse_params(&st[0].params).map_err(|e| e.context(name))?;
            return Ok(Some(DevKind::Cached(Box::new(CacheDev {
                start: t.start,
                len: t.len,
                info,
                table: spec,
                status,
            }))));
        }
        let ours = info
            .uuid
            .as_deref()
            .is_some_and(|u| u.starts_with(UUID_PREFIX));
        if ours && table.iter().all(|t| t.ttype == "linear") {
            return Ok(Some(DevKind::Detached { info, table }));
        }
        Ok(Some(DevKind::Other { info, table }))
    }

    /// A tiercache device, or an error that says why `name` is not one.
    pub fn cache_dev(&self, name: &str) -> Result<CacheDev> {
        match self.classify(name)? {
            Some(DevKind::Cached(c)) => Ok(*c),
            None => Err(not_found(format!("{name}: no such device"))
                .hint("'tiercache list' shows the cached devices")),
            Some(DevKind::Detached { .. }) => Err(not_found(format!(
                "{name}: not a cache any more: detached, now a linear mapping of its origin"
            ))
            .hint(format!(
                "remove it with 'tiercache remove {name}' once it is unused"
            ))),
            Some(DevKind::Other { table, .. }) => {
                let types: Vec<&str> = table.iter().map(|t| t.ttype.as_str()).collect();
                let what = if types.is_empty() {
                    "no active table".to_string()
                } else {
                    format!("table type {}", types.join(","))
                };
                Err(
                    not_found(format!("{name}: not a tiercache device ({what})"))
                        .hint("'tiercache list' shows the cached devices"),
                )
            }
        }
    }

    fn cached_names(&self) -> Result<Vec<String>> {
        let mut v = vec![];
        for n in self.dm.list()? {
            if let Ok(Some(DevKind::Cached(_))) = self.classify(&n) {
                v.push(n);
            }
        }
        Ok(v)
    }

    fn refresh(&self, name: &str) -> Result<(DevInfo, Status)> {
        let info = self
            .dm
            .info(name)?
            .ok_or_else(|| not_found(format!("{name}: device disappeared")))?;
        let st = self.dm.status(name)?;
        let t = st
            .first()
            .filter(|t| t.ttype == TARGET_TYPE)
            .ok_or_else(|| failure(format!("{name}: no longer a tiercache device")))?;
        let s = Status::parse_params(&t.params).map_err(|e| e.context(name))?;
        Ok((info, s))
    }

    fn describe(&self, dev: &str) -> String {
        match parse_devno(dev) {
            Some(d) => self.host.describe_devno(d),
            None => dev.to_string(),
        }
    }

    // ----------------------------------------------------------------
    // Creating
    // ----------------------------------------------------------------

    fn resolve(
        &self,
        r: &DevRef,
        role: &str,
        activate: bool,
    ) -> Result<(BlockDev, Option<LvInfo>)> {
        match r {
            DevRef::Path(p) => {
                let bd = self.host.blockdev(p).map_err(|e| e.context(role))?;
                Ok((bd, None))
            }
            DevRef::Lv { vg, lv } => {
                let mut info = lvm::require_lv(self.lvm, vg, lv).map_err(|e| e.context(role))?;
                if info.devno.is_none() {
                    if !activate {
                        return Err(failure(format!(
                            "{role}: logical volume {vg}/{lv} is not active"
                        ))
                        .hint(format!("activate it: lvchange -ay {vg}/{lv}")));
                    }
                    self.lvm.activate(vg, lv).map_err(|e| e.context(role))?;
                    info = lvm::require_lv(self.lvm, vg, lv)?;
                }
                let devno = info.devno.ok_or_else(|| {
                    failure(format!(
                        "{role}: logical volume {vg}/{lv} did not become active"
                    ))
                })?;
                let size_bytes = self.host.size_of_devno(devno)?;
                Ok((
                    BlockDev {
                        path: info.path.clone(),
                        devno,
                        size_bytes,
                    },
                    Some(info),
                ))
            }
        }
    }

    fn check_free(&self, role: &str, r: &DevRef, bd: &BlockDev) -> Result<()> {
        if let Some(how) = self.host.in_use(bd)? {
            return Err(busy(format!("{role} {r} ({}) is in use: {how}", self.host.describe_devno(bd.devno)))
                .hint("unmount it and stop whatever uses it; a cache must be the only user of its devices"));
        }
        Ok(())
    }

    fn ensure_target(&self) -> Result<()> {
        let have = |s: &Self| {
            s.dm.target_types()
                .map(|v| v.iter().any(|t| t == TARGET_TYPE))
        };
        if have(self)? {
            return Ok(());
        }
        self.host.modprobe("dm-tiercache");
        if have(self)? {
            return Ok(());
        }
        Err(Error::new(
            Kind::Kernel,
            "the tiercache device-mapper target is not available",
        )
        .hint("load the module: 'modprobe dm-tiercache' (or 'insmod dm-tiercache.ko')"))
    }

    /// Build the table for `s` and bring the device up.  LVs are activated
    /// if `activate` (cache first: an origin is never exposed when its cache
    /// cannot be set up).  The cache's superblock decides between loading
    /// its metadata and formatting it (`FormatPolicy`, `decide_format`).
    pub fn setup(&self, s: &Setup, activate: bool, policy: FormatPolicy) -> Result<SetupDone> {
        if !config::valid_name(&s.name) {
            return Err(usage(format!(
                "'{}' is not a valid device name (letters, digits, '+', '_', '.', '-'; not starting with '-')",
                s.name
            )));
        }
        if self.dm.info(&s.name)?.is_some() {
            return Err(busy(format!(
                "{}: a device-mapper device of that name already exists",
                s.name
            ))
            .hint("choose another name, or remove the existing device first"));
        }
        if s.origin == s.cache {
            return Err(usage(format!(
                "the cache may not be the origin ({})",
                s.origin
            )));
        }
        let (cache, cache_lv) = self.resolve(&s.cache, "cache", activate)?;
        // The cache's metadata is judged before the origin is touched (or
        // its LV activated): a cache that cannot be used stops here.
        // Reading it is harmless even if the device turns out to be busy.
        let sbr = self.read_cache_sb(s, &cache)?;
        self.precheck_meta(s, &cache, &sbr, policy)?;
        let (origin, origin_lv) = self.resolve(&s.origin, "origin", activate)?;
        if origin.devno == cache.devno {
            return Err(usage(format!(
                "origin {} and cache {} are the same device",
                s.origin, s.cache
            )));
        }
        self.check_free("origin", &s.origin, &origin)?;
        self.check_free("cache", &s.cache, &cache)?;

        let bs = s.options.block_size;
        let block_bytes = bs as u64 * 512;
        // As the kernel counts: the slots left beside the metadata.
        let slots = disk::layout(cache.size_bytes / 512, bs)
            .map(|l| l.nr_slots)
            .unwrap_or(0);
        if slots < table::MIN_CACHE_BLOCKS {
            return Err(usage(format!(
                "cache {} holds {} blocks of {} beside its metadata, at least {} are needed",
                s.cache,
                slots,
                fmt_bytes(block_bytes),
                table::MIN_CACHE_BLOCKS
            ))
            .hint("use a larger cache device or a smaller --block-size"));
        }
        let len = origin.size_bytes / 512;
        if len == 0 {
            return Err(usage(format!("origin {} is empty", s.origin)));
        }
        let meta = self.decide_format(s, &cache, &sbr, len, bs, policy)?;
        let mut spec = TableSpec::new(&origin.devno_str(), &cache.devno_str(), bs);
        spec.mode = s.options.mode;
        spec.format = matches!(meta, MetaAction::Format { .. });
        for (k, v) in &s.options.tunables {
            spec.set(*k, *v);
        }
        spec.validate()?;
        self.ensure_target()?;
        if let MetaAction::Format { clear: true } = meta {
            // The module formats only over a blank device or a superblock
            // of the same geometry; this one was checked to hold no dirty
            // data.
            self.host
                .clear_superblock(&cache)
                .map_err(|e| e.context(&s.name))?;
        }

        let info = self.dm.create(&s.name, Some(&uuid_for(&s.name)))?;
        let targets = [Target::new(0, len, TARGET_TYPE, spec.to_params())];
        if let Err(e) = self.dm.load(&s.name, &targets) {
            let reason = self.host.kernel_error(info.devno);
            let _ = self.dm.remove(&s.name);
            if let MetaAction::Load { .. } = meta {
                // The module refuses corrupt or ambiguous entries: say
                // which, as 'tiercache check' would.
                if let Some(err) = self.explain_load_refusal(s, &cache, &sbr) {
                    return Err(err);
                }
            }
            let mut err = Error::new(
                if e.kind == Kind::Busy {
                    Kind::Busy
                } else {
                    Kind::Failure
                },
                format!(
                    "{}: the kernel refused the table '0 {len} {TARGET_TYPE} {}': {}",
                    s.name,
                    spec.to_params(),
                    reason.clone().unwrap_or_else(|| e.msg.clone())
                ),
            );
            err = err.hint(if reason.is_some() {
                "fix the value named above".to_string()
            } else {
                "see 'dmesg | tail' for the reason".to_string()
            });
            return Err(err);
        }
        if let Err(e) = self.dm.resume(&s.name) {
            let _ = self.dm.remove(&s.name);
            return Err(e);
        }
        self.host.make_nodes(&s.name, info.devno)?;
        let info = self.dm.info(&s.name)?.unwrap_or(info);
        let meta_note = match meta {
            MetaAction::Format { clear: false } => format!("cache {} formatted", s.cache),
            MetaAction::Format { clear: true } => format!(
                "cache {} formatted (its superblock, of another geometry and without dirty data, was cleared first)",
                s.cache
            ),
            MetaAction::Load { commit_seq } => {
                let dirty = self
                    .refresh(&s.name)
                    .map(|(_, st)| {
                        format!(
                            "{} dirty ({} blocks)",
                            fmt_bytes(st.dirty_bytes()),
                            st.dirty_blocks
                        )
                    })
                    .unwrap_or_else(|_| "dirty data unknown".into());
                format!(
                    "cache {} loaded from its metadata (commit {commit_seq}): {dirty}",
                    s.cache
                )
            }
        };
        Ok(SetupDone {
            info,
            origin_lv,
            cache_lv,
            meta_note,
        })
    }

    // ----------------------------------------------------------------
    // The cache's metadata: load or format
    // ----------------------------------------------------------------

    fn read_cache_sb(&self, s: &Setup, cache: &BlockDev) -> Result<SbRead> {
        let dev = self.host.open_read(cache).map_err(|e| e.context(&s.name))?;
        disk::read_superblock(dev.as_ref()).map_err(|e| e.context(&s.name))
    }

    fn survey_cache(&self, s: &Setup, cache: &BlockDev, sbr: &SbRead) -> Result<Survey> {
        let dev = self.host.open_read(cache).map_err(|e| e.context(&s.name))?;
        disk::survey(dev.as_ref(), sbr.sb.as_ref().unwrap()).map_err(|e| e.context(&s.name))
    }

    /// What to tell the user to do to get a fresh format for `s`.
    fn format_how(s: &Setup, policy: FormatPolicy) -> String {
        match policy {
            FormatPolicy::Never => format!("'tiercache activate --format {}'", s.name),
            _ => "--format".to_string(),
        }
    }

    /// The checks that need only the cache: a blank cache is never
    /// formatted at boot, an unreadable superblock is never loaded.
    fn precheck_meta(
        &self,
        s: &Setup,
        cache: &BlockDev,
        sbr: &SbRead,
        policy: FormatPolicy,
    ) -> Result<()> {
        let name = &s.name;
        let cpath = &cache.path;
        match sbr.state {
            SbState::Blank if policy == FormatPolicy::Never => Err(Error::new(
                Kind::NoSuperblock,
                format!(
                    "{name}: cache {} holds no tiercache metadata (never formatted, or wiped): activation does not format a cache",
                    s.cache
                ),
            )
            .hint(format!(
                "if {} is the right cache device for {name} and whatever it holds may be overwritten, format it once with {}",
                s.cache,
                Self::format_how(s, policy)
            ))),
            SbState::BadVersion => Err(Error::new(
                Kind::BadSuperblock,
                format!(
                    "{name}: cache {}: {} (written by another version of dm-tiercache?)",
                    s.cache,
                    SbState::BadVersion.describe()
                ),
            )
            .hint(
                "set it up with the module version that wrote it; this tool neither loads nor formats it",
            )),
            SbState::BadCsum | SbState::BadFields if policy != FormatPolicy::Force => {
                Err(Error::new(
                    Kind::BadSuperblock,
                    format!("{name}: cache {}: {}", s.cache, sbr.state.describe()),
                )
                .hint(format!(
                    "'tiercache check {cpath}' tells more; the dirty data of this cache cannot be located, so {name} is not set up (its origin stays hidden); {} formats the cache afresh if its content is lost for good",
                    Self::format_how(s, policy)
                )))
            }
            SbState::Ok if policy != FormatPolicy::Force => match sbr.problem(cpath) {
                Some(e) => Err(e.context(name)),
                None if sbr.sb.as_ref().is_some_and(|sb| sb.failed()) => Err(Error::new(
                    Kind::SbFailed,
                    format!(
                        "{name}: cache {}: its superblock is marked failed (by the module when a metadata commit failed, or by 'tiercache detach --abandon' when the cache was given up): the module does not load it",
                        s.cache
                    ),
                )
                .hint(format!(
                    "writes since the failure went to the origin, which may hold newer data than its dirty blocks; {} formats the cache afresh, giving them up ('tiercache writeback --force --cache {cpath} --origin ORIGIN' first, if you know they are newer)",
                    Self::format_how(s, policy)
                ))),
                None => Ok(()),
            },
            _ => Ok(()),
        }
    }

    /// Load or format, from the superblock of the cache, the table's block
    /// size, the origin's length and the device's uuid:
    ///
    /// * blank: format (`Auto`, `Force`); `Never` was refused before;
    /// * valid and matching (block size, origin length, and the uuid if the
    ///   superblock holds one): load, without `format`, unless `Force`;
    /// * valid but not matching: refused (dirty data: exit 5; none: exit 4,
    ///   `--format` reformats);
    /// * `Force`: refused while committed dirty entries exist (the kernel
    ///   refuses too), unless the superblock is marked failed (they were
    ///   given up: the kernel formats it); a corrupt superblock is
    ///   formatted over, with a warning.
    fn decide_format(
        &self,
        s: &Setup,
        cache: &BlockDev,
        sbr: &SbRead,
        origin_sectors: u64,
        block_sectors: u32,
        policy: FormatPolicy,
    ) -> Result<MetaAction> {
        let name = &s.name;
        let Some(sb) = sbr.sb.as_ref().filter(|_| sbr.state == SbState::Ok) else {
            if sbr.state != SbState::Blank {
                errln!(
                    self,
                    "tiercache: warning: {name}: cache {}: {}; formatting it as asked (--format): whatever it held is dropped",
                    s.cache,
                    sbr.state.describe()
                );
            }
            return Ok(MetaAction::Format { clear: false });
        };
        let uuid = uuid_for(name);
        let bb = sb.layout.block_bytes();
        // The geometry this table gives the device in the superblock's
        // format version (tc_disk_layout_v): a cache formatted before
        // version 4 keeps its layout, without a summary, which may hold a
        // slot more than a new format's; it is loaded as it is.
        let slots_now = disk::layout_v(cache.size_bytes / 512, block_sectors, sb.version)
            .map(|l| l.nr_slots)
            .unwrap_or(0);
        let same_geometry = sb.layout.nr_slots == slots_now;
        let mut mismatch = vec![];
        if sb.layout.block_sectors != block_sectors {
            mismatch.push(format!(
                "it has {} blocks, not {}",
                fmt_bytes(bb),
                fmt_bytes(block_sectors as u64 * 512)
            ));
        } else if !same_geometry {
            mismatch.push(format!(
                "it was formatted for {} slots, the device now holds {slots_now}",
                sb.layout.nr_slots
            ));
        }
        if sb.origin_sectors != origin_sectors {
            mismatch.push(format!(
                "it caches an origin of {} sectors, {} has {}",
                sb.origin_sectors, s.origin, origin_sectors
            ));
        }
        if !sb.uuid.is_empty() && sb.uuid != uuid {
            let owner = sb.uuid.strip_prefix(UUID_PREFIX).unwrap_or(&sb.uuid);
            mismatch.push(format!(
                "it belongs to the device '{owner}' (uuid {})",
                sb.uuid
            ));
        }
        if mismatch.is_empty() && policy != FormatPolicy::Force {
            return Ok(MetaAction::Load {
                commit_seq: sb.commit_seq,
            });
        }
        // Refusing or formatting: what is at stake is the dirty data.
        let survey = if sbr.entries_readable() {
            Some(self.survey_cache(s, cache, sbr)?)
        } else {
            None
        };
        let counted = survey
            .as_ref()
            .map(|v| v.dirty_for_format(sb.commit_seq))
            .unwrap_or(0);
        // The dirty blocks of a cache marked failed were given up when it
        // failed (the origin may hold newer data): they do not stop a
        // format, as the kernel does not count them.
        let dirty = if sb.failed() { 0 } else { counted };
        let corrupt = survey.as_ref().map(|v| v.counts.corrupt).unwrap_or(0);
        let writeback_hint = format!(
            "'tiercache writeback --cache {} --origin ORIGIN' writes them to their origin offline",
            cache.path
        );
        if !mismatch.is_empty() {
            let what = mismatch.join("; ");
            if dirty > 0 {
                return Err(Error::new(
                    Kind::Dirty,
                    format!(
                        "{name}: cache {} holds {} of dirty data ({dirty} blocks) for another set-up: {what}",
                        s.cache,
                        fmt_bytes(dirty * bb)
                    ),
                )
                .hint(format!(
                    "set it up as it was made (name, origin, block size {}), or {writeback_hint}; --format and --force do not drop dirty data",
                    fmt_bytes(bb)
                )));
            }
            if policy != FormatPolicy::Force {
                return Err(busy(format!(
                    "{name}: cache {} is formatted for another set-up ({what}); it holds no dirty data",
                    s.cache
                ))
                .hint(format!(
                    "{} reformats it for {name}",
                    Self::format_how(s, policy)
                )));
            }
        }
        if dirty > 0 {
            return Err(Error::new(
                Kind::Dirty,
                format!(
                    "{name}: refusing to format cache {}: it holds {} of dirty data ({dirty} blocks) not yet on the origin (the kernel refuses too)",
                    s.cache,
                    fmt_bytes(dirty * bb)
                ),
            )
            .hint(format!(
                "set {name} up without --format to keep it, then 'tiercache flush --wait {name}'; or {writeback_hint}. --force does not drop dirty data"
            )));
        }
        if sb.failed() {
            errln!(
                self,
                "tiercache: warning: {name}: cache {} is marked failed; formatting it as asked (--format){}",
                s.cache,
                if counted > 0 {
                    format!(": its {counted} dirty blocks are given up")
                } else {
                    String::new()
                }
            );
        }
        if corrupt > 0 {
            errln!(
                self,
                "tiercache: warning: {name}: cache {}: {corrupt} corrupt metadata {} dropped by the format ('tiercache check {}' lists them)",
                s.cache,
                if corrupt == 1 { "entry" } else { "entries" },
                cache.path
            );
        }
        if survey.is_none() {
            errln!(
                self,
                "tiercache: warning: {name}: cache {}: its metadata lies beyond the end of the device; formatting it as asked (--format)",
                s.cache
            );
        }
        Ok(MetaAction::Format {
            clear: !same_geometry,
        })
    }

    /// After the module refused to load a cache: the corrupt or duplicate
    /// entries it found, if that was the reason.
    fn explain_load_refusal(&self, s: &Setup, cache: &BlockDev, sbr: &SbRead) -> Option<Error> {
        let v = self.survey_cache(s, cache, sbr).ok()?;
        let check = format!("'tiercache check {}' lists them", cache.path);
        let wb = format!(
            "'tiercache writeback --force --cache {} --origin ORIGIN' saves the dirty blocks of the readable entries",
            cache.path
        );
        if !v.corrupt.is_empty() {
            let which: Vec<String> = v
                .corrupt
                .iter()
                .take(5)
                .map(|b| format!("slot {}: {}", b.slot, b.reason))
                .collect();
            return Some(
                Error::new(
                    Kind::BadEntries,
                    format!(
                        "{}: the kernel refused to load cache {}: {} corrupt metadata {} ({}{})",
                        s.name,
                        s.cache,
                        v.corrupt.len(),
                        if v.corrupt.len() == 1 {
                            "entry"
                        } else {
                            "entries"
                        },
                        which.join("; "),
                        if v.corrupt.len() > 5 { "; ..." } else { "" }
                    ),
                )
                .hint(format!("{check}; {wb}")),
            );
        }
        if !v.duplicates.is_empty() {
            let epochs = sbr.sb.as_ref().is_some_and(|sb| sb.has_epochs());
            let which: Vec<String> = v
                .duplicates
                .iter()
                .take(5)
                .map(|d| {
                    if epochs {
                        format!(
                            "block {} in slots {:?}, all of epoch {}",
                            d.block, d.slots, d.epoch
                        )
                    } else {
                        format!("block {} in slots {:?}", d.block, d.slots)
                    }
                })
                .collect();
            return Some(
                Error::new(
                    Kind::DuplicateDirty,
                    format!(
                        "{}: the kernel refused to load cache {}: origin blocks dirty in several slots{} ({})",
                        s.name,
                        s.cache,
                        if epochs { " of one epoch" } else { "" },
                        which.join("; ")
                    ),
                )
                .hint(format!("{check}; {wb}")),
            );
        }
        None
    }

    pub fn create(&self, s: &Setup, save: bool, format: bool) -> Result<()> {
        if save {
            self.config_check_free(&s.name)?;
        }
        let done = self.setup(s, false, FormatPolicy::auto_or_force(format))?;
        let info = &done.info;
        if save {
            if let Err(e) = self.config_add(s) {
                let _ = self.dm.remove(&s.name);
                self.host.remove_nodes(&s.name);
                return Err(e);
            }
        }
        outln!(
            self,
            "{}: created /dev/mapper/{} ({}:{}), origin {}, cache {}",
            s.name,
            s.name,
            info.devno.0,
            info.devno.1,
            s.origin,
            s.cache
        );
        outln!(self, "{}: {}", s.name, done.meta_note);
        Ok(())
    }

    // ----------------------------------------------------------------
    // Configuration file
    // ----------------------------------------------------------------

    fn config_text(&self) -> Result<String> {
        Ok(self.host.read_file(&self.config_path)?.unwrap_or_default())
    }

    pub fn config_entries(&self) -> Result<Vec<Entry>> {
        config::parse(&self.config_path, &self.config_text()?)
    }

    fn config_check_free(&self, name: &str) -> Result<()> {
        if self.config_entries()?.iter().any(|e| e.name == name) {
            return Err(
                busy(format!("{name}: already listed in {}", self.config_path))
                    .hint("choose another name, or remove that line"),
            );
        }
        Ok(())
    }

    fn config_add(&self, s: &Setup) -> Result<()> {
        let text = self.config_text()?;
        let e = Entry {
            name: s.name.clone(),
            origin: s.origin.clone(),
            cache: s.cache.clone(),
            options: s.options.clone(),
            line: 0,
        };
        self.host
            .write_file(&self.config_path, &config::upsert(&text, &e))
    }

    fn config_remove(&self, name: &str) -> Result<bool> {
        let Some(text) = self.host.read_file(&self.config_path)? else {
            return Ok(false);
        };
        let (new, found) = config::remove(&text, name);
        if found {
            self.host.write_file(&self.config_path, &new)?;
        }
        Ok(found)
    }

    // ----------------------------------------------------------------
    // Flushing
    // ----------------------------------------------------------------

    /// Start a full flush and, if `wait`, follow it to the end.
    pub fn flush(&self, name: &str, wait: bool, o: FlushOpts) -> Result<()> {
        if !wait {
            self.cache_dev(name)?;
            self.dm.message(name, "flush")?;
            outln!(self, "{name}: flush started");
            return Ok(());
        }
        let sum = self.flush_wait(name, o)?;
        self.print_flush_summary(name, &sum);
        Ok(())
    }

    pub fn print_flush_summary(&self, name: &str, s: &FlushSummary) {
        let avg = if s.wb_requests > 0 {
            s.wb_sectors as f64 / 2.0 / s.wb_requests as f64
        } else {
            0.0
        };
        let merge = if s.wb_requests > 0 {
            s.wb_blocks as f64 / s.wb_requests as f64
        } else {
            0.0
        };
        outln!(
            self,
            "{name}: flushed {} in {} ({} blocks in {} origin writes, average {:.0} KiB, merge ratio {:.2}, {} bridged)",
            fmt_bytes(s.dirty_bytes_at_start),
            fmt_duration(s.seconds),
            s.wb_blocks,
            s.wb_requests,
            avg,
            merge,
            s.bridged_blocks
        );
    }

    /// Full flush, waiting for its end; progress on stderr.
    pub fn flush_wait(&self, name: &str, o: FlushOpts) -> Result<FlushSummary> {
        let cd = self.cache_dev(name)?;
        if cd.info.suspended {
            // The target writes nothing back while suspended: the wait
            // would never end.
            return Err(failure(format!(
                "{name}: the device is suspended: a flush cannot run until it is resumed"
            ))
            .hint(format!(
                "resume it ('dmsetup resume {name}'), then run the command again"
            )));
        }
        let st0 = cd.status.clone();
        // A full flush already running ends first, and counts; the target
        // keeps this request and starts ours after it: two more then.
        let want_flushes = st0
            .flushes
            .saturating_add(if st0.flush_state == FlushState::Flushing {
                2
            } else {
                1
            });
        let ev0 = cd.info.event_nr;
        let t0 = self.host.now();
        let bb = st0.block_bytes();
        let total = st0.dirty_bytes();
        self.dm.message(name, "flush")?;

        let tty = o.progress == ProgressMode::Auto && self.host.stderr_is_tty();
        let show = o.progress != ProgressMode::Quiet;
        let line_every = 5.0;
        let mut last_line = f64::NEG_INFINITY;
        let mut meter = Meter::new(5.0);
        let mut drew = false;
        let mut quiet_rounds_after_event = 0;
        let mut saw_flushing = false;

        let result = loop {
            let (info, st) = self.refresh(name)?;
            let now = self.host.now();
            meter.add(now, st.wb_blocks.saturating_mul(bb));
            let left = st.dirty_bytes();
            let done = total.saturating_sub(left);

            if show && (tty || now - last_line >= line_every) {
                let l = progress::line(name, done, total, left, meter.rate(), tty);
                if tty {
                    let _ = write!(self.err.borrow_mut(), "\r\x1b[K{l}");
                    let _ = self.err.borrow_mut().flush();
                    drew = true;
                } else {
                    errln!(self, "{l}");
                }
                last_line = now;
            }

            // Done when the target counts a completed full flush, or when
            // nothing is dirty any more (blocks are only marked clean after
            // the origin acknowledged a cache flush, so what was dirty when
            // we started is on the origin).
            if st.flushes >= want_flushes
                || (st.dirty_blocks == 0 && st.flush_state != FlushState::Flushing)
            {
                break Ok(st);
            }
            // The flush is over when it is not running any more and either
            // the target raised its completion event or we saw it running.
            saw_flushing |= st.flush_state == FlushState::Flushing;
            let ended =
                (info.event_nr != ev0 || saw_flushing) && st.flush_state != FlushState::Flushing;
            if ended && st.error != 0 {
                break Err(Error::new(
                    Kind::FlushFailed,
                    format!(
                        "{name}: flush failed: writeback error {}; {} still dirty",
                        crate::error::errno_name(st.error),
                        fmt_bytes(left)
                    ),
                )
                .hint(format!(
                    "check the origin device ({}) and the kernel log; 'tiercache flush {name}' retries",
                    self.describe(&cd.table.origin)
                )));
            }
            if ended {
                // An event, the flush is not running, and the completion
                // counter has not moved: give the status a few rounds.
                quiet_rounds_after_event += 1;
                if quiet_rounds_after_event > 10 {
                    break Err(failure(format!(
                        "{name}: the flush ended without completing (state {}, {} dirty, no error reported)",
                        st.flush_state,
                        fmt_bytes(left)
                    ))
                    .hint(format!("start it again: tiercache flush --wait {name}")));
                }
            }
            if let Some(tmo) = o.timeout {
                if now - t0 >= tmo {
                    break Err(Error::new(
                        Kind::Timeout,
                        format!(
                            "{name}: flush not finished after {}; {} still dirty",
                            fmt_duration(tmo),
                            fmt_bytes(left)
                        ),
                    )
                    .hint(format!(
                        "the flush goes on in the kernel; follow it with 'tiercache status {name}'"
                    )));
                }
            }
            let mut wait = if show { 0.25 } else { 1.0 };
            if let Some(tmo) = o.timeout {
                wait = f64::min(wait, (t0 + tmo - now).max(0.01));
            }
            self.dm
                .wait_event(std::time::Duration::from_secs_f64(wait))?;
            // A fake dm returns at once; the real one may too after an
            // unrelated event.  Never spin faster than this.
            self.host.sleep(0.02);
        };
        if drew {
            let _ = writeln!(self.err.borrow_mut());
        }
        let st = result?;
        let d = |a: u64, b: u64| a.checked_sub(b).unwrap_or(a);
        Ok(FlushSummary {
            dirty_bytes_at_start: total,
            seconds: self.host.now() - t0,
            wb_blocks: d(st.wb_blocks, st0.wb_blocks),
            wb_requests: d(st.wb_requests, st0.wb_requests),
            wb_sectors: d(st.wb_sectors, st0.wb_sectors),
            bridged_blocks: d(st.bridged_blocks, st0.bridged_blocks),
        })
    }

    // ----------------------------------------------------------------
    // Removing
    // ----------------------------------------------------------------

    /// The open count, after giving short-lived openers (udev probing a
    /// device that was just written and closed) a few seconds to go away.
    fn open_count_settled(&self, name: &str, info: &DevInfo) -> Result<i32> {
        let t0 = self.host.now();
        let mut n = info.open_count;
        while n > 0 && self.host.now() - t0 < 5.0 {
            self.host.sleep(0.1);
            n = self.dm.info(name)?.map(|i| i.open_count).unwrap_or(0);
        }
        Ok(n)
    }

    /// Resume `name` after a step that gave up with `e`; if that fails,
    /// `e`'s hint says the device is left suspended.
    fn resume_after(&self, name: &str, e: Error) -> Error {
        match self.dm.resume(name) {
            Ok(()) => e,
            Err(r) => left_suspended(name, e, &r),
        }
    }

    /// Suspend `name`, check what it holds, remove it; returns the status
    /// it had once suspended.  Nothing new can arrive while suspended: the
    /// dirty count checked is the one dropped.  A udev probe queued before
    /// the suspend opens the device and blocks on it while it is suspended,
    /// so the remove finds it busy until a resume: then resume, let the
    /// probe end, and try again.
    fn suspend_and_remove(&self, name: &str, force: bool) -> Result<Status> {
        const ATTEMPTS: u32 = 3;
        let mut attempt = 1;
        loop {
            self.dm.suspend(name, true)?;
            let st = match self.refresh(name) {
                Ok((_, st)) => st,
                Err(e) => {
                    let _ = self.dm.resume(name);
                    return Err(e);
                }
            };
            if st.dirty_blocks > 0 && !force {
                let what = format!(
                    "{name}: refusing to remove: the cache holds {} of dirty data ({} blocks) not yet on the origin",
                    fmt_bytes(st.dirty_bytes()),
                    st.dirty_blocks
                );
                let e = Error::new(Kind::Dirty, what).hint(format!(
                    "run 'tiercache flush --wait {name}' (or drop the --no-flush), or pass --force to remove it anyway (the dirty data stays on the cache device, not on the origin)"
                ));
                return Err(self.resume_after(name, e));
            }
            let e = match self.dm.remove(name) {
                Ok(()) => return Ok(st),
                Err(e) => e,
            };
            if let Err(r) = self.dm.resume(name) {
                return Err(left_suspended(name, e, &r));
            }
            if e.kind != Kind::Busy || attempt == ATTEMPTS {
                return Err(e);
            }
            attempt += 1;
            let info = self.dm.info(name)?.ok_or_else(|| e.clone())?;
            if self.open_count_settled(name, &info)? > 0 {
                return Err(e);
            }
        }
    }

    /// Flush (unless `no_flush`), then remove.  Dirty data is only ever
    /// dropped with `force`.
    pub fn remove(&self, name: &str, no_flush: bool, force: bool, o: FlushOpts) -> Result<()> {
        let cd = match self.classify(name)? {
            None => {
                return Err(not_found(format!("{name}: no such device"))
                    .hint("'tiercache list' shows the cached devices"))
            }
            Some(DevKind::Detached { info, .. }) => {
                let n = self.open_count_settled(name, &info)?;
                if n > 0 {
                    return Err(
                        busy(format!("{name}: device is in use (open count {n})")).hint(format!(
                            "unmount /dev/mapper/{name} and stop its users first"
                        )),
                    );
                }
                self.dm.remove(name)?;
                self.host.remove_nodes(name);
                let _ = self.config_remove(name);
                outln!(self, "{name}: removed");
                return Ok(());
            }
            Some(DevKind::Other { .. }) => {
                return Err(self.cache_dev(name).unwrap_err());
            }
            Some(DevKind::Cached(c)) => c,
        };
        let n = self.open_count_settled(name, &cd.info)?;
        if n > 0 {
            return Err(
                busy(format!("{name}: device is in use (open count {n})")).hint(format!(
                    "unmount /dev/mapper/{name} and stop its users first"
                )),
            );
        }
        let mut flush_err = None;
        if !no_flush && cd.status.dirty_blocks > 0 {
            match self.flush_wait(name, o) {
                Ok(s) => self.print_flush_summary(name, &s),
                Err(e) if force && e.kind == Kind::FlushFailed => {
                    errln!(self, "tiercache: warning: {}", e.msg);
                    flush_err = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        let st = self.suspend_and_remove(name, force)?;
        self.host.remove_nodes(name);
        if st.dirty_blocks > 0 {
            errln!(
                self,
                "tiercache: warning: {name}: removed with {} of dirty data not on the origin: it stays in the metadata of cache {} and is loaded when {name} is set up again; do not use the origin alone meanwhile ('tiercache writeback' writes it back offline)",
                fmt_bytes(st.dirty_bytes()),
                self.describe(&cd.table.cache)
            );
        }
        let _ = flush_err;
        outln!(self, "{name}: removed");
        Ok(())
    }

    // ----------------------------------------------------------------
    // Tuning
    // ----------------------------------------------------------------

    pub fn set(&self, name: &str, key: &str, value: &str, save: bool) -> Result<()> {
        let cd = self.cache_dev(name)?;
        match key {
            "mode" => {
                let m: Mode = value
                    .parse()
                    .map_err(|e: String| usage(format!("invalid mode '{value}': {e}")))?;
                if m == Mode::Passthrough && cd.status.dirty_blocks > 0 {
                    return Err(Error::new(
                        Kind::Dirty,
                        format!(
                            "{name}: cannot switch to passthrough with {} of dirty data",
                            fmt_bytes(cd.status.dirty_bytes())
                        ),
                    )
                    .hint(format!("run 'tiercache flush --wait {name}' first")));
                }
                let mut spec = cd.table.clone();
                spec.mode = Some(m);
                self.reload(&cd, &spec)?;
            }
            "cleaner" => {
                if value != "on" && value != "off" {
                    return Err(usage(format!(
                        "invalid value '{value}' for cleaner: on or off"
                    )));
                }
                self.dm.message(name, &format!("cleaner {value}"))?;
            }
            k => {
                let key = Key::parse(k).ok_or_else(|| {
                    usage(format!(
                        "unknown key '{k}' (known: mode, cleaner, {})",
                        table::key_list()
                    ))
                })?;
                let n = table::check_value(key, value, cd.status.block_size)?;
                // Cross-key rules against the live table's values.
                let mut spec = cd.table.clone();
                spec.set(key, n);
                spec.validate().map_err(|e| e.context(name))?;
                if let Err(e) = self.dm.message(name, &format!("set {key} {n}")) {
                    let why = self.host.kernel_error(cd.info.devno);
                    return Err(
                        e.hint(why.unwrap_or_else(|| "see 'dmesg | tail' for the reason".into()))
                    );
                }
            }
        }
        outln!(self, "{name}: {key} = {value}");
        if save {
            let mut entries = self.config_entries()?;
            let Some(e) = entries.iter_mut().find(|e| e.name == name) else {
                return Err(not_found(format!("{name}: not listed in {}", self.config_path))
                    .hint("--save only updates devices listed there (tiercache attach or create --save)"));
            };
            match key {
                "mode" => e.options.mode = Some(value.parse().unwrap()),
                "cleaner" => {}
                k => {
                    let key = Key::parse(k).unwrap();
                    let n: u64 = value.parse().unwrap();
                    e.options.tunables.retain(|(kk, _)| *kk != key);
                    e.options.tunables.push((key, n));
                }
            }
            let text = self.config_text()?;
            self.host
                .write_file(&self.config_path, &config::upsert(&text, e))?;
        }
        Ok(())
    }

    fn reload(&self, cd: &CacheDev, spec: &TableSpec) -> Result<()> {
        let name = &cd.info.name;
        // A reload keeps the cache's content: never a format.
        let spec = &TableSpec {
            format: false,
            ..spec.clone()
        };
        spec.validate()?;
        let t = [Target::new(cd.start, cd.len, TARGET_TYPE, spec.to_params())];
        if let Err(e) = self.dm.load(name, &t) {
            let why = self.host.kernel_error(cd.info.devno);
            let _ = self.dm.clear_inactive(name);
            return Err(failure(format!(
                "{name}: the kernel refused the new table: {}",
                why.unwrap_or(e.msg)
            )));
        }
        if let Err(e) = self.dm.suspend(name, true) {
            let _ = self.dm.clear_inactive(name);
            return Err(e);
        }
        if let Err(e) = self.dm.resume(name) {
            return Err(e.hint(format!(
                "the device may be left suspended; try 'dmsetup resume {name}'"
            )));
        }
        Ok(())
    }

    // ----------------------------------------------------------------
    // Status and list
    // ----------------------------------------------------------------

    pub fn status_json(&self, cd: &CacheDev) -> serde_json::Value {
        let s = &cd.status;
        serde_json::json!({
            "name": cd.info.name,
            "uuid": cd.info.uuid,
            "device": format!("/dev/mapper/{}", cd.info.name),
            "devno": format!("{}:{}", cd.info.devno.0, cd.info.devno.1),
            "size_bytes": cd.len * 512,
            "open_count": cd.info.open_count,
            "suspended": cd.info.suspended,
            "origin": { "dev": cd.table.origin, "name": self.describe(&cd.table.origin) },
            "cache": { "dev": cd.table.cache, "name": self.describe(&cd.table.cache) },
            "table": cd.table,
            "status": s,
            "block_bytes": s.block_bytes(),
            "cache_bytes": s.cache_bytes(),
            "used_bytes": s.used_bytes(),
            "used_percent": round2(s.used_pct()),
            "dirty_bytes": s.dirty_bytes(),
            "dirty_percent": round2(s.dirty_pct()),
            "read_hit_ratio": s.read_hit_ratio().map(round4),
            "write_hit_ratio": s.write_hit_ratio().map(round4),
            "error_name": if s.error != 0 { Some(crate::error::errno_name(s.error)) } else { None },
            "failed": s.failed_errno().is_some(),
            "cache_failed_name": s.failed_errno().map(crate::error::errno_name),
            "epochs": s.epochs().map(|(oldest, current)| serde_json::json!({
                "origin_holds_before": oldest,
                "oldest": oldest,
                "current": current,
                "live": current - oldest + 1,
            })),
        })
    }

    pub fn status_text(&self, cd: &CacheDev) -> String {
        let s = &cd.status;
        let mut o = String::new();
        let name = &cd.info.name;
        let pct = |r: Option<f64>| {
            r.map(|x| format!("{:.1}%", x * 100.0))
                .unwrap_or("--".into())
        };
        o += &format!(
            "{name}: {} cache of {} ({}:{}){}{}\n",
            s.mode,
            fmt_bytes(cd.len * 512),
            cd.info.devno.0,
            cd.info.devno.1,
            if s.failed_errno().is_some() {
                ", CACHE DEVICE FAILED"
            } else {
                ""
            },
            if cd.info.suspended { ", SUSPENDED" } else { "" }
        );
        if let Some(e) = s.failed_errno() {
            let lost = if s.dirty_blocks == 0 {
                "no dirty blocks, nothing is lost".to_string()
            } else {
                let (blocks, are) = if s.dirty_blocks == 1 {
                    ("block", "is")
                } else {
                    ("blocks", "are")
                };
                format!(
                    "{} dirty {blocks} ({}) {are} only in the failed cache; reads of them fail",
                    s.dirty_blocks,
                    fmt_bytes(s.dirty_bytes())
                )
            };
            o += &format!(
                "  FAILED:     cache device FAILED (error {e}, {}): {lost}; all other IO goes to the origin\n",
                crate::error::errno_name(e)
            );
            o += &format!(
                "  way out:    tiercache detach {name} --abandon (the origin without the cache{})\n",
                if s.dirty_blocks == 0 {
                    ""
                } else {
                    "; the dirty blocks read as the origin's older data"
                }
            );
            if s.dirty_blocks > 0 {
                o += &format!(
                    "              ('tiercache flush --wait {name}' first writes back those the cache device can still read)\n"
                );
            }
        }
        o += &format!("  origin:     {}\n", self.describe(&cd.table.origin));
        o += &format!(
            "  cache:      {}, {} in {} blocks of {}\n",
            self.describe(&cd.table.cache),
            fmt_bytes(s.cache_bytes()),
            s.total_blocks,
            fmt_bytes(s.block_bytes())
        );
        o += &format!(
            "  usage:      {} used ({} of {} blocks, {})\n",
            fmt_bytes(s.used_bytes()),
            s.used_blocks,
            s.total_blocks,
            fmt_pct(s.used_blocks, s.total_blocks)
        );
        o += &format!(
            "  dirty:      {} ({} blocks, {} of the cache)\n",
            fmt_bytes(s.dirty_bytes()),
            s.dirty_blocks,
            fmt_pct(s.dirty_blocks, s.total_blocks)
        );
        o += &format!(
            "  reads:      {} hit, {} hits, {} misses\n",
            pct(s.read_hit_ratio()),
            s.read_hits,
            s.read_misses
        );
        o += &format!(
            "  writes:     {} hit, {} hits, {} misses, {} bypassed\n",
            pct(s.write_hit_ratio()),
            s.write_hits,
            s.write_misses,
            s.write_bypass
        );
        let state = match s.flush_state {
            FlushState::Flushing => {
                format!("flushing (full flush, {} left)", fmt_bytes(s.dirty_bytes()))
            }
            FlushState::Background => format!(
                "background writeback ({} dirty)",
                fmt_bytes(s.dirty_bytes())
            ),
            FlushState::Cleaning => format!("cleaning ({} left)", fmt_bytes(s.dirty_bytes())),
            FlushState::Idle => "idle".into(),
        };
        o += &format!(
            "  writeback:  {state}{}; {} full flushes completed\n",
            if s.cleaner { ", cleaner on" } else { "" },
            s.flushes
        );
        o += &format!(
            "  written:    {} blocks in {} origin writes ({}), {} bridged blocks\n",
            s.wb_blocks,
            s.wb_requests,
            fmt_bytes(s.wb_sectors * 512),
            s.bridged_blocks
        );
        o += &format!(
            "  efficiency: average origin write {} KiB, merge ratio {:.2}, up to {} writes in flight\n",
            trim_dec(s.avg_write_kb),
            s.merge_ratio,
            s.inflight_max
        );
        o += &format!(
            "  error:      {}\n",
            if s.error == 0 {
                "none".to_string()
            } else {
                format!(
                    "{} (writeback failed; blocks stay dirty; 'tiercache flush {name}' retries)",
                    crate::error::errno_name(s.error)
                )
            }
        );
        if let (Some(n), Some(err)) = (s.meta_commits, s.meta_error) {
            o += &format!(
                "  metadata:   {n} commits, {}\n",
                if err == 0 {
                    "no error".to_string()
                } else {
                    format!(
                        "commit failed: {} (flushes and FUA writes failed; dirty blocks \
                         since the last commit may not survive a crash)",
                        crate::error::errno_name(err)
                    )
                }
            );
        }
        if let Some((oldest, current)) = s.epochs() {
            o += &format!("  epochs:     {}\n", epochs_line(oldest, current));
        }
        let tun: Vec<String> = cd
            .table
            .options
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        if !tun.is_empty() {
            o += &format!("  tunables:   {}\n", tun.join(" "));
        }
        if !s.extra.is_empty() {
            o += &format!(
                "  (newer module: {} more status fields not shown)\n",
                s.extra.len()
            );
        }
        o
    }

    pub fn status(&self, names: &[String], json: bool) -> Result<()> {
        let names = if names.is_empty() {
            self.cached_names()?
        } else {
            names.to_vec()
        };
        let mut devs = vec![];
        for n in &names {
            devs.push(self.cache_dev(n)?);
        }
        if json {
            let v: Vec<_> = devs.iter().map(|d| self.status_json(d)).collect();
            outln!(self, "{}", serde_json::to_string_pretty(&v).unwrap());
        } else {
            if devs.is_empty() {
                errln!(self, "no tiercache devices");
            }
            let texts: Vec<String> = devs.iter().map(|d| self.status_text(d)).collect();
            let _ = write!(self.out.borrow_mut(), "{}", texts.join("\n"));
        }
        Ok(())
    }

    pub fn list(&self, json: bool) -> Result<()> {
        let mut rows: Vec<serde_json::Value> = vec![];
        for n in self.dm.list()? {
            match self.classify(&n) {
                Ok(Some(DevKind::Cached(c))) => {
                    let s = &c.status;
                    rows.push(serde_json::json!({
                        "name": n, "state": "cached", "mode": s.mode.as_str(),
                        "size_bytes": c.len * 512,
                        "origin": self.describe(&c.table.origin),
                        "cache": self.describe(&c.table.cache),
                        "cache_bytes": s.cache_bytes(), "used_bytes": s.used_bytes(),
                        "dirty_bytes": s.dirty_bytes(), "flush_state": s.flush_state.as_str(),
                        "error": s.error, "cache_failed": s.failed_errno().unwrap_or(0),
                    }));
                }
                Ok(Some(DevKind::Detached { table, .. })) => {
                    let origin = table
                        .first()
                        .and_then(|t| t.params.split_whitespace().next())
                        .map(|d| self.describe(d))
                        .unwrap_or_default();
                    let size: u64 = table.iter().map(|t| t.len).sum::<u64>() * 512;
                    rows.push(serde_json::json!({
                        "name": n, "state": "detached", "mode": "linear", "size_bytes": size,
                        "origin": origin, "cache": null, "cache_bytes": 0, "used_bytes": 0,
                        "dirty_bytes": 0, "flush_state": null, "error": 0, "cache_failed": 0,
                    }));
                }
                Ok(_) => {}
                Err(e) => errln!(self, "tiercache: warning: {}", e.msg),
            }
        }
        if json {
            outln!(self, "{}", serde_json::to_string_pretty(&rows).unwrap());
            return Ok(());
        }
        let mut lines = vec![[
            "NAME".to_string(),
            "STATE".into(),
            "MODE".into(),
            "SIZE".into(),
            "CACHE".into(),
            "USED".into(),
            "DIRTY".into(),
            "FLUSH".into(),
            "ORIGIN".into(),
            "CACHE DEVICE".into(),
        ]];
        for r in &rows {
            let s = |k: &str| r[k].as_str().unwrap_or("-").to_string();
            let b = |k: &str| fmt_bytes(r[k].as_u64().unwrap_or(0));
            let cached = r["state"] == "cached";
            lines.push([
                s("name"),
                s("state"),
                s("mode"),
                b("size_bytes"),
                if cached { b("cache_bytes") } else { "-".into() },
                if cached { b("used_bytes") } else { "-".into() },
                if cached { b("dirty_bytes") } else { "-".into() },
                if cached {
                    if r["cache_failed"].as_i64() != Some(0) {
                        "FAILED".into()
                    } else if r["error"].as_i64() != Some(0) {
                        "ERROR".into()
                    } else {
                        s("flush_state")
                    }
                } else {
                    "-".into()
                },
                s("origin"),
                s("cache"),
            ]);
        }
        let mut w = [0usize; 10];
        for l in &lines {
            for (i, c) in l.iter().enumerate() {
                w[i] = w[i].max(c.len());
            }
        }
        for l in &lines {
            let mut t = String::new();
            for (i, c) in l.iter().enumerate() {
                if i == l.len() - 1 {
                    t += c;
                } else {
                    t += &format!("{c:<width$}  ", width = w[i]);
                }
            }
            outln!(self, "{}", t.trim_end());
        }
        Ok(())
    }

    // ----------------------------------------------------------------
    // LVM: attach and detach
    // ----------------------------------------------------------------

    fn lv_ref(s: &str, what: &str) -> Result<(String, String)> {
        match DevRef::parse(s) {
            Ok(DevRef::Lv { vg, lv }) => Ok((vg, lv)),
            _ => Err(usage(format!(
                "{what} '{s}' is not a logical volume name of the form VG/LV"
            ))),
        }
    }

    pub fn attach(
        &self,
        origin: &str,
        cache: &str,
        name: Option<&str>,
        options: Options,
        save: bool,
        format: bool,
    ) -> Result<()> {
        let (ovg, olv) = Self::lv_ref(origin, "origin")?;
        let (cvg, clv) = Self::lv_ref(cache, "--cache")?;
        let oinfo = lvm::require_lv(self.lvm, &ovg, &olv)?;
        let cinfo = lvm::require_lv(self.lvm, &cvg, &clv)?;
        for (i, role) in [(&oinfo, "origin"), (&cinfo, "cache")] {
            if i.has_tag(lvm::TAG_ORIGIN) || i.has_tag(lvm::TAG_CACHE) {
                return Err(busy(format!(
                    "{role} {} is already part of a cached device",
                    i.full_name()
                ))
                .hint("'tiercache list' shows it; detach it first"));
            }
        }
        let name = name.unwrap_or(&olv).to_string();
        let s = Setup {
            name: name.clone(),
            origin: DevRef::Lv {
                vg: ovg.clone(),
                lv: olv.clone(),
            },
            cache: DevRef::Lv {
                vg: cvg.clone(),
                lv: clv.clone(),
            },
            options,
        };
        if save {
            self.config_check_free(&name)?;
        }
        let done = self.setup(&s, true, FormatPolicy::auto_or_force(format))?;
        let undo = |ctx: &Self| {
            let _ = ctx.dm.remove(&name);
            ctx.host.remove_nodes(&name);
            let _ = ctx.lvm.mark(&ovg, &olv, lvm::TAG_ORIGIN, false);
            let _ = ctx.lvm.mark(&cvg, &clv, lvm::TAG_CACHE, false);
        };
        // Hide the pair from LVM autoactivation: from now on the origin is
        // only ever activated together with its cache ('tiercache activate').
        for (vg, lv, tag) in [(&ovg, &olv, lvm::TAG_ORIGIN), (&cvg, &clv, lvm::TAG_CACHE)] {
            if let Err(e) = self.lvm.mark(vg, lv, tag, true) {
                undo(self);
                return Err(e.context(&name));
            }
        }
        if save {
            if let Err(e) = self.config_add(&s) {
                undo(self);
                return Err(e);
            }
        }
        outln!(
            self,
            "{name}: {}/{} cached on {}/{}; use /dev/tiercache/{name} (/dev/mapper/{name})",
            ovg,
            olv,
            cvg,
            clv
        );
        outln!(self, "{name}: {}", done.meta_note);
        Ok(())
    }

    /// The LVs of `devs` (None for a device that is no LV).  An `lvs`
    /// that fails is an error: taken for "no LV", a detach would leave the
    /// origin LV tagged and skipped at activation, silently.
    fn lvs_of<const N: usize>(&self, devs: [&str; N]) -> Result<[Option<LvInfo>; N]> {
        let all = self.lvm.all()?;
        Ok(devs.map(|dev| {
            let d = parse_devno(dev)?;
            all.iter().find(|l| l.devno == Some(d)).cloned()
        }))
    }

    /// Wait until the cleaner has drained every dirty block.
    fn drain(&self, name: &str, o: FlushOpts) -> Result<()> {
        let t0 = self.host.now();
        loop {
            let (_, st) = self.refresh(name)?;
            if st.dirty_blocks == 0 {
                return Ok(());
            }
            if st.error != 0 {
                return Err(Error::new(
                    Kind::FlushFailed,
                    format!(
                        "{name}: writeback error {} while draining",
                        crate::error::errno_name(st.error)
                    ),
                ));
            }
            if let Some(t) = o.timeout {
                if self.host.now() - t0 > t {
                    return Err(Error::new(
                        Kind::Timeout,
                        format!("{name}: dirty data did not drain in time"),
                    ));
                }
            }
            self.dm.wait_event(std::time::Duration::from_millis(200))?;
            self.host.sleep(0.02);
        }
    }

    /// Flush, then swap the table to a linear mapping of the origin while
    /// the device stays open, then release the cache.
    pub fn detach(&self, name: &str, mode: DetachCache, o: FlushOpts) -> Result<()> {
        let cd = self.cache_dev(name)?;
        let origin_dev = cd.table.origin.clone();
        let cache_dev = cd.table.cache.clone();
        let [origin_lv, cache_lv] = self.lvs_of([origin_dev.as_str(), cache_dev.as_str()])?;
        if mode == DetachCache::Uncache && cache_lv.is_none() {
            return Err(usage(format!(
                "{name}: --uncache removes the cache LV, but the cache {} is not a logical volume",
                self.describe(&cache_dev)
            )));
        }

        let sum = self.flush_wait(name, o).map_err(|e| match cd.status.failed_errno() {
            Some(err) if e.kind == Kind::FlushFailed => e.hint(format!(
                "the cache device failed (error {err}, {}): dirty blocks it cannot read are lost; 'tiercache detach {name} --abandon' gives the cache up without a flush",
                crate::error::errno_name(err)
            )),
            _ => e,
        })?;
        self.print_flush_summary(name, &sum);

        // From here on writes go to the origin and nothing new turns dirty.
        self.dm.message(name, "cleaner on")?;
        let mut swapped = false;
        let mut last_err = None;
        for _attempt in 0..3 {
            if let Err(e) = self.drain(name, o) {
                last_err = Some(e);
                break;
            }
            if let Err(e) = self.load_linear(&cd) {
                last_err = Some(e);
                break;
            }
            // Suspend with flush: in-flight IO completes, new IO is held.
            if let Err(e) = self.dm.suspend(name, true) {
                let _ = self.dm.clear_inactive(name);
                last_err = Some(e);
                break;
            }
            let (_, st) = match self.refresh(name) {
                Ok(x) => x,
                Err(e) => {
                    let _ = self.dm.clear_inactive(name);
                    let _ = self.dm.resume(name);
                    last_err = Some(e);
                    break;
                }
            };
            if st.dirty_blocks > 0 {
                // Written while we loaded the table: drop it, go around.
                let _ = self.dm.clear_inactive(name);
                self.dm.resume(name)?;
                continue;
            }
            self.dm.resume(name)?;
            swapped = true;
            break;
        }
        if !swapped {
            let _ = self.dm.message(name, "cleaner off");
            return Err(last_err.unwrap_or_else(|| {
                failure(format!(
                    "{name}: new dirty data kept arriving; the cache stays attached"
                ))
                .hint("retry when the device is less busy")
            }));
        }

        // The cache device is released now.
        let mut warn = vec![];
        self.unmark_released(name, origin_lv.as_ref(), cache_lv.as_ref(), &mut warn);
        let cache_note = self.release_cache_lv(&cache_dev, cache_lv.as_ref(), mode, &mut warn);
        self.detach_done(
            name,
            "detached",
            &origin_dev,
            origin_lv.as_ref(),
            &cache_note,
            &warn,
        )
    }

    /// Load a linear mapping of the origin of `cd`, over the same range,
    /// as the inactive table.
    fn load_linear(&self, cd: &CacheDev) -> Result<()> {
        let name = &cd.info.name;
        let linear = linear_of(cd);
        if let Err(e) = self.dm.load(name, &linear) {
            let why = self.host.kernel_error(cd.info.devno);
            let _ = self.dm.clear_inactive(name);
            return Err(failure(format!(
                "{name}: cannot load the linear table: {}",
                why.unwrap_or(e.msg)
            )));
        }
        Ok(())
    }

    /// After the swap to a linear table: the LVs lose their tiercache
    /// marks (the origin activates on its own again) and the device its
    /// configuration entry, so that `activate` does not set the cache up
    /// again.  What fails is added to `warn`.
    fn unmark_released(
        &self,
        name: &str,
        origin_lv: Option<&LvInfo>,
        cache_lv: Option<&LvInfo>,
        warn: &mut Vec<String>,
    ) {
        for (l, tag) in [(origin_lv, lvm::TAG_ORIGIN), (cache_lv, lvm::TAG_CACHE)] {
            if let Some(l) = l {
                if let Err(e) = self.lvm.mark(&l.vg, &l.lv, tag, false) {
                    warn.push(e.msg);
                }
            }
        }
        if let Err(e) = self.config_remove(name) {
            warn.push(e.msg);
        }
    }

    /// Keep the cache LV, or remove it (`Uncache`); says which.
    fn release_cache_lv(
        &self,
        cache_dev: &str,
        cache_lv: Option<&LvInfo>,
        mode: DetachCache,
        warn: &mut Vec<String>,
    ) -> String {
        let Some(l) = cache_lv else {
            return format!("cache {} released", self.describe(cache_dev));
        };
        if mode == DetachCache::Uncache {
            match self.lvm.remove(&l.vg, &l.lv) {
                Ok(()) => return format!("cache LV {} removed", l.full_name()),
                Err(e) => warn.push(e.msg),
            }
        }
        format!("cache LV {} kept", l.full_name())
    }

    /// The last lines of `detach`: `what` happened, the warnings; an error
    /// if cleaning up failed.
    fn detach_done(
        &self,
        name: &str,
        what: &str,
        origin_dev: &str,
        origin_lv: Option<&LvInfo>,
        cache_note: &str,
        warn: &[String],
    ) -> Result<()> {
        for w in warn {
            errln!(self, "tiercache: warning: {name}: {w}");
        }
        let origin_name = origin_lv
            .map(|l| l.full_name())
            .unwrap_or_else(|| self.describe(origin_dev));
        outln!(
            self,
            "{name}: {what}: /dev/mapper/{name} now maps {origin_name} directly; {cache_note}"
        );
        outln!(
            self,
            "{name}: when it is no longer in use, 'tiercache remove {name}' drops the mapping"
        );
        if !warn.is_empty() {
            return Err(failure(format!(
                "{name}: {what}, but cleaning up failed (see warnings)"
            )));
        }
        Ok(())
    }

    /// `detach --abandon`: the way out of a failed cache device.  No flush
    /// and no cleaner mode: the dirty blocks the cache holds are lost (the
    /// origin's older data of those blocks shows through).  After a
    /// confirmation (the device name typed on a terminal, or `yes`), the
    /// table is swapped for a linear mapping of the origin as `detach`
    /// does (once suspended, the device must still be what was confirmed:
    /// `recheck_abandon`), the cache is released as `detach` releases it
    /// (the configuration entry included), and its superblock is marked
    /// failed, so that no module loads its stale metadata again
    /// (`mark_abandoned`: a mark that cannot be written fails the command,
    /// the device being linear already).  Refused
    /// unless the module reports the cache device failed, or `force` (a
    /// cache device the administrator knows is bad).  Not a way out of a
    /// cache device that hangs: the suspend waits for the IO in flight,
    /// and the module's postsuspend commits metadata to the cache device.
    pub fn abandon(&self, name: &str, mode: DetachCache, yes: bool, force: bool) -> Result<()> {
        let cd = match self.classify(name)? {
            Some(DevKind::Cached(c)) => *c,
            Some(DevKind::Detached { info, table }) => {
                let len = table.iter().map(|t| t.len).sum();
                return Err(not_found(format!(
                    "{name}: not a cache any more: detached (or abandoned), now a linear mapping of its origin; nothing to abandon"
                ))
                .hint(format!(
                    "if 'detach --abandon' could not mark the superblock of its cache device failed, mark it offline: '{}'",
                    mark_failed_command(info.uuid.as_deref(), len, "CACHE_DEV")
                )));
            }
            _ => {
                return Err(self.cache_dev(name).err().unwrap_or_else(|| {
                    failure(format!("{name}: changed while it was looked at"))
                        .hint("run the command again")
                }))
            }
        };
        let st = &cd.status;
        let origin_dev = cd.table.origin.clone();
        let cache_dev = cd.table.cache.clone();
        let cache_name = self.describe(&cache_dev);
        // An emergency path: a failing `lvs` (a dead PV) does not stop it.
        let [origin_lv, cache_lv] = self
            .lvs_of([origin_dev.as_str(), cache_dev.as_str()])
            .unwrap_or_else(|e| {
                errln!(
                    self,
                    "tiercache: warning: {name}: lvs failed ({}): the tiercache tags of its logical volumes, if any, are left in place ('lvchange --deltag')",
                    e.msg
                );
                [None, None]
            });
        let dirty = |n: u64| {
            format!(
                "{n} dirty {} ({})",
                if n == 1 { "block" } else { "blocks" },
                fmt_bytes(n * st.block_bytes())
            )
        };
        let failed = st.failed_errno();
        if failed.is_none() && !force {
            let why = match st.cache_failed {
                Some(_) => format!("the cache device {cache_name} has not failed"),
                None => "the module does not report whether the cache device failed (no status field 23: an older module)".to_string(),
            };
            let what = if st.dirty_blocks == 0 {
                format!("it holds no dirty blocks: 'tiercache detach {name}' detaches it without a loss")
            } else {
                format!(
                    "--abandon would lose its {}, which 'tiercache detach {name}' writes back first",
                    dirty(st.dirty_blocks)
                )
            };
            return Err(Error::new(
                Kind::Dirty,
                format!("{name}: refusing to abandon the cache: {why}; {what}"),
            )
            .hint(format!(
                "use 'tiercache detach {name}' (it flushes); add --force only for a cache device you know is bad although the module does not report it failed"
            )));
        }
        if mode == DetachCache::Uncache && cache_lv.is_none() {
            return Err(usage(format!(
                "{name}: --uncache removes the cache LV, but the cache {cache_name} is not a logical volume"
            )));
        }
        let loss = if st.dirty_blocks == 0 {
            "it holds no dirty blocks, nothing is lost".to_string()
        } else {
            format!(
                "its {} are lost: those blocks will read as the origin's older data",
                dirty(st.dirty_blocks)
            )
        };
        match failed {
            Some(e) => outln!(
                self,
                "{name}: the cache device {cache_name} FAILED (error {e}, {}); abandoning it: {loss}",
                crate::error::errno_name(e)
            ),
            None => outln!(
                self,
                "{name}: the cache device {cache_name} is not reported failed; abandoning it anyway (--force): {loss}"
            ),
        }
        if let Some(note) = abandon_epochs_note(st) {
            outln!(self, "{name}: {note}");
        }
        if !yes {
            let what = if st.dirty_blocks == 0 {
                "its cache (it holds no dirty blocks)".to_string()
            } else {
                format!(
                    "its cache and lose its {}{}",
                    dirty(st.dirty_blocks),
                    lost_epochs(st)
                        .map(|e| format!(", {e}"))
                        .unwrap_or_default()
                )
            };
            self.confirm_abandon(name, &what)?;
        }

        // No flush, no cleaner: the linear table replaces the cache as it is.
        // No lockfs either: a file system's dirty pages cannot be written
        // to a failed cache, and their sync would fail the suspend.
        self.load_linear(&cd)?;
        if let Err(e) = self.dm.suspend_nolockfs(name) {
            let _ = self.dm.clear_inactive(name);
            return Err(e.hint(format!(
                "{name} was not abandoned: its cache stays attached"
            )));
        }
        // Suspended: nothing changes any more.  What was confirmed must
        // still hold; what is dirty now is what is lost.
        let (lost, lost_in) = match self.recheck_abandon(&cd, force) {
            Ok(s) => (s.dirty_blocks, lost_epochs(&s)),
            Err(e) => {
                let _ = self.dm.clear_inactive(name);
                return Err(self.resume_after(name, e));
            }
        };
        let mut still_suspended = None;
        if let Err(e) = self.dm.resume(name) {
            still_suspended = self.abandon_resume_failed(&cd, e)?;
        }

        // Marked first, at once: the origin takes writes through the linear
        // table from now on, and until the mark a table without `format`
        // (the boot's `activate`, if the configuration still lists the
        // device) would load the cache's dirty blocks over them.  Marked
        // before an --uncache removes the LV too: a new LV on the same
        // extents must not find a loadable superblock there either.  If
        // it cannot be marked, the LV is kept for a retry.
        let mark = self.mark_abandoned(&cd, cache_lv.as_ref());
        let mut warn = vec![];
        self.unmark_released(name, origin_lv.as_ref(), cache_lv.as_ref(), &mut warn);
        let mode = match (&mark, cache_lv.as_ref()) {
            (Err(_), Some(l)) if mode == DetachCache::Uncache => {
                errln!(
                    self,
                    "tiercache: warning: {name}: the cache LV {} is kept, not removed (--uncache): its superblock is not marked failed",
                    l.full_name()
                );
                DetachCache::Split
            }
            _ => mode,
        };
        let lv_note = self.release_cache_lv(&cache_dev, cache_lv.as_ref(), mode, &mut warn);
        let lost_note = if lost == 0 {
            "no dirty blocks lost".to_string()
        } else {
            match lost_in {
                Some(e) => format!("{} lost, {e}", dirty(lost)),
                None => format!("{} lost", dirty(lost)),
            }
        };
        let mark_note = match &mark {
            Ok(note) => note.as_str(),
            Err(_) => "its superblock NOT marked failed",
        };
        let done = self.detach_done(
            name,
            "cache abandoned",
            &origin_dev,
            origin_lv.as_ref(),
            &format!("{lost_note}; {lv_note}, {mark_note}"),
            &warn,
        );
        // The most pressing first; the others as warnings.
        let errors: Vec<Error> = [still_suspended, mark.err(), done.err()]
            .into_iter()
            .flatten()
            .collect();
        let mut errors = errors.into_iter();
        let Some(first) = errors.next() else {
            return Ok(());
        };
        for e in errors {
            errln!(self, "tiercache: warning: {}", e.msg);
            if let Some(h) = &e.hint {
                errln!(self, "tiercache: hint: {h}");
            }
        }
        Err(first)
    }

    /// The resume that should have swapped in the linear table failed
    /// (`e`): what does the device map now?  The linear table: the cache
    /// is out of it, abandon goes on (`Some(error)` if the device cannot
    /// be resumed, to be returned at the end).  Its cache table (the swap
    /// failed): the linear table is dropped, the device resumed, and the
    /// cache is not abandoned (an error).
    fn abandon_resume_failed(&self, cd: &CacheDev, e: Error) -> Result<Option<Error>> {
        let name = &cd.info.name;
        let linear = linear_of(cd);
        let table = match self.dm.table(name) {
            Ok(t) => t,
            Err(t) => {
                return Err(e.hint(format!(
                    "it cannot be told whether the linear table is in place ({}): see 'dmsetup table {name}' and 'dmsetup info {name}'",
                    t.msg
                )))
            }
        };
        if table == linear {
            errln!(
                self,
                "tiercache: warning: {name}: the resume reported an error ({}), but the linear table is in place: going on",
                e.msg
            );
            let suspended = self
                .dm
                .info(name)
                .ok()
                .flatten()
                .is_none_or(|i| i.suspended);
            if !suspended {
                return Ok(None);
            }
            return Ok(self.dm.resume(name).err().map(|r| {
                failure(format!(
                    "{name}: cache abandoned, but /dev/mapper/{name} is still suspended: resuming it failed ({})",
                    r.msg
                ))
                .hint(format!(
                    "IO to it waits until it is resumed: try 'dmsetup resume {name}'"
                ))
            }));
        }
        if table.len() == 1 && table[0].ttype == TARGET_TYPE {
            let _ = self.dm.clear_inactive(name);
            let msg = format!(
                "{name}: not abandoned: the swap to the linear table failed ({}); the cache stays attached",
                e.msg
            );
            return Err(match self.dm.resume(name) {
                Ok(()) => Error { msg, ..e }.hint(format!(
                    "{name} was resumed with its cache; see 'tiercache status {name}' and the kernel log"
                )),
                Err(r) => Error { msg, ..e }.hint(format!(
                    "resuming it with its cache failed too ({}): it is left suspended; try 'dmsetup resume {name}'",
                    r.msg
                )),
            });
        }
        let types: Vec<&str> = table.iter().map(|t| t.ttype.as_str()).collect();
        Err(e.hint(format!(
            "it maps neither its cache nor the linear origin now (table type {}): see 'dmsetup table {name}' and 'dmsetup info {name}'",
            types.join(",")
        )))
    }

    /// After the suspend of `abandon`: the device must still be the one
    /// the administrator confirmed: same device-mapper device (number and
    /// uuid), a tiercache table of the same range over the same origin and
    /// cache devices, the cache still reported failed (unless `force`), no
    /// more dirty blocks than the count confirmed.  Returns its status, or
    /// why not (a status read failure included): the caller then drops the
    /// linear table and resumes.
    fn recheck_abandon(&self, cd: &CacheDev, force: bool) -> Result<Status> {
        let name = &cd.info.name;
        let changed = |what: String| {
            failure(format!(
                "{name}: not abandoned: {what} since the confirmation; the cache stays attached"
            ))
            .hint(format!(
                "see 'tiercache status {name}', and run the command again if {name} is still to be abandoned"
            ))
        };
        let not_read = |e: Error| {
            let msg = format!(
                "{name}: not abandoned: cannot read it back once suspended ({}); the cache stays attached",
                e.msg
            );
            Error { msg, ..e }
        };
        let info = self
            .dm
            .info(name)
            .map_err(not_read)?
            .ok_or_else(|| changed("the device disappeared".into()))?;
        if info.devno != cd.info.devno {
            return Err(changed(format!(
                "the device was replaced (device number {}:{}, was {}:{})",
                info.devno.0, info.devno.1, cd.info.devno.0, cd.info.devno.1
            )));
        }
        if info.uuid != cd.info.uuid {
            let u = |u: &Option<String>| u.clone().unwrap_or_else(|| "none".into());
            return Err(changed(format!(
                "its device-mapper uuid changed (now {}, was {})",
                u(&info.uuid),
                u(&cd.info.uuid)
            )));
        }
        let table = self.dm.table(name).map_err(not_read)?;
        let spec = match table.as_slice() {
            [t] if t.ttype == TARGET_TYPE => TableSpec::parse_params(&t.params)
                .map_err(|e| not_read(e.context(name)))
                .map(|spec| (t.start, t.len, spec))?,
            _ => {
                return Err(changed(
                    "its table changed (no longer a tiercache table)".into(),
                ))
            }
        };
        let same_dev = |a: &str, b: &str| match (parse_devno(a), parse_devno(b)) {
            (Some(x), Some(y)) => x == y,
            _ => a == b,
        };
        let (start, len, spec) = spec;
        if start != cd.start || len != cd.len {
            return Err(changed(format!(
                "its table changed (sectors {start}+{len}, was {}+{})",
                cd.start, cd.len
            )));
        }
        for (what, now, was) in [
            ("origin", &spec.origin, &cd.table.origin),
            ("cache", &spec.cache, &cd.table.cache),
        ] {
            if !same_dev(now, was) {
                return Err(changed(format!(
                    "its table changed ({what} device {}, was {})",
                    self.describe(now),
                    self.describe(was)
                )));
            }
        }
        let st = self.dm.status(name).map_err(not_read)?;
        let st = match st.as_slice() {
            [t] if t.ttype == TARGET_TYPE => {
                Status::parse_params(&t.params).map_err(|e| not_read(e.context(name)))?
            }
            _ => {
                return Err(changed(
                    "its table changed (no longer a tiercache table)".into(),
                ))
            }
        };
        if !force && st.failed_errno().is_none() {
            return Err(Error::new(
                Kind::Dirty,
                format!(
                    "{name}: not abandoned: the module no longer reports the cache device {} failed; the cache stays attached",
                    self.describe(&cd.table.cache)
                ),
            )
            .hint(format!("see 'tiercache status {name}'; 'tiercache detach {name}' flushes")));
        }
        if st.dirty_blocks > cd.status.dirty_blocks {
            return Err(Error::new(
                Kind::Dirty,
                format!(
                    "{name}: not abandoned: the cache now holds {} dirty blocks, more than the {} confirmed; the cache stays attached",
                    st.dirty_blocks, cd.status.dirty_blocks
                ),
            )
            .hint(format!(
                "run the command again to confirm the loss as it is now ('tiercache status {name}' shows it)"
            )));
        }
        Ok(st)
    }

    /// Ask for the device name on the terminal, to abandon `what`.  No
    /// terminal: a usage error (exit 2: --yes is needed); another answer:
    /// exit 16.
    fn confirm_abandon(&self, name: &str, what: &str) -> Result<()> {
        if !self.host.stdin_is_tty() {
            return Err(Error::new(
                Kind::Usage,
                format!(
                    "{name}: refusing to abandon the cache without a confirmation, and stdin is not a terminal to ask for one"
                ),
            )
            .hint("run it on a terminal, or add --yes to confirm on the command line"));
        }
        {
            let mut err = self.err.borrow_mut();
            let _ = write!(err, "Type the device name ({name}) to abandon {what}: ");
            let _ = err.flush();
        }
        let answer = self.host.read_line()?;
        match answer.as_deref().map(str::trim) {
            Some(a) if a == name => Ok(()),
            a => Err(Error::new(
                Kind::NotConfirmed,
                format!(
                    "{name}: not confirmed ({}): nothing was changed",
                    match a {
                        None => "end of input".to_string(),
                        Some(a) => format!("'{a}' is not '{name}'"),
                    }
                ),
            )),
        }
    }

    /// Mark the superblock of the abandoned cache device of `cd` failed;
    /// says how it went.  Only the device recorded before the question
    /// (its number, fstat of the node opened exclusively), and only the
    /// cache of this device (the superblock's uuid and origin length).
    /// A superblock that is blank or does not decode is not marked (a
    /// warning): no module loads it as it reads.  Any other failure is
    /// an error, which says the device is linear already and how to
    /// retry the mark.
    fn mark_abandoned(&self, cd: &CacheDev, cache_lv: Option<&LvInfo>) -> Result<String> {
        let name = &cd.info.name;
        let cache_dev = &cd.table.cache;
        let cache_name = self.describe(cache_dev);
        let devno = parse_devno(cache_dev);
        let path = cache_lv
            .map(|l| l.path.clone())
            .or_else(|| devno.and_then(|d| self.host.node_of_devno(d)));
        let want = disk::MarkWant {
            devno,
            uuid: cd.info.uuid.clone(),
            origin_sectors: Some(cd.len),
        };
        let r = match (&path, devno) {
            (Some(path), Some(_)) => self
                .host
                .open_exclusive(path)
                .and_then(|dev| disk::mark_failed(&*dev, &want)),
            _ => Err(not_found(format!("no device node for {cache_name}"))),
        };
        let e = match r {
            Ok(true) => return Ok("its superblock marked failed (no module loads it again)".into()),
            Ok(false) => return Ok("its superblock was marked failed already".into()),
            Err(e) => e,
        };
        if matches!(e.kind, Kind::NoSuperblock | Kind::BadSuperblock) {
            errln!(
                self,
                "tiercache: warning: {name}: the superblock of the cache device {cache_name} was not marked failed: {}; no module loads it as it reads now, but wipe or format the device before any other use",
                e.msg
            );
            return Ok(if e.kind == Kind::NoSuperblock {
                "it holds no superblock to mark".into()
            } else {
                "its superblock unreadable, not marked".into()
            });
        }
        let retry = mark_failed_command(
            cd.info.uuid.as_deref(),
            cd.len,
            path.as_deref().unwrap_or("CACHE_DEV"),
        );
        Err(Error {
            msg: format!(
                "{name}: cache abandoned (/dev/mapper/{name} maps the origin directly now), but the superblock of its cache device {cache_name} could not be marked failed: {}",
                e.msg
            ),
            hint: Some(format!(
                "until it is marked, its stale dirty entries can be loaded again (by a set-up of the same name and origin); mark it once the device answers with '{retry}', or wipe it before any other use"
            )),
            ..e
        })
    }

    // ----------------------------------------------------------------
    // Boot-time activation
    // ----------------------------------------------------------------

    fn select<'e>(
        &self,
        entries: &'e [Entry],
        all: bool,
        names: &[String],
    ) -> Result<Vec<&'e Entry>> {
        if all && !names.is_empty() {
            return Err(usage("give either --all or device names, not both"));
        }
        if !all && names.is_empty() {
            return Err(usage(
                "give --all or the names of devices listed in the configuration",
            ));
        }
        if all {
            return Ok(entries.iter().filter(|e| !e.options.noauto).collect());
        }
        names
            .iter()
            .map(|n| {
                entries.iter().find(|e| &e.name == n).ok_or_else(|| {
                    not_found(format!("{n}: not listed in {}", self.config_path))
                        .hint("'tiercache attach' or 'tiercache create --save' adds devices there")
                })
            })
            .collect()
    }

    /// Set up configured devices.  Never formats a cache unless `format`
    /// (only with names, not `--all`): a blank cache, a bad superblock or
    /// one of another set-up fails loudly and the origin stays hidden.
    pub fn activate(&self, all: bool, names: &[String], format: bool) -> Result<()> {
        if format && all {
            return Err(usage(
                "--format only with device names: boot activation (--all) never formats a cache",
            ));
        }
        let entries = self.config_entries()?;
        let sel = self.select(&entries, all, names)?;
        let mut first_err: Option<Error> = None;
        let policy = if format {
            FormatPolicy::Force
        } else {
            FormatPolicy::Never
        };
        for e in sel {
            let r = self.activate_one(e, policy);
            if let Err(err) = r {
                let _ = write!(self.err.borrow_mut(), "{}", err.report());
                first_err.get_or_insert(err);
            }
        }
        match first_err {
            Some(e) => Err(Error::new(
                e.kind,
                "some devices could not be activated (see above)",
            )),
            None => Ok(()),
        }
    }

    fn activate_one(&self, e: &Entry, policy: FormatPolicy) -> Result<()> {
        match self.classify(&e.name)? {
            Some(DevKind::Cached(_)) => {
                outln!(self, "{}: already active", e.name);
                return Ok(());
            }
            Some(_) => {
                return Err(busy(format!(
                    "{}: a device-mapper device of that name exists and is not a tiercache device",
                    e.name
                )))
            }
            None => {}
        }
        let s = Setup {
            name: e.name.clone(),
            origin: e.origin.clone(),
            cache: e.cache.clone(),
            options: e.options.clone(),
        };
        match self.setup(&s, true, policy) {
            Ok(done) => {
                outln!(
                    self,
                    "{}: activated ({}:{}); {}",
                    e.name,
                    done.info.devno.0,
                    done.info.devno.1,
                    done.meta_note
                );
                Ok(())
            }
            Err(err) => {
                // Do not leave an origin LV exposed without its cache.
                if let DevRef::Lv { vg, lv } = &e.origin {
                    if let Ok(Some(l)) = self.lvm.lv(vg, lv) {
                        if l.active && l.has_tag(lvm::TAG_ORIGIN) {
                            let _ = self.lvm.deactivate(vg, lv);
                        }
                    }
                }
                Err(err.context(&format!("{}:{}", self.config_path, e.line)))
            }
        }
    }

    /// Flush and remove configured devices (shutdown), then deactivate the
    /// LVs so that the origin is not left exposed.
    pub fn deactivate(&self, all: bool, names: &[String], o: FlushOpts) -> Result<()> {
        let entries = self.config_entries()?;
        let sel: Vec<&Entry> = if all {
            entries.iter().collect()
        } else {
            self.select(&entries, false, names)?
        };
        let mut first_err: Option<Error> = None;
        for e in sel {
            match self.classify(&e.name) {
                Ok(None) => continue,
                Ok(Some(DevKind::Cached(_))) | Ok(Some(DevKind::Detached { .. })) => {}
                Ok(Some(_)) => continue,
                Err(err) => {
                    let _ = write!(self.err.borrow_mut(), "{}", err.report());
                    first_err.get_or_insert(err);
                    continue;
                }
            }
            if let Err(err) = self.remove(&e.name, false, false, o) {
                let _ = write!(self.err.borrow_mut(), "{}", err.report());
                first_err.get_or_insert(err);
                continue;
            }
            for r in [&e.cache, &e.origin] {
                if let DevRef::Lv { vg, lv } = r {
                    if let Err(err) = self.lvm.deactivate(vg, lv) {
                        errln!(self, "tiercache: warning: {}: {}", e.name, err.msg);
                    }
                }
            }
        }
        match first_err {
            Some(e) => Err(Error::new(
                e.kind,
                "some devices could not be deactivated (see above)",
            )),
            None => Ok(()),
        }
    }
}

/// The epochs of the dirty blocks an abandon loses: "of epochs 17 to 19",
/// "of epoch 19"; None without status fields 24-25 or dirty blocks.
fn lost_epochs(s: &Status) -> Option<String> {
    let (oldest, current) = s.epochs().filter(|_| s.dirty_blocks > 0)?;
    Some(if oldest == current {
        format!("of epoch {oldest}")
    } else {
        format!("of epochs {oldest} to {current}")
    })
}

/// What the origin holds once the cache is abandoned, by the epochs
/// (status fields 24-25): every epoch before the oldest with dirty
/// blocks, entirely.  None without the fields or without dirty blocks
/// (then the origin holds every write).
fn abandon_epochs_note(s: &Status) -> Option<String> {
    let (oldest, _) = s.epochs()?;
    let lost = lost_epochs(s)?;
    Some(if oldest == 0 {
        format!("the origin holds no epoch entirely: the dirty blocks lost are {lost}")
    } else {
        format!(
            "the origin holds every write completed before the flush that opened epoch {oldest} was issued \
             (epochs up to {} entirely); the dirty blocks lost are {lost}",
            oldest - 1
        )
    })
}

/// "origin holds all before 17, live 17..19": status fields 24 and 25.
fn epochs_line(oldest: u64, current: u64) -> String {
    if oldest == current {
        format!("origin holds all before {oldest}, live {current}")
    } else {
        format!("origin holds all before {oldest}, live {oldest}..{current}")
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}
fn round4(x: f64) -> f64 {
    (x * 10000.0).round() / 10000.0
}
fn trim_dec(x: f64) -> String {
    if x.fract() == 0.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.2}")
    }
}
