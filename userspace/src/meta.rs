// SPDX-License-Identifier: GPL-2.0-only
//! Offline commands on a cache device's metadata, without the module and
//! without device-mapper: `check`, `dump` and `writeback`.  They take a
//! block device or an image file (a regular file), and decode everything
//! with the module's C code (`disk`).
//!
//! Exit codes (`error::Kind`): 0 consistent; 10 the device cannot be
//! opened or read; 11 no superblock; 12 bad superblock; 13 corrupt
//! entries, or (version 4) dirty entries in metadata blocks the summary
//! does not mark; 14 duplicate dirty entries; 15 the superblock is marked
//! failed.  When several apply, the lowest.

use serde::Serialize;
use std::io::Write;

use crate::disk::{
    self, Access, BadEntry, Counts, Dev, DirtyMblock, DirtyRef, Duplicate, EntryState, EpochCount,
    ReadAt, SbRead, SbState, SumBlock, SumState, Summary, Superblock, Survey, WriteAt,
};
use crate::error::{usage, Error, Kind, Result};
use crate::units::fmt_bytes;

/// Largest origin write of the offline writeback.
pub const MAX_WRITE_BYTES: u64 = 4 << 20;

fn warn_if_held(dev: &Dev, err: &mut dyn Write) {
    if let Some(d) = dev.devno {
        let h = disk::holders(d);
        if !h.is_empty() {
            let _ = writeln!(
                err,
                "tiercache: warning: {}: in use (held by {}): a live cache changes its metadata while it is read",
                dev.path(),
                h.join(", ")
            );
        }
    }
}

// --------------------------------------------------------------------
// check
// --------------------------------------------------------------------

/// What `check` found, as printed by `--json`.
#[derive(Clone, Debug, Serialize)]
pub struct CheckReport {
    pub device: String,
    /// ok, unreadable, no_superblock, bad_superblock, bad_entries,
    /// bad_summary (exit code 13 too), duplicate_dirty, failed
    pub result: &'static str,
    pub exit_code: i32,
    /// The first problem, as also printed on stderr.
    pub error: Option<String>,
    pub device_bytes: Option<u64>,
    pub superblock_state: Option<SbState>,
    pub superblock: Option<Superblock>,
    /// The superblock is marked failed (whatever else is wrong).
    pub failed: bool,
    pub counts: Option<Counts>,
    pub dirty_bytes: Option<u64>,
    pub corrupt: Vec<BadEntry>,
    pub duplicates: Vec<Duplicate>,
    /// The epochs of the committed dirty entries.
    pub epochs: Option<EpochReport>,
    /// The summary (version 4; null before, or when not read).
    pub summary: Option<SummaryReport>,
}

/// The summary of a version 4 cache against its entries, as `check`
/// reports it.
#[derive(Clone, Debug, Serialize)]
pub struct SummaryReport {
    /// Its first sector and its 4 KiB blocks.
    pub start: u64,
    pub blocks: u64,
    /// Metadata blocks in all, and those it marks ("may hold a dirty
    /// entry"; every one of a bad summary block).
    pub meta_blocks: u64,
    pub marked: u64,
    /// Metadata blocks holding dirty entries (committed or not).
    pub dirty_meta_blocks: u64,
    /// Summary blocks torn, damaged or not of this format (a format
    /// writes every one): read as marking every metadata block of their
    /// range, as the module reads them (not an error).
    pub damaged: Vec<DamagedSum>,
    /// Metadata blocks holding dirty entries that it does not mark: the
    /// module's load, which reads only the marked ones, would miss their
    /// dirty blocks (an error).
    pub unmarked: Vec<Unmarked>,
}

/// A summary block torn, damaged or not of this format.
#[derive(Clone, Debug, Serialize)]
pub struct DamagedSum {
    pub index: u64,
    /// The metadata blocks it covers, all read as marked.
    pub meta_blocks: u64,
}

/// A metadata block with dirty entries that the summary does not mark.
#[derive(Clone, Debug, Serialize)]
pub struct Unmarked {
    pub meta_block: u64,
    /// Its entries with the DIRTY flag, and the slot of the first.
    pub dirty_entries: u64,
    pub first_slot: u64,
    /// The summary block covering it (valid, with the bit clear: a bad
    /// one marks every block of its range).
    pub summary_block: u64,
}

impl SummaryReport {
    fn of(sb: &Superblock, sum: &Summary, s: &Survey) -> SummaryReport {
        let l = &sb.layout;
        SummaryReport {
            start: l.sum_start,
            blocks: l.sum_blocks,
            meta_blocks: l.meta_blocks,
            marked: sum.marked(),
            dirty_meta_blocks: s.dirty_mblocks.len() as u64,
            damaged: sum
                .blocks
                .iter()
                .filter(|b| b.state == SumState::Bad)
                .map(|b| DamagedSum {
                    index: b.index,
                    meta_blocks: b.covers(l.meta_blocks),
                })
                .collect(),
            unmarked: sum
                .unmarked(&s.dirty_mblocks)
                .iter()
                .map(|d: &DirtyMblock| {
                    let b = sum.block_of(d.mblock);
                    Unmarked {
                        meta_block: d.mblock,
                        dirty_entries: d.entries,
                        first_slot: d.first_slot,
                        summary_block: b.index,
                    }
                })
                .collect(),
        }
    }
}

/// The epochs of the committed dirty entries, as `check` reports them.
#[derive(Clone, Debug, Serialize)]
pub struct EpochReport {
    /// The superblock's epoch: a lower bound of the dirty entries' epochs.
    pub superblock: u64,
    /// Epochs with committed dirty entries (live: not written back).
    pub live: u64,
    pub oldest: Option<u64>,
    pub newest: Option<u64>,
    /// Origin blocks dirty in more than one epoch (chains of versions).
    pub versioned_blocks: u64,
    /// Committed dirty entries per epoch, oldest first.
    pub per_epoch: Vec<EpochCount>,
}

impl EpochReport {
    fn of(sb: &Superblock, s: &Survey) -> EpochReport {
        let per_epoch = s.epochs();
        EpochReport {
            superblock: sb.epoch,
            live: per_epoch.len() as u64,
            oldest: per_epoch.first().map(|e| e.epoch),
            newest: per_epoch.last().map(|e| e.epoch),
            versioned_blocks: s.versioned_blocks(),
            per_epoch,
        }
    }
}

/// "block 40" or, with epochs, "block 40 in epoch 5".
fn dup_name(sb: &Superblock, d: &Duplicate) -> String {
    if sb.has_epochs() {
        format!("{} in epoch {}", d.block, d.epoch)
    } else {
        d.block.to_string()
    }
}

fn result_name(k: Option<Kind>) -> &'static str {
    match k {
        None => "ok",
        Some(Kind::NoSuperblock) => "no_superblock",
        Some(Kind::BadSuperblock) => "bad_superblock",
        Some(Kind::BadEntries) => "bad_entries",
        Some(Kind::DuplicateDirty) => "duplicate_dirty",
        Some(Kind::SbFailed) => "failed",
        Some(_) => "unreadable",
    }
}

/// Read and judge the metadata of `dev`.  Returns the report and the
/// error that decides the exit status (None: consistent).
pub fn check_dev(dev: &dyn ReadAt) -> (CheckReport, Option<Error>) {
    let name = dev.name().to_string();
    let mut rep = CheckReport {
        device: name.clone(),
        result: "ok",
        exit_code: 0,
        error: None,
        device_bytes: Some(dev.size_bytes()),
        superblock_state: None,
        superblock: None,
        failed: false,
        counts: None,
        dirty_bytes: None,
        corrupt: vec![],
        duplicates: vec![],
        epochs: None,
        summary: None,
    };
    let finish = |mut rep: CheckReport, e: Option<Error>| {
        rep.result = result_name(e.as_ref().map(|e| e.kind));
        rep.exit_code = e.as_ref().map(|e| e.kind.exit_code()).unwrap_or(0);
        rep.error = e.as_ref().map(|e| e.msg.clone());
        (rep, e)
    };
    let sbr = match disk::read_superblock(dev) {
        Ok(s) => s,
        Err(e) => return finish(rep, Some(e)),
    };
    rep.superblock_state = Some(sbr.state);
    rep.superblock = sbr.sb.clone();
    rep.failed = sbr.sb.as_ref().is_some_and(|sb| sb.failed());
    if let Some(e) = sbr.problem(&name) {
        return finish(rep, Some(e));
    }
    let sb = sbr.sb.as_ref().unwrap();
    let s = match disk::survey(dev, sb) {
        Ok(s) => s,
        Err(e) => return finish(rep, Some(e)),
    };
    rep.counts = Some(s.counts);
    rep.dirty_bytes = Some(s.counts.dirty * sb.layout.block_bytes());
    rep.corrupt = s.corrupt.clone();
    rep.duplicates = s.duplicates.clone();
    rep.epochs = Some(EpochReport::of(sb, &s));
    match disk::read_summary(dev, sb) {
        Ok(sum) => rep.summary = sum.map(|sum| SummaryReport::of(sb, &sum, &s)),
        Err(e) => return finish(rep, Some(e)),
    }
    let unmarked = summary_error(&name, rep.summary.as_ref());
    // Its own result name, under the exit code of corrupt entries, which
    // come first.
    let bad_summary = unmarked.is_some() && s.corrupt.is_empty();
    let e = if !s.corrupt.is_empty() {
        Some(Error::new(
            Kind::BadEntries,
            format!(
                "{name}: {} corrupt {} (slot{} {})",
                s.corrupt.len(),
                plural(s.corrupt.len() as u64, "entry", "entries"),
                if s.corrupt.len() == 1 { "" } else { "s" },
                list_some(s.corrupt.iter().map(|b| b.slot))
            ),
        ))
    } else if unmarked.is_some() {
        unmarked
    } else if !s.duplicates.is_empty() {
        let which: Vec<String> = s
            .duplicates
            .iter()
            .take(8)
            .map(|d| dup_name(sb, d))
            .collect();
        Some(Error::new(
            Kind::DuplicateDirty,
            format!(
                "{name}: {} origin {} dirty in more than one slot{} (block{} {}{})",
                s.duplicates.len(),
                plural(s.duplicates.len() as u64, "block is", "blocks are"),
                if sb.has_epochs() { " of one epoch" } else { "" },
                if s.duplicates.len() == 1 { "" } else { "s" },
                which.join(", "),
                if s.duplicates.len() > 8 {
                    format!(", ... ({} in all)", s.duplicates.len())
                } else {
                    String::new()
                }
            ),
        ))
    } else if sb.failed() {
        Some(Error::new(
            Kind::SbFailed,
            format!("{name}: {}", FAILED_MARK),
        ))
    } else {
        None
    };
    let (mut rep, e) = finish(rep, e);
    if bad_summary {
        rep.result = "bad_summary";
    }
    (rep, e)
}

/// The error of a summary that does not mark every metadata block holding
/// dirty entries (exit 13, as corrupt entries: the module's load would
/// miss them, as it misses a corrupt entry's block).
fn summary_error(name: &str, sum: Option<&SummaryReport>) -> Option<Error> {
    let u = &sum?.unmarked;
    if u.is_empty() {
        return None;
    }
    let n = u.len() as u64;
    Some(
        Error::new(
            Kind::BadEntries,
            format!(
                "{name}: {n} metadata {} dirty entries but {} not marked in the summary (metadata block{} {})",
                plural(n, "block holds", "blocks hold"),
                plural(n, "is", "are"),
                if n == 1 { "" } else { "s" },
                list_some(u.iter().map(|x| x.meta_block))
            ),
        )
        .hint(
            "the module's load reads only the metadata blocks the summary marks, and would not see these dirty blocks; 'tiercache writeback', which reads every entry, writes them to their origin offline",
        ),
    )
}

/// What the failed mark says.
const FAILED_MARK: &str = "the superblock is marked failed: by the module when a metadata commit \
     failed, or by 'tiercache detach --abandon' (or 'check --mark-failed') when an administrator \
     gave the cache up; the module does not load it again";

fn plural<'a>(n: u64, one: &'a str, many: &'a str) -> &'a str {
    if n == 1 {
        one
    } else {
        many
    }
}

/// "1, 5, 9" or "1, 5, 9, ... (12 in all)".
fn list_some(it: impl Iterator<Item = u64>) -> String {
    let v: Vec<u64> = it.collect();
    let mut s: Vec<String> = v.iter().take(8).map(|x| x.to_string()).collect();
    if v.len() > 8 {
        s.push(format!("... ({} in all)", v.len()));
    }
    s.join(", ")
}

fn sb_lines(sb: &Superblock, o: &mut Vec<String>) {
    let l = &sb.layout;
    o.push(format!(
        "  uuid:        {}",
        if sb.uuid.is_empty() {
            "(none: any device)"
        } else {
            &sb.uuid
        }
    ));
    o.push(format!(
        "  origin:      {} ({} sectors, {} blocks)",
        fmt_bytes(sb.origin_sectors * 512),
        sb.origin_sectors,
        sb.origin_blocks()
    ));
    o.push(format!(
        "  block size:  {} ({} sectors)",
        fmt_bytes(l.block_bytes()),
        l.block_sectors
    ));
    o.push(format!(
        "  slots:       {} ({} of data from sector {}; entries in {} metadata {} from sector {})",
        l.nr_slots,
        fmt_bytes(l.nr_slots * l.block_bytes()),
        l.data_start,
        l.meta_blocks,
        plural(l.meta_blocks, "block", "blocks"),
        l.meta_start
    ));
    o.push(format!("  commit seq:  {}", sb.commit_seq));
    o.push(format!("  generation:  {:#010x}", sb.generation));
    if sb.failed() {
        o.push(format!("  FAILED:      {FAILED_MARK}"));
    }
}

/// What check says after the format version: how the module treats it.
fn version_note(version: u32) -> String {
    if version < disk::VERSION_V3 {
        format!(
            " (the module writes version {} from its first commit)",
            disk::VERSION_V3
        )
    } else if version < disk::VERSION {
        format!(
            " (no summary: the module reads every metadata block; a format makes version {})",
            disk::VERSION
        )
    } else {
        String::new()
    }
}

/// The summary lines of check: the marked count, then a warning per bad
/// summary block (torn, damaged or not of this format) and an error per
/// unmarked metadata block (an OK summary block with its bit clear).
fn summary_lines(sb: &Superblock, sum: Option<&SummaryReport>, o: &mut Vec<String>) {
    let Some(r) = sum else {
        // Version 4 with its summary unread: the error says why.
        if !sb.has_summary() {
            o.push(format!(
                "  summary:     none in format version {} (the module reads every metadata block)",
                sb.version
            ));
        }
        return;
    };
    o.push(format!(
        "  summary:     {} of {} metadata blocks marked, {} with dirty entries ({} summary {} from sector {})",
        r.marked,
        r.meta_blocks,
        r.dirty_meta_blocks,
        r.blocks,
        plural(r.blocks, "block", "blocks"),
        r.start,
    ));
    for d in &r.damaged {
        o.push(format!(
            "  warning:     summary block {} torn, damaged or not of this format: its {} metadata {} read as marked",
            d.index,
            d.meta_blocks,
            plural(d.meta_blocks, "block", "blocks")
        ));
    }
    for u in &r.unmarked {
        o.push(format!(
            "  unmarked:    metadata block {} holds {} dirty {} (the first in slot {}), but its bit in summary block {} is clear",
            u.meta_block,
            u.dirty_entries,
            plural(u.dirty_entries, "entry", "entries"),
            u.first_slot,
            u.summary_block
        ));
    }
}

/// "3 live, oldest 17, newest 19 (...)": the epochs line of check.
fn epochs_text(sb: &Superblock, e: &EpochReport) -> String {
    if !sb.has_epochs() {
        return format!(
            "none in format version {} (its dirty entries read as epoch 0)",
            sb.version
        );
    }
    let (Some(oldest), Some(newest)) = (e.oldest, e.newest) else {
        return format!(
            "none live (no committed dirty entry; the superblock's lower bound: {})",
            e.superblock
        );
    };
    let chains = if e.versioned_blocks == 0 {
        "no origin block dirty in several epochs".to_string()
    } else {
        format!(
            "{} origin {} dirty in several epochs (the newest version is the data)",
            e.versioned_blocks,
            plural(e.versioned_blocks, "block", "blocks")
        )
    };
    if e.live == 1 {
        format!(
            "1 live: {oldest} (the superblock's lower bound: {}); {chains}",
            e.superblock
        )
    } else {
        format!(
            "{} live, oldest {oldest}, newest {newest} (the superblock's lower bound: {}); {chains}",
            e.live, e.superblock
        )
    }
}

/// The text form of a check report.
pub fn check_text(rep: &CheckReport) -> String {
    let mut o = vec![];
    let Some(sb) = &rep.superblock else {
        return String::new();
    };
    o.push(format!(
        "{}: tiercache metadata, format version {}{}",
        rep.device,
        sb.version,
        version_note(sb.version)
    ));
    sb_lines(sb, &mut o);
    if let Some(c) = &rep.counts {
        o.push(format!(
            "  slots used:  {} of {}: {} dirty ({}), {} clean, {} uncommitted (ignored), {} corrupt",
            c.used(),
            sb.layout.nr_slots,
            c.dirty,
            fmt_bytes(rep.dirty_bytes.unwrap_or(0)),
            c.clean,
            c.uncommitted,
            c.corrupt
        ));
        o.push(format!(
            "  free slots:  {} empty, {} foreign (of another format generation, or leftover bytes: free, not errors)",
            c.empty, c.foreign
        ));
    }
    if let Some(e) = &rep.epochs {
        o.push(format!("  epochs:      {}", epochs_text(sb, e)));
    }
    if rep.counts.is_some() {
        summary_lines(sb, rep.summary.as_ref(), &mut o);
    }
    for b in &rep.corrupt {
        o.push(format!(
            "  corrupt:     slot {}: {} (entry {})",
            b.slot, b.reason, b.raw
        ));
    }
    for d in &rep.duplicates {
        let at: Vec<String> = d
            .slots
            .iter()
            .zip(&d.seqs)
            .map(|(s, q)| format!("slot {s} (seq {q})"))
            .collect();
        o.push(format!(
            "  duplicate:   origin block {} is dirty in {}{}",
            d.block,
            at.join(", "),
            if sb.has_epochs() {
                format!(", all of epoch {}", d.epoch)
            } else {
                String::new()
            }
        ));
    }
    o.push(format!(
        "  result:      {}",
        match rep.result {
            "ok" => "consistent",
            "bad_superblock" => "superblock unusable",
            "bad_entries" => "CORRUPT ENTRIES",
            "bad_summary" => "DIRTY METADATA BLOCKS NOT MARKED IN THE SUMMARY",
            "duplicate_dirty" => "DUPLICATE DIRTY ENTRIES",
            "failed" => "MARKED FAILED",
            other => other,
        }
    ));
    o.join("\n") + "\n"
}

/// `tiercache check DEV [--json]`.
pub fn check(path: &str, json: bool, out: &mut dyn Write, err: &mut dyn Write) -> Result<()> {
    let (rep, e) = match Dev::open(path, Access::Read) {
        Ok(dev) => {
            warn_if_held(&dev, err);
            check_dev(&dev)
        }
        Err(e) => {
            let rep = CheckReport {
                device: path.to_string(),
                result: result_name(Some(e.kind)),
                exit_code: e.kind.exit_code(),
                error: Some(e.msg.clone()),
                device_bytes: None,
                superblock_state: None,
                superblock: None,
                failed: false,
                counts: None,
                dirty_bytes: None,
                corrupt: vec![],
                duplicates: vec![],
                epochs: None,
                summary: None,
            };
            (rep, Some(e))
        }
    };
    if json {
        let _ = writeln!(out, "{}", serde_json::to_string_pretty(&rep).unwrap());
    } else {
        let _ = write!(out, "{}", check_text(&rep));
    }
    match e {
        None => Ok(()),
        Some(e) => Err(add_check_hint(e, path)),
    }
}

/// `tiercache check DEV --mark-failed --uuid UUID [--origin-sectors N]`:
/// mark the superblock of a cache device failed, offline, as `detach
/// --abandon` does: for a cache device whose mark it could not write.
/// Opened exclusively; only the cache of the device of dm uuid `uuid`
/// (and length `origin_sectors`) is marked (`disk::mark_failed`).
pub fn mark_failed(
    path: &str,
    uuid: &str,
    origin_sectors: Option<u64>,
    out: &mut dyn Write,
) -> Result<()> {
    let dev = Dev::open(path, Access::WriteExclusive)?;
    let want = disk::MarkWant {
        devno: None,
        uuid: Some(uuid.to_string()),
        origin_sectors,
    };
    let marked = disk::mark_failed(&dev, &want).map_err(|e| match e.kind {
        Kind::NoSuperblock | Kind::BadSuperblock => e.hint(
            "there is no valid superblock to mark: no module loads this device as it reads now; wipe or format it before any other use",
        ),
        Kind::Busy if e.hint.is_none() => e.hint(format!(
            "'tiercache check {path}' shows whose cache it is: is it the device you meant?"
        )),
        _ => e,
    })?;
    let owner = match disk::read_superblock(&dev).ok().and_then(|r| r.sb) {
        Some(sb) if !sb.uuid.is_empty() => format!(" (cache of {})", sb.uuid),
        _ => String::new(),
    };
    let _ = if marked {
        writeln!(
            out,
            "{path}{owner}: superblock marked failed: no module loads it again (format it to reuse the device)"
        )
    } else {
        writeln!(
            out,
            "{path}{owner}: superblock marked failed already: nothing written"
        )
    };
    Ok(())
}

fn add_check_hint(e: Error, path: &str) -> Error {
    if e.hint.is_some() {
        return e;
    }
    match e.kind {
        Kind::BadSuperblock => e.hint(
            "the module refuses to load this cache; its dirty data (if any) cannot be located",
        ),
        Kind::BadEntries => e.hint(format!(
            "'tiercache dump {path}' shows the entries; 'tiercache writeback --force' saves the dirty blocks of the readable ones"
        )),
        Kind::DuplicateDirty => e.hint(
            "the metadata does not say which copy is current; 'tiercache dump' shows them",
        ),
        Kind::SbFailed => e.hint(format!(
            "writes since the failure went to the origin, which may hold newer data than the dirty blocks recorded here; format the device to use it again ('--format'), or 'tiercache writeback --force --cache {path} --origin ORIGIN' if you know the origin's copies are older"
        )),
        _ => e,
    }
}

// --------------------------------------------------------------------
// dump
// --------------------------------------------------------------------

#[derive(Serialize)]
struct EntryJson<'a> {
    slot: u64,
    state: EntryState,
    block: Option<u64>,
    seq: Option<u64>,
    /// The absolute epoch of a dirty version.
    epoch: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    raw: Option<&'a str>,
}

#[derive(Serialize)]
struct SbJson<'a> {
    magic: &'static str,
    version: u32,
    generation: u32,
    epoch: u64,
    commit_seq: u64,
    block_sectors: u32,
    nr_slots: u64,
    meta_start: u64,
    meta_blocks: u64,
    sum_start: u64,
    sum_blocks: u64,
    data_start: u64,
    origin_sectors: u64,
    uuid: &'a str,
    flags: u32,
    failed: bool,
}

fn sb_json(sb: &Superblock) -> SbJson<'_> {
    let l = &sb.layout;
    SbJson {
        magic: disk::magic(),
        version: sb.version,
        generation: sb.generation,
        epoch: sb.epoch,
        commit_seq: sb.commit_seq,
        block_sectors: l.block_sectors,
        nr_slots: l.nr_slots,
        meta_start: l.meta_start,
        meta_blocks: l.meta_blocks,
        sum_start: l.sum_start,
        sum_blocks: l.sum_blocks,
        data_start: l.data_start,
        origin_sectors: sb.origin_sectors,
        uuid: &sb.uuid,
        flags: sb.flags,
        failed: sb.failed(),
    }
}

/// The metadata blocks summary block `b` marks, as runs (first, last):
/// a bad one marks its whole range.
fn marked_runs(b: &SumBlock, meta_blocks: u64) -> Vec<(u64, u64)> {
    let first = b.first_mblock();
    runs_of((first..first + b.covers(meta_blocks)).filter(|&mb| b.marks(mb)))
}

#[derive(Serialize)]
struct SumBlockJson {
    index: u64,
    state: SumState,
    /// Metadata blocks it covers and marks, and the marked ones as runs
    /// [first, last].
    meta_blocks: u64,
    marked: u64,
    runs: Vec<(u64, u64)>,
}

#[derive(Serialize)]
struct SumJson {
    meta_blocks: u64,
    marked: u64,
    blocks: Vec<SumBlockJson>,
}

fn sum_json(sum: &Summary) -> SumJson {
    let blocks: Vec<SumBlockJson> = sum
        .blocks
        .iter()
        .map(|b| {
            let runs = marked_runs(b, sum.meta_blocks);
            SumBlockJson {
                index: b.index,
                state: b.state,
                meta_blocks: b.covers(sum.meta_blocks),
                marked: runs.iter().map(|(a, z)| z - a + 1).sum(),
                runs,
            }
        })
        .collect();
    SumJson {
        meta_blocks: sum.meta_blocks,
        marked: blocks.iter().map(|b| b.marked).sum(),
        blocks,
    }
}

/// The summary part of dump's text: per summary block its state and the
/// metadata blocks it marks.
fn sum_text(sum: &Summary, sb: &Superblock, out: &mut dyn Write) {
    let l = &sb.layout;
    let _ = writeln!(
        out,
        "summary ({} {} from sector {}): {} of {} metadata blocks marked",
        l.sum_blocks,
        plural(l.sum_blocks, "block", "blocks"),
        l.sum_start,
        sum.marked(),
        sum.meta_blocks
    );
    for b in &sum.blocks {
        let n = b.covers(sum.meta_blocks);
        let first = b.first_mblock();
        let what = match b.state {
            SumState::Ok => {
                let runs = marked_runs(b, sum.meta_blocks);
                let marked: u64 = runs.iter().map(|(a, z)| z - a + 1).sum();
                if marked == 0 {
                    "valid, none marked".to_string()
                } else {
                    format!("valid, {marked} marked: {}", runs_text(&runs))
                }
            }
            st => st.describe().to_string(),
        };
        let _ = writeln!(
            out,
            "  block {} (metadata blocks {first}-{}): {what}",
            b.index,
            first + n.max(1) - 1
        );
    }
}

/// Dump the superblock and the entries of `dev` (the non-empty ones, or
/// all with `all`).
pub fn dump_dev(dev: &dyn ReadAt, json: bool, all: bool, out: &mut dyn Write) -> Result<()> {
    let name = dev.name().to_string();
    let sbr = disk::read_superblock(dev)?;
    let problem = sbr.problem(&name);
    let Some(sb) = sbr.sb.as_ref() else {
        // Nothing decodes: show what the first sector holds.
        let raw = (sbr.state != SbState::Blank).then(|| disk::hex(&sbr.raw));
        if json {
            let v = serde_json::json!({
                "device": name,
                "superblock_state": sbr.state,
                "superblock_error": sbr.state.describe(),
                "superblock_raw": raw,
                "entries": [],
            });
            let _ = writeln!(out, "{}", serde_json::to_string_pretty(&v).unwrap());
        } else {
            let _ = writeln!(out, "{name}: superblock: {}", sbr.state.describe());
            if let Some(r) = raw {
                let _ = writeln!(out, "first sector:");
                for line in r.as_bytes().chunks(64) {
                    let _ = writeln!(out, "  {}", std::str::from_utf8(line).unwrap());
                }
            }
        }
        return Err(problem.unwrap());
    };
    if !sbr.entries_readable() {
        return Err(problem.unwrap());
    }
    // A summary beyond the end of the device is left out (the problem
    // says so at the end), as the data area is.
    let sum = if sbr.summary_readable() {
        disk::read_summary(dev, sb)?
    } else {
        None
    };
    if json {
        let head = serde_json::json!({
            "device": name,
            "superblock_state": sbr.state,
            "superblock": sb_json(sb),
            "summary": sum.as_ref().map(sum_json),
        });
        let head = serde_json::to_string_pretty(&head).unwrap();
        // Stream the entries: a large cache has millions.
        let head = head.trim_end().strip_suffix('}').unwrap().trim_end();
        let _ = write!(out, "{head},\n  \"entries\": [");
    } else {
        let l = &sb.layout;
        let _ = writeln!(out, "{name}: superblock");
        for (k, v) in [
            ("magic", disk::magic().to_string()),
            ("version", sb.version.to_string()),
            ("generation", format!("{:#010x}", sb.generation)),
            (
                "epoch",
                if sb.has_epochs() {
                    format!("{} (dirty entries are of this epoch or later)", sb.epoch)
                } else {
                    format!("{} (format version {}: no epochs)", sb.epoch, sb.version)
                },
            ),
            ("commit_seq", sb.commit_seq.to_string()),
            ("block_sectors", l.block_sectors.to_string()),
            ("nr_slots", l.nr_slots.to_string()),
            ("meta_start", l.meta_start.to_string()),
            ("meta_blocks", l.meta_blocks.to_string()),
            ("sum_start", l.sum_start.to_string()),
            (
                "sum_blocks",
                if sb.has_summary() {
                    l.sum_blocks.to_string()
                } else {
                    format!("0 (format version {}: no summary)", sb.version)
                },
            ),
            ("data_start", l.data_start.to_string()),
            ("origin_sectors", sb.origin_sectors.to_string()),
            ("uuid", sb.uuid.clone()),
            (
                "flags",
                if sb.failed() {
                    format!("{:#x} (failed: {FAILED_MARK})", sb.flags)
                } else {
                    format!("{:#x}", sb.flags)
                },
            ),
        ] {
            let _ = writeln!(out, "  {k:<15} {v}");
        }
        if let Some(sum) = &sum {
            sum_text(sum, sb, out);
        }
        let _ = writeln!(
            out,
            "entries ({}):",
            if all { "all slots" } else { "non-empty slots" }
        );
        let _ = writeln!(
            out,
            "  {:>10} {:>14} {:<11} {:>10} {:>10}",
            "SLOT", "ORIGIN BLOCK", "STATE", "SEQ", "EPOCH"
        );
    }
    let mut first = true;
    disk::for_each_entry(dev, sb, |e, raw| {
        // Foreign entries read as empty: shown with --all only.
        if matches!(e.state, EntryState::Empty | EntryState::Foreign) && !all {
            return Ok(());
        }
        let corrupt = e.state.is_corrupt();
        let rawhex = disk::hex(raw);
        if json {
            let j = EntryJson {
                slot: e.slot,
                state: e.state,
                block: e.block,
                seq: e.seq,
                epoch: e.epoch,
                reason: corrupt.then(|| e.state.describe()),
                raw: corrupt.then_some(rawhex.as_str()),
            };
            let _ = write!(
                out,
                "{}\n    {}",
                if first { "" } else { "," },
                serde_json::to_string(&j).unwrap()
            );
        } else {
            let opt = |v: Option<u64>| v.map(|x| x.to_string()).unwrap_or("-".into());
            let note = if corrupt {
                format!("  {} (entry {rawhex})", e.state.describe())
            } else if e.state == EntryState::Uncommitted {
                format!("  ignored: newer than commit {}", sb.commit_seq)
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "  {:>10} {:>14} {:<11} {:>10} {:>10}{note}",
                e.slot,
                opt(e.block),
                e.state.as_str(),
                opt(e.seq),
                opt(e.epoch)
            );
        }
        first = false;
        Ok(())
    })?;
    if json {
        let _ = writeln!(out, "{}]\n}}", if first { "" } else { "\n  " });
    }
    match problem {
        Some(p) => Err(p),
        None => Ok(()),
    }
}

/// `tiercache dump DEV [--json] [--all]`.
pub fn dump(
    path: &str,
    json: bool,
    all: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<()> {
    let dev = Dev::open(path, Access::Read)?;
    warn_if_held(&dev, err);
    dump_dev(&dev, json, all, out)
}

// --------------------------------------------------------------------
// writeback
// --------------------------------------------------------------------

/// Origin-adjacent dirty blocks written as one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run {
    pub blocks: Vec<DirtyRef>,
}

impl Run {
    pub fn first_block(&self) -> u64 {
        self.blocks[0].block
    }
}

/// Group dirty blocks (sorted by block) into runs of adjacent blocks of
/// at most `max_bytes`.
pub fn plan_runs(dirty: &[DirtyRef], block_bytes: u64, max_bytes: u64) -> Vec<Run> {
    let per_run = (max_bytes / block_bytes).max(1) as usize;
    let mut runs: Vec<Run> = vec![];
    for d in dirty {
        match runs.last_mut() {
            Some(r)
                if r.blocks.len() < per_run && r.blocks.last().unwrap().block + 1 == d.block =>
            {
                r.blocks.push(*d)
            }
            _ => runs.push(Run { blocks: vec![*d] }),
        }
    }
    runs
}

/// The dirty versions of one epoch, as origin writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EpochPlan {
    pub epoch: u64,
    pub runs: Vec<Run>,
}

impl EpochPlan {
    pub fn blocks(&self) -> u64 {
        self.runs.iter().map(|r| r.blocks.len() as u64).sum()
    }
}

/// Plan the offline writeback of `versions`, sorted by epoch then origin
/// block (`Survey::versions_to_write`): epoch by epoch, oldest first, and
/// within an epoch runs of adjacent blocks of at most `max_bytes`
/// (`plan_runs`): a run never joins two epochs.
pub fn plan_writeback(versions: &[DirtyRef], block_bytes: u64, max_bytes: u64) -> Vec<EpochPlan> {
    let mut out = vec![];
    let mut i = 0;
    while i < versions.len() {
        let epoch = versions[i].epoch;
        let mut j = i + 1;
        while j < versions.len() && versions[j].epoch == epoch {
            j += 1;
        }
        out.push(EpochPlan {
            epoch,
            runs: plan_runs(&versions[i..j], block_bytes, max_bytes),
        });
        i = j;
    }
    out
}

/// Write `plan` to `origin`: the runs of an epoch, then a sync of the
/// origin (a flush), before the first write of the next epoch.  A power
/// cut at any point leaves the origin holding every epoch before the one
/// being written and some of that one's writes: a state the module's
/// ordered writeback could have left too.  After the last epoch's sync,
/// everything written is durable.
pub fn write_plan(
    cache: &dyn ReadAt,
    origin: &dyn WriteAt,
    sb: &Superblock,
    plan: &[EpochPlan],
) -> Result<()> {
    let bb = sb.layout.block_bytes();
    for ep in plan {
        for r in &ep.runs {
            let data = read_run(cache, sb, r)?;
            origin.write_at(r.first_block() * bb, &data)?;
        }
        origin.sync()?;
    }
    Ok(())
}

/// "4 dirty blocks (16 KiB)", or "5 dirty versions of 3 origin blocks
/// (20 KiB)" when some are dirty in several epochs.
fn dirty_phrase(sum: &WritebackSummary) -> String {
    if sum.origin_blocks == sum.blocks {
        format!(
            "{} dirty {} ({})",
            sum.blocks,
            plural(sum.blocks, "block", "blocks"),
            fmt_bytes(sum.bytes)
        )
    } else {
        format!(
            "{} dirty versions of {} origin {} ({})",
            sum.blocks,
            sum.origin_blocks,
            plural(sum.origin_blocks, "block", "blocks"),
            fmt_bytes(sum.bytes)
        )
    }
}

/// "epoch 7" or "3 epochs, 5 to 9".
fn epochs_note(plan: &[EpochPlan]) -> String {
    match plan {
        [] => "no epoch".to_string(),
        [one] => format!("epoch {}", one.epoch),
        [first, .., last] => format!("{} epochs, {} to {}", plan.len(), first.epoch, last.epoch),
    }
}

/// The runs of consecutive numbers of an ascending `v`, first and last:
/// 3, 4, 5, 9 gives (3, 5), (9, 9).
fn runs_of(v: impl Iterator<Item = u64>) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = vec![];
    for x in v {
        match out.last_mut() {
            Some((_, b)) if x == *b + 1 => *b = x,
            _ => out.push((x, x)),
        }
    }
    out
}

/// "3-7, 9, 12-13".
fn ranges(v: impl Iterator<Item = u64>) -> String {
    runs_text(&runs_of(v))
}

/// Runs as `ranges` writes them.
fn runs_text(runs: &[(u64, u64)]) -> String {
    runs.iter()
        .map(|&(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Read the data of a run's slots (consecutive slots in one read).
fn read_run(cache: &dyn ReadAt, sb: &Superblock, run: &Run) -> Result<Vec<u8>> {
    let l = &sb.layout;
    let bb = l.block_bytes() as usize;
    let mut buf = Vec::with_capacity(run.blocks.len() * bb);
    let mut i = 0;
    while i < run.blocks.len() {
        let mut j = i + 1;
        while j < run.blocks.len() && run.blocks[j].slot == run.blocks[j - 1].slot + 1 {
            j += 1;
        }
        let data = cache.read_at(l.slot_offset(run.blocks[i].slot), (j - i) * bb)?;
        buf.extend_from_slice(&data);
        i = j;
    }
    Ok(buf)
}

/// Rewrite the entries of `plan` as clean (same block and seq, valid
/// checksum, no epoch), epoch by epoch, oldest first, each epoch made
/// durable (a sync) before the next is touched.  A block dirty in several
/// epochs has a version in each: were a newer one clean on disk while an
/// older one is still dirty (a crash in between, or the write of a later
/// metadata block failing), the module would load the older version as
/// the block's newest, serve its data and write it back over the newer
/// data on the origin, and so would another offline writeback.  In this
/// order a crash leaves the newest versions dirty, whose data the origin
/// already holds.
fn mark_clean(cache: &dyn WriteAt, sb: &Superblock, plan: &[EpochPlan]) -> Result<()> {
    for ep in plan {
        let mut done: Vec<DirtyRef> = ep
            .runs
            .iter()
            .flat_map(|r| r.blocks.iter().copied())
            .collect();
        done.sort_by_key(|d| d.slot);
        mark_clean_slots(cache, sb, &done)?;
        cache.sync()?;
    }
    Ok(())
}

/// Rewrite the entries of `done` (ascending slots) as clean, metadata
/// block by metadata block.
fn mark_clean_slots(cache: &dyn WriteAt, sb: &Superblock, done: &[DirtyRef]) -> Result<()> {
    let l = &sb.layout;
    let per = disk::entries_per_mblock();
    let mut i = 0;
    while i < done.len() {
        let mb = done[i].slot / per;
        let off = l.meta_start * 512 + mb * disk::MBLOCK_BYTES as u64;
        let mut buf = cache.read_at(off, disk::MBLOCK_BYTES)?;
        while i < done.len() && done[i].slot / per == mb {
            let d = done[i];
            let k = ((d.slot % per) as usize) * disk::ENTRY_BYTES;
            let raw = &mut buf[k..k + disk::ENTRY_BYTES];
            // The entry must still be the one we wrote back (we hold the
            // device exclusively; this guards against our own mistakes).
            let e = disk::decode_entry(raw, d.slot, sb);
            if e.state != EntryState::Dirty
                || e.block != Some(d.block)
                || e.seq != Some(d.seq)
                || e.epoch != Some(d.epoch)
            {
                return Err(Error::new(
                    Kind::Failure,
                    format!(
                        "{}: the entry of slot {} changed during the writeback ({}); not marking it clean",
                        cache.name(),
                        d.slot,
                        e.state.describe()
                    ),
                ));
            }
            raw.copy_from_slice(&disk::encode_entry(
                d.slot,
                d.block,
                false,
                d.seq,
                sb.generation,
                0,
            ));
            i += 1;
        }
        cache.write_at(off, &buf)?;
    }
    Ok(())
}

/// What an offline writeback did (or would do).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WritebackSummary {
    /// Dirty versions written (block writes).
    pub blocks: u64,
    /// Origin blocks written (fewer than `blocks` if some are dirty in
    /// several epochs).
    pub origin_blocks: u64,
    pub writes: u64,
    pub bytes: u64,
    /// Epochs written, each followed by a sync of the origin.
    pub epochs: u64,
    pub skipped_corrupt: u64,
    pub skipped_duplicate: u64,
}

/// `tiercache writeback --cache DEV --origin DEV [--dry-run] [--force]`.
pub fn writeback(
    cache_path: &str,
    origin_path: &str,
    dry_run: bool,
    force: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<WritebackSummary> {
    let access = if dry_run {
        Access::ReadExclusive
    } else {
        Access::WriteExclusive
    };
    let cache = Dev::open(cache_path, access)?;
    let origin = Dev::open(origin_path, access)?;
    if cache.ident == origin.ident || (cache.devno.is_some() && cache.devno == origin.devno) {
        return Err(usage(format!(
            "{cache_path} and {origin_path} are the same device"
        )));
    }
    let sbr: SbRead = disk::read_superblock(&cache)?;
    if let Some(e) = sbr.problem(cache_path) {
        let h = match e.kind {
            Kind::NoSuperblock => "nothing to write back: this device holds no tiercache metadata".to_string(),
            _ => format!(
                "without a valid superblock the dirty blocks cannot be located; 'tiercache check {cache_path}' tells more"
            ),
        };
        return Err(e.hint(h));
    }
    let sb = sbr.sb.clone().unwrap();
    let s: Survey = disk::survey(&cache, &sb)?;
    if !s.corrupt.is_empty() {
        for b in &s.corrupt {
            let _ = writeln!(
                err,
                "tiercache: {}: slot {}: {} (entry {})",
                cache_path, b.slot, b.reason, b.raw
            );
        }
        if !force {
            return Err(Error::new(
                Kind::BadEntries,
                format!(
                    "{cache_path}: {} corrupt {} (listed above): refusing to write back",
                    s.corrupt.len(),
                    plural(s.corrupt.len() as u64, "entry", "entries")
                ),
            )
            .hint("--force writes back the dirty blocks of the readable entries and leaves the corrupt ones as they are"));
        }
        let _ = writeln!(
            err,
            "tiercache: warning: {cache_path}: skipping {} corrupt {} (--force): whatever they held is not written",
            s.corrupt.len(),
            plural(s.corrupt.len() as u64, "entry", "entries")
        );
    }
    if !s.duplicates.is_empty() {
        for d in &s.duplicates {
            let _ = writeln!(
                err,
                "tiercache: {cache_path}: origin block {} is dirty in slots {} (seqs {}){}",
                d.block,
                ranges(d.slots.iter().copied()),
                d.seqs
                    .iter()
                    .map(|x| x.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                if sb.has_epochs() {
                    format!(", all of epoch {}", d.epoch)
                } else {
                    String::new()
                }
            );
        }
        if !force {
            return Err(Error::new(
                Kind::DuplicateDirty,
                format!(
                    "{cache_path}: {} origin {} dirty in more than one slot{} (listed above): refusing to write back",
                    s.duplicates.len(),
                    plural(s.duplicates.len() as u64, "block is", "blocks are"),
                    if sb.has_epochs() { " of one epoch" } else { "" }
                ),
            )
            .hint(if sb.has_epochs() {
                "the metadata does not say which copy is current; --force writes back every other block and leaves these as they are (all their versions)"
            } else {
                "the metadata does not say which copy is current; --force writes back every other block and leaves these as they are"
            }));
        }
        let _ = writeln!(
            err,
            "tiercache: warning: {cache_path}: skipping {} ambiguous origin {} (--force)",
            s.duplicates.len(),
            plural(s.duplicates.len() as u64, "block", "blocks")
        );
    }
    let need = sb.origin_sectors * 512;
    if origin.size_bytes() < need {
        return Err(usage(format!(
            "{origin_path}: holds {} ({} sectors), but the origin of this cache had {} sectors: not its origin?",
            fmt_bytes(origin.size_bytes()),
            origin.size_bytes() / 512,
            sb.origin_sectors
        ))
        .hint("give the origin device the cache was set up with"));
    }
    let dirty = s.versions_to_write();
    // Refused without --force; a dry run still lists what --force would
    // write, and is refused at the end.
    let mut refused = None;
    if sb.failed() && !dirty.is_empty() {
        if !force {
            let e = Error::new(
                Kind::SbFailed,
                format!(
                    "{cache_path}: the superblock is marked failed (by the module when a metadata commit failed, or by 'tiercache detach --abandon' when the cache was given up): writes acknowledged since the failure went to the origin, which may hold newer data than these {} dirty {}: refusing to write them back",
                    dirty.len(),
                    plural(dirty.len() as u64, "block", "blocks")
                ),
            )
            .hint("--force writes them back anyway, if you know the origin's copies of those blocks are older (nothing wrote to the device since the cache failed)");
            if !dry_run {
                return Err(e);
            }
            refused = Some(e);
        } else if !dry_run {
            let _ = writeln!(
                err,
                "tiercache: warning: {cache_path}: the superblock is marked failed; writing its dirty blocks back anyway (--force): they replace whatever the origin holds there"
            );
        }
    }
    let bb = sb.layout.block_bytes();
    let plan = plan_writeback(&dirty, bb, MAX_WRITE_BYTES);
    let sum = WritebackSummary {
        blocks: dirty.len() as u64,
        origin_blocks: Survey::origin_blocks_of(&dirty),
        writes: plan.iter().map(|e| e.runs.len() as u64).sum(),
        bytes: dirty.len() as u64 * bb,
        epochs: plan.len() as u64,
        skipped_corrupt: s.corrupt.len() as u64,
        skipped_duplicate: s.duplicates.len() as u64,
    };
    let owner = if sb.uuid.is_empty() {
        String::new()
    } else {
        format!(" (cache of {})", sb.uuid)
    };
    if dirty.is_empty() {
        let _ = writeln!(
            out,
            "{cache_path}{owner}: no committed dirty blocks: nothing to write back"
        );
        return Ok(sum);
    }
    // Versions 1 and 2 have no epochs: one, 0, written and synced as before.
    let by_epoch = sb.has_epochs();
    if dry_run {
        let _ = writeln!(
            out,
            "{cache_path}{owner}: {} {} to {origin_path} in {} {}{}:",
            if refused.is_some() {
                "marked failed: refused without --force, which would write"
            } else {
                "would write"
            },
            dirty_phrase(&sum),
            sum.writes,
            plural(sum.writes, "write", "writes"),
            if by_epoch {
                format!(
                    ", epoch by epoch ({}, the origin synced after each)",
                    epochs_note(&plan)
                )
            } else {
                String::new()
            }
        );
        let indent = if by_epoch { "    " } else { "  " };
        for ep in &plan {
            if by_epoch {
                let n = ep.blocks();
                let _ = writeln!(
                    out,
                    "  epoch {}: {n} {} ({}) in {} {}",
                    ep.epoch,
                    plural(n, "block", "blocks"),
                    fmt_bytes(n * bb),
                    ep.runs.len(),
                    plural(ep.runs.len() as u64, "write", "writes")
                );
            }
            for r in &ep.runs {
                let b0 = r.first_block();
                let _ = writeln!(
                    out,
                    "{indent}origin blocks {} ({} at sector {}) from slots {}",
                    ranges(r.blocks.iter().map(|d| d.block)),
                    fmt_bytes(r.blocks.len() as u64 * bb),
                    b0 * sb.layout.block_sectors as u64,
                    ranges(r.blocks.iter().map(|d| d.slot))
                );
            }
        }
        let _ = writeln!(out, "dry run: nothing written");
        return match refused {
            Some(e) => Err(e),
            None => Ok(sum),
        };
    }
    write_plan(&cache, &origin, &sb, &plan)?;
    // Only once every epoch is on the origin: a crash before leaves the
    // entries dirty, and a later writeback starts again from the oldest
    // epoch, which passes through power-cut states again (each epoch
    // rewritten in full over the ones before it).
    mark_clean(&cache, &sb, &plan)?;
    // Read back: what was written must now decode as clean.
    let after = disk::survey(&cache, &sb)?;
    let written: std::collections::HashSet<u64> = dirty.iter().map(|d| d.slot).collect();
    let left: Vec<u64> = after
        .dirty
        .iter()
        .filter(|d| written.contains(&d.slot))
        .map(|d| d.slot)
        .collect();
    if !left.is_empty() {
        return Err(Error::new(
            Kind::Failure,
            format!(
                "{cache_path}: slots {} still read back dirty after being marked clean",
                ranges(left.into_iter())
            ),
        ));
    }
    let _ = writeln!(
        out,
        "{origin_path}: wrote {} from {cache_path}{owner} in {} {}{}; marked clean in its metadata",
        dirty_phrase(&sum),
        sum.writes,
        plural(sum.writes, "write", "writes"),
        if by_epoch {
            format!(
                ", epoch by epoch ({}, the origin synced after each)",
                epochs_note(&plan)
            )
        } else {
            String::new()
        }
    );
    if sum.skipped_corrupt + sum.skipped_duplicate > 0 {
        let _ = writeln!(
            out,
            "{cache_path}: left as they were: {} corrupt {}, {} ambiguous {}",
            sum.skipped_corrupt,
            plural(sum.skipped_corrupt, "entry", "entries"),
            sum.skipped_duplicate,
            plural(sum.skipped_duplicate, "block", "blocks")
        );
    }
    Ok(sum)
}

#[cfg(test)]
#[path = "meta_tests.rs"]
mod tests;
