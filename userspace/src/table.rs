// SPDX-License-Identifier: GPL-2.0-only
//! Building and decoding tiercache table lines (docs/tiercache.rst,
//! "Constructor"):
//!
//! ```text
//! <origin dev> <cache dev> <block size> <#feature args>
//!     [writeback|writethrough|passthrough] [<key> <value>]...
//! ```

use serde::Serialize;
use std::fmt;

use crate::error::{usage, Error, Kind, Result};
use crate::status::Mode;

pub const MIN_BLOCK_SECTORS: u32 = 8;
pub const MAX_BLOCK_SECTORS: u32 = 2048;
pub const MIN_CACHE_BLOCKS: u64 = 16;
pub const MAX_FLUSH_KB_LIMIT: u64 = 16384;

/// The live-tunable keys, in the order the documentation lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Key {
    FlushDepth,
    MaxFlushKb,
    BridgeGapKb,
    HighWatermark,
    LowWatermark,
    FlushOnSuspend,
    CommitMs,
    Ordered,
}

pub const ALL_KEYS: [Key; 8] = [
    Key::FlushDepth,
    Key::MaxFlushKb,
    Key::BridgeGapKb,
    Key::HighWatermark,
    Key::LowWatermark,
    Key::FlushOnSuspend,
    Key::CommitMs,
    Key::Ordered,
];

impl Key {
    pub fn as_str(self) -> &'static str {
        match self {
            Key::FlushDepth => "flush_depth",
            Key::MaxFlushKb => "max_flush_kb",
            Key::BridgeGapKb => "bridge_gap_kb",
            Key::HighWatermark => "high_watermark",
            Key::LowWatermark => "low_watermark",
            Key::FlushOnSuspend => "flush_on_suspend",
            Key::CommitMs => "commit_ms",
            Key::Ordered => "ordered",
        }
    }
    /// Accepts the kernel spelling and the dashed option spelling.
    pub fn parse(s: &str) -> Option<Key> {
        let n = s.replace('-', "_");
        ALL_KEYS.iter().copied().find(|k| k.as_str() == n)
    }
    pub fn rule(self) -> &'static str {
        match self {
            Key::FlushDepth => "writeback requests in flight, 1 to 4096",
            Key::MaxFlushKb => "largest origin write in KiB, from the block size up to 16384",
            Key::BridgeGapKb => "largest hole bridged, in KiB, 0 (off) up to max_flush_kb",
            Key::HighWatermark => "dirty percent that starts background writeback, 1 to 100",
            Key::LowWatermark => "dirty percent that stops it, 0 to high_watermark",
            Key::FlushOnSuspend => "flush when suspended, 0 or 1",
            Key::CommitMs => "metadata commit interval in milliseconds, 1 to 600000",
            Key::Ordered => {
                "writeback policy, 0 (default) or 1: epoch by epoch, the origin always consistent"
            }
        }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

pub fn key_list() -> String {
    ALL_KEYS
        .iter()
        .map(|k| k.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn parse_value(key: Key, v: &str) -> Result<u64> {
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(usage(format!(
            "invalid value '{v}' for {key}: expected an unsigned number ({})",
            key.rule()
        )));
    }
    v.parse()
        .map_err(|_| usage(format!("invalid value '{v}' for {key}: out of range")))
}

/// Check one value on its own (cross-key rules are in `TableSpec::validate`).
pub fn check_value(key: Key, v: &str, block_sectors: u32) -> Result<u64> {
    let n = parse_value(key, v)?;
    let block_kb = block_sectors as u64 / 2;
    let ok = match key {
        Key::FlushDepth => (1..=4096).contains(&n),
        Key::MaxFlushKb => n >= block_kb && n <= MAX_FLUSH_KB_LIMIT,
        Key::BridgeGapKb => n <= MAX_FLUSH_KB_LIMIT,
        Key::HighWatermark => (1..=100).contains(&n),
        Key::LowWatermark => n <= 100,
        Key::FlushOnSuspend => n <= 1,
        Key::CommitMs => (1..=600_000).contains(&n),
        Key::Ordered => n <= 1,
    };
    if !ok {
        return Err(usage(format!(
            "invalid value {n} for {key}: {}",
            key.rule()
        )));
    }
    Ok(n)
}

/// A decoded or to-be-built tiercache table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TableSpec {
    /// Origin device as the kernel accepts it: `major:minor` or a path.
    pub origin: String,
    pub cache: String,
    /// Sectors per block.
    pub block_size: u32,
    /// `None`: no mode word (the target's default, writeback).
    pub mode: Option<Mode>,
    /// Key/value pairs in table order.  Keys this tool does not know (from a
    /// newer module) are kept verbatim so that a reload re-emits them.
    pub options: Vec<(String, String)>,
    /// The `format` feature argument: the target formats a blank or clean
    /// cache device (and refuses one holding dirty data).  Only ever in a
    /// table the tool loads: the kernel does not print it back.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub format: bool,
}

/// The feature argument that makes the target format the cache device.
pub const FORMAT_ARG: &str = "format";

pub fn check_block_size(sectors: u64) -> Result<u32> {
    if sectors < MIN_BLOCK_SECTORS as u64
        || sectors > MAX_BLOCK_SECTORS as u64
        || !sectors.is_power_of_two()
    {
        return Err(usage(format!(
            "invalid block size {} ({} bytes): must be a power of two from 4 KiB to 1 MiB",
            crate::units::fmt_bytes(sectors * 512),
            sectors * 512
        )));
    }
    Ok(sectors as u32)
}

impl TableSpec {
    pub fn new(origin: &str, cache: &str, block_size: u32) -> TableSpec {
        TableSpec {
            origin: origin.into(),
            cache: cache.into(),
            block_size,
            mode: None,
            options: vec![],
            format: false,
        }
    }

    pub fn get(&self, key: Key) -> Option<&str> {
        self.options
            .iter()
            .rev()
            .find(|(k, _)| k == key.as_str())
            .map(|(_, v)| v.as_str())
    }

    /// Set (or replace) a key.
    pub fn set(&mut self, key: Key, value: u64) {
        let v = value.to_string();
        if let Some(slot) = self.options.iter_mut().find(|(k, _)| k == key.as_str()) {
            slot.1 = v;
        } else {
            self.options.push((key.as_str().into(), v));
        }
    }

    /// Apply the documented rules, so that a bad value is reported by the
    /// tool with the rule instead of a bare EINVAL from the kernel.
    pub fn validate(&self) -> Result<()> {
        check_block_size(self.block_size as u64)?;
        if self.origin.is_empty() || self.cache.is_empty() {
            return Err(usage("origin and cache devices must be given"));
        }
        if self.origin == self.cache {
            return Err(usage(format!(
                "the cache device may not be the origin ({})",
                self.origin
            )));
        }
        let mut seen: Vec<Key> = vec![];
        for (k, v) in &self.options {
            let key = Key::parse(k)
                .ok_or_else(|| usage(format!("unknown key '{k}' (known: {})", key_list())))?;
            if seen.contains(&key) {
                return Err(usage(format!("{key} given twice")));
            }
            seen.push(key);
            check_value(key, v, self.block_size)?;
        }
        let num = |k: Key| self.get(k).map(|v| v.parse::<u64>().unwrap());
        if let (Some(gap), Some(max)) = (num(Key::BridgeGapKb), num(Key::MaxFlushKb)) {
            if gap > max {
                return Err(usage(format!(
                    "bridge_gap_kb {gap} is larger than max_flush_kb {max}: {}",
                    Key::BridgeGapKb.rule()
                )));
            }
        }
        let high = num(Key::HighWatermark).unwrap_or(50);
        if let Some(low) = num(Key::LowWatermark) {
            if low > high {
                return Err(usage(format!(
                    "low_watermark {low} is above high_watermark {high}: {}",
                    Key::LowWatermark.rule()
                )));
            }
        }
        Ok(())
    }

    /// The target parameters (what follows `<start> <len> tiercache`).
    pub fn to_params(&self) -> String {
        let mut feat: Vec<&str> = vec![];
        if let Some(m) = self.mode {
            feat.push(m.as_str());
        }
        if self.format {
            feat.push(FORMAT_ARG);
        }
        for (k, v) in &self.options {
            feat.push(k);
            feat.push(v);
        }
        let mut s = format!(
            "{} {} {} {}",
            self.origin,
            self.cache,
            self.block_size,
            feat.len()
        );
        for w in feat {
            s.push(' ');
            s.push_str(w);
        }
        s
    }

    /// Decode the parameters printed by `dmsetup table` for a tiercache
    /// target.
    pub fn parse_params(params: &str) -> Result<TableSpec> {
        let kerr =
            |m: String| Error::new(Kind::Kernel, format!("table line '{}': {m}", params.trim()));
        let w: Vec<&str> = params.split_ascii_whitespace().collect();
        if w.len() < 4 {
            return Err(kerr(format!("has {} words, expected at least 4", w.len())));
        }
        let bs: u64 = w[2]
            .parse()
            .map_err(|_| kerr(format!("bad block size '{}'", w[2])))?;
        let block_size = check_block_size(bs).map_err(|e| kerr(e.msg))?;
        let n: usize = w[3]
            .parse()
            .map_err(|_| kerr(format!("bad feature argument count '{}'", w[3])))?;
        if w.len() != 4 + n {
            return Err(kerr(format!(
                "feature argument count {n} does not match the {} words that follow",
                w.len() - 4
            )));
        }
        // As the kernel reads them: a mode word and `format` anywhere,
        // everything else a key followed by its value.
        let feat = &w[4..];
        let mut mode = None;
        let mut format = false;
        let mut options = vec![];
        let mut i = 0;
        while i < feat.len() {
            if let Ok(m) = feat[i].parse::<Mode>() {
                if mode.is_some() {
                    return Err(kerr(format!("mode given twice ('{}')", feat[i])));
                }
                mode = Some(m);
                i += 1;
            } else if feat[i] == FORMAT_ARG {
                format = true;
                i += 1;
            } else if i + 1 < feat.len() {
                options.push((feat[i].to_string(), feat[i + 1].to_string()));
                i += 2;
            } else {
                return Err(kerr(format!("key '{}' has no value", feat[i])));
            }
        }
        Ok(TableSpec {
            origin: w[0].into(),
            cache: w[1].into(),
            block_size,
            mode,
            options,
            format,
        })
    }
}

/// Parameters of a linear mapping of the whole of `dev`.
pub fn linear_params(dev: &str) -> String {
    format!("{dev} 0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_minimal() {
        let t = TableSpec::new("253:1", "253:2", 8);
        t.validate().unwrap();
        assert_eq!(t.to_params(), "253:1 253:2 8 0");
    }

    #[test]
    fn build_full_and_roundtrip() {
        let mut t = TableSpec::new("253:1", "1:0", 128);
        t.mode = Some(Mode::Writeback);
        t.set(Key::BridgeGapKb, 64);
        t.set(Key::FlushDepth, 256);
        t.set(Key::BridgeGapKb, 128); // replaces, keeps position
        t.validate().unwrap();
        let p = t.to_params();
        assert_eq!(
            p,
            "253:1 1:0 128 5 writeback bridge_gap_kb 128 flush_depth 256"
        );
        assert_eq!(TableSpec::parse_params(&p).unwrap(), t);
        assert_eq!(t.get(Key::FlushDepth), Some("256"));
        assert_eq!(t.get(Key::MaxFlushKb), None);
    }

    #[test]
    fn doc_example_parses() {
        let t =
            TableSpec::parse_params("/dev/slow /dev/ram0 8 3 writeback bridge_gap_kb 64").unwrap();
        assert_eq!(t.mode, Some(Mode::Writeback));
        assert_eq!(
            t.options,
            vec![("bridge_gap_kb".to_string(), "64".to_string())]
        );
        // Without a mode word.
        let t = TableSpec::parse_params("8:16 8:32 8 2 flush_depth 4").unwrap();
        assert_eq!(t.mode, None);
        assert_eq!(t.get(Key::FlushDepth), Some("4"));
        // An unknown key from a newer module is kept for re-emission.
        let t = TableSpec::parse_params("8:16 8:32 8 3 passthrough future_key 7").unwrap();
        assert_eq!(t.to_params(), "8:16 8:32 8 3 passthrough future_key 7");
    }

    #[test]
    fn format_feature() {
        let mut t = TableSpec::new("253:1", "253:2", 8);
        t.mode = Some(Mode::Writeback);
        t.format = true;
        t.set(Key::FlushDepth, 64);
        let p = t.to_params();
        assert_eq!(p, "253:1 253:2 8 4 writeback format flush_depth 64");
        assert_eq!(TableSpec::parse_params(&p).unwrap(), t);
        let mut t = TableSpec::new("253:1", "253:2", 8);
        t.format = true;
        assert_eq!(t.to_params(), "253:1 253:2 8 1 format");
        // Not shown in JSON unless set.
        let v = serde_json::to_value(TableSpec::new("a", "b", 8)).unwrap();
        assert!(v.get("format").is_none());
        // The kernel's reading: format and the mode in any position.
        let t = TableSpec::parse_params("8:16 8:32 8 4 flush_depth 4 format writethrough").unwrap();
        assert!(t.format);
        assert_eq!(t.mode, Some(Mode::Writethrough));
        assert_eq!(t.get(Key::FlushDepth), Some("4"));
        assert!(TableSpec::parse_params("8:16 8:32 8 2 writeback writethrough").is_err());
    }

    #[test]
    fn parse_rejects() {
        for bad in [
            "",
            "8:16 8:32 8",
            "8:16 8:32 12 0",
            "8:16 8:32 8 x",
            "8:16 8:32 8 2 writeback",
            "8:16 8:32 8 1 writeback extra",
            "8:16 8:32 8 1 flush_depth",
            "8:16 8:32 8 2 writeback flush_depth",
        ] {
            let e = TableSpec::parse_params(bad).unwrap_err();
            assert_eq!(e.kind, Kind::Kernel, "{bad}");
        }
    }

    fn with(opts: &[(&str, &str)], bs: u32) -> Result<()> {
        let mut t = TableSpec::new("8:16", "8:32", bs);
        t.options = opts
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        t.validate()
    }

    #[test]
    fn rules() {
        assert!(with(&[("flush_depth", "1")], 8).is_ok());
        assert!(with(&[("flush_depth", "4096")], 8).is_ok());
        assert!(with(&[("flush_depth", "0")], 8).is_err());
        assert!(with(&[("flush_depth", "4097")], 8).is_err());
        assert!(with(&[("max_flush_kb", "4")], 8).is_ok());
        assert!(with(&[("max_flush_kb", "4")], 16).is_err()); // below one 8 KiB block
        assert!(with(&[("max_flush_kb", "16384")], 8).is_ok());
        assert!(with(&[("max_flush_kb", "16385")], 8).is_err());
        assert!(with(&[("bridge_gap_kb", "0")], 8).is_ok());
        assert!(with(&[("bridge_gap_kb", "64"), ("max_flush_kb", "32")], 8).is_err());
        assert!(with(&[("bridge_gap_kb", "32"), ("max_flush_kb", "32")], 8).is_ok());
        assert!(with(&[("high_watermark", "0")], 8).is_err());
        assert!(with(&[("high_watermark", "101")], 8).is_err());
        assert!(with(&[("low_watermark", "60")], 8).is_err()); // default high is 50
        assert!(with(&[("low_watermark", "60"), ("high_watermark", "70")], 8).is_ok());
        assert!(with(&[("high_watermark", "20"), ("low_watermark", "30")], 8).is_err());
        assert!(with(&[("flush_on_suspend", "1")], 8).is_ok());
        assert!(with(&[("ordered", "0")], 8).is_ok());
        assert!(with(&[("ordered", "1")], 8).is_ok());
        assert!(with(&[("ordered", "2")], 8).is_err());
        assert!(with(&[("flush_on_suspend", "2")], 8).is_err());
        assert!(with(&[("commit_ms", "1")], 8).is_ok());
        assert!(with(&[("commit_ms", "600000")], 8).is_ok());
        assert!(with(&[("commit_ms", "0")], 8).is_err());
        assert!(with(&[("commit_ms", "600001")], 8).is_err());
        assert!(with(&[("flush_depth", "-1")], 8).is_err());
        assert!(with(&[("flush_depth", "1k")], 8).is_err());
        assert!(with(&[("no_such_key", "1")], 8).is_err());
        assert!(with(&[("flush_depth", "1"), ("flush_depth", "2")], 8).is_err());
        let e = with(&[("flush_depth", "0")], 8).unwrap_err();
        assert_eq!(e.kind, Kind::Usage);
        assert!(e.msg.contains("1 to 4096"), "{}", e.msg);
    }

    #[test]
    fn block_sizes() {
        for ok in [8u64, 16, 64, 1024, 2048] {
            assert_eq!(check_block_size(ok).unwrap() as u64, ok);
        }
        for bad in [0u64, 1, 4, 12, 4096] {
            assert!(check_block_size(bad).is_err());
        }
        assert!(TableSpec::new("a", "a", 8).validate().is_err());
    }

    #[test]
    fn keys() {
        assert_eq!(Key::parse("flush-depth"), Some(Key::FlushDepth));
        assert_eq!(Key::parse("bridge_gap_kb"), Some(Key::BridgeGapKb));
        assert_eq!(Key::parse("mode"), None);
        assert_eq!(linear_params("253:4"), "253:4 0");
    }
}
