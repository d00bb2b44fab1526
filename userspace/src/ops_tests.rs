// SPDX-License-Identifier: GPL-2.0-only
//! Command logic against the fakes.

use std::cell::RefCell;
use std::io::Write;
use std::rc::Rc;

use crate::config::{DevRef, Options};
use crate::disk;
use crate::error::Kind;
use crate::fake::{FakeDm, FakeHost, FakeLvm, Sim};
use crate::lvm::{TAG_CACHE, TAG_ORIGIN};
use crate::ops::{Ctx, DetachCache, DevKind, FlushOpts, Setup};
use crate::progress::ProgressMode;
use crate::status::Mode;
use crate::table::{Key, TableSpec};

#[derive(Clone, Default)]
struct Buf(Rc<RefCell<Vec<u8>>>);
impl Write for Buf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.borrow_mut().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
impl Buf {
    fn text(&self) -> String {
        String::from_utf8(self.0.borrow().clone()).unwrap()
    }
}

struct T {
    dm: FakeDm,
    host: FakeHost,
    lvm: FakeLvm,
    out: Buf,
    err: Buf,
}

const CONF: &str = "/etc/tiercache.conf";
const MIB: u64 = 1 << 20;

/// The metadata of a formatted cache, for `T::image`.
#[derive(Clone)]
struct Meta {
    uuid: String,
    cache_bytes: u64,
    origin_sectors: u64,
    block_sectors: u32,
    commit_seq: u64,
    generation: u32,
    /// Superblock flags (disk::SB_FAILED).
    flags: u32,
    /// The format version, in its layout (before 4: no summary).
    version: u32,
    /// (slot, origin block, dirty, seq)
    entries: Vec<(u64, u64, bool, u64)>,
}

impl Meta {
    /// A cache formatted for device `name` (uuid TIERCACHE-name).
    fn new(name: &str, cache_bytes: u64, origin_bytes: u64) -> Meta {
        Meta {
            uuid: format!("TIERCACHE-{name}"),
            cache_bytes,
            origin_sectors: origin_bytes / 512,
            block_sectors: 8,
            commit_seq: 10,
            generation: 0x0bad_cafe,
            flags: 0,
            version: disk::VERSION,
            entries: vec![],
        }
    }
    fn dirty(mut self, n: u64) -> Meta {
        for k in 0..n {
            self.entries.push((k, 1000 + k, true, 3));
        }
        self
    }
    /// Superblock, entries and summary (version 4: the metadata blocks of
    /// the dirty entries marked) through the C encoder; the data area is
    /// left out (the fake device reads zeros there).
    fn bytes(&self) -> Vec<u8> {
        let layout =
            disk::layout_v(self.cache_bytes / 512, self.block_sectors, self.version).unwrap();
        let sb = disk::Superblock {
            layout,
            commit_seq: self.commit_seq,
            origin_sectors: self.origin_sectors,
            uuid: self.uuid.clone(),
            version: self.version,
            generation: self.generation,
            flags: self.flags,
            epoch: 0,
        };
        let end = layout.meta_end_sector().max(layout.sum_end_sector());
        let mut v = vec![0u8; (end * 512) as usize];
        v[..disk::SB_BYTES].copy_from_slice(&disk::encode_sb(&sb));
        for &(slot, block, dirty, seq) in &self.entries {
            let o = disk::entry_offset(&layout, slot) as usize;
            v[o..o + disk::ENTRY_BYTES].copy_from_slice(&disk::encode_entry(
                slot,
                block,
                dirty,
                seq,
                self.generation,
                0,
            ));
        }
        let per = disk::entries_per_mblock();
        let dirty: Vec<u64> = self
            .entries
            .iter()
            .filter(|e| e.2)
            .map(|e| e.0 / per)
            .collect();
        disk::write_summary(&mut v, &sb, &dirty);
        v
    }
}

impl T {
    fn new() -> T {
        let t = T {
            dm: FakeDm::new(),
            host: FakeHost::default(),
            lvm: FakeLvm::default(),
            out: Buf::default(),
            err: Buf::default(),
        };
        t.host.add_dev("/dev/slow", (8, 16), 256 * MIB);
        t.host.add_dev("/dev/fast", (8, 32), 64 * MIB);
        t.host.add_dev("/dev/tiny", (8, 48), 32 * 1024);
        t
    }
    fn ctx(&self) -> Ctx<'_> {
        Ctx {
            dm: &self.dm,
            host: &self.host,
            lvm: &self.lvm,
            config_path: CONF.into(),
            out: RefCell::new(Box::new(self.out.clone())),
            err: RefCell::new(Box::new(self.err.clone())),
        }
    }
    fn log(&self) -> Vec<String> {
        self.dm.log.borrow().clone()
    }
    fn image(&self, path: &str, m: &Meta) {
        self.host.images.borrow_mut().insert(path.into(), m.bytes());
    }
    fn raw_image(&self, path: &str, data: Vec<u8>) {
        self.host.images.borrow_mut().insert(path.into(), data);
    }
    fn cached(&self, name: &str, dirty: u64) {
        let mut sim = Sim::new(8, 16384);
        sim.dirty = dirty;
        sim.used = dirty;
        self.dm.add_cached(name, "8:16", "8:32", sim, 524288);
    }
    fn lvs(&self) {
        self.lvm
            .add(&self.host, "vg", "slow", 256 * MIB, (253, 1), true);
        self.lvm
            .add(&self.host, "vg", "fast", 64 * MIB, (253, 2), true);
    }
}

fn quiet() -> FlushOpts {
    FlushOpts {
        timeout: None,
        progress: ProgressMode::Quiet,
    }
}

fn setup(name: &str, origin: &str, cache: &str) -> Setup {
    Setup {
        name: name.into(),
        origin: DevRef::parse(origin).unwrap(),
        cache: DevRef::parse(cache).unwrap(),
        options: Options::default(),
    }
}

#[test]
fn create_loads_the_table() {
    let t = T::new();
    let mut s = setup("c", "/dev/slow", "/dev/fast");
    s.options.mode = Some(Mode::Writeback);
    s.options.tunables = vec![(Key::BridgeGapKb, 64)];
    t.ctx().create(&s, false, false).unwrap();
    assert_eq!(
        t.log(),
        vec![
            "create c",
            "load c 0 524288 tiercache 8:16 8:32 8 4 writeback format bridge_gap_kb 64",
            "resume c"
        ],
        "a blank cache is formatted"
    );
    assert!(t.out.text().contains("c: cache /dev/fast formatted"));
    assert_eq!(t.host.nodes.borrow().as_slice(), ["c"]);
    assert!(t.out.text().starts_with("c: created /dev/mapper/c"));
    assert_eq!(
        t.dm.info("c").unwrap().unwrap().uuid.as_deref(),
        Some("TIERCACHE-c"),
        "uuid marks devices made by the tool"
    );
    use crate::dm::Dm;
}

#[test]
fn create_refusals() {
    let t = T::new();
    let refused = |name: &str, origin: &str, cache: &str| {
        t.ctx()
            .create(&setup(name, origin, cache), false, false)
            .unwrap_err()
    };
    let hold = |dev: (u32, u32), why: &str| {
        t.host.users.borrow_mut().insert(dev, why.into());
    };
    t.cached("busy", 0);
    let e = refused("busy", "/dev/slow", "/dev/fast");
    assert_eq!(e.kind, Kind::Busy);
    assert!(
        e.msg
            .contains("busy: a device-mapper device of that name already exists"),
        "{}",
        e.msg
    );

    let e = refused("x", "/dev/nope", "/dev/fast");
    assert_eq!(e.kind, Kind::NotFound);
    assert!(e.msg.starts_with("origin: /dev/nope"), "{}", e.msg);
    // A missing origin is reported before a busy cache.
    hold((8, 32), "held by dm-9 (hold)");
    let e = refused("x", "/dev/nope", "/dev/fast");
    assert_eq!(e.kind, Kind::NotFound);
    t.host.users.borrow_mut().clear();

    hold((8, 16), "mounted on /mnt");
    let e = refused("x", "/dev/slow", "/dev/fast");
    assert_eq!(e.kind, Kind::Busy);
    assert!(
        e.msg.contains("origin /dev/slow") && e.msg.contains("mounted on /mnt"),
        "{}",
        e.msg
    );
    assert!(e.hint.unwrap().contains("unmount"));
    t.host.users.borrow_mut().clear();

    let e = refused("x", "/dev/slow", "/dev/tiny");
    assert_eq!(e.kind, Kind::Usage);
    assert!(
        e.msg
            .contains("holds 5 blocks of 4 KiB beside its metadata, at least 16"),
        "{}",
        e.msg
    );

    let e = refused("x", "/dev/slow", "/dev/slow");
    assert_eq!(e.kind, Kind::Usage);

    let e = refused("a/b", "/dev/slow", "/dev/fast");
    assert_eq!(e.kind, Kind::Usage);

    let mut s = setup("x", "/dev/slow", "/dev/fast");
    s.options.tunables = vec![(Key::HighWatermark, 20), (Key::LowWatermark, 30)];
    let e = t.ctx().create(&s, false, false).unwrap_err();
    assert_eq!(e.kind, Kind::Usage);
    assert!(
        e.msg
            .contains("low_watermark 30 is above high_watermark 20"),
        "{}",
        e.msg
    );

    // Nothing was created by any of these.
    assert!(t.log().is_empty(), "{:?}", t.log());
}

#[test]
fn create_reports_the_kernel_reason_and_cleans_up() {
    let t = T::new();
    t.dm.reject_tiercache.set(true);
    *t.host.kmsg.borrow_mut() = Some("tiercache: Invalid block size: 12".into());
    let e = t
        .ctx()
        .create(&setup("c", "/dev/slow", "/dev/fast"), false, false)
        .unwrap_err();
    assert!(
        e.msg.contains("the kernel refused the table") && e.msg.contains("Invalid block size: 12"),
        "{}",
        e.msg
    );
    assert_eq!(t.log().last().unwrap(), "remove c");
    assert!(t.dm.devs.borrow().is_empty());

    let t = T::new();
    t.dm.have_target.set(false);
    let e = t
        .ctx()
        .create(&setup("c", "/dev/slow", "/dev/fast"), false, false)
        .unwrap_err();
    assert_eq!(e.kind, Kind::Kernel);
    assert!(e.hint.unwrap().contains("modprobe dm-tiercache"));
}

#[test]
fn create_save_writes_config() {
    let t = T::new();
    t.ctx()
        .create(&setup("c", "/dev/slow", "/dev/fast"), true, false)
        .unwrap();
    let conf = t.host.files.borrow().get(CONF).cloned().unwrap();
    assert!(
        conf.contains("c\t/dev/slow\t/dev/fast\tblock_size=4K"),
        "{conf}"
    );
    // A second device of the same name in the file is refused up front.
    t.dm.devs.borrow_mut().clear();
    let e = t
        .ctx()
        .create(&setup("c", "/dev/slow", "/dev/fast"), true, false)
        .unwrap_err();
    assert_eq!(e.kind, Kind::Busy);
    // Unwritable config: the device is rolled back.
    let t = T::new();
    t.host.readonly_files.set(true);
    let e = t
        .ctx()
        .create(&setup("c", "/dev/slow", "/dev/fast"), true, false)
        .unwrap_err();
    assert_eq!(e.kind, Kind::Config);
    assert!(t.dm.devs.borrow().is_empty());
}

/// A refused remove whose resume fails says the device is left suspended
/// (before, the failed resume was dropped: only "refusing to remove").
#[test]
fn refused_remove_says_when_the_device_stays_suspended() {
    let t = T::new();
    t.cached("c", 300);
    t.dm.fail_resumes.set(1);
    let e = t.ctx().remove("c", true, false, quiet()).unwrap_err();
    assert_eq!(e.kind, Kind::Dirty);
    let hint = e.hint.unwrap_or_default();
    assert!(
        hint.contains("it is left suspended") && hint.contains("dmsetup resume c"),
        "{hint}"
    );
}

#[test]
fn remove_refuses_dirty_without_force() {
    let t = T::new();
    t.cached("c", 300);
    let e = t.ctx().remove("c", true, false, quiet()).unwrap_err();
    assert_eq!(e.kind, Kind::Dirty);
    assert_eq!(e.kind.exit_code(), 5);
    assert!(
        e.msg
            .contains("c: refusing to remove: the cache holds 1.2 MiB of dirty data (300 blocks)"),
        "{}",
        e.msg
    );
    assert!(e.hint.unwrap().contains("--force"));
    assert!(t.dm.devs.borrow().contains_key("c"));
    assert!(!t.dm.devs.borrow()["c"].info.suspended, "left suspended");

    t.ctx().remove("c", true, true, quiet()).unwrap();
    assert!(
        t.err.text().contains(
            "c: removed with 1.2 MiB of dirty data not on the origin: it stays in the metadata of cache dev8:32"
        ),
        "{}",
        t.err.text()
    );
    assert!(!t.dm.devs.borrow().contains_key("c"));
}

#[test]
fn remove_flushes_first() {
    let t = T::new();
    t.cached("c", 300);
    t.ctx().remove("c", false, false, quiet()).unwrap();
    let log = t.log();
    let pos = |s: &str| {
        log.iter()
            .position(|l| l == s)
            .unwrap_or_else(|| panic!("{s} not in {log:?}"))
    };
    assert!(pos("message c flush") < pos("suspend c"));
    assert!(pos("suspend c") < pos("remove c"));
    assert!(t.out.text().contains("c: flushed 1.2 MiB"));
    assert!(t.out.text().contains("c: removed"));
}

#[test]
fn remove_retries_a_device_busy_while_suspended() {
    // A udev probe opened the device just before the suspend: the remove
    // finds it busy, the device is resumed (the probe ends) and removed.
    let t = T::new();
    t.cached("c", 300);
    t.dm.busy_removes.set(1);
    t.ctx().remove("c", true, true, quiet()).unwrap();
    let log = t.log();
    let n = |s: &str| log.iter().filter(|l| *l == s).count();
    assert_eq!(
        (n("suspend c"), n("resume c"), n("remove c")),
        (2, 1, 2),
        "{log:?}"
    );
    assert!(!t.dm.devs.borrow().contains_key("c"));

    // Busy on every attempt: the error, and the device left resumed.
    let t = T::new();
    t.cached("c", 0);
    t.dm.busy_removes.set(10);
    let e = t.ctx().remove("c", true, false, quiet()).unwrap_err();
    assert_eq!(e.kind, Kind::Busy);
    assert_eq!(t.log().iter().filter(|l| *l == "remove c").count(), 3);
    assert!(!t.dm.devs.borrow()["c"].info.suspended, "left suspended");
}

#[test]
fn remove_refusals() {
    let t = T::new();
    t.cached("c", 0);
    t.dm.with("c", |d| d.info.open_count = 1);
    let e = t.ctx().remove("c", false, false, quiet()).unwrap_err();
    assert_eq!(e.kind, Kind::Busy);
    assert!(e.msg.contains("c: device is in use (open count 1)"));

    let e = t
        .ctx()
        .remove("nothere", false, false, quiet())
        .unwrap_err();
    assert_eq!(e.kind, Kind::NotFound);
    assert_eq!(e.msg, "nothere: no such device");

    // A failing flush keeps the device.
    let t = T::new();
    let mut sim = Sim::new(8, 1024);
    sim.dirty = 10;
    sim.fail_with = Some(-5);
    t.dm.add_cached("c", "8:16", "8:32", sim, 1000);
    let e = t.ctx().remove("c", false, false, quiet()).unwrap_err();
    assert_eq!(e.kind, Kind::FlushFailed);
    assert!(t.dm.devs.borrow().contains_key("c"));
}

#[test]
fn flush_wait_success_and_summary() {
    let t = T::new();
    t.cached("c", 1000);
    t.ctx()
        .flush(
            "c",
            true,
            FlushOpts {
                timeout: None,
                progress: ProgressMode::Lines,
            },
        )
        .unwrap();
    let out = t.out.text();
    assert!(
        out.contains("c: flushed 3.9 MiB in") && out.contains("(1000 blocks in 10 origin writes"),
        "{out}"
    );
    // Progress lines went to stderr, not stdout.
    assert!(t.err.text().contains("c: flush "), "{}", t.err.text());
    assert!(!out.contains("ETA"));
}

#[test]
fn flush_wait_error_and_timeout() {
    let t = T::new();
    let mut sim = Sim::new(8, 1024);
    sim.dirty = 10;
    sim.fail_with = Some(-5);
    t.dm.add_cached("c", "8:16", "8:32", sim, 1000);
    let e = t.ctx().flush("c", true, quiet()).unwrap_err();
    assert_eq!(e.kind, Kind::FlushFailed);
    assert_eq!(e.kind.exit_code(), 6);
    assert!(
        e.msg
            .contains("writeback error EIO (Input/output error); 40 KiB still dirty"),
        "{}",
        e.msg
    );
    assert!(e.hint.unwrap().contains("dev8:16"), "names the origin");

    let t = T::new();
    let mut sim = Sim::new(8, 1024);
    sim.dirty = 10;
    sim.step = 0;
    t.dm.add_cached("c", "8:16", "8:32", sim, 1000);
    let e = t
        .ctx()
        .flush(
            "c",
            true,
            FlushOpts {
                timeout: Some(2.0),
                progress: ProgressMode::Quiet,
            },
        )
        .unwrap_err();
    assert_eq!(e.kind, Kind::Timeout);
    assert!(
        e.msg
            .contains("c: flush not finished after 2s; 40 KiB still dirty"),
        "{}",
        e.msg
    );

    // Without --wait: just the message.
    let t = T::new();
    t.cached("c", 10);
    t.ctx().flush("c", false, quiet()).unwrap();
    assert_eq!(t.log(), vec!["message c flush"]);
}

#[test]
fn flush_of_clean_cache_completes() {
    let t = T::new();
    t.cached("c", 0);
    t.ctx().flush("c", true, quiet()).unwrap();
    assert!(t.out.text().contains("c: flushed 0 B"));
}

#[test]
fn status_text_and_json() {
    let t = T::new();
    t.cached("c", 4096);
    t.ctx().status(&["c".into()], false).unwrap();
    let o = t.out.text();
    for needle in [
        "c: writeback cache of 256 MiB",
        "origin:     dev8:16",
        "cache:      dev8:32, 64 MiB in 16384 blocks of 4 KiB",
        "dirty:      16 MiB (4096 blocks, 25.0% of the cache)",
        "error:      none",
        "merge ratio",
        "metadata:   2 commits, no error",
    ] {
        assert!(o.contains(needle), "missing '{needle}' in\n{o}");
    }
    let t = T::new();
    t.cached("c", 4096);
    t.dm.devs
        .borrow_mut()
        .get_mut("c")
        .unwrap()
        .sim
        .as_mut()
        .unwrap()
        .meta_error = -5;
    t.ctx().status(&["c".into()], false).unwrap();
    let o = t.out.text();
    assert!(
        o.contains("metadata:   2 commits, commit failed: EIO"),
        "{o}"
    );
    let t = T::new();
    t.cached("c", 4096);
    t.ctx().status(&[], true).unwrap();
    let v: serde_json::Value = serde_json::from_str(&t.out.text()).unwrap();
    assert_eq!(v[0]["name"], "c");
    assert_eq!(v[0]["dirty_bytes"], 16 * MIB);
    assert_eq!(v[0]["dirty_percent"], 25.0);
    assert_eq!(v[0]["status"]["flush_state"], "idle");
    assert_eq!(v[0]["status"]["mode"], "writeback");
    assert_eq!(v[0]["table"]["block_size"], 8);
}

#[test]
fn status_shows_the_epochs() {
    let t = T::new();
    t.cached("c", 12);
    // A module without epochs: no line, null in JSON.
    t.ctx().status(&["c".into()], false).unwrap();
    assert!(!t.out.text().contains("epochs:"), "{}", t.out.text());
    t.dm.with("c", |d| d.sim.as_mut().unwrap().epochs = Some((17, 19)));
    t.ctx().status(&["c".into()], false).unwrap();
    let o = t.out.text();
    assert!(
        o.contains("\n  epochs:     origin holds all before 17, live 17..19\n"),
        "{o}"
    );
    assert!(!o.contains("newer module"), "{o}");
    t.dm.with("c", |d| d.sim.as_mut().unwrap().epochs = Some((19, 19)));
    t.ctx().status(&["c".into()], false).unwrap();
    assert!(
        t.out
            .text()
            .contains("\n  epochs:     origin holds all before 19, live 19\n"),
        "{}",
        t.out.text()
    );

    let t = T::new();
    t.cached("c", 12);
    t.cached("d", 0);
    t.dm.with("c", |d| d.sim.as_mut().unwrap().epochs = Some((17, 19)));
    t.ctx().status(&[], true).unwrap();
    let v: serde_json::Value = serde_json::from_str(&t.out.text()).unwrap();
    assert_eq!(
        (
            v[0]["status"]["epoch_oldest"].as_u64(),
            v[0]["status"]["epoch_current"].as_u64()
        ),
        (Some(17), Some(19))
    );
    assert_eq!(
        v[0]["epochs"],
        serde_json::json!({"origin_holds_before": 17, "oldest": 17, "current": 19, "live": 3})
    );
    assert!(v[1]["epochs"].is_null() && v[1]["status"]["epoch_oldest"].is_null());
}

#[test]
fn status_shows_a_failed_cache() {
    let t = T::new();
    t.cached("c", 12);
    t.ctx().status(&["c".into()], false).unwrap();
    let o = t.out.text();
    assert!(!o.contains("FAILED") && !o.contains("--abandon"), "{o}");

    t.dm.with("c", |d| d.sim.as_mut().unwrap().cache_failed = -5);
    t.ctx().status(&["c".into()], false).unwrap();
    let o = t.out.text();
    let o = &o[o.rfind("c: writeback").unwrap()..];
    let lines: Vec<&str> = o.lines().collect();
    assert!(lines[0].ends_with(", CACHE DEVICE FAILED"), "{o}");
    assert_eq!(
        lines[1],
        "  FAILED:     cache device FAILED (error -5, EIO (Input/output error)): \
         12 dirty blocks (48 KiB) are only in the failed cache; reads of them fail; \
         all other IO goes to the origin"
    );
    assert_eq!(
        lines[2],
        "  way out:    tiercache detach c --abandon (the origin without the cache; \
         the dirty blocks read as the origin's older data)"
    );
    assert_eq!(
        lines[3],
        "              ('tiercache flush --wait c' first writes back those the cache device can still read)"
    );

    let t = T::new();
    t.cached("c", 0);
    t.dm.with("c", |d| d.sim.as_mut().unwrap().cache_failed = -5);
    t.ctx().status(&["c".into()], false).unwrap();
    let o = t.out.text();
    assert!(
        o.contains("(error -5, EIO (Input/output error)): no dirty blocks, nothing is lost;"),
        "{o}"
    );
    assert!(
        o.contains("way out:    tiercache detach c --abandon (the origin without the cache)\n"),
        "{o}"
    );
    assert!(!o.contains("flush --wait"), "{o}");

    let t = T::new();
    t.cached("c", 12);
    t.cached("d", 0);
    t.dm.with("c", |d| d.sim.as_mut().unwrap().cache_failed = -5);
    t.ctx().status(&[], true).unwrap();
    let v: serde_json::Value = serde_json::from_str(&t.out.text()).unwrap();
    assert_eq!(v[0]["status"]["cache_failed"], -5);
    assert_eq!(v[0]["failed"], true);
    assert_eq!(v[0]["cache_failed_name"], "EIO (Input/output error)");
    assert_eq!(v[1]["status"]["cache_failed"], 0);
    assert_eq!(v[1]["failed"], false);
    assert!(v[1]["cache_failed_name"].is_null());

    // A module without field 23: null, never "failed".
    t.dm.with("d", |d| d.sim.as_mut().unwrap().nr_fields = Some(22));
    let t2 = Buf::default();
    let ctx = Ctx {
        out: RefCell::new(Box::new(t2.clone())),
        ..t.ctx()
    };
    ctx.status(&["d".into()], true).unwrap();
    let v: serde_json::Value = serde_json::from_str(&t2.text()).unwrap();
    assert!(v[0]["status"]["cache_failed"].is_null());
    assert_eq!(v[0]["failed"], false);

    // list: FAILED in the flush column.
    let t3 = Buf::default();
    let ctx = Ctx {
        out: RefCell::new(Box::new(t3.clone())),
        ..t.ctx()
    };
    ctx.list(false).unwrap();
    let row = t3
        .text()
        .lines()
        .find(|l| l.starts_with("c "))
        .unwrap()
        .to_string();
    assert!(row.contains(" FAILED "), "{row}");
}

#[test]
fn status_errors() {
    let t = T::new();
    let e = t.ctx().status(&["zz".into()], false).unwrap_err();
    assert_eq!(e.kind, Kind::NotFound);
    t.cached("c", 0);
    *t.dm.bad_status.borrow_mut() = Some("writeback 8 1/2 0".into());
    let e = t.ctx().status(&["c".into()], false).unwrap_err();
    assert_eq!(e.kind, Kind::Kernel);
    assert!(
        e.msg
            .starts_with("c: status line has 4 fields, expected at least 20"),
        "{}",
        e.msg
    );
}

#[test]
fn set_values() {
    let t = T::new();
    t.cached("c", 10);
    t.ctx().set("c", "flush-depth", "64", false).unwrap();
    assert_eq!(t.log(), vec!["message c set flush_depth 64"]);
    let e = t.ctx().set("c", "flush_depth", "0", false).unwrap_err();
    assert_eq!(e.kind, Kind::Usage);
    let e = t.ctx().set("c", "colour", "1", false).unwrap_err();
    assert!(e.msg.contains("unknown key 'colour'"));
    let e = t.ctx().set("c", "low_watermark", "70", false).unwrap_err();
    assert!(e.msg.contains("above high_watermark 50"), "{}", e.msg);
    let e = t.ctx().set("c", "mode", "passthrough", false).unwrap_err();
    assert_eq!(e.kind, Kind::Dirty);
    t.ctx().set("c", "cleaner", "on", false).unwrap();
    t.dm.log.borrow_mut().clear();
    t.ctx().set("c", "mode", "writethrough", false).unwrap();
    let log = t.log();
    assert!(
        log[0].starts_with("load c 0 524288 tiercache 8:16 8:32 8 1 writethrough"),
        "{log:?}"
    );
    assert_eq!(&log[1..], ["suspend c", "resume c"]);
    let e = t.ctx().set("c", "mode", "writeback", true).unwrap_err();
    assert_eq!(e.kind, Kind::NotFound, "--save needs a config entry");
}

/// A device whose live table says `ordered 1` (the tool once refused to
/// reload it or set any key: an unknown key in the table).
#[test]
fn set_keeps_and_sets_ordered() {
    let t = T::new();
    t.cached("c", 10);
    t.dm.with("c", |d| {
        let mut spec = TableSpec::new("8:16", "8:32", 8);
        spec.set(Key::Ordered, 1);
        d.table[0].params = spec.to_params();
    });
    t.ctx().set("c", "high_watermark", "30", false).unwrap();
    t.ctx().set("c", "ordered", "0", false).unwrap();
    assert_eq!(
        t.log(),
        vec!["message c set high_watermark 30", "message c set ordered 0"]
    );
    let e = t.ctx().set("c", "ordered", "2", false).unwrap_err();
    assert_eq!(e.kind, Kind::Usage);
    t.dm.log.borrow_mut().clear();
    t.ctx().set("c", "mode", "writethrough", false).unwrap();
    let log = t.log();
    assert!(
        log[0].starts_with("load c 0 524288 tiercache 8:16 8:32 8 3 writethrough ordered 1"),
        "{log:?}"
    );
}

fn attach(t: &T) {
    t.lvs();
    t.ctx()
        .attach("vg/slow", "vg/fast", None, Options::default(), true, false)
        .unwrap();
}

#[test]
fn attach_marks_and_saves() {
    let t = T::new();
    attach(&t);
    assert!(
        t.log()
            .contains(&"load slow 0 524288 tiercache 253:1 253:2 8 1 format".to_string()),
        "{:?}",
        t.log()
    );
    let o = t.lvm.get("vg", "slow");
    assert!(o.has_tag(TAG_ORIGIN) && o.skip_activation);
    let c = t.lvm.get("vg", "fast");
    assert!(c.has_tag(TAG_CACHE) && c.skip_activation);
    let conf = t.host.files.borrow().get(CONF).cloned().unwrap();
    assert!(
        conf.contains("slow\tvg/slow\tvg/fast\tblock_size=4K"),
        "{conf}"
    );
    assert!(t.out.text().contains("use /dev/tiercache/slow"));

    // Again: both LVs are taken.
    let e = t
        .ctx()
        .attach(
            "vg/slow",
            "vg/fast",
            Some("other"),
            Options::default(),
            true,
            false,
        )
        .unwrap_err();
    assert_eq!(e.kind, Kind::Busy);
    assert!(
        e.msg
            .contains("origin vg/slow is already part of a cached device"),
        "{}",
        e.msg
    );
}

#[test]
fn attach_refusals() {
    let t = T::new();
    t.lvs();
    let e = t
        .ctx()
        .attach("vg/nope", "vg/fast", None, Options::default(), true, false)
        .unwrap_err();
    assert_eq!(e.kind, Kind::NotFound);
    assert_eq!(e.msg, "logical volume vg/nope not found");
    let e = t
        .ctx()
        .attach(
            "/dev/slow",
            "vg/fast",
            None,
            Options::default(),
            true,
            false,
        )
        .unwrap_err();
    assert_eq!(e.kind, Kind::Usage);
    t.host
        .users
        .borrow_mut()
        .insert((253, 1), "mounted on /srv".into());
    let e = t
        .ctx()
        .attach("vg/slow", "vg/fast", None, Options::default(), true, false)
        .unwrap_err();
    assert_eq!(e.kind, Kind::Busy);
    assert!(e.msg.contains("mounted on /srv"));
    assert!(t.lvm.log.borrow().is_empty(), "no LVM changes on refusal");
    t.host.users.borrow_mut().clear();
    // A config file that cannot be written rolls everything back.
    t.host.readonly_files.set(true);
    let e = t
        .ctx()
        .attach("vg/slow", "vg/fast", None, Options::default(), true, false)
        .unwrap_err();
    assert_eq!(e.kind, Kind::Config);
    assert!(t.dm.devs.borrow().is_empty());
    assert!(!t.lvm.get("vg", "slow").has_tag(TAG_ORIGIN));
    assert!(!t.lvm.get("vg", "slow").skip_activation);
}

#[test]
fn detach_swaps_to_linear_while_open() {
    let t = T::new();
    attach(&t);
    t.dm.with("slow", |d| {
        d.info.open_count = 1; // mounted
        d.sim.as_mut().unwrap().dirty = 500;
    });
    t.dm.log.borrow_mut().clear();
    t.ctx().detach("slow", DetachCache::Split, quiet()).unwrap();
    let log = t.log();
    let pos = |p: &str| {
        log.iter()
            .position(|l| l.starts_with(p))
            .unwrap_or_else(|| panic!("{p}: {log:?}"))
    };
    assert!(pos("message slow flush") < pos("message slow cleaner on"));
    assert!(pos("message slow cleaner on") < pos("load slow 0 524288 linear 253:1 0"));
    assert!(pos("load slow") < pos("suspend slow"));
    assert!(pos("suspend slow") < pos("resume slow"));
    assert!(
        !log.iter().any(|l| l.starts_with("remove")),
        "device stays: {log:?}"
    );
    match t.ctx().classify("slow").unwrap() {
        Some(DevKind::Detached { .. }) => {}
        other => panic!("{other:?}"),
    }
    assert!(!t.lvm.get("vg", "slow").has_tag(TAG_ORIGIN));
    assert!(!t.lvm.get("vg", "slow").skip_activation);
    assert!(!t.lvm.get("vg", "fast").has_tag(TAG_CACHE));
    assert!(!t.host.files.borrow()[CONF].contains("vg/slow"));
    assert!(
        t.out
            .text()
            .contains("now maps vg/slow directly; cache LV vg/fast kept"),
        "{}",
        t.out.text()
    );

    // Busy while mounted, removable after.
    assert_eq!(
        t.ctx()
            .remove("slow", false, false, quiet())
            .unwrap_err()
            .kind,
        Kind::Busy
    );
    t.dm.with("slow", |d| d.info.open_count = 0);
    t.ctx().remove("slow", false, false, quiet()).unwrap();
    assert!(t.dm.devs.borrow().is_empty());
}

#[test]
fn detach_uncache_removes_cache_lv() {
    let t = T::new();
    attach(&t);
    t.ctx()
        .detach("slow", DetachCache::Uncache, quiet())
        .unwrap();
    assert!(t.lvm.log.borrow().contains(&"remove vg/fast".to_string()));
    assert!(t.out.text().contains("cache LV vg/fast removed"));
}

#[test]
fn detach_keeps_cache_on_flush_error() {
    let t = T::new();
    attach(&t);
    t.dm.with("slow", |d| {
        let s = d.sim.as_mut().unwrap();
        s.dirty = 50;
        s.fail_with = Some(-28);
    });
    let e = t
        .ctx()
        .detach("slow", DetachCache::Split, quiet())
        .unwrap_err();
    assert_eq!(e.kind, Kind::FlushFailed);
    assert!(e.msg.contains("ENOSPC"));
    assert!(matches!(
        t.ctx().classify("slow").unwrap(),
        Some(DevKind::Cached(_))
    ));
    assert!(t.lvm.get("vg", "slow").has_tag(TAG_ORIGIN));
}

#[test]
fn detach_of_a_failed_cache_points_to_abandon() {
    let t = T::new();
    attach(&t);
    fail_cache(&t, "slow", 50, -5);
    t.dm.with("slow", |d| d.sim.as_mut().unwrap().fail_with = Some(-5));
    let e = t
        .ctx()
        .detach("slow", DetachCache::Split, quiet())
        .unwrap_err();
    assert_eq!(e.kind, Kind::FlushFailed);
    let h = e.hint.unwrap();
    assert!(
        h.contains("the cache device failed (error -5, EIO")
            && h.contains("'tiercache detach slow --abandon'"),
        "{h}"
    );
    assert!(matches!(
        t.ctx().classify("slow").unwrap(),
        Some(DevKind::Cached(_))
    ));
}

/// A failed cache device: the module reports `errno` in status field 23.
fn fail_cache(t: &T, name: &str, dirty: u64, errno: i32) {
    t.dm.with(name, |d| {
        let s = d.sim.as_mut().unwrap();
        s.dirty = dirty;
        s.used = s.used.max(dirty);
        s.cache_failed = errno;
    });
}

fn sb_of(t: &T, path: &str) -> disk::Superblock {
    let img = t.host.images.borrow()[path].clone();
    let (st, sb) = disk::decode_sb(&img);
    assert_eq!(st, disk::SbState::Ok);
    sb.unwrap()
}

#[test]
fn abandon_is_refused_on_a_cache_that_did_not_fail() {
    let t = T::new();
    t.cached("c", 12);
    t.image("/dev/fast", &Meta::new("c", FAST, SLOW).dirty(12));
    let e = t
        .ctx()
        .abandon("c", DetachCache::Split, true, false)
        .unwrap_err();
    assert_eq!((e.kind, e.kind.exit_code()), (Kind::Dirty, 5));
    assert!(
        e.msg.contains("the cache device dev8:32 has not failed")
            && e.msg.contains("12 dirty blocks (48 KiB)")
            && e.msg.contains("'tiercache detach c' writes back first"),
        "{}",
        e.msg
    );
    assert_eq!(
        e.hint.as_deref(),
        Some("use 'tiercache detach c' (it flushes); add --force only for a cache device you know is bad although the module does not report it failed")
    );
    // A module without field 23 cannot say: refused too.
    t.dm.with("c", |d| d.sim.as_mut().unwrap().nr_fields = Some(22));
    let e = t
        .ctx()
        .abandon("c", DetachCache::Split, true, false)
        .unwrap_err();
    assert!(e.msg.contains("no status field 23"), "{}", e.msg);
    // Nothing dirty: no "would lose its 0 dirty blocks".
    t.dm.with("c", |d| {
        let s = d.sim.as_mut().unwrap();
        s.nr_fields = None;
        s.dirty = 0;
    });
    let e = t
        .ctx()
        .abandon("c", DetachCache::Split, true, false)
        .unwrap_err();
    assert_eq!((e.kind, e.kind.exit_code()), (Kind::Dirty, 5));
    assert_eq!(
        e.msg,
        "c: refusing to abandon the cache: the cache device dev8:32 has not failed; \
         it holds no dirty blocks: 'tiercache detach c' detaches it without a loss"
    );
    assert!(t.log().is_empty(), "nothing done: {:?}", t.log());
    assert!(t.host.marked.borrow().is_empty());
    assert!(matches!(
        t.ctx().classify("c").unwrap(),
        Some(DevKind::Cached(_))
    ));
}

#[test]
fn abandon_swaps_to_linear_without_flushing() {
    let t = T::new();
    attach(&t);
    t.image("/dev/vg/fast", &Meta::new("slow", FAST, SLOW).dirty(3));
    t.dm.with("slow", |d| d.info.open_count = 1); // mounted
    fail_cache(&t, "slow", 500, -5);
    t.dm.log.borrow_mut().clear();
    t.ctx()
        .abandon("slow", DetachCache::Split, true, false)
        .unwrap();
    let log = t.log();
    assert_eq!(
        log,
        [
            "load slow 0 524288 linear 253:1 0",
            "suspend slow",
            "resume slow"
        ],
        "no flush, no cleaner, no remove"
    );
    assert!(matches!(
        t.ctx().classify("slow").unwrap(),
        Some(DevKind::Detached { .. })
    ));
    // Released as detach releases it: LV marks, configuration entry.
    assert!(!t.lvm.get("vg", "slow").has_tag(TAG_ORIGIN));
    assert!(!t.lvm.get("vg", "slow").skip_activation);
    assert!(!t.lvm.get("vg", "fast").has_tag(TAG_CACHE));
    assert!(!t.host.files.borrow()[CONF].contains("vg/slow"));
    let e = t
        .ctx()
        .activate(false, &["slow".into()], false)
        .unwrap_err();
    assert_eq!(e.kind, Kind::NotFound);
    // The superblock is marked failed, the rest of it as it was.
    assert_eq!(*t.host.marked.borrow(), ["/dev/vg/fast"]);
    let sb = sb_of(&t, "/dev/vg/fast");
    assert!(sb.failed());
    assert_eq!(sb.commit_seq, 10);
    let o = t.out.text();
    for needle in [
        "slow: the cache device dev253:2 FAILED (error -5, EIO (Input/output error)); abandoning it: \
         its 500 dirty blocks (",
        ") are lost: those blocks will read as the origin's older data\n",
        "slow: cache abandoned: /dev/mapper/slow now maps vg/slow directly; 500 dirty blocks (",
        ") lost; cache LV vg/fast kept, its superblock marked failed (no module loads it again)\n",
        "'tiercache remove slow' drops the mapping",
    ] {
        assert!(o.contains(needle), "missing '{needle}' in\n{o}");
    }
    assert_eq!(t.err.text(), "", "no question with --yes, no warning");

    // Once more: not a cache any more.
    let e = t
        .ctx()
        .abandon("slow", DetachCache::Split, true, false)
        .unwrap_err();
    assert_eq!(e.kind, Kind::NotFound);
}

#[test]
fn abandon_names_the_epoch_the_origin_holds() {
    let t = T::new();
    t.cached("c", 7);
    t.image("/dev/fast", &Meta::new("c", FAST, SLOW).dirty(7));
    fail_cache(&t, "c", 7, -5);
    t.dm.with("c", |d| d.sim.as_mut().unwrap().epochs = Some((17, 19)));
    t.host.stdin_tty.set(true);
    t.host.stdin.borrow_mut().push_back("c".into());
    t.ctx()
        .abandon("c", DetachCache::Split, false, false)
        .unwrap();
    let o = t.out.text();
    let lines: Vec<&str> = o.lines().collect();
    assert_eq!(
        lines[..2],
        [
            "c: the cache device dev8:32 FAILED (error -5, EIO (Input/output error)); abandoning it: \
             its 7 dirty blocks (28 KiB) are lost: those blocks will read as the origin's older data",
            "c: the origin holds every write completed before the flush that opened epoch 17 was issued \
             (epochs up to 16 entirely); the dirty blocks lost are of epochs 17 to 19"
        ],
        "{o}"
    );
    assert!(
        o.contains("c: cache abandoned: /dev/mapper/c now maps dev8:16 directly; 7 dirty blocks (28 KiB) lost, of epochs 17 to 19; "),
        "{o}"
    );
    // The question says it too.
    assert_eq!(
        t.err.text(),
        "Type the device name (c) to abandon its cache and lose its 7 dirty blocks (28 KiB), of epochs 17 to 19: "
    );

    // One epoch; epoch 0 (the origin holds none entirely); nothing dirty
    // (nothing to say: the origin holds every write); no fields.
    for (epochs, dirty, want) in [
        (Some((19, 19)), 7, Some("c: the origin holds every write completed before the flush that opened epoch 19 was issued (epochs up to 18 entirely); the dirty blocks lost are of epoch 19")),
        (Some((0, 3)), 7, Some("c: the origin holds no epoch entirely: the dirty blocks lost are of epochs 0 to 3")),
        (Some((5, 5)), 0, None),
        (None, 7, None),
    ] {
        let t = T::new();
        t.cached("c", dirty);
        t.image("/dev/fast", &Meta::new("c", FAST, SLOW).dirty(dirty));
        fail_cache(&t, "c", dirty, -5);
        t.dm.with("c", |d| d.sim.as_mut().unwrap().epochs = epochs);
        t.ctx().abandon("c", DetachCache::Split, true, false).unwrap();
        let o = t.out.text();
        let note = o.lines().find(|l| l.contains("epoch"));
        assert_eq!(note, want, "{epochs:?} {dirty}: {o}");
    }
}

#[test]
fn abandon_asks_for_the_device_name() {
    let t = T::new();
    t.cached("c", 7);
    t.image("/dev/fast", &Meta::new("c", FAST, SLOW).dirty(7));
    fail_cache(&t, "c", 7, -5);
    // No terminal, no --yes: exit 2, not 5 (the cache has failed).
    let e = t
        .ctx()
        .abandon("c", DetachCache::Split, false, false)
        .unwrap_err();
    assert_eq!((e.kind, e.kind.exit_code()), (Kind::Usage, 2));
    assert!(e.msg.contains("stdin is not a terminal"), "{}", e.msg);
    assert!(e.hint.unwrap().contains("--yes"));
    // A terminal: the wrong name, then nothing at all.
    t.host.stdin_tty.set(true);
    t.host.stdin.borrow_mut().push_back("d".into());
    let e = t
        .ctx()
        .abandon("c", DetachCache::Split, false, false)
        .unwrap_err();
    assert_eq!((e.kind, e.kind.exit_code()), (Kind::NotConfirmed, 16));
    assert_eq!(
        e.msg,
        "c: not confirmed ('d' is not 'c'): nothing was changed"
    );
    // The loss is in the question itself (stderr), not only on stdout.
    assert_eq!(
        t.err.text(),
        "Type the device name (c) to abandon its cache and lose its 7 dirty blocks (28 KiB): "
    );
    let e = t
        .ctx()
        .abandon("c", DetachCache::Split, false, false)
        .unwrap_err();
    assert!(e.msg.contains("(end of input)"), "{}", e.msg);
    assert_eq!(e.kind, Kind::NotConfirmed);
    assert!(t.log().is_empty(), "nothing done: {:?}", t.log());
    assert!(t.host.marked.borrow().is_empty());
    assert!(t
        .out
        .text()
        .contains("its 7 dirty blocks (28 KiB) are lost"));
    // The right name.
    t.host.stdin.borrow_mut().push_back(" c".into());
    t.ctx()
        .abandon("c", DetachCache::Split, false, false)
        .unwrap();
    assert!(t
        .log()
        .contains(&"load c 0 524288 linear 8:16 0".to_string()));
    assert_eq!(*t.host.marked.borrow(), ["/dev/fast"]);
    assert!(t.out.text().contains(
        "7 dirty blocks (28 KiB) lost; cache dev8:32 released, its superblock marked failed"
    ));

    // Nothing dirty: the question says so.
    let t = T::new();
    t.cached("c", 0);
    t.image("/dev/fast", &Meta::new("c", FAST, SLOW));
    fail_cache(&t, "c", 0, -5);
    t.host.stdin_tty.set(true);
    t.host.stdin.borrow_mut().push_back("c".into());
    t.ctx()
        .abandon("c", DetachCache::Split, false, false)
        .unwrap();
    assert!(t
        .err
        .text()
        .starts_with("Type the device name (c) to abandon its cache (it holds no dirty blocks): "));
}

#[test]
fn abandon_fails_if_the_superblock_cannot_be_marked() {
    // The cache device takes no write (likely, on a failed device): the
    // device is linear, but the command fails and says how to retry.
    let t = T::new();
    t.cached("c", 0);
    t.image("/dev/fast", &Meta::new("c", FAST, SLOW));
    fail_cache(&t, "c", 0, -5);
    t.host.sb_write_error.set(true);
    let e = t
        .ctx()
        .abandon("c", DetachCache::Split, true, false)
        .unwrap_err();
    assert_eq!((e.kind, e.kind.exit_code()), (Kind::Unreadable, 10));
    assert_eq!(
        e.msg,
        "c: cache abandoned (/dev/mapper/c maps the origin directly now), but the superblock of its \
         cache device dev8:32 could not be marked failed: /dev/fast: write error at byte 0: Input/output error"
    );
    let hint = e.hint.unwrap();
    assert!(
        hint.contains(
            "mark it once the device answers with \
             'tiercache check --mark-failed --uuid TIERCACHE-c --origin-sectors 524288 /dev/fast', \
             or wipe it before any other use"
        ),
        "{hint}"
    );
    assert!(matches!(
        t.ctx().classify("c").unwrap(),
        Some(DevKind::Detached { .. })
    ));
    assert!(!sb_of(&t, "/dev/fast").failed());
    let o = t.out.text();
    assert!(
        o.contains(
            "no dirty blocks lost; cache dev8:32 released, its superblock NOT marked failed\n"
        ),
        "{o}"
    );
    // Once more: the device is detached, the cache device unknown; the
    // offline command, with what is known of it.
    let e = t
        .ctx()
        .abandon("c", DetachCache::Split, true, false)
        .unwrap_err();
    assert_eq!(e.kind, Kind::NotFound);
    assert!(e.msg.contains("not a cache any more"), "{}", e.msg);
    assert!(
        e.hint.as_deref().unwrap().contains(
            "'tiercache check --mark-failed --uuid TIERCACHE-c --origin-sectors 524288 CACHE_DEV'"
        ),
        "{:?}",
        e.hint
    );

    // Nor a read; and --uncache keeps the LV, for the retry.
    let t = T::new();
    attach(&t);
    t.image("/dev/vg/fast", &Meta::new("slow", FAST, SLOW).dirty(3));
    fail_cache(&t, "slow", 3, -5);
    t.host.sb_read_error.set(true);
    let e = t
        .ctx()
        .abandon("slow", DetachCache::Uncache, true, false)
        .unwrap_err();
    assert_eq!(e.kind, Kind::Unreadable);
    assert!(e.msg.ends_with(
        "could not be marked failed: /dev/vg/fast: read error at byte 0: Input/output error"
    ));
    assert!(!t.lvm.log.borrow().contains(&"remove vg/fast".to_string()));
    assert!(t.err.text().contains(
        "tiercache: warning: slow: the cache LV vg/fast is kept, not removed (--uncache): its superblock is not marked failed"
    ));
    assert!(t
        .out
        .text()
        .contains("cache LV vg/fast kept, its superblock NOT marked failed"));
    // Released all the same.
    assert!(!t.lvm.get("vg", "fast").has_tag(TAG_CACHE));
    assert!(!t.host.files.borrow()[CONF].contains("vg/slow"));

    // A blank or corrupt superblock: no module loads it, nothing to
    // mark: a warning (not of stale metadata), exit 0.
    for (img, note, why) in [
        (
            vec![0u8; 4096],
            "it holds no superblock to mark",
            "/dev/fast: no tiercache superblock",
        ),
        (
            {
                let mut b = Meta::new("c", FAST, SLOW).bytes();
                b[100] ^= 1;
                b
            },
            "its superblock unreadable, not marked",
            "/dev/fast: superblock checksum mismatch (torn or corrupt)",
        ),
    ] {
        let t = T::new();
        t.cached("c", 0);
        t.raw_image("/dev/fast", img);
        fail_cache(&t, "c", 0, -5);
        t.ctx()
            .abandon("c", DetachCache::Split, true, false)
            .unwrap();
        let err = t.err.text();
        assert!(
            err.starts_with(&format!(
                "tiercache: warning: c: the superblock of the cache device dev8:32 was not marked failed: {why}"
            )) && err.contains(
                "; no module loads it as it reads now, but wipe or format the device before any other use\n"
            ),
            "{err}"
        );
        assert!(!err.contains("stale"), "{err}");
        assert!(
            t.out
                .text()
                .contains(&format!("cache dev8:32 released, {note}\n")),
            "{}",
            t.out.text()
        );
        assert!(t.host.marked.borrow().is_empty());
    }

    // Marked already (by the module, when a commit failed): nothing written.
    let t = T::new();
    t.cached("c", 2);
    let mut m = Meta::new("c", FAST, SLOW).dirty(2);
    m.flags = disk::SB_FAILED;
    t.image("/dev/fast", &m);
    fail_cache(&t, "c", 2, -5);
    t.ctx()
        .abandon("c", DetachCache::Split, true, false)
        .unwrap();
    assert!(t.host.marked.borrow().is_empty());
    assert!(t
        .out
        .text()
        .contains("its superblock was marked failed already"));
}

#[test]
fn abandon_force_and_uncache() {
    // A cache device the administrator knows is bad: not reported
    // failed, --force.
    let t = T::new();
    attach(&t);
    t.image("/dev/vg/fast", &Meta::new("slow", FAST, SLOW).dirty(4));
    fail_cache(&t, "slow", 4, 0);
    t.ctx()
        .abandon("slow", DetachCache::Uncache, true, true)
        .unwrap();
    let o = t.out.text();
    assert!(
        o.contains(
            "the cache device dev253:2 is not reported failed; abandoning it anyway (--force)"
        ),
        "{o}"
    );
    // Marked before the LV is removed.
    assert_eq!(*t.host.marked.borrow(), ["/dev/vg/fast"]);
    assert!(sb_of(&t, "/dev/vg/fast").failed());
    assert!(t.lvm.log.borrow().contains(&"remove vg/fast".to_string()));
    assert!(
        o.contains("cache LV vg/fast removed, its superblock marked failed"),
        "{o}"
    );
    assert!(!t
        .log()
        .iter()
        .any(|l| l.contains("flush") || l.contains("cleaner")));

    // --uncache needs a cache LV.
    let t = T::new();
    t.cached("c", 1);
    fail_cache(&t, "c", 1, -5);
    let e = t
        .ctx()
        .abandon("c", DetachCache::Uncache, true, false)
        .unwrap_err();
    assert_eq!(e.kind, Kind::Usage);
}

#[test]
fn abandon_rechecks_the_device_once_suspended() {
    use crate::fake::FakeDev;
    // What the administrator confirmed: cache 8:32 of origin 8:16, uuid
    // TIERCACHE-c, failed, 7 dirty blocks.  Each change below happens
    // after that (at the suspend); each is refused.
    type Change = Box<dyn Fn(&mut FakeDev)>;
    let cases: Vec<(&str, Change, Kind, &str)> = vec![
        (
            "cache",
            Box::new(|d| d.table[0].params = d.table[0].params.replace("8:32", "8:48")),
            Kind::Failure,
            "c: not abandoned: its table changed (cache device dev8:48, was dev8:32) since the confirmation; the cache stays attached",
        ),
        (
            "origin",
            Box::new(|d| d.table[0].params = d.table[0].params.replacen("8:16", "8:48", 1)),
            Kind::Failure,
            "c: not abandoned: its table changed (origin device dev8:48, was dev8:16) since the confirmation; the cache stays attached",
        ),
        (
            "length",
            Box::new(|d| d.table[0].len = 1000),
            Kind::Failure,
            "c: not abandoned: its table changed (sectors 0+1000, was 0+524288) since the confirmation; the cache stays attached",
        ),
        (
            "uuid",
            Box::new(|d| d.info.uuid = Some("OTHER".into())),
            Kind::Failure,
            "c: not abandoned: its device-mapper uuid changed (now OTHER, was TIERCACHE-c) since the confirmation; the cache stays attached",
        ),
        (
            "devno",
            Box::new(|d| d.info.devno = (253, 99)),
            Kind::Failure,
            "c: not abandoned: the device was replaced (device number 253:99, was 253:10) since the confirmation; the cache stays attached",
        ),
        (
            "linear",
            Box::new(|d| {
                d.table = vec![crate::dm::Target::new(0, 524288, "linear", "8:16 0".into())];
                d.sim = None;
            }),
            Kind::Failure,
            "c: not abandoned: its table changed (no longer a tiercache table) since the confirmation; the cache stays attached",
        ),
        (
            "healed",
            Box::new(|d| d.sim.as_mut().unwrap().cache_failed = 0),
            Kind::Dirty,
            "c: not abandoned: the module no longer reports the cache device dev8:32 failed; the cache stays attached",
        ),
        (
            "dirtier",
            Box::new(|d| d.sim.as_mut().unwrap().dirty = 8),
            Kind::Dirty,
            "c: not abandoned: the cache now holds 8 dirty blocks, more than the 7 confirmed; the cache stays attached",
        ),
    ];
    for (what, change, kind, msg) in cases {
        let t = T::new();
        t.cached("c", 7);
        t.image("/dev/fast", &Meta::new("c", FAST, SLOW).dirty(7));
        fail_cache(&t, "c", 7, -5);
        *t.dm.before_suspend.borrow_mut() = Some(Box::new(move |dm| dm.with("c", change)));
        let e = t
            .ctx()
            .abandon("c", DetachCache::Split, true, false)
            .unwrap_err();
        assert_eq!((e.kind, e.msg.as_str()), (kind, msg), "{what}");
        assert_eq!(
            t.log(),
            [
                "load c 0 524288 linear 8:16 0",
                "suspend c",
                "clear c",
                "resume c"
            ],
            "{what}"
        );
        t.dm.with("c", |d| {
            assert!(!d.info.suspended && d.inactive.is_none(), "{what}");
            if what != "linear" {
                assert_eq!(d.table[0].ttype, "tiercache", "{what}: no swap");
            }
        });
        assert!(t.host.marked.borrow().is_empty(), "{what}");
        assert!(!t.out.text().contains("cache abandoned"), "{what}");
    }

    // Fewer dirty blocks than confirmed (written around the failed cache
    // meanwhile): abandoned, the count lost is the one at the suspend.
    let t = T::new();
    t.cached("c", 7);
    t.image("/dev/fast", &Meta::new("c", FAST, SLOW).dirty(7));
    fail_cache(&t, "c", 7, -5);
    *t.dm.before_suspend.borrow_mut() = Some(Box::new(|dm| {
        dm.with("c", |d| d.sim.as_mut().unwrap().dirty = 5)
    }));
    t.ctx()
        .abandon("c", DetachCache::Split, true, false)
        .unwrap();
    assert!(
        t.out.text().contains("; 5 dirty blocks (20 KiB) lost;"),
        "{}",
        t.out.text()
    );

    // --force: a cache the module does not report failed (any more).
    let t = T::new();
    t.cached("c", 7);
    t.image("/dev/fast", &Meta::new("c", FAST, SLOW).dirty(7));
    fail_cache(&t, "c", 7, -5);
    *t.dm.before_suspend.borrow_mut() = Some(Box::new(|dm| {
        dm.with("c", |d| d.sim.as_mut().unwrap().cache_failed = 0)
    }));
    t.ctx()
        .abandon("c", DetachCache::Split, true, true)
        .unwrap();
    assert!(matches!(
        t.ctx().classify("c").unwrap(),
        Some(DevKind::Detached { .. })
    ));
}

#[test]
fn abandon_does_not_go_on_without_reading_the_device_back() {
    // The status cannot be read once suspended: not ignored.
    let t = T::new();
    t.cached("c", 7);
    t.image("/dev/fast", &Meta::new("c", FAST, SLOW).dirty(7));
    fail_cache(&t, "c", 7, -5);
    t.dm.fail_status_suspended.set(true);
    let e = t
        .ctx()
        .abandon("c", DetachCache::Split, true, false)
        .unwrap_err();
    assert_eq!(e.kind, Kind::Failure);
    assert_eq!(
        e.msg,
        "c: not abandoned: cannot read it back once suspended (c: status: Input/output error); the cache stays attached"
    );
    assert_eq!(
        t.log(),
        [
            "load c 0 524288 linear 8:16 0",
            "suspend c",
            "clear c",
            "resume c"
        ]
    );
    t.dm.fail_status_suspended.set(false);
    assert!(matches!(
        t.ctx().classify("c").unwrap(),
        Some(DevKind::Cached(_))
    ));
    assert!(t.host.marked.borrow().is_empty());

    // The load or the suspend fails: nothing changed either.
    for load in [true, false] {
        let t = T::new();
        t.cached("c", 7);
        t.image("/dev/fast", &Meta::new("c", FAST, SLOW).dirty(7));
        fail_cache(&t, "c", 7, -5);
        if load {
            t.dm.fail_load.set(true);
        } else {
            t.dm.fail_suspend.set(true);
        }
        let e = t
            .ctx()
            .abandon("c", DetachCache::Split, true, false)
            .unwrap_err();
        assert_eq!(e.kind, Kind::Failure);
        let log = t.log();
        if load {
            assert!(
                e.msg.starts_with("c: cannot load the linear table"),
                "{}",
                e.msg
            );
            assert_eq!(log, ["load c 0 524288 linear 8:16 0", "clear c"]);
        } else {
            assert_eq!(e.msg, "c: suspend: Input/output error");
            assert_eq!(
                e.hint.as_deref(),
                Some("c was not abandoned: its cache stays attached")
            );
            assert_eq!(
                log,
                ["load c 0 524288 linear 8:16 0", "suspend c", "clear c"]
            );
        }
        t.dm.with("c", |d| {
            assert!(!d.info.suspended && d.inactive.is_none());
            assert_eq!(d.table[0].ttype, "tiercache");
        });
        assert!(t.host.marked.borrow().is_empty());
    }
}

#[test]
fn abandon_looks_at_the_table_after_a_failed_resume() {
    let failed = |fails: u32, after_swap: bool| {
        let t = T::new();
        attach(&t);
        t.image("/dev/vg/fast", &Meta::new("slow", FAST, SLOW).dirty(3));
        fail_cache(&t, "slow", 3, -5);
        t.dm.log.borrow_mut().clear();
        t.dm.fail_resumes.set(fails);
        t.dm.fail_resume_after_swap.set(after_swap);
        let r = t.ctx().abandon("slow", DetachCache::Split, true, false);
        (t, r)
    };

    // The kernel swapped the tables, then failed to resume: the linear
    // table is in place, the cache out of it: go on, resume once more.
    let (t, r) = failed(1, true);
    r.unwrap();
    assert_eq!(
        t.log(),
        [
            "load slow 0 524288 linear 253:1 0",
            "suspend slow",
            "resume slow",
            "resume slow"
        ]
    );
    assert!(t.err.text().contains(
        "tiercache: warning: slow: the resume reported an error (slow: resume: Input/output error), but the linear table is in place: going on"
    ));
    assert!(matches!(
        t.ctx().classify("slow").unwrap(),
        Some(DevKind::Detached { .. })
    ));
    t.dm.with("slow", |d| assert!(!d.info.suspended));
    assert_eq!(*t.host.marked.borrow(), ["/dev/vg/fast"]);
    assert!(!t.lvm.get("vg", "fast").has_tag(TAG_CACHE));

    // ... and it stays suspended: released and marked all the same, but
    // an error that says so.
    let (t, r) = failed(2, true);
    let e = r.unwrap_err();
    assert_eq!(e.kind, Kind::Failure);
    assert_eq!(
        e.msg,
        "slow: cache abandoned, but /dev/mapper/slow is still suspended: resuming it failed (slow: resume: Input/output error)"
    );
    assert!(e.hint.unwrap().contains("'dmsetup resume slow'"));
    assert_eq!(*t.host.marked.borrow(), ["/dev/vg/fast"]);
    assert!(!t.lvm.get("vg", "fast").has_tag(TAG_CACHE));
    assert!(!t.host.files.borrow()[CONF].contains("vg/slow"));
    assert!(t.out.text().contains("slow: cache abandoned:"));

    // Still suspended, and the mark fails too: the first is the error,
    // the other a warning with its hint (the retry).
    let t = T::new();
    attach(&t);
    t.image("/dev/vg/fast", &Meta::new("slow", FAST, SLOW).dirty(3));
    fail_cache(&t, "slow", 3, -5);
    t.dm.fail_resumes.set(2);
    t.dm.fail_resume_after_swap.set(true);
    t.host.sb_write_error.set(true);
    let e = t
        .ctx()
        .abandon("slow", DetachCache::Split, true, false)
        .unwrap_err();
    assert!(e.msg.contains("is still suspended"), "{}", e.msg);
    let err = t.err.text();
    assert!(
        err.contains(
            "tiercache: warning: slow: cache abandoned (/dev/mapper/slow maps the origin directly now), \
             but the superblock of its cache device dev253:2 could not be marked failed: "
        ) && err.contains("tiercache: hint: until it is marked, ")
            && err.contains("'tiercache check --mark-failed --uuid TIERCACHE-slow --origin-sectors 524288 /dev/vg/fast'"),
        "{err}"
    );

    // The swap itself failed: the cache table is still there.  Drop the
    // linear table, resume with the cache: not abandoned.
    let (t, r) = failed(1, false);
    let e = r.unwrap_err();
    assert_eq!(e.kind, Kind::Failure);
    assert_eq!(
        e.msg,
        "slow: not abandoned: the swap to the linear table failed (slow: resume: Invalid argument); the cache stays attached"
    );
    assert!(e
        .hint
        .unwrap()
        .starts_with("slow was resumed with its cache"),);
    assert_eq!(
        t.log(),
        [
            "load slow 0 524288 linear 253:1 0",
            "suspend slow",
            "resume slow",
            "clear slow",
            "resume slow"
        ]
    );
    assert!(matches!(
        t.ctx().classify("slow").unwrap(),
        Some(DevKind::Cached(_))
    ));
    t.dm.with("slow", |d| assert!(!d.info.suspended));
    assert!(t.host.marked.borrow().is_empty());
    assert!(t.lvm.get("vg", "fast").has_tag(TAG_CACHE));
    assert!(t.host.files.borrow()[CONF].contains("vg/slow"));
    assert!(!t.out.text().contains("cache abandoned"));

    // ... and it cannot be resumed with its cache either: say so.
    let (t, r) = failed(2, false);
    let e = r.unwrap_err();
    assert!(e
        .msg
        .starts_with("slow: not abandoned: the swap to the linear table failed"));
    assert!(
        e.hint
            .as_deref()
            .unwrap()
            .contains("it is left suspended; try 'dmsetup resume slow'"),
        "{:?}",
        e.hint
    );
    assert!(t.host.marked.borrow().is_empty());
}

#[test]
fn abandon_marks_only_the_cache_of_this_device() {
    let abandon = |setup: &dyn Fn(&T)| {
        let t = T::new();
        attach(&t);
        t.image("/dev/vg/fast", &Meta::new("slow", FAST, SLOW).dirty(3));
        fail_cache(&t, "slow", 3, -5);
        setup(&t);
        let r = t.ctx().abandon("slow", DetachCache::Split, true, false);
        (t, r)
    };
    // Each refusal fails the command (the device is linear already).
    let refused = |t: &T, r: crate::error::Result<()>, kind: Kind, why: &str| {
        let e = r.unwrap_err();
        assert_eq!(e.kind, kind, "{}", e.msg);
        assert!(
            e.msg.starts_with(
                "slow: cache abandoned (/dev/mapper/slow maps the origin directly now), but the superblock \
                 of its cache device dev253:2 could not be marked failed: "
            ) && e.msg.ends_with(why),
            "{}",
            e.msg
        );
        assert!(t.host.marked.borrow().is_empty());
        assert!(!sb_of(t, "/dev/vg/fast").failed());
        assert!(matches!(
            t.ctx().classify("slow").unwrap(),
            Some(DevKind::Detached { .. })
        ));
    };
    // The LV's node names another device now (the LV was replaced).
    let (t, r) = abandon(&|t| {
        t.host
            .node_devno
            .borrow_mut()
            .insert("/dev/vg/fast".into(), (253, 7));
    });
    refused(
        &t,
        r,
        Kind::NotFound,
        "/dev/vg/fast: not the cache device: it is device 253:7, the cache device was 253:2; not marked",
    );
    // Its superblock is another device's cache, or of another origin.
    for (meta, why) in [
        (
            Meta::new("other", FAST, SLOW),
            "(uuid TIERCACHE-other, not TIERCACHE-slow)",
        ),
        (
            Meta::new("slow", FAST, SLOW / 2),
            "(an origin of 262144 sectors, not 524288)",
        ),
    ] {
        let (t, r) = abandon(&|t| t.image("/dev/vg/fast", &meta));
        refused(
            &t,
            r,
            Kind::Busy,
            &format!(
                "/dev/vg/fast: its superblock is the cache of another device {why}; not marked"
            ),
        );
    }
    // Held by someone (exclusive open refused).
    let (t, r) = abandon(&|t| {
        t.host
            .users
            .borrow_mut()
            .insert((253, 2), "mounted on /mnt".into());
    });
    refused(&t, r, Kind::Busy, "/dev/vg/fast: in use (mounted on /mnt)");
    // A superblock without uuid (any device's): marked.
    let (t, r) = abandon(&|t| {
        let mut m = Meta::new("slow", FAST, SLOW);
        m.uuid = String::new();
        t.image("/dev/vg/fast", &m);
    });
    r.unwrap();
    assert_eq!(*t.host.marked.borrow(), ["/dev/vg/fast"]);
}

#[test]
fn activate_from_config() {
    let t = T::new();
    t.lvm.add(&t.host, "vg", "slow", 256 * MIB, (253, 1), false);
    t.lvm.add(&t.host, "vg", "fast", 64 * MIB, (253, 2), false);
    // Both caches were formatted when the devices were first set up.
    t.image("/dev/vg/fast", &Meta::new("a", 64 * MIB, 256 * MIB));
    t.image("/dev/fast", &Meta::new("b", 64 * MIB, 256 * MIB));
    t.host.files.borrow_mut().insert(
        CONF.into(),
        "a vg/slow vg/fast bridge_gap_kb=64\nb /dev/slow /dev/fast noauto\n".into(),
    );
    t.ctx().activate(true, &[], false).unwrap();
    let lvlog = t.lvm.log.borrow().clone();
    assert_eq!(
        lvlog,
        vec!["activate vg/fast", "activate vg/slow"],
        "cache first"
    );
    assert!(t.dm.devs.borrow().contains_key("a"));
    assert!(!t.dm.devs.borrow().contains_key("b"), "noauto skipped");
    assert!(t
        .log()
        .contains(&"load a 0 524288 tiercache 253:1 253:2 8 2 bridge_gap_kb 64".to_string()));
    // Idempotent.
    t.ctx().activate(true, &[], false).unwrap();
    assert!(t.out.text().contains("a: already active"));
    // By name, including noauto ones.
    t.ctx().activate(false, &["b".into()], false).unwrap();
    assert!(t.dm.devs.borrow().contains_key("b"));
    let e = t.ctx().activate(false, &["zz".into()], false).unwrap_err();
    assert_eq!(e.kind, Kind::NotFound);
    assert_eq!(
        t.ctx().activate(false, &[], false).unwrap_err().kind,
        Kind::Usage
    );
}

#[test]
fn activate_never_exposes_origin_without_cache() {
    // A blank cache: never formatted at boot; the origin is not touched.
    let t = T::new();
    t.lvm.add(&t.host, "vg", "slow", 256 * MIB, (253, 1), false);
    t.lvm.add(&t.host, "vg", "fast", 64 * MIB, (253, 2), false);
    t.host
        .files
        .borrow_mut()
        .insert(CONF.into(), "a vg/slow vg/fast\n".into());
    let e = t.ctx().activate(true, &[], false).unwrap_err();
    assert_eq!((e.kind, e.kind.exit_code()), (Kind::NoSuperblock, 11));
    let err = t.err.text();
    assert!(
        err.contains("cache vg/fast holds no tiercache metadata")
            && err.contains("activation does not format a cache"),
        "{err}"
    );
    assert!(err.contains("'tiercache activate --format a'"), "{err}");
    assert_eq!(t.lvm.log.borrow().as_slice(), ["activate vg/fast"]);
    assert!(t.dm.devs.borrow().is_empty());

    let t = T::new();
    t.lvm.add(&t.host, "vg", "slow", 256 * MIB, (253, 1), false);
    t.host
        .files
        .borrow_mut()
        .insert(CONF.into(), "a vg/slow vg/gone\n".into());
    let e = t.ctx().activate(true, &[], false).unwrap_err();
    assert_eq!(e.kind, Kind::NotFound);
    assert!(
        t.err.text().contains("vg/gone not found"),
        "{}",
        t.err.text()
    );
    assert!(
        t.lvm.log.borrow().is_empty(),
        "origin untouched: {:?}",
        t.lvm.log.borrow()
    );

    // The cache is there but the table is refused: the origin LV, activated
    // for the attempt, is deactivated again.
    let t = T::new();
    t.lvm.add(&t.host, "vg", "slow", 256 * MIB, (253, 1), false);
    t.lvm.add(&t.host, "vg", "fast", 64 * MIB, (253, 2), false);
    t.image("/dev/vg/fast", &Meta::new("a", 64 * MIB, 256 * MIB));
    t.lvm.mark("vg", "slow", TAG_ORIGIN, true).unwrap();
    t.dm.reject_tiercache.set(true);
    t.host
        .files
        .borrow_mut()
        .insert(CONF.into(), "a vg/slow vg/fast\n".into());
    assert!(t.ctx().activate(true, &[], false).is_err());
    assert!(
        t.lvm
            .log
            .borrow()
            .contains(&"deactivate vg/slow".to_string()),
        "{:?}",
        t.lvm.log.borrow()
    );
    use crate::lvm::Lvm;
}

#[test]
fn bad_config_is_reported_with_line() {
    let t = T::new();
    t.host
        .files
        .borrow_mut()
        .insert(CONF.into(), "# x\na vg/slow\n".into());
    let e = t.ctx().activate(true, &[], false).unwrap_err();
    assert_eq!(e.kind, Kind::Config);
    assert!(e.msg.starts_with("/etc/tiercache.conf:2: "), "{}", e.msg);
}

#[test]
fn deactivate_flushes_removes_and_hides_lvs() {
    let t = T::new();
    attach(&t);
    t.dm.with("slow", |d| d.sim.as_mut().unwrap().dirty = 100);
    t.ctx().deactivate(true, &[], quiet()).unwrap();
    assert!(t.dm.devs.borrow().is_empty());
    let lvlog = t.lvm.log.borrow().clone();
    assert!(
        lvlog.ends_with(&[
            "deactivate vg/fast".to_string(),
            "deactivate vg/slow".to_string()
        ]),
        "{lvlog:?}"
    );
}

#[test]
fn list_shows_cached_and_detached() {
    let t = T::new();
    attach(&t);
    t.cached("other", 3);
    t.ctx().list(false).unwrap();
    let o = t.out.text();
    assert!(o.lines().any(|l| l.starts_with("NAME ")), "{o}");
    assert!(
        o.lines()
            .any(|l| l.starts_with("other") && l.contains("cached") && l.contains("12 KiB")),
        "{o}"
    );
    t.ctx().detach("slow", DetachCache::Split, quiet()).unwrap();
    let t2out = Buf::default();
    let ctx = Ctx {
        out: RefCell::new(Box::new(t2out.clone())),
        ..t.ctx()
    };
    ctx.list(true).unwrap();
    let v: serde_json::Value = serde_json::from_str(&t2out.text()).unwrap();
    let states: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, vec!["cached", "detached"]);
}

#[test]
fn set_save_updates_the_config_entry() {
    let t = T::new();
    attach(&t);
    t.ctx().set("slow", "flush_depth", "64", true).unwrap();
    t.ctx().set("slow", "mode", "writethrough", true).unwrap();
    t.ctx().set("slow", "flush_depth", "32", true).unwrap();
    let conf = t.host.files.borrow()[CONF].clone();
    assert!(
        conf.contains("slow\tvg/slow\tvg/fast\tblock_size=4K,mode=writethrough,flush_depth=32\n"),
        "{conf}"
    );
    assert_eq!(crate::config::parse("x", &conf).unwrap().len(), 1);
}

// --------------------------------------------------------------------
// Load or format: what the cache's superblock decides
// --------------------------------------------------------------------

/// The table line loaded for device `c` (create on /dev/slow, /dev/fast).
fn create_line(t: &T, format: bool) -> Result<String, crate::error::Error> {
    t.dm.log.borrow_mut().clear();
    t.dm.devs.borrow_mut().clear();
    t.ctx()
        .create(&setup("c", "/dev/slow", "/dev/fast"), false, format)?;
    Ok(t.log()
        .into_iter()
        .find(|l| l.starts_with("load c"))
        .unwrap())
}

const FAST: u64 = 64 * MIB;
const SLOW: u64 = 256 * MIB;

#[test]
fn matching_cache_is_loaded_not_formatted() {
    let t = T::new();
    t.image("/dev/fast", &Meta::new("c", FAST, SLOW).dirty(5));
    assert_eq!(
        create_line(&t, false).unwrap(),
        "load c 0 524288 tiercache 8:16 8:32 8 0"
    );
    assert!(
        t.out
            .text()
            .contains("c: cache /dev/fast loaded from its metadata (commit 10)"),
        "{}",
        t.out.text()
    );
    // A superblock without a uuid matches any device.
    let mut m = Meta::new("c", FAST, SLOW);
    m.uuid.clear();
    t.image("/dev/fast", &m);
    assert_eq!(
        create_line(&t, false).unwrap(),
        "load c 0 524288 tiercache 8:16 8:32 8 0"
    );
}

#[test]
fn version_3_cache_keeps_its_geometry() {
    // A cache formatted before the summary: its layout holds a slot more
    // on this device than a new format's.
    let v3 = disk::layout_v(FAST / 512, 8, disk::VERSION_V3).unwrap();
    let v4 = disk::layout(FAST / 512, 8).unwrap();
    assert_eq!((v3.nr_slots, v4.nr_slots), (16256, 16255));
    let t = T::new();
    let old = |m: Meta| Meta {
        version: disk::VERSION_V3,
        ..m
    };
    // Same geometry in its own version: loaded as it is, dirty data kept.
    t.image("/dev/fast", &old(Meta::new("c", FAST, SLOW).dirty(3)));
    assert_eq!(sb_of(&t, "/dev/fast").version, disk::VERSION_V3);
    assert_eq!(
        create_line(&t, false).unwrap(),
        "load c 0 524288 tiercache 8:16 8:32 8 0"
    );
    assert!(t.host.cleared.borrow().is_empty());
    // --format with its dirty data: refused as for any cache.
    assert_eq!(create_line(&t, true).unwrap_err().kind, Kind::Dirty);
    // Clean, --format: the module formats over a superblock of this
    // device in its own version's layout, and writes version 4; nothing
    // is cleared (the next generation keeps its order).
    t.image("/dev/fast", &old(Meta::new("c", FAST, SLOW)));
    assert!(create_line(&t, true).unwrap().ends_with("8 1 format"));
    assert!(t.host.cleared.borrow().is_empty());
    // A version 3 cache of a smaller device: counted in its own layout.
    t.image("/dev/fast", &old(Meta::new("c", FAST / 2, SLOW)));
    let e = create_line(&t, false).unwrap_err();
    assert_eq!(e.kind, Kind::Busy);
    assert!(
        e.msg
            .contains("it was formatted for 8127 slots, the device now holds 16256"),
        "{}",
        e.msg
    );
}

#[test]
fn format_option() {
    let t = T::new();
    // Clean: --format formats.
    t.image("/dev/fast", &Meta::new("c", FAST, SLOW));
    assert_eq!(
        create_line(&t, true).unwrap(),
        "load c 0 524288 tiercache 8:16 8:32 8 1 format"
    );
    // Blank: formatted with or without --format.
    t.host.images.borrow_mut().clear();
    assert!(create_line(&t, true).unwrap().ends_with("8 1 format"));
    // Dirty: refused up front, nothing created.
    t.image("/dev/fast", &Meta::new("c", FAST, SLOW).dirty(3));
    let e = create_line(&t, true).unwrap_err();
    assert_eq!((e.kind, e.kind.exit_code()), (Kind::Dirty, 5));
    assert!(
        e.msg.contains(
            "c: refusing to format cache /dev/fast: it holds 12 KiB of dirty data (3 blocks) not yet on the origin"
        ),
        "{}",
        e.msg
    );
    let h = e.hint.unwrap();
    assert!(
        h.contains("without --format") && h.contains("tiercache writeback --cache /dev/fast"),
        "{h}"
    );
    assert!(h.contains("--force does not drop dirty data"), "{h}");
    assert!(t.log().is_empty(), "{:?}", t.log());
    // Uncommitted dirty entries do not count (the kernel ignores them).
    let mut m = Meta::new("c", FAST, SLOW);
    m.entries.push((4, 9, true, 11));
    t.image("/dev/fast", &m);
    assert!(create_line(&t, true).unwrap().ends_with("8 1 format"));
    // Nor do dirty entries of an earlier generation (an earlier format's),
    // which the kernel's count reads as empty too.
    let mut img = Meta::new("c", FAST, SLOW).dirty(3).bytes();
    let mut newer = Meta::new("c", FAST, SLOW);
    newer.generation += 1;
    img[..disk::SB_BYTES].copy_from_slice(&newer.bytes()[..disk::SB_BYTES]);
    t.raw_image("/dev/fast", img.clone());
    assert!(create_line(&t, true).unwrap().ends_with("8 1 format"));
    // ... and a load of it finds them foreign, not corrupt: loaded.
    t.raw_image("/dev/fast", img);
    assert_eq!(
        create_line(&t, false).unwrap(),
        "load c 0 524288 tiercache 8:16 8:32 8 0"
    );
}

#[test]
fn cache_of_another_setup_is_refused() {
    let t = T::new();
    // Another device's cache, clean: refused, --format reformats it.
    t.image("/dev/fast", &Meta::new("other", FAST, SLOW));
    let e = create_line(&t, false).unwrap_err();
    assert_eq!((e.kind, e.kind.exit_code()), (Kind::Busy, 4));
    assert!(
        e.msg
            .contains("it belongs to the device 'other' (uuid TIERCACHE-other)")
            && e.msg.contains("it holds no dirty data"),
        "{}",
        e.msg
    );
    assert_eq!(e.hint.unwrap(), "--format reformats it for c");
    assert!(create_line(&t, true).unwrap().ends_with("8 1 format"));
    assert!(
        t.host.cleared.borrow().is_empty(),
        "same geometry: the kernel formats over it"
    );

    // Clean, another block size: --format clears the superblock first (the
    // kernel does not format over another geometry), then formats.
    let mut m = Meta::new("c", FAST, SLOW);
    m.block_sectors = 16;
    t.image("/dev/fast", &m);
    assert_eq!(create_line(&t, false).unwrap_err().kind, Kind::Busy);
    assert!(t.host.cleared.borrow().is_empty());
    assert!(create_line(&t, true).unwrap().ends_with("8 1 format"));
    assert_eq!(t.host.cleared.borrow().as_slice(), ["/dev/fast"]);
    assert!(
        t.out.text().contains(
            "its superblock, of another geometry and without dirty data, was cleared first"
        ),
        "{}",
        t.out.text()
    );
    t.host.cleared.borrow_mut().clear();

    // The cache device grew: same block size, more slots.
    t.image("/dev/fast", &Meta::new("c", FAST / 2, SLOW));
    let e = create_line(&t, false).unwrap_err();
    assert_eq!(e.kind, Kind::Busy);
    assert!(
        e.msg
            .contains("it was formatted for 8126 slots, the device now holds 16255"),
        "{}",
        e.msg
    );

    // Dirty, another block size: refused, with or without --format.
    let mut m = Meta::new("c", FAST, SLOW).dirty(2);
    m.block_sectors = 16;
    t.image("/dev/fast", &m);
    for format in [false, true] {
        let e = create_line(&t, format).unwrap_err();
        assert_eq!(e.kind, Kind::Dirty);
        assert!(
            e.msg.contains("16 KiB of dirty data (2 blocks) for another set-up: it has 8 KiB blocks, not 4 KiB"),
            "{}",
            e.msg
        );
        assert!(e.hint.unwrap().contains("block size 8 KiB"));
    }
    // Another origin size.
    let m = Meta::new("c", FAST, 128 * MIB);
    t.image("/dev/fast", &m);
    let e = create_line(&t, false).unwrap_err();
    assert_eq!(e.kind, Kind::Busy);
    assert!(
        e.msg
            .contains("it caches an origin of 262144 sectors, /dev/slow has 524288"),
        "{}",
        e.msg
    );
    assert!(t.log().is_empty());
}

#[test]
fn bad_superblock_is_never_loaded() {
    let t = T::new();
    let mut img = Meta::new("c", FAST, SLOW).dirty(1).bytes();
    img[60] ^= 0x20;
    t.raw_image("/dev/fast", img.clone());
    let e = create_line(&t, false).unwrap_err();
    assert_eq!((e.kind, e.kind.exit_code()), (Kind::BadSuperblock, 12));
    assert_eq!(
        e.msg,
        "c: cache /dev/fast: superblock checksum mismatch (torn or corrupt)"
    );
    let h = e.hint.unwrap();
    assert!(
        h.contains("'tiercache check /dev/fast'") && h.contains("--format"),
        "{h}"
    );
    // --format: formatted over, with a warning.
    assert!(create_line(&t, true).unwrap().ends_with("8 1 format"));
    assert!(
        t.err
            .text()
            .contains("warning: c: cache /dev/fast: superblock checksum mismatch (torn or corrupt); formatting it as asked"),
        "{}",
        t.err.text()
    );

    // An unknown version: neither loaded nor formatted.
    let mut img = Meta::new("c", FAST, SLOW).bytes();
    let v = std::mem::offset_of!(disk::ffi::tc_disk_sb, version);
    let c = std::mem::offset_of!(disk::ffi::tc_disk_sb, csum);
    img[v..v + 4].copy_from_slice(&7u32.to_le_bytes());
    img[c..c + 4].fill(0);
    let crc = disk::crc(&img[..disk::SB_BYTES]);
    img[c..c + 4].copy_from_slice(&crc.to_le_bytes());
    t.raw_image("/dev/fast", img);
    for format in [false, true] {
        let e = create_line(&t, format).unwrap_err();
        assert_eq!(e.kind, Kind::BadSuperblock);
        assert!(e.msg.contains("unknown format version"), "{}", e.msg);
    }

    // A superblock for a larger device than the cache.
    t.image("/dev/fast", &Meta::new("c", 2 * FAST, SLOW));
    let e = create_line(&t, false).unwrap_err();
    assert_eq!(e.kind, Kind::BadSuperblock);
    assert!(e.msg.contains("but the device has 131072"), "{}", e.msg);
    assert!(t.log().is_empty());
}

#[test]
fn a_cache_marked_failed_is_formatted_only_with_format() {
    let failed = |m: Meta| Meta {
        flags: disk::SB_FAILED,
        ..m
    };
    let t = T::new();
    t.image("/dev/fast", &failed(Meta::new("c", FAST, SLOW).dirty(3)));
    // Not loaded: the module refuses it too.
    let e = create_line(&t, false).unwrap_err();
    assert_eq!((e.kind, e.kind.exit_code()), (Kind::SbFailed, 15));
    assert_eq!(
        e.msg,
        "c: cache /dev/fast: its superblock is marked failed (by the module when a metadata commit failed, or by 'tiercache detach --abandon' when the cache was given up): the module does not load it"
    );
    let h = e.hint.unwrap();
    assert!(
        h.contains("--format formats the cache afresh")
            && h.contains("'tiercache writeback --force --cache /dev/fast --origin ORIGIN'"),
        "{h}"
    );
    assert!(t.log().is_empty());
    // --format: its dirty blocks were given up; formatted, with a warning.
    assert_eq!(
        create_line(&t, true).unwrap(),
        "load c 0 524288 tiercache 8:16 8:32 8 1 format"
    );
    assert!(
        t.err.text().contains(
            "warning: c: cache /dev/fast is marked failed; formatting it as asked (--format): its 3 dirty blocks are given up"
        ),
        "{}",
        t.err.text()
    );
    // Of another set-up too (it was abandoned, and is reused).
    t.image(
        "/dev/fast",
        &failed(Meta::new("old", FAST, 2 * SLOW).dirty(3)),
    );
    assert!(create_line(&t, true).unwrap().ends_with("8 1 format"));
    let e = create_line(&t, false).unwrap_err();
    assert_eq!(e.kind, Kind::SbFailed);
    // Without the mark, the same dirty cache is still refused.
    t.image("/dev/fast", &Meta::new("old", FAST, 2 * SLOW).dirty(3));
    assert_eq!(create_line(&t, true).unwrap_err().kind, Kind::Dirty);

    // At boot: refused before the origin LV is activated.
    let t = T::new();
    t.lvm.add(&t.host, "vg", "slow", SLOW, (253, 1), false);
    t.lvm.add(&t.host, "vg", "fast", FAST, (253, 2), false);
    t.host
        .files
        .borrow_mut()
        .insert(CONF.into(), "a vg/slow vg/fast\n".into());
    t.image("/dev/vg/fast", &failed(Meta::new("a", FAST, SLOW)));
    let e = t.ctx().activate(true, &[], false).unwrap_err();
    assert_eq!(e.kind, Kind::SbFailed);
    assert_eq!(t.lvm.log.borrow().as_slice(), ["activate vg/fast"]);
    assert!(
        t.err
            .text()
            .contains("'tiercache activate --format a' formats"),
        "{}",
        t.err.text()
    );
    assert!(t.dm.devs.borrow().is_empty());
}

#[test]
fn activate_loads_and_never_formats() {
    let conf = "a vg/slow vg/fast\n";
    let with = |m: Option<Meta>| {
        let t = T::new();
        t.lvm.add(&t.host, "vg", "slow", SLOW, (253, 1), false);
        t.lvm.add(&t.host, "vg", "fast", FAST, (253, 2), false);
        t.lvm.mark("vg", "slow", TAG_ORIGIN, true).unwrap();
        t.lvm.mark("vg", "fast", TAG_CACHE, true).unwrap();
        t.lvm.log.borrow_mut().clear();
        t.host.files.borrow_mut().insert(CONF.into(), conf.into());
        if let Some(m) = m {
            t.image("/dev/vg/fast", &m);
        }
        t
    };
    use crate::lvm::Lvm;

    // Matching, dirty: loaded.
    let t = with(Some(Meta::new("a", FAST, SLOW).dirty(4)));
    t.ctx().activate(true, &[], false).unwrap();
    assert!(t
        .log()
        .contains(&"load a 0 524288 tiercache 253:1 253:2 8 0".to_string()));
    assert!(
        t.out
            .text()
            .contains("a: activated (253:10); cache vg/fast loaded from its metadata (commit 10)"),
        "{}",
        t.out.text()
    );

    // A bad superblock: the origin LV is never activated.
    let mut img = Meta::new("a", FAST, SLOW).dirty(4).bytes();
    img[70] ^= 1;
    let t = with(None);
    t.raw_image("/dev/vg/fast", img);
    let e = t.ctx().activate(true, &[], false).unwrap_err();
    assert_eq!(e.kind, Kind::BadSuperblock);
    assert_eq!(t.lvm.log.borrow().as_slice(), ["activate vg/fast"]);
    assert!(t.err.text().contains("'tiercache activate --format a'"));
    assert!(t.dm.devs.borrow().is_empty());

    // Another set-up with dirty data: refused, the origin hidden again.
    let t = with(Some(Meta::new("zz", FAST, SLOW).dirty(4)));
    let e = t.ctx().activate(true, &[], false).unwrap_err();
    assert_eq!(e.kind, Kind::Dirty);
    assert!(
        t.lvm.log.borrow().ends_with(&[
            "activate vg/slow".to_string(),
            "deactivate vg/slow".to_string()
        ]),
        "{:?}",
        t.lvm.log.borrow()
    );
    assert!(!t.lvm.lv("vg", "slow").unwrap().unwrap().active);

    // --format: only by name, formats a blank cache once.
    let t = with(None);
    assert_eq!(
        t.ctx().activate(true, &[], true).unwrap_err().kind,
        Kind::Usage
    );
    t.ctx().activate(false, &["a".into()], true).unwrap();
    assert!(t
        .log()
        .contains(&"load a 0 524288 tiercache 253:1 253:2 8 1 format".to_string()));
    // ... and not a dirty one.
    let t = with(Some(Meta::new("a", FAST, SLOW).dirty(1)));
    let e = t.ctx().activate(false, &["a".into()], true).unwrap_err();
    assert_eq!(e.kind, Kind::Dirty);
}

#[test]
fn reload_never_formats() {
    let t = T::new();
    t.ctx()
        .create(&setup("c", "/dev/slow", "/dev/fast"), false, false)
        .unwrap();
    t.dm.log.borrow_mut().clear();
    t.ctx().set("c", "mode", "writethrough", false).unwrap();
    let log = t.log();
    assert_eq!(
        log[0],
        "load c 0 524288 tiercache 8:16 8:32 8 1 writethrough"
    );
}

#[test]
fn format_counts_dirty_entries_beyond_the_origin_as_the_kernel_does() {
    // A committed dirty entry naming a block beyond the origin: corrupt for
    // check, but dirty for the kernel's format refusal.
    let t = T::new();
    let mut m = Meta::new("c", FAST, SLOW);
    m.entries.push((0, 1 << 40, true, 3));
    t.image("/dev/fast", &m);
    let e = create_line(&t, true).unwrap_err();
    assert_eq!(e.kind, Kind::Dirty);
    // Clean, it does not count.
    let mut m = Meta::new("c", FAST, SLOW);
    m.entries.push((0, 1 << 40, false, 3));
    t.image("/dev/fast", &m);
    assert!(create_line(&t, true).unwrap().ends_with("8 1 format"));
    assert!(
        t.err
            .text()
            .contains("1 corrupt metadata entry dropped by the format"),
        "{}",
        t.err.text()
    );
}

#[test]
fn a_refused_load_is_explained_from_the_entries() {
    let t = T::new();
    let mut img = Meta::new("c", FAST, SLOW).dirty(3).bytes();
    let o = disk::entry_offset(&disk::layout(FAST / 512, 8).unwrap(), 1) as usize;
    img[o + 5] ^= 0x40;
    t.raw_image("/dev/fast", img);
    t.dm.reject_tiercache.set(true);
    let e = create_line(&t, false).unwrap_err();
    assert_eq!((e.kind, e.kind.exit_code()), (Kind::BadEntries, 13));
    assert_eq!(
        e.msg,
        "c: the kernel refused to load cache /dev/fast: 1 corrupt metadata entry (slot 1: checksum mismatch)"
    );
    assert!(e.hint.unwrap().contains("tiercache writeback --force"));
    assert!(t.dm.devs.borrow().is_empty(), "rolled back");

    let mut m = Meta::new("c", FAST, SLOW).dirty(2);
    m.entries.push((9, 1000, true, 4));
    t.image("/dev/fast", &m);
    let e = create_line(&t, false).unwrap_err();
    assert_eq!(e.kind, Kind::DuplicateDirty);
    assert!(
        e.msg.contains(
            "origin blocks dirty in several slots of one epoch (block 1000 in slots [0, 9], all of epoch 0)"
        ),
        "{}",
        e.msg
    );
}

/// A full flush already runs when `flush --wait` asks for one: the
/// running one ends first (and counts), the target then starts the one
/// asked for.  The wait must last until that one ends, not the older one
/// (which returned with blocks dirtied since it began still dirty).
#[test]
fn flush_wait_waits_for_its_own_flush_behind_a_running_one() {
    let t = T::new();
    t.cached("c", 300);
    t.dm.with("c", |d| {
        let s = d.sim.as_mut().unwrap();
        s.state = "flushing";
        s.flushes = 1;
        s.end_at_dirty = 150;
    });
    t.ctx().flush("c", true, quiet()).unwrap();
    let (dirty, state, flushes) = t.dm.with("c", |d| {
        let s = d.sim.as_ref().unwrap();
        (s.dirty, s.state, s.flushes)
    });
    assert_eq!(
        (dirty, state, flushes),
        (0, "idle", 3),
        "flush --wait returned at the end of the flush that was running before it asked"
    );
}

/// A suspended device writes nothing back: `remove` (and `flush --wait`,
/// `detach`) say so at once instead of waiting for ever for a flush.
#[test]
fn flush_wait_refuses_a_suspended_device() {
    let t = T::new();
    t.cached("c", 500);
    t.dm.with("c", |d| d.info.suspended = true);
    let o = FlushOpts {
        timeout: Some(60.0),
        progress: ProgressMode::Quiet,
    };
    let e = t.ctx().remove("c", false, false, o).unwrap_err();
    assert_ne!(e.kind, Kind::Timeout, "{}", e.msg);
    assert!(e.msg.contains("is suspended"), "{}", e.msg);
    assert!(e.hint.as_deref().unwrap_or("").contains("dmsetup resume c"));
    assert!(
        !t.log().contains(&"message c flush".to_string()),
        "{:?}",
        t.log()
    );
}

/// `detach --abandon` killed once the linear table is in, before it
/// removes the LV tags and the configuration entry: the superblock must
/// already be marked failed, so that the boot's `activate` does not load
/// the cache's stale dirty blocks over what the origin took since.
#[test]
fn abandon_marks_the_cache_before_it_touches_tags_and_configuration() {
    let t = T::new();
    attach(&t);
    t.image("/dev/vg/fast", &Meta::new("slow", FAST, SLOW).dirty(3));
    fail_cache(&t, "slow", 3, -5);
    t.lvm.die_on_unmark.set(true);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = t.ctx().abandon("slow", DetachCache::Split, true, false);
    }));
    assert!(
        r.is_err(),
        "the fake did not kill the abandon at the unmark"
    );
    t.lvm.die_on_unmark.set(false);
    assert!(matches!(
        t.ctx().classify("slow").unwrap(),
        Some(DevKind::Detached { .. })
    ));
    assert!(t.host.files.borrow()[CONF].contains("vg/slow"));
    assert!(
        sb_of(&t, "/dev/vg/fast").failed(),
        "killed after the swap, the cache's superblock is not marked failed"
    );
    // A reboot: no dm devices, the cache device answers again.
    t.dm.devs.borrow_mut().clear();
    t.dm.log.borrow_mut().clear();
    let _ = t.ctx().activate(true, &[], false);
    assert!(
        !t.log().iter().any(|l| l.starts_with("load slow")
            && l.contains("tiercache")
            && !l.contains("format")),
        "the boot loads the abandoned cache: {:?}",
        t.log()
    );
}

/// `lvs` fails when `detach` starts: nothing is changed (before, the
/// detach went on taking both devices for no LV, and left the origin LV
/// tagged and skipped at activation with its configuration entry gone).
#[test]
fn detach_with_lvs_failing_changes_nothing() {
    let t = T::new();
    attach(&t);
    t.dm.log.borrow_mut().clear();
    t.lvm.fail_all.set(true);
    let e = t
        .ctx()
        .detach("slow", DetachCache::Split, quiet())
        .unwrap_err();
    t.lvm.fail_all.set(false);
    assert!(e.msg.contains("lvs"), "{}", e.msg);
    assert!(
        t.log().is_empty(),
        "dm calls after lvs failed: {:?}",
        t.log()
    );
    let o = t.lvm.get("vg", "slow");
    assert!(o.has_tag(TAG_ORIGIN) && o.skip_activation);
    assert!(t.host.files.borrow()[CONF].contains("vg/slow"));
    assert!(matches!(
        t.ctx().classify("slow").unwrap(),
        Some(DevKind::Cached(_))
    ));
}
