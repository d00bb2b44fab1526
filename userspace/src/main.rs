// SPDX-License-Identifier: GPL-2.0-only
//! `tiercache`: command line front end of the tiercache library.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::cell::RefCell;
use std::io::Write;
use std::process::ExitCode;

use tiercache::config::{DevRef, Options, DEFAULT_PATH};
use tiercache::dm::KernelDm;
use tiercache::error::{usage, Result};
use tiercache::host::RealHost;
use tiercache::lvm::LvmCmd;
use tiercache::meta;
use tiercache::ops::{Ctx, DetachCache, FlushOpts, Setup};
use tiercache::progress::ProgressMode;
use tiercache::status::Mode;
use tiercache::table::{self, Key};

const EXIT_CODES: &str = "\
Exit status:
  0  success
  1  failure (an ioctl or LVM command failed)
  2  bad command line (unknown option, invalid value; --abandon without
     --yes and without a terminal to ask on)
  3  no such device, logical volume or configuration entry
  4  a device is in use or a name is taken
  5  refused: dirty data would be lost (--abandon: the cache has not failed)
  6  the target reported a writeback error (flush failed)
  7  timed out
  8  the kernel's answer was not understood, or the target is missing
  9  configuration file error
 10  a device cannot be opened or read
 11  no tiercache superblock on the cache device (never formatted)
 12  the superblock is corrupt, of an unknown version, or larger than the device
 13  corrupt metadata entries, or dirty ones the summary does not mark
 14  duplicate dirty entries (one origin block dirty in several slots)
 15  the superblock is marked failed (by the module when a metadata commit
     failed, or by 'detach --abandon' or 'check --mark-failed')
 16  not confirmed: the question was not answered with the device name

Units: sizes take a suffix (s = 512-byte sectors, b, K, M, G); a bare number
is KiB.  Keys ending in _kb are KiB, watermarks are percent of the cache.";

#[derive(Parser)]
#[command(
    name = "tiercache",
    version,
    about = "Manage dm-tiercache devices: a fast cache in front of a slow disk",
    after_help = EXIT_CODES,
    disable_help_subcommand = true
)]
struct Cli {
    /// Configuration file listing the devices set up at boot
    #[arg(long, global = true, value_name = "PATH", env = "TIERCACHE_CONFIG", hide_env_values = true, default_value = DEFAULT_PATH)]
    config: String,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, ValueEnum)]
enum ModeArg {
    Writeback,
    Writethrough,
    Passthrough,
}

impl From<ModeArg> for Mode {
    fn from(m: ModeArg) -> Mode {
        match m {
            ModeArg::Writeback => Mode::Writeback,
            ModeArg::Writethrough => Mode::Writethrough,
            ModeArg::Passthrough => Mode::Passthrough,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum ProgressArg {
    /// A bar on a terminal, a line every 5 s otherwise
    Auto,
    /// A line every 5 s
    Lines,
    /// No progress output
    None,
}

#[derive(Args)]
struct CacheOpts {
    /// Cache block size, a power of two from 4K to 1M
    #[arg(short = 'b', long, value_name = "SIZE", default_value = "4K")]
    block_size: String,
    /// Cache mode
    #[arg(short, long, value_enum)]
    mode: Option<ModeArg>,
    /// Writeback requests in flight to the origin (1-4096; default 128)
    #[arg(long, value_name = "N")]
    flush_depth: Option<u64>,
    /// Largest origin write in KiB (block size to 16384; default from the origin, at least 1024)
    #[arg(long, value_name = "KIB")]
    max_flush_kb: Option<u64>,
    /// Largest hole between dirty runs filled and written with them, in KiB (0 = off, default)
    #[arg(long, value_name = "KIB")]
    bridge_gap_kb: Option<u64>,
    /// Dirty percent that starts background writeback (1-100; default 50)
    #[arg(long, value_name = "PCT")]
    high_watermark: Option<u64>,
    /// Dirty percent that stops background writeback (0-high; default 10)
    #[arg(long, value_name = "PCT")]
    low_watermark: Option<u64>,
    /// Flush all dirty data when the device is suspended (0 or 1; default 0)
    #[arg(long, value_name = "0|1")]
    flush_on_suspend: Option<u64>,
    /// Metadata commit interval in milliseconds while anything changed (1-600000; default 1000)
    #[arg(long, value_name = "MS")]
    commit_ms: Option<u64>,
    /// Write back epoch by epoch, so that the origin alone is always consistent (0 or 1; default 0)
    #[arg(long, value_name = "0|1")]
    ordered: Option<u64>,
}

impl CacheOpts {
    fn to_options(&self) -> Result<Options> {
        let bytes = tiercache::units::parse_size("block size", &self.block_size)?;
        if bytes % 512 != 0 {
            return Err(usage(format!(
                "invalid block size '{}': not a whole number of 512-byte sectors",
                self.block_size
            )));
        }
        let block_size = table::check_block_size(bytes / 512)?;
        let mut tunables = vec![];
        for (k, v) in [
            (Key::FlushDepth, self.flush_depth),
            (Key::MaxFlushKb, self.max_flush_kb),
            (Key::BridgeGapKb, self.bridge_gap_kb),
            (Key::HighWatermark, self.high_watermark),
            (Key::LowWatermark, self.low_watermark),
            (Key::FlushOnSuspend, self.flush_on_suspend),
            (Key::CommitMs, self.commit_ms),
            (Key::Ordered, self.ordered),
        ] {
            if let Some(v) = v {
                table::check_value(k, &v.to_string(), block_size)?;
                tunables.push((k, v));
            }
        }
        // Cross-key rules (bridge_gap_kb <= max_flush_kb, low <= high).
        let mut spec = table::TableSpec::new("origin", "cache", block_size);
        for (k, v) in &tunables {
            spec.set(*k, *v);
        }
        spec.validate()?;
        Ok(Options {
            block_size,
            mode: self.mode.map(Into::into),
            tunables,
            noauto: false,
        })
    }
}

#[derive(Args, Clone, Copy)]
struct WaitOpts {
    /// Give up waiting after this many seconds (the flush goes on)
    #[arg(long, value_name = "SECS")]
    timeout: Option<f64>,
    /// Progress display on stderr
    #[arg(long, value_enum, default_value = "auto")]
    progress: ProgressArg,
    /// No progress display (same as --progress none)
    #[arg(short, long)]
    quiet: bool,
}

impl WaitOpts {
    fn to_opts(self) -> Result<FlushOpts> {
        if let Some(t) = self.timeout {
            if t.is_nan() || t <= 0.0 || !t.is_finite() {
                return Err(usage(format!(
                    "invalid --timeout {t}: must be a positive number of seconds"
                )));
            }
        }
        let progress = if self.quiet {
            ProgressMode::Quiet
        } else {
            match self.progress {
                ProgressArg::Auto => ProgressMode::Auto,
                ProgressArg::Lines => ProgressMode::Lines,
                ProgressArg::None => ProgressMode::Quiet,
            }
        };
        Ok(FlushOpts {
            timeout: self.timeout,
            progress,
        })
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Create a cached device from an origin and a cache device
    #[command(after_help = "\
ORIGIN and CACHE are block devices (/dev/...) or logical volumes (VG/LV).
Both must be unused.  The device covers the whole origin and appears as
/dev/mapper/NAME and /dev/tiercache/NAME.  With --save it is also listed in
the configuration file and set up again by 'tiercache activate --all'.

The cache's superblock decides what happens to its content: a blank cache is
formatted; a cache made for this device (same name, origin size and block
size) is loaded with its dirty data, so a cache survives a reboot; anything
else is refused.  --format starts afresh, but never while the cache holds
dirty data ('tiercache writeback' writes it back offline).")]
    Create {
        /// Name of the new device
        name: String,
        /// The slow device
        origin: String,
        /// The fast device
        cache: String,
        #[command(flatten)]
        opts: CacheOpts,
        /// Also list the device in the configuration file
        #[arg(long)]
        save: bool,
        /// Format the cache afresh even if it holds metadata (refused while it holds dirty data)
        #[arg(long)]
        format: bool,
    },
    /// Flush and remove a cached device
    #[command(after_help = "\
Dirty data is flushed to the origin first.  A device still holding dirty data
(after --no-flush, or when the flush failed) is only removed with --force.
That data then stays in the cache device's metadata, not on the origin:
setting the device up again loads it, 'tiercache writeback' writes it to the
origin offline.  Do not use the origin on its own meanwhile.")]
    Remove {
        name: String,
        /// Do not flush first
        #[arg(long)]
        no_flush: bool,
        /// Remove even if dirty data would be lost
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        wait: WaitOpts,
    },
    /// Show usage, dirty data, hit ratios, flush progress and writeback efficiency
    Status {
        /// Devices (default: all tiercache devices)
        names: Vec<String>,
        /// Machine-readable output
        #[arg(long)]
        json: bool,
    },
    /// Write all dirty data back to the origin
    #[command(after_help = "\
Without --wait the flush is started and the command returns at once.  With
--wait it shows the dirty data left, the rate and an ETA, and exits 0 when
the flush completed, 6 on a writeback error, 7 on --timeout.")]
    Flush {
        name: String,
        /// Wait for the end of the flush, showing progress
        #[arg(short, long)]
        wait: bool,
        #[command(flatten)]
        opts: WaitOpts,
    },
    /// Change a setting of a running device
    #[command(after_help = "\
Keys: flush_depth, max_flush_kb, bridge_gap_kb, high_watermark,
low_watermark, flush_on_suspend, commit_ms, ordered (live), mode
(writeback|writethrough|passthrough; reloads the table, keeps the cached
data), cleaner (on|off).")]
    Set {
        name: String,
        key: String,
        value: String,
        /// Also record the value in the configuration file
        #[arg(long)]
        save: bool,
    },
    /// List cached devices
    List {
        /// Machine-readable output
        #[arg(long)]
        json: bool,
    },
    /// Cache an existing logical volume on another one
    #[command(after_help = "\
The cached device appears as /dev/mapper/NAME and /dev/tiercache/NAME (NAME
defaults to the origin LV's name); use it instead of the LV.  Both LVs get a
tag (tiercache_origin, tiercache_cache) and LVM's activation-skip flag, so
that boot-time autoactivation never exposes the origin without its cache;
'tiercache activate --all' sets the pair up from the configuration file.")]
    Attach {
        /// The logical volume to cache (VG/LV), unused
        origin: String,
        /// The fast logical volume to cache it on (VG/LV)
        #[arg(long, value_name = "VG/LV")]
        cache: String,
        /// Device name (default: the origin LV's name)
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        opts: CacheOpts,
        /// Do not record the device in the configuration file
        #[arg(long)]
        no_save: bool,
        /// Format the cache afresh even if it holds metadata (refused while it holds dirty data)
        #[arg(long)]
        format: bool,
    },
    /// Flush and stop caching, keeping the device (and a mounted filesystem) in place
    #[command(after_help = "\
The cache is flushed, switched to cleaner mode, and the device's table is
swapped for a linear mapping of the origin while it stays open.  Then the
cache is released: its LV is kept (--split, the default) or removed
(--uncache), the LVs lose their tiercache tags and the device its line in
the configuration file (the origin LV activates on its own at boot; use it
directly).  'tiercache remove NAME' drops the mapping once unused.

--abandon is the way out of a failed cache device ('tiercache status'
shows FAILED): no flush, no cleaner mode.  The dirty blocks only the cache
holds are lost: those blocks read as the origin's older data.  It says how
many and, from a module that reports epochs (the writes between two
flushes), which epoch the origin holds: every write completed before the
flush that opened the oldest epoch with dirty blocks.  It asks to type the
device name, the loss in the question (--yes: no
question; without a terminal and without --yes it refuses, exit 2; another
answer: exit 16), swaps the table for the linear mapping and releases the
cache as above, and marks the cache device's superblock failed: no module
loads it again ('tiercache create' or 'attach' with --format reuses it;
'tiercache writeback --force' still copies its dirty blocks offline).
Only the device recorded before the question is marked, and only if its
superblock is this device's cache (uuid, origin length).  If the mark
cannot be written (likely on a failed device), the command fails (exit
10; 4 if the device is held or is another device's cache) although the
device is linear already, and prints the command that marks it offline
once the device answers, 'tiercache check --mark-failed' (an --uncache
then keeps the LV).  A blank or unreadable superblock is not marked, with
a warning: no module loads it.  --abandon is refused (exit 5) on a cache
the module does not report failed, unless --force: for a cache device you
know is bad although the module does not report it failed.  Neither is a
way out of a cache device that hangs: the device is suspended, which waits
for the IO in flight, and the module then commits its metadata to the
cache device (with flush_on_suspend 1 it writes back first), so on a hung
cache device --abandon waits too.")]
    Detach {
        name: String,
        /// Keep the cache LV (default)
        #[arg(long, conflicts_with = "uncache")]
        split: bool,
        /// Remove the cache LV
        #[arg(long)]
        uncache: bool,
        /// Give up a failed cache device: no flush, its dirty blocks are lost
        #[arg(long, conflicts_with = "timeout")]
        abandon: bool,
        /// With --abandon: do not ask for confirmation
        #[arg(long, requires = "abandon")]
        yes: bool,
        /// With --abandon: also a cache device the module does not report failed (one known to be bad)
        #[arg(long, requires = "abandon")]
        force: bool,
        #[command(flatten)]
        wait: WaitOpts,
    },
    /// Set up the devices listed in the configuration file (boot)
    #[command(after_help = "\
Each line of the configuration file (default /etc/tiercache.conf) reads
  NAME  ORIGIN  CACHE  [OPTIONS]
with ORIGIN and CACHE as VG/LV or /dev/... paths, and OPTIONS a comma list of
block_size=SIZE, mode=MODE, KEY=VALUE tunables and noauto (skipped by --all).
The cache is set up before the origin is touched; if it is missing, the
origin is left alone (and its LV inactive).  Activation loads the cache's
metadata and never formats it: a blank cache, a bad superblock or one made
for another device fails loudly and the origin stays hidden.  --format
(with names only) formats a blank or clean cache once.")]
    Activate {
        /// All devices in the configuration file (except noauto ones)
        #[arg(long)]
        all: bool,
        names: Vec<String>,
        /// Format the named devices' caches (refused while they hold dirty data)
        #[arg(long, conflicts_with = "all")]
        format: bool,
    },
    /// Flush and remove configured devices, then deactivate their LVs (shutdown)
    Deactivate {
        /// All devices in the configuration file
        #[arg(long)]
        all: bool,
        names: Vec<String>,
        #[command(flatten)]
        wait: WaitOpts,
    },
    /// Check the metadata of a cache device (offline)
    #[command(after_help = "\
Reads the superblock and every entry with the module's own decoder and
prints a summary.  DEVICE may be a block device or an image file.  Exit
status: 0 consistent, 10 cannot read the device, 11 no superblock (never
formatted), 12 superblock corrupt or of an unknown version, 13 corrupt
entries (each listed with its slot and the reason) or metadata blocks with
dirty entries that the summary does not mark (format version 4), 14 an
origin block dirty in several slots (of one epoch, from format version 3),
15 the superblock is marked failed (by the module when a metadata commit
failed, or by 'detach --abandon' or 'check --mark-failed' when an
administrator gave the cache up: the module does not load it again); the
lowest applies.
Entries of a commit that did not finish are ignored, as the module ignores
them.  Entries of another format generation (an earlier format's, or bytes
the device held before) are free slots, counted apart, not errors.  Format
version 3 records the epoch of each dirty block (the writes between two
flushes): one origin block may be dirty in several slots, one version per
epoch, the newest being its data; check reports the live epochs (the
oldest and the newest) and the blocks with several versions.  Format
version 4 adds a summary, a bit per metadata block that may hold a dirty
entry, so that the module loads only those: check reports how many are
marked, and a torn summary block (read as marking all of its blocks) as a
warning.  A format writes version 4; older caches keep their layout.

--mark-failed writes the failed mark instead, as 'detach --abandon' does:
for a cache device whose mark 'detach --abandon' could not write (it
prints this command).  The device is opened exclusively (exit 4 while it
is held or mounted); its superblock must be the cache of the device of dm
uuid --uuid (TIERCACHE-NAME for a device made by this tool, as 'check'
prints it; a superblock without uuid matches any) and, with
--origin-sectors, of an origin of that length: else nothing is written
(exit 4).  Exit 0 once marked (or marked already), 10 if it cannot be
read or written, 11 or 12 if it holds no valid superblock to mark (no
module loads it either).")]
    Check {
        /// Cache device or image file
        device: String,
        /// Machine-readable output
        #[arg(long)]
        json: bool,
        /// Mark the superblock failed (for a cache given up with 'detach --abandon')
        #[arg(long, requires = "uuid", conflicts_with = "json")]
        mark_failed: bool,
        /// With --mark-failed: the dm uuid of the device it must be the cache of
        #[arg(long, value_name = "UUID", requires = "mark_failed")]
        uuid: Option<String>,
        /// With --mark-failed: the length of that device, in sectors
        #[arg(long, value_name = "N", requires = "mark_failed")]
        origin_sectors: Option<u64>,
    },
    /// Show the superblock and the entries of a cache device
    #[command(after_help = "\
Each entry: slot, origin block, state (dirty, clean, uncommitted, or what is
wrong with it), the commit that wrote it and, for a dirty block, the epoch
of its version (format version 3 on; 0 before).  Exit status as for check,
but corrupt entries, the summary and the failed mark are shown, not judged.
The superblock shows the format version, generation, epoch (a lower bound of
the dirty entries' epochs), layout and flags (failed), then in format
version 4 the summary: what each of its blocks marks.  Entries of another
generation (foreign) are free slots, shown with --all.")]
    Dump {
        /// Cache device or image file
        device: String,
        /// Machine-readable output
        #[arg(long)]
        json: bool,
        /// Also the empty slots (and foreign entries)
        #[arg(long)]
        all: bool,
    },
    /// Write a cache's dirty blocks to its origin without the module (offline)
    #[command(after_help = "\
For when the cache cannot be set up: every committed dirty block is copied
from its slot to the origin, epoch by epoch, oldest first (format version 3
on; an epoch is the writes between two flushes), in origin order within an
epoch, adjacent blocks merged into writes of up to 4 MiB; the origin is
synced after each epoch, so that it only passes through states a power cut
could have left.  Then the entries are rewritten as clean (and synced), so
that a later load does not write them again.  --dry-run lists the writes per
epoch.  Both devices are opened exclusively: refused while a device-mapper
device or a mount uses either.  Refused on a bad superblock, on corrupt
entries and on ambiguous (duplicate) dirty entries; --force writes back the
rest and leaves those as they are.  Refused on a superblock marked failed:
writes since the failure went to the origin, which may hold newer data than
the dirty blocks; --force writes them anyway (the mark stays), and --dry-run
without --force lists what --force would write, then exits 15.  Exit status
as for check, 4 when a device is in use.")]
    Writeback {
        /// The cache device (or image file)
        #[arg(long, value_name = "DEV")]
        cache: String,
        /// Its origin device (or image file)
        #[arg(long, value_name = "DEV")]
        origin: String,
        /// Show what would be written, write nothing
        #[arg(long)]
        dry_run: bool,
        /// Skip corrupt and duplicate entries, write back a cache marked failed
        #[arg(long)]
        force: bool,
    },
}

/// A command: through device-mapper, or offline (devices and image files
/// only, no device-mapper needed).
enum Action {
    Dm(DmAction),
    Offline(OfflineAction),
}
type DmAction = Box<dyn FnOnce(&Ctx) -> Result<()>>;
/// Gets stdout and stderr.
type OfflineAction = Box<dyn FnOnce(&mut dyn Write, &mut dyn Write) -> Result<()>>;

/// Check the whole command line first, so that a usage error is reported
/// as one (exit 2) even without root or device-mapper.
fn plan(cmd: Cmd) -> Result<Action> {
    Ok(match cmd {
        Cmd::Create {
            name,
            origin,
            cache,
            opts,
            save,
            format,
        } => {
            let origin = DevRef::parse(&origin).map_err(|e| usage(format!("origin: {e}")))?;
            let cache = DevRef::parse(&cache).map_err(|e| usage(format!("cache: {e}")))?;
            let s = Setup {
                name,
                origin,
                cache,
                options: opts.to_options()?,
            };
            Action::Dm(Box::new(move |c| c.create(&s, save, format)))
        }
        Cmd::Remove {
            name,
            no_flush,
            force,
            wait,
        } => {
            let o = wait.to_opts()?;
            Action::Dm(Box::new(move |c| c.remove(&name, no_flush, force, o)))
        }
        Cmd::Status { names, json } => Action::Dm(Box::new(move |c| c.status(&names, json))),
        Cmd::Flush { name, wait, opts } => {
            let o = opts.to_opts()?;
            if !wait && (opts.timeout.is_some()) {
                return Err(usage("--timeout only makes sense with --wait"));
            }
            Action::Dm(Box::new(move |c| c.flush(&name, wait, o)))
        }
        Cmd::Set {
            name,
            key,
            value,
            save,
        } => Action::Dm(Box::new(move |c| c.set(&name, &key, &value, save))),
        Cmd::List { json } => Action::Dm(Box::new(move |c| c.list(json))),
        Cmd::Attach {
            origin,
            cache,
            name,
            opts,
            no_save,
            format,
        } => {
            for (what, v) in [("origin", &origin), ("--cache", &cache)] {
                if !matches!(DevRef::parse(v), Ok(DevRef::Lv { .. })) {
                    return Err(usage(format!(
                        "{what} '{v}' is not a logical volume name of the form VG/LV"
                    )));
                }
            }
            if let Some(n) = &name {
                if !tiercache::config::valid_name(n) {
                    return Err(usage(format!("'{n}' is not a valid device name")));
                }
            }
            let options = opts.to_options()?;
            Action::Dm(Box::new(move |c| {
                c.attach(&origin, &cache, name.as_deref(), options, !no_save, format)
            }))
        }
        Cmd::Detach {
            name,
            split: _,
            uncache,
            abandon,
            yes,
            force,
            wait,
        } => {
            let o = wait.to_opts()?;
            let m = if uncache {
                DetachCache::Uncache
            } else {
                DetachCache::Split
            };
            if abandon {
                Action::Dm(Box::new(move |c| c.abandon(&name, m, yes, force)))
            } else {
                Action::Dm(Box::new(move |c| c.detach(&name, m, o)))
            }
        }
        Cmd::Activate { all, names, format } => {
            if all != names.is_empty() {
                return Err(usage(
                    "give either --all or the names of devices listed in the configuration file",
                ));
            }
            Action::Dm(Box::new(move |c| c.activate(all, &names, format)))
        }
        Cmd::Deactivate { all, names, wait } => {
            if all != names.is_empty() {
                return Err(usage(
                    "give either --all or the names of devices listed in the configuration file",
                ));
            }
            let o = wait.to_opts()?;
            Action::Dm(Box::new(move |c| c.deactivate(all, &names, o)))
        }
        Cmd::Check {
            device,
            json,
            mark_failed,
            uuid,
            origin_sectors,
        } => Action::Offline(Box::new(move |out, err| {
            if mark_failed {
                meta::mark_failed(&device, uuid.as_deref().unwrap_or(""), origin_sectors, out)
            } else {
                meta::check(&device, json, out, err)
            }
        })),
        Cmd::Dump { device, json, all } => Action::Offline(Box::new(move |out, err| {
            meta::dump(&device, json, all, out, err)
        })),
        Cmd::Writeback {
            cache,
            origin,
            dry_run,
            force,
        } => Action::Offline(Box::new(move |out, err| {
            meta::writeback(&cache, &origin, dry_run, force, out, err).map(|_| ())
        })),
    })
}

fn run(cli: Cli) -> Result<()> {
    let action = match plan(cli.cmd)? {
        Action::Dm(a) => a,
        Action::Offline(a) => {
            return a(&mut std::io::stdout().lock(), &mut std::io::stderr().lock());
        }
    };
    let dm = KernelDm::open()?;
    let host = RealHost;
    let lvm = LvmCmd;
    let ctx = Ctx {
        dm: &dm,
        host: &host,
        lvm: &lvm,
        config_path: cli.config.clone(),
        out: RefCell::new(Box::new(std::io::stdout())),
        err: RefCell::new(Box::new(std::io::stderr())),
    };
    action(&ctx)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprint!("{}", e.report());
            ExitCode::from(e.kind.exit_code() as u8)
        }
    }
}
