// SPDX-License-Identifier: GPL-2.0-only
//! The list of cached devices activated at boot (/etc/tiercache.conf).
//!
//! One device per line, fields separated by blanks, `#` starts a comment:
//!
//! ```text
//! # <name>   <origin>        <cache>          [<options>]
//! data       vg0/data        vg0/data_cache   block_size=64K,bridge_gap_kb=256
//! scratch    /dev/sdb        /dev/nvme0n1p3   mode=writethrough,noauto
//! ```
//!
//! `<origin>` and `<cache>` are either `VG/LV` (an LVM logical volume, the
//! form `tiercache attach` writes) or an absolute path to a block device
//! (use a stable one, /dev/disk/by-id/...).  `<options>` is a comma
//! separated list, or `-` for none:
//!
//! * `block_size=SIZE` (default 4K; units as for --block-size)
//! * `mode=writeback|writethrough|passthrough`
//! * any tunable `KEY=VALUE` (flush_depth, max_flush_kb, bridge_gap_kb,
//!   high_watermark, low_watermark, flush_on_suspend, commit_ms)
//! * `noauto`: not activated by `activate --all`.

use serde::Serialize;
use std::fmt;

use crate::error::{Error, Kind, Result};
use crate::status::Mode;
use crate::table::{self, Key};

pub const DEFAULT_PATH: &str = "/etc/tiercache.conf";
pub const DEFAULT_BLOCK_SECTORS: u32 = 8;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "type", content = "name", rename_all = "lowercase")]
pub enum DevRef {
    /// An LVM logical volume.
    Lv { vg: String, lv: String },
    /// A block device node.
    Path(String),
}

impl DevRef {
    pub fn parse(s: &str) -> std::result::Result<DevRef, String> {
        if s.starts_with('/') {
            return Ok(DevRef::Path(s.to_string()));
        }
        match s.split_once('/') {
            Some((vg, lv)) if valid_lvm_name(vg) && valid_lvm_name(lv) => Ok(DevRef::Lv {
                vg: vg.into(),
                lv: lv.into(),
            }),
            _ => Err(format!(
                "'{s}' is neither VG/LV nor an absolute device path such as /dev/sdb"
            )),
        }
    }
}

/// LVM's rule for VG and LV names.
pub fn valid_lvm_name(s: &str) -> bool {
    !s.is_empty()
        && s != "."
        && s != ".."
        && !s.starts_with('-')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+_.-".contains(&b))
}

impl fmt::Display for DevRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DevRef::Lv { vg, lv } => write!(f, "{vg}/{lv}"),
            DevRef::Path(p) => f.write_str(p),
        }
    }
}

/// Names usable both as a DM name and as a file name under /dev/tiercache.
pub fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 100
        && s != "."
        && s != ".."
        && !s.starts_with('-')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+_.-".contains(&b))
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Options {
    pub block_size: u32,
    pub mode: Option<Mode>,
    pub tunables: Vec<(Key, u64)>,
    pub noauto: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            block_size: DEFAULT_BLOCK_SECTORS,
            mode: None,
            tunables: vec![],
            noauto: false,
        }
    }
}

impl Options {
    pub fn parse(s: &str) -> std::result::Result<Options, String> {
        let mut o = Options::default();
        if s == "-" || s.is_empty() {
            return Ok(o);
        }
        let mut pending: Vec<(Key, String)> = vec![];
        for item in s.split(',') {
            let (k, v) = match item.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (item, None),
            };
            match (k, v) {
                ("noauto", None) => o.noauto = true,
                ("block_size", Some(v)) => {
                    let b = crate::units::parse_size("block_size", v).map_err(|e| e.msg)?;
                    if b % 512 != 0 {
                        return Err(format!("block_size={v} is not a whole number of sectors"));
                    }
                    o.block_size = table::check_block_size(b / 512).map_err(|e| e.msg)?;
                }
                ("mode", Some(v)) => {
                    o.mode = Some(v.parse().map_err(|e| format!("mode={v}: {e}"))?)
                }
                (k, Some(v)) => match Key::parse(k) {
                    Some(key) => pending.push((key, v.to_string())),
                    None => {
                        return Err(format!(
                            "unknown option '{k}' (known: block_size, mode, noauto, {})",
                            table::key_list()
                        ))
                    }
                },
                (k, None) => return Err(format!("option '{k}' needs a value ({k}=...)")),
            }
        }
        for (key, v) in pending {
            let n = table::check_value(key, &v, o.block_size).map_err(|e| e.msg)?;
            o.tunables.push((key, n));
        }
        Ok(o)
    }

    /// The options field as written to the file.
    pub fn to_field(&self) -> String {
        let mut v = vec![format!(
            "block_size={}",
            crate::units::fmt_bytes(self.block_size as u64 * 512)
                .replace(" KiB", "K")
                .replace(" MiB", "M")
        )];
        if let Some(m) = self.mode {
            v.push(format!("mode={m}"));
        }
        for (k, n) in &self.tunables {
            v.push(format!("{k}={n}"));
        }
        if self.noauto {
            v.push("noauto".into());
        }
        v.join(",")
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Entry {
    pub name: String,
    pub origin: DevRef,
    pub cache: DevRef,
    pub options: Options,
    /// 1-based line number in the file (0 for a new entry).
    #[serde(skip)]
    pub line: usize,
}

impl Entry {
    pub fn to_line(&self) -> String {
        format!(
            "{}\t{}\t{}\t{}",
            self.name,
            self.origin,
            self.cache,
            self.options.to_field()
        )
    }
}

fn cerr(path: &str, line: usize, msg: String) -> Error {
    Error::new(Kind::Config, format!("{path}:{line}: {msg}")).hint(format!(
        "fix or remove that line of {path} (see 'tiercache activate --help')"
    ))
}

fn strip_comment(l: &str) -> &str {
    l.split('#').next().unwrap_or("").trim()
}

/// Parse the whole file; `path` is only used in messages.
pub fn parse(path: &str, text: &str) -> Result<Vec<Entry>> {
    let mut out: Vec<Entry> = vec![];
    for (i, raw) in text.lines().enumerate() {
        let l = strip_comment(raw);
        if l.is_empty() {
            continue;
        }
        let f: Vec<&str> = l.split_ascii_whitespace().collect();
        if f.len() < 3 || f.len() > 4 {
            return Err(cerr(
                path,
                i + 1,
                format!(
                    "expected <name> <origin> <cache> [<options>], found {} fields",
                    f.len()
                ),
            ));
        }
        if !valid_name(f[0]) {
            return Err(cerr(path, i + 1, format!("invalid device name '{}'", f[0])));
        }
        if out.iter().any(|e| e.name == f[0]) {
            return Err(cerr(
                path,
                i + 1,
                format!("device '{}' is listed twice", f[0]),
            ));
        }
        let origin = DevRef::parse(f[1]).map_err(|m| cerr(path, i + 1, format!("origin: {m}")))?;
        let cache = DevRef::parse(f[2]).map_err(|m| cerr(path, i + 1, format!("cache: {m}")))?;
        if origin == cache {
            return Err(cerr(
                path,
                i + 1,
                "origin and cache are the same device".into(),
            ));
        }
        let options =
            Options::parse(f.get(3).copied().unwrap_or("-")).map_err(|m| cerr(path, i + 1, m))?;
        out.push(Entry {
            name: f[0].into(),
            origin,
            cache,
            options,
            line: i + 1,
        });
    }
    Ok(out)
}

pub const HEADER: &str = "\
# tiercache.conf: cached devices set up by 'tiercache activate --all' at boot.
# <name>  <origin VG/LV or /dev/...>  <cache VG/LV or /dev/...>  [<options>]
";

/// Return `text` with `e` appended (or replacing the line of the same name).
pub fn upsert(text: &str, e: &Entry) -> String {
    let mut out = String::new();
    if text.trim().is_empty() {
        out.push_str(HEADER);
    }
    let mut replaced = false;
    for raw in text.lines() {
        let name = strip_comment(raw).split_ascii_whitespace().next();
        if name == Some(e.name.as_str()) {
            if !replaced {
                out.push_str(&e.to_line());
                out.push('\n');
                replaced = true;
            }
        } else {
            out.push_str(raw);
            out.push('\n');
        }
    }
    if !replaced {
        out.push_str(&e.to_line());
        out.push('\n');
    }
    out
}

/// Return `text` without the line for `name`; comments and other lines stay.
pub fn remove(text: &str, name: &str) -> (String, bool) {
    let mut out = String::new();
    let mut found = false;
    for raw in text.lines() {
        if strip_comment(raw).split_ascii_whitespace().next() == Some(name) {
            found = true;
        } else {
            out.push_str(raw);
            out.push('\n');
        }
    }
    (out, found)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
# comment
data   vg0/data   vg0/data_cache   block_size=64K,bridge_gap_kb=256   # trailing
  scratch /dev/sdb /dev/nvme0n1p3 mode=writethrough,noauto

plain  vg/a  vg/b
dash   vg/a2 vg/b2 -
";

    #[test]
    fn parse_sample() {
        let v = parse("t.conf", SAMPLE).unwrap();
        assert_eq!(v.len(), 4);
        assert_eq!(v[0].name, "data");
        assert_eq!(
            v[0].origin,
            DevRef::Lv {
                vg: "vg0".into(),
                lv: "data".into()
            }
        );
        assert_eq!(v[0].options.block_size, 128);
        assert_eq!(v[0].options.tunables, vec![(Key::BridgeGapKb, 256)]);
        assert_eq!(v[0].line, 2);
        assert_eq!(v[1].origin, DevRef::Path("/dev/sdb".into()));
        assert_eq!(v[1].options.mode, Some(Mode::Writethrough));
        assert!(v[1].options.noauto);
        assert_eq!(v[2].options, Options::default());
        assert_eq!(v[3].options, Options::default());
    }

    fn err(text: &str, needle: &str) {
        let e = parse("t.conf", text).unwrap_err();
        assert_eq!(e.kind, Kind::Config);
        assert!(e.msg.starts_with("t.conf:"), "{}", e.msg);
        assert!(e.msg.contains(needle), "{text}: {}", e.msg);
    }

    #[test]
    fn parse_errors() {
        err("a vg/b\n", "found 2 fields");
        err("a vg/b vg/c x y\n", "found 5 fields");
        err("a b vg/c\n", "neither VG/LV");
        err("a vg/b vg/b\n", "same device");
        err(
            "a vg/b vg/c\na vg/d vg/e\n",
            "t.conf:2: device 'a' is listed twice",
        );
        err("a vg/b vg/c block_size=12K\n", "power of two");
        err("a vg/b vg/c block_size=100b\n", "whole number of sectors");
        err("a vg/b vg/c mode=fast\n", "mode=fast");
        err("a vg/b vg/c flush_depth=0\n", "1 to 4096");
        err("a vg/b vg/c bogus=1\n", "unknown option 'bogus'");
        err("a vg/b vg/c flush_depth\n", "needs a value");
        err("-a vg/b vg/c\n", "invalid device name");
        err("a vg/b/c vg/c\n", "neither VG/LV");
    }

    #[test]
    fn roundtrip_and_edit() {
        let e = Entry {
            name: "new".into(),
            origin: DevRef::Lv {
                vg: "vg".into(),
                lv: "slow".into(),
            },
            cache: DevRef::Lv {
                vg: "vg".into(),
                lv: "fast".into(),
            },
            options: Options {
                block_size: 8,
                mode: Some(Mode::Writeback),
                tunables: vec![(Key::FlushDepth, 64)],
                noauto: false,
            },
            line: 0,
        };
        let t = upsert("", &e);
        assert!(t.starts_with("# tiercache.conf"));
        let v = parse("x", &t).unwrap();
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].options, e.options);
        assert_eq!(
            v[0].to_line(),
            "new\tvg/slow\tvg/fast\tblock_size=4K,mode=writeback,flush_depth=64"
        );

        let t2 = upsert(SAMPLE, &e);
        assert_eq!(parse("x", &t2).unwrap().len(), 5);
        // Replacing keeps the number of entries.
        let mut e2 = e.clone();
        e2.options.noauto = true;
        let t3 = upsert(&t2, &e2);
        let v3 = parse("x", &t3).unwrap();
        assert_eq!(v3.len(), 5);
        assert!(v3.iter().find(|x| x.name == "new").unwrap().options.noauto);

        let (t4, found) = remove(&t3, "new");
        assert!(found);
        assert_eq!(parse("x", &t4).unwrap(), parse("x", SAMPLE).unwrap());
        assert!(t4.contains("# comment"));
        let (_, found) = remove(&t4, "nothere");
        assert!(!found);
    }

    #[test]
    fn names() {
        assert!(valid_name("slow_c-1.x"));
        assert!(!valid_name("a/b"));
        assert!(!valid_name(""));
        assert!(!valid_name(".."));
        assert!(!valid_name("-x"));
        assert!(DevRef::parse("vg/lv").is_ok());
        assert!(DevRef::parse("/dev/disk/by-id/x").is_ok());
        assert!(DevRef::parse("lv").is_err());
        assert!(Options::parse("block_size=1M").unwrap().block_size == 2048);
        assert_eq!(
            Options::parse("block_size=1M").unwrap().to_field(),
            "block_size=1M"
        );
    }
}
