// SPDX-License-Identifier: GPL-2.0-only
//! Typed decoding of the tiercache status line (docs/tiercache.rst, "Status").
//!
//! Policy: the kernel documents that fields are only ever appended.  The
//! parser therefore requires at least the 20 fields every module prints,
//! checks each of them strictly (a field it cannot decode is an error naming
//! the field number, its name and the offending text), decodes the two
//! metadata fields (21-22) when the module prints them, the failed state
//! (23) when it prints that, and the two epoch fields (24-25) when it
//! prints those, just as strictly; `None` stands for a field an older
//! module does not print.  Any further fields are kept verbatim in `extra`
//! without being interpreted (so is a lone 21st or 24th field: the
//! metadata fields and the epoch fields come as pairs).  Fewer than 20
//! fields, an unknown mode or flush state, a malformed number, or an
//! oldest epoch above the current one is rejected.

use serde::Serialize;
use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Kind, Result};

pub const TARGET_TYPE: &str = "tiercache";
/// Number of fields every module prints (docs/tiercache.rst).
pub const NR_FIELDS: usize = 20;
/// Fields with the metadata ones (21 meta_commits, 22 meta_error).
pub const NR_FIELDS_META: usize = 22;
/// Fields with the failed state (23 cache_failed).
pub const NR_FIELDS_FAILED: usize = 23;
/// Fields with the epochs (24 epoch_oldest, 25 epoch_current).
pub const NR_FIELDS_EPOCHS: usize = 25;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Writeback,
    Writethrough,
    Passthrough,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Writeback => "writeback",
            Mode::Writethrough => "writethrough",
            Mode::Passthrough => "passthrough",
        }
    }
}

impl FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "writeback" => Ok(Mode::Writeback),
            "writethrough" => Ok(Mode::Writethrough),
            "passthrough" => Ok(Mode::Passthrough),
            _ => Err("expected writeback, writethrough or passthrough".into()),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FlushState {
    Idle,
    Flushing,
    Background,
    Cleaning,
}

impl FlushState {
    pub fn as_str(self) -> &'static str {
        match self {
            FlushState::Idle => "idle",
            FlushState::Flushing => "flushing",
            FlushState::Background => "background",
            FlushState::Cleaning => "cleaning",
        }
    }
}

impl FromStr for FlushState {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "idle" => Ok(FlushState::Idle),
            "flushing" => Ok(FlushState::Flushing),
            "background" => Ok(FlushState::Background),
            "cleaning" => Ok(FlushState::Cleaning),
            _ => Err("expected idle, flushing, background or cleaning".into()),
        }
    }
}

impl fmt::Display for FlushState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One decoded status line.  Counters are exactly as the kernel printed them.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Status {
    pub mode: Mode,
    /// Sectors per block.
    pub block_size: u32,
    pub used_blocks: u64,
    pub total_blocks: u64,
    pub dirty_blocks: u64,
    pub read_hits: u64,
    pub read_misses: u64,
    pub write_hits: u64,
    pub write_misses: u64,
    pub write_bypass: u64,
    pub flush_state: FlushState,
    pub wb_blocks: u64,
    pub wb_requests: u64,
    pub wb_sectors: u64,
    pub avg_write_kb: f64,
    pub merge_ratio: f64,
    pub bridged_blocks: u64,
    pub inflight_max: u64,
    /// 0, or a negative errno.
    pub error: i32,
    pub flushes: u64,
    pub cleaner: bool,
    /// Metadata commits written (field 21; None from a module without it).
    pub meta_commits: Option<u64>,
    /// 0 or the negative errno of the first failed metadata commit (22).
    pub meta_error: Option<i32>,
    /// 0 or the negative errno of the cache device error that latched the
    /// failed state (23; None from a module without it).
    pub cache_failed: Option<i32>,
    /// The oldest epoch that still has dirty blocks, or `epoch_current` if
    /// none: the origin holds every epoch before it entirely (24; None
    /// from a module without epochs).
    pub epoch_oldest: Option<u64>,
    /// The open epoch: writes now go to it (25).
    pub epoch_current: Option<u64>,
    /// Fields after the last one decoded, from a newer module; kept, not
    /// interpreted.
    pub extra: Vec<String>,
}

const FIELD_NAMES: [&str; NR_FIELDS_EPOCHS] = [
    "mode",
    "block_size",
    "used/total",
    "dirty",
    "read_hits",
    "read_misses",
    "write_hits",
    "write_misses",
    "write_bypass",
    "flush_state",
    "wb_blocks",
    "wb_requests",
    "wb_sectors",
    "avg_write_kb",
    "merge_ratio",
    "bridged_blocks",
    "inflight_max",
    "error",
    "flushes",
    "cleaner",
    "meta_commits",
    "meta_error",
    "cache_failed",
    "epoch_oldest",
    "epoch_current",
];

fn kerr(msg: String) -> Error {
    Error::new(Kind::Kernel, msg).hint(
        "the tiercache tool and the dm-tiercache module do not agree on the status \
         format; use a tool built from the same tree as the module",
    )
}

fn field_err(idx: usize, text: &str, why: &str) -> Error {
    kerr(format!(
        "status field {} ({}): cannot decode '{}': {}",
        idx + 1,
        FIELD_NAMES[idx],
        text,
        why
    ))
}

fn num_u64(idx: usize, s: &str) -> Result<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(field_err(idx, s, "expected an unsigned decimal number"));
    }
    s.parse::<u64>()
        .map_err(|_| field_err(idx, s, "number out of range"))
}

/// `0` or a negative errno such as `-5`.
fn errno_field(idx: usize, s: &str) -> Result<i32> {
    let ok = s == "0"
        || (s.len() > 1
            && s.starts_with('-')
            && s[1..].bytes().all(|b| b.is_ascii_digit())
            && !s[1..].starts_with('0'));
    if !ok {
        return Err(field_err(idx, s, "expected 0 or a negative errno"));
    }
    s.parse::<i32>()
        .map_err(|_| field_err(idx, s, "number out of range"))
}

/// Unsigned decimal with an optional fraction: `256`, `256.00`.
fn num_dec(idx: usize, s: &str) -> Result<f64> {
    let mut parts = s.splitn(2, '.');
    let int = parts.next().unwrap_or("");
    let frac = parts.next();
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    if !digits(int) || frac.is_some_and(|f| !digits(f)) {
        return Err(field_err(
            idx,
            s,
            "expected a decimal number such as 256.00",
        ));
    }
    s.parse::<f64>()
        .map_err(|_| field_err(idx, s, "number out of range"))
}

impl Status {
    /// Decode the target parameters of a status line, i.e. what follows
    /// `<start> <len> tiercache`.
    pub fn parse_params(params: &str) -> Result<Status> {
        let f: Vec<&str> = params.split_ascii_whitespace().collect();
        if f.len() < NR_FIELDS {
            return Err(kerr(format!(
                "status line has {} fields, expected at least {}: '{}'",
                f.len(),
                NR_FIELDS,
                params.trim()
            )));
        }
        let mode = f[0].parse().map_err(|e: String| field_err(0, f[0], &e))?;
        let block_size = num_u64(1, f[1])?;
        if !(8..=2048).contains(&block_size) || !block_size.is_power_of_two() {
            return Err(field_err(1, f[1], "not a power of two from 8 to 2048"));
        }
        let (used, total) = f[2]
            .split_once('/')
            .ok_or_else(|| field_err(2, f[2], "expected <used>/<total>"))?;
        let used_blocks = num_u64(2, used)?;
        let total_blocks = num_u64(2, total)?;
        if total_blocks == 0 {
            return Err(field_err(2, f[2], "the cache has no slots"));
        }
        let flush_state = f[9].parse().map_err(|e: String| field_err(9, f[9], &e))?;
        let error = errno_field(17, f[17])?;
        let cleaner = match f[19] {
            "0" => false,
            "1" => true,
            s => return Err(field_err(19, s, "expected 0 or 1")),
        };
        let (meta_commits, meta_error) = if f.len() >= NR_FIELDS_META {
            (Some(num_u64(20, f[20])?), Some(errno_field(21, f[21])?))
        } else {
            (None, None)
        };
        let cache_failed = if f.len() >= NR_FIELDS_FAILED {
            Some(errno_field(22, f[22])?)
        } else {
            None
        };
        let (epoch_oldest, epoch_current) = if f.len() >= NR_FIELDS_EPOCHS {
            let oldest = num_u64(23, f[23])?;
            let current = num_u64(24, f[24])?;
            if oldest > current {
                return Err(field_err(
                    23,
                    f[23],
                    &format!("above epoch_current ({current})"),
                ));
            }
            (Some(oldest), Some(current))
        } else {
            (None, None)
        };
        let decoded = match f.len() {
            n if n >= NR_FIELDS_EPOCHS => NR_FIELDS_EPOCHS,
            n if n >= NR_FIELDS_FAILED => NR_FIELDS_FAILED,
            n if n >= NR_FIELDS_META => NR_FIELDS_META,
            _ => NR_FIELDS,
        };
        Ok(Status {
            mode,
            block_size: block_size as u32,
            used_blocks,
            total_blocks,
            dirty_blocks: num_u64(3, f[3])?,
            read_hits: num_u64(4, f[4])?,
            read_misses: num_u64(5, f[5])?,
            write_hits: num_u64(6, f[6])?,
            write_misses: num_u64(7, f[7])?,
            write_bypass: num_u64(8, f[8])?,
            flush_state,
            wb_blocks: num_u64(10, f[10])?,
            wb_requests: num_u64(11, f[11])?,
            wb_sectors: num_u64(12, f[12])?,
            avg_write_kb: num_dec(13, f[13])?,
            merge_ratio: num_dec(14, f[14])?,
            bridged_blocks: num_u64(15, f[15])?,
            inflight_max: num_u64(16, f[16])?,
            error,
            flushes: num_u64(18, f[18])?,
            cleaner,
            meta_commits,
            meta_error,
            cache_failed,
            epoch_oldest,
            epoch_current,
            extra: f[decoded..].iter().map(|s| s.to_string()).collect(),
        })
    }

    /// Decode a whole line as printed by `dmsetup status`:
    /// `<start> <len> tiercache <fields>`.
    pub fn parse_line(line: &str) -> Result<(u64, u64, Status)> {
        let mut rest = line.trim();
        let mut word = || {
            let w = rest.split_ascii_whitespace().next().unwrap_or("");
            rest = rest[w.len()..].trim_start();
            w
        };
        let start = word();
        let len = word();
        let ty = word();
        let start: u64 = start.parse().map_err(|_| {
            kerr(format!(
                "status line does not start with <start> <len>: '{line}'"
            ))
        })?;
        let len: u64 = len.parse().map_err(|_| {
            kerr(format!(
                "status line does not start with <start> <len>: '{line}'"
            ))
        })?;
        if ty != TARGET_TYPE {
            return Err(Error::new(
                Kind::Kernel,
                format!("target type is '{ty}', not '{TARGET_TYPE}'"),
            ));
        }
        Ok((start, len, Status::parse_params(rest)?))
    }

    pub fn block_bytes(&self) -> u64 {
        self.block_size as u64 * crate::units::SECTOR
    }
    pub fn dirty_bytes(&self) -> u64 {
        self.dirty_blocks * self.block_bytes()
    }
    pub fn used_bytes(&self) -> u64 {
        self.used_blocks * self.block_bytes()
    }
    pub fn cache_bytes(&self) -> u64 {
        self.total_blocks * self.block_bytes()
    }
    /// Dirty share of all cache slots, in percent (what the watermarks use).
    pub fn dirty_pct(&self) -> f64 {
        self.dirty_blocks as f64 * 100.0 / self.total_blocks as f64
    }
    /// The errno of the cache device error that latched the failed state,
    /// if the module reports one.
    pub fn failed_errno(&self) -> Option<i32> {
        self.cache_failed.filter(|&e| e != 0)
    }
    /// (oldest, current) epochs, if the module reports them: the origin
    /// holds every epoch before `oldest`; `oldest..=current` are live.
    pub fn epochs(&self) -> Option<(u64, u64)> {
        self.epoch_oldest.zip(self.epoch_current)
    }
    pub fn used_pct(&self) -> f64 {
        self.used_blocks as f64 * 100.0 / self.total_blocks as f64
    }
    pub fn read_hit_ratio(&self) -> Option<f64> {
        ratio(self.read_hits, self.read_hits + self.read_misses)
    }
    /// Write hits over all write bios (hits, misses and bypassed ones).
    pub fn write_hit_ratio(&self) -> Option<f64> {
        ratio(
            self.write_hits,
            self.write_hits + self.write_misses + self.write_bypass,
        )
    }
}

fn ratio(a: u64, b: u64) -> Option<f64> {
    if b == 0 {
        None
    } else {
        Some(a as f64 / b as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC_EXAMPLE: &str = "0 65536 tiercache writeback 8 8192/131072 0 0 0 0 8192 0 idle \
                               8192 32 65536 1024 256.00 0 32 0 1 0";

    #[test]
    fn documented_example() {
        let (start, len, s) = Status::parse_line(DOC_EXAMPLE).unwrap();
        assert_eq!((start, len), (0, 65536));
        assert_eq!(s.mode, Mode::Writeback);
        assert_eq!(s.block_size, 8);
        assert_eq!((s.used_blocks, s.total_blocks), (8192, 131072));
        assert_eq!(s.dirty_blocks, 0);
        assert_eq!(s.write_misses, 8192);
        assert_eq!(s.flush_state, FlushState::Idle);
        assert_eq!(
            (s.wb_blocks, s.wb_requests, s.wb_sectors),
            (8192, 32, 65536)
        );
        assert_eq!(s.avg_write_kb, 1024.0);
        assert_eq!(s.merge_ratio, 256.0);
        assert_eq!(s.bridged_blocks, 0);
        assert_eq!(s.inflight_max, 32);
        assert_eq!(s.error, 0);
        assert_eq!(s.flushes, 1);
        assert!(!s.cleaner);
        assert!(s.extra.is_empty());
        assert_eq!(s.cache_bytes(), 512 << 20);
        assert_eq!(s.read_hit_ratio(), None);
        assert_eq!(s.write_hit_ratio(), Some(0.0));
    }

    fn params(over: &[(usize, &str)]) -> String {
        let mut f: Vec<String> = DOC_EXAMPLE
            .split_whitespace()
            .skip(3)
            .map(String::from)
            .collect();
        for (i, v) in over {
            f[*i - 1] = v.to_string();
        }
        f.join(" ")
    }

    #[test]
    fn all_values() {
        let s = Status::parse_params(&params(&[
            (1, "writethrough"),
            (2, "2048"),
            (4, "17"),
            (10, "flushing"),
            (15, "1.5"),
            (18, "-5"),
            (20, "1"),
        ]))
        .unwrap();
        assert_eq!(s.mode, Mode::Writethrough);
        assert_eq!(s.block_size, 2048);
        assert_eq!(s.dirty_bytes(), 17 << 20);
        assert_eq!(s.flush_state, FlushState::Flushing);
        assert_eq!(s.merge_ratio, 1.5);
        assert_eq!(s.error, -5);
        assert!(s.cleaner);
        for st in ["idle", "flushing", "background", "cleaning"] {
            assert_eq!(
                Status::parse_params(&params(&[(10, st)]))
                    .unwrap()
                    .flush_state
                    .as_str(),
                st
            );
        }
        for m in ["writeback", "writethrough", "passthrough"] {
            assert_eq!(
                Status::parse_params(&params(&[(1, m)]))
                    .unwrap()
                    .mode
                    .as_str(),
                m
            );
        }
    }

    #[test]
    fn metadata_fields_when_present() {
        let s = Status::parse_params(&params(&[])).unwrap();
        assert_eq!((s.meta_commits, s.meta_error), (None, None));
        let s = Status::parse_params(&format!("{} 17 -5", params(&[]))).unwrap();
        assert_eq!((s.meta_commits, s.meta_error), (Some(17), Some(-5)));
        assert!(s.extra.is_empty());
        for bad in ["17 5", "17 -05", "x 0", "-1 0"] {
            let e = Status::parse_params(&format!("{} {bad}", params(&[]))).unwrap_err();
            assert!(e.msg.contains("meta_"), "{bad}: {}", e.msg);
        }
    }

    #[test]
    fn failed_state_when_present() {
        // 20 and 22 fields: an older module, no failed state.
        let s = Status::parse_params(&params(&[])).unwrap();
        assert_eq!(s.cache_failed, None);
        assert_eq!(s.failed_errno(), None);
        let s = Status::parse_params(&format!("{} 17 0", params(&[]))).unwrap();
        assert_eq!((s.meta_commits, s.cache_failed), (Some(17), None));
        // 23 fields.
        let s = Status::parse_params(&format!("{} 17 0 0", params(&[]))).unwrap();
        assert_eq!((s.meta_error, s.cache_failed), (Some(0), Some(0)));
        assert_eq!(s.failed_errno(), None);
        assert!(s.extra.is_empty());
        let s = Status::parse_params(&format!("{} 17 -5 -5", params(&[(4, "9")]))).unwrap();
        assert_eq!((s.meta_error, s.cache_failed), (Some(-5), Some(-5)));
        assert_eq!(s.failed_errno(), Some(-5));
        assert_eq!(s.dirty_blocks, 9);
        let s = Status::parse_params(&format!("{} 17 0 -28", params(&[]))).unwrap();
        assert_eq!((s.meta_error, s.failed_errno()), (Some(0), Some(-28)));
        // Malformed: decoded as strictly as field 22.
        for bad in ["5", "-05", "-", "--5", "+5", "x", "-5x", "99999999999"] {
            let e = Status::parse_params(&format!("{} 17 0 {bad}", params(&[]))).unwrap_err();
            assert_eq!(e.kind, Kind::Kernel);
            assert!(
                e.msg
                    .starts_with("status field 23 (cache_failed): cannot decode"),
                "{bad}: {}",
                e.msg
            );
        }
    }

    #[test]
    fn epochs_when_present() {
        // 23 fields: no epochs.
        let s = Status::parse_params(&format!("{} 17 0 0", params(&[]))).unwrap();
        assert_eq!(
            (s.epoch_oldest, s.epoch_current, s.epochs()),
            (None, None, None)
        );
        // 25 fields.
        let s = Status::parse_params(&format!("{} 17 0 0 12 15", params(&[]))).unwrap();
        assert_eq!(s.epochs(), Some((12, 15)));
        assert!(s.extra.is_empty());
        let s = Status::parse_params(&format!("{} 17 0 -5 7 7", params(&[]))).unwrap();
        assert_eq!((s.failed_errno(), s.epochs()), (Some(-5), Some((7, 7))));
        let big = format!("{} 17 0 0 0 18446744073709551615", params(&[]));
        assert_eq!(
            Status::parse_params(&big).unwrap().epochs(),
            Some((0, u64::MAX))
        );
        // A lone 24th field is not half of the pair: kept, not decoded.
        let s = Status::parse_params(&format!("{} 17 0 0 12", params(&[]))).unwrap();
        assert_eq!(
            (s.epochs(), s.extra.clone()),
            (None, vec!["12".to_string()])
        );
        // More: kept.
        let s = Status::parse_params(&format!("{} 17 0 0 12 15 x", params(&[]))).unwrap();
        assert_eq!(
            (s.epochs(), s.extra),
            (Some((12, 15)), vec!["x".to_string()])
        );
        // Malformed, as strictly as the other counters.
        for (bad, idx, name) in [
            ("-1 5", 24, "epoch_oldest"),
            ("1.0 5", 24, "epoch_oldest"),
            ("1 x", 25, "epoch_current"),
            ("1 +5", 25, "epoch_current"),
            ("1 18446744073709551616", 25, "epoch_current"),
        ] {
            let e = Status::parse_params(&format!("{} 17 0 0 {bad}", params(&[]))).unwrap_err();
            assert_eq!(e.kind, Kind::Kernel);
            assert!(
                e.msg
                    .starts_with(&format!("status field {idx} ({name}): cannot decode")),
                "{bad}: {}",
                e.msg
            );
        }
        // The oldest live epoch cannot be after the open one.
        let e = Status::parse_params(&format!("{} 17 0 0 16 15", params(&[]))).unwrap_err();
        assert_eq!(
            e.msg,
            "status field 24 (epoch_oldest): cannot decode '16': above epoch_current (15)"
        );
    }

    #[test]
    fn documented_example_of_this_module() {
        // docs/tiercache.rst, "Status": 23 fields.
        let line = format!("{DOC_EXAMPLE} 5 0 0");
        let (_, _, s) = Status::parse_line(&line).unwrap();
        assert_eq!(
            (s.meta_commits, s.meta_error, s.cache_failed),
            (Some(5), Some(0), Some(0))
        );
        assert!(s.extra.is_empty());
    }

    #[test]
    fn extra_fields_are_kept_not_interpreted() {
        let p = format!("{} 3 0 -5 42 43 future-word 7", params(&[]));
        let s = Status::parse_params(&p).unwrap();
        assert_eq!((s.meta_commits, s.meta_error), (Some(3), Some(0)));
        assert_eq!(s.cache_failed, Some(-5));
        assert_eq!(s.epochs(), Some((42, 43)));
        assert_eq!(s.extra, vec!["future-word", "7"]);
        // A lone 21st field is not half of the metadata pair.
        let s = Status::parse_params(&format!("{} 3", params(&[]))).unwrap();
        assert_eq!((s.meta_commits, s.cache_failed), (None, None));
        assert_eq!(s.extra, vec!["3"]);
    }

    #[test]
    fn too_few_fields() {
        let p: Vec<&str> = DOC_EXAMPLE.split_whitespace().skip(3).take(19).collect();
        let e = Status::parse_params(&p.join(" ")).unwrap_err();
        assert_eq!(e.kind, Kind::Kernel);
        assert!(
            e.msg.contains("19 fields, expected at least 20"),
            "{}",
            e.msg
        );
        assert!(e.hint.is_some());
        assert!(Status::parse_params("").is_err());
    }

    fn bad(idx: usize, val: &str, needle: &str) {
        let e = Status::parse_params(&params(&[(idx, val)])).unwrap_err();
        assert_eq!(e.kind, Kind::Kernel);
        assert!(
            e.msg.starts_with(&format!("status field {idx} (")),
            "field {idx} '{val}': {}",
            e.msg
        );
        assert!(e.msg.contains(needle), "field {idx} '{val}': {}", e.msg);
    }

    #[test]
    fn malformed_fields() {
        bad(1, "writeaside", "mode");
        bad(1, "WRITEBACK", "expected writeback");
        bad(2, "12", "power of two");
        bad(2, "4", "power of two");
        bad(2, "4096", "power of two");
        bad(2, "x", "unsigned");
        bad(3, "8192", "<used>/<total>");
        bad(3, "8192/", "unsigned");
        bad(3, "/1", "unsigned");
        bad(3, "1/0", "no slots");
        bad(4, "-1", "unsigned");
        bad(5, "1e3", "unsigned");
        bad(5, "+3", "unsigned");
        bad(7, "18446744073709551616", "out of range");
        bad(10, "busy", "flush_state");
        bad(14, "abc", "decimal");
        bad(14, "1.", "decimal");
        bad(15, ".5", "decimal");
        bad(15, "-1.00", "decimal");
        bad(18, "5", "negative errno");
        bad(18, "-", "negative errno");
        bad(18, "-05", "negative errno");
        bad(18, "--5", "negative errno");
        bad(20, "2", "0 or 1");
        bad(20, "yes", "0 or 1");
    }

    #[test]
    fn line_header() {
        assert!(Status::parse_line("x 1 tiercache a")
            .unwrap_err()
            .msg
            .contains("<start> <len>"));
        let e = Status::parse_line("0 100 linear 8:0 0").unwrap_err();
        assert!(e.msg.contains("'linear'"), "{}", e.msg);
        // Multiple spaces between fields are fine.
        let sp = DOC_EXAMPLE.replace(' ', "  ");
        assert!(Status::parse_line(&sp).is_ok());
    }

    #[test]
    fn ratios() {
        let s = Status::parse_params(&params(&[(5, "3"), (6, "1"), (7, "1"), (8, "2"), (9, "1")]))
            .unwrap();
        assert_eq!(s.read_hit_ratio(), Some(0.75));
        assert_eq!(s.write_hit_ratio(), Some(0.25));
        assert_eq!(s.dirty_pct(), 0.0);
        assert!((s.used_pct() - 6.25).abs() < 1e-9);
    }
}
