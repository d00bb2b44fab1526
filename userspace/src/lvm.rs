// SPDX-License-Identifier: GPL-2.0-only
//! LVM integration: logical volumes are looked up through LVM's JSON report
//! (`lvs --reportformat json`) and changed with lvchange/lvremove.

use serde::Serialize;
use std::process::Command;

use crate::error::{failure, not_found, Error, Kind, Result};

/// Tags put on the logical volumes of a cached pair.  An LV carrying one
/// of them also has LVM's activation-skip flag set, so that a plain
/// `vgchange -ay` (autoactivation at boot) does not activate it: the origin
/// must not be exposed without its cache.
pub const TAG_ORIGIN: &str = "tiercache_origin";
pub const TAG_CACHE: &str = "tiercache_cache";

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LvInfo {
    pub vg: String,
    pub lv: String,
    pub path: String,
    pub dm_path: String,
    pub size_bytes: u64,
    pub attr: String,
    pub active: bool,
    /// Kernel device number while active.
    pub devno: Option<(u32, u32)>,
    pub tags: Vec<String>,
    pub skip_activation: bool,
}

impl LvInfo {
    pub fn full_name(&self) -> String {
        format!("{}/{}", self.vg, self.lv)
    }
    pub fn has_tag(&self, t: &str) -> bool {
        self.tags.iter().any(|x| x == t)
    }
}

/// The fields requested from `lvs`.
pub const LVS_FIELDS: &str = "vg_name,lv_name,lv_path,lv_dm_path,lv_size,lv_attr,lv_active,\
lv_kernel_major,lv_kernel_minor,lv_tags,lv_skip_activation";

fn field<'a>(o: &'a serde_json::Value, k: &str) -> Result<&'a str> {
    match o.get(k) {
        Some(serde_json::Value::String(s)) => Ok(s),
        _ => Err(failure(format!(
            "lvs report: field '{k}' missing or not a string"
        ))),
    }
}

/// Decode `lvs --reportformat json --units b --nosuffix -o LVS_FIELDS`.
pub fn parse_lvs_json(text: &str) -> Result<Vec<LvInfo>> {
    let v: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| failure(format!("cannot decode the JSON report of lvs: {e}")))?;
    let mut out = vec![];
    let reports = v
        .get("report")
        .and_then(|r| r.as_array())
        .ok_or_else(|| failure("lvs report: no 'report' array"))?;
    for r in reports {
        let Some(lvs) = r.get("lv").and_then(|l| l.as_array()) else {
            continue;
        };
        for o in lvs {
            let size_s = field(o, "lv_size")?;
            let size_bytes = size_s
                .trim_end_matches('B')
                .parse::<u64>()
                .map_err(|_| failure(format!("lvs report: bad lv_size '{size_s}'")))?;
            let maj = field(o, "lv_kernel_major")?.parse::<i64>().unwrap_or(-1);
            let min = field(o, "lv_kernel_minor")?.parse::<i64>().unwrap_or(-1);
            let attr = field(o, "lv_attr")?.to_string();
            let active_s = field(o, "lv_active")?;
            let active = active_s == "active"
                || active_s.starts_with("active")
                || attr.as_bytes().get(4) == Some(&b'a');
            let tags = field(o, "lv_tags")?
                .split(',')
                .filter(|t| !t.is_empty())
                .map(String::from)
                .collect();
            let skip = field(o, "lv_skip_activation")?;
            out.push(LvInfo {
                vg: field(o, "vg_name")?.into(),
                lv: field(o, "lv_name")?.into(),
                path: field(o, "lv_path")?.into(),
                dm_path: field(o, "lv_dm_path")?.into(),
                size_bytes,
                attr,
                active,
                devno: if maj >= 0 && min >= 0 {
                    Some((maj as u32, min as u32))
                } else {
                    None
                },
                tags,
                skip_activation: skip == "skip activation" || skip == "1" || skip == "yes",
            });
        }
    }
    Ok(out)
}

/// What the command logic needs from LVM.
pub trait Lvm {
    /// `None` when the LV does not exist.
    fn lv(&self, vg: &str, lv: &str) -> Result<Option<LvInfo>>;
    /// All LVs (used to map a device number back to an LV).
    fn all(&self) -> Result<Vec<LvInfo>>;
    /// Activate, ignoring the activation-skip flag.
    fn activate(&self, vg: &str, lv: &str) -> Result<()>;
    fn deactivate(&self, vg: &str, lv: &str) -> Result<()>;
    /// Mark (or unmark) an LV as part of a cached pair: tag + activation skip.
    fn mark(&self, vg: &str, lv: &str, tag: &str, on: bool) -> Result<()>;
    fn remove(&self, vg: &str, lv: &str) -> Result<()>;
}

/// The real thing: runs the LVM commands.
pub struct LvmCmd;

fn udev_running() -> bool {
    std::path::Path::new("/run/udev/control").exists()
}

fn lvm(args: &[&str]) -> Result<(i32, String, String)> {
    let mut c = Command::new("lvm");
    c.arg(args[0]);
    if !udev_running() {
        // No udev (rescue shell, early boot, test VM): let LVM create its
        // device nodes itself instead of waiting for udev.
        c.args(["--config", "activation { udev_sync = 0 udev_rules = 0 }"]);
    }
    c.args(&args[1..]);
    c.env("LVM_SUPPRESS_FD_WARNINGS", "1");
    let out = c.output().map_err(|e| {
        failure(format!("cannot run 'lvm {}': {e}", args[0])).hint("install the lvm2 package")
    })?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).trim().to_string(),
    ))
}

fn checked(args: &[&str]) -> Result<String> {
    let (rc, out, err) = lvm(args)?;
    if rc != 0 {
        return Err(Error::new(
            Kind::Failure,
            format!(
                "'lvm {}' failed (exit {rc}): {}",
                args.join(" "),
                err.replace('\n', "; ")
            ),
        ));
    }
    Ok(out)
}

impl Lvm for LvmCmd {
    fn lv(&self, vg: &str, lv: &str) -> Result<Option<LvInfo>> {
        let name = format!("{vg}/{lv}");
        let (rc, out, err) = lvm(&[
            "lvs",
            "--reportformat",
            "json",
            "--units",
            "b",
            "--nosuffix",
            "-o",
            LVS_FIELDS,
            &name,
        ])?;
        if rc != 0 {
            if err.contains("Failed to find")
                || err.contains("not found")
                || err.contains("Volume group")
            {
                return Ok(None);
            }
            return Err(failure(format!("lvs {name} failed (exit {rc}): {err}")));
        }
        Ok(parse_lvs_json(&out)?.into_iter().next())
    }

    fn all(&self) -> Result<Vec<LvInfo>> {
        let out = checked(&[
            "lvs",
            "--reportformat",
            "json",
            "--units",
            "b",
            "--nosuffix",
            "-o",
            LVS_FIELDS,
        ])?;
        parse_lvs_json(&out)
    }

    fn activate(&self, vg: &str, lv: &str) -> Result<()> {
        checked(&["lvchange", "-ay", "-K", &format!("{vg}/{lv}")]).map(|_| ())
    }

    fn deactivate(&self, vg: &str, lv: &str) -> Result<()> {
        checked(&["lvchange", "-an", &format!("{vg}/{lv}")]).map(|_| ())
    }

    fn mark(&self, vg: &str, lv: &str, tag: &str, on: bool) -> Result<()> {
        let name = format!("{vg}/{lv}");
        let (tag_op, skip) = if on {
            ("--addtag", "y")
        } else {
            ("--deltag", "n")
        };
        checked(&["lvchange", tag_op, tag, "--setactivationskip", skip, &name]).map(|_| ())
    }

    fn remove(&self, vg: &str, lv: &str) -> Result<()> {
        checked(&["lvremove", "-y", &format!("{vg}/{lv}")]).map(|_| ())
    }
}

/// Look an LV up, with the standard message when it does not exist.
pub fn require_lv(lvm: &dyn Lvm, vg: &str, lv: &str) -> Result<LvInfo> {
    lvm.lv(vg, lv)?.ok_or_else(|| {
        not_found(format!("logical volume {vg}/{lv} not found"))
            .hint("check the name with 'lvs'; the form is VG/LV")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // As printed by lvm2 2.03.16 (Debian 12).
    const SAMPLE: &str = r#"  {
      "report": [
          {
              "lv": [
                  {"vg_name":"tcvg", "lv_name":"slow", "lv_path":"/dev/tcvg/slow", "lv_dm_path":"/dev/mapper/tcvg-slow", "lv_size":"268435456", "lv_attr":"-wi-a-----", "lv_active":"active", "lv_kernel_major":"253", "lv_kernel_minor":"0", "lv_tags":"", "lv_skip_activation":""},
                  {"vg_name":"tcvg", "lv_name":"fast", "lv_path":"/dev/tcvg/fast", "lv_dm_path":"/dev/mapper/tcvg-fast", "lv_size":"67108864", "lv_attr":"-wi-------", "lv_active":"", "lv_kernel_major":"-1", "lv_kernel_minor":"-1", "lv_tags":"tiercache_cache,other", "lv_skip_activation":"skip activation"}
              ]
          }
      ]
  }
"#;

    #[test]
    fn parse_report() {
        let v = parse_lvs_json(SAMPLE).unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].full_name(), "tcvg/slow");
        assert_eq!(v[0].size_bytes, 256 << 20);
        assert!(v[0].active);
        assert_eq!(v[0].devno, Some((253, 0)));
        assert!(v[0].tags.is_empty());
        assert!(!v[0].skip_activation);
        assert_eq!(v[0].dm_path, "/dev/mapper/tcvg-slow");
        assert!(!v[1].active);
        assert_eq!(v[1].devno, None);
        assert!(v[1].has_tag(TAG_CACHE));
        assert!(v[1].skip_activation);
    }

    #[test]
    fn parse_bad_reports() {
        assert!(parse_lvs_json("not json").is_err());
        assert!(parse_lvs_json("{}").is_err());
        assert_eq!(
            parse_lvs_json(r#"{"report":[{"lv":[]}]}"#).unwrap().len(),
            0
        );
        assert!(parse_lvs_json(r#"{"report":[{"lv":[{"vg_name":"a"}]}]}"#).is_err());
    }
}
