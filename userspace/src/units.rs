// SPDX-License-Identifier: GPL-2.0-only
//! Sizes and durations, parsed and printed with explicit units.

use crate::error::{usage, Result};

pub const SECTOR: u64 = 512;

/// Parse a size.  A bare number is KiB (as LVM's --chunksize); suffixes:
/// `s` (512-byte sectors), `b` (bytes), `k`/`K`/`KiB`, `m`/`M`/`MiB`,
/// `g`/`G`/`GiB`.  Returns bytes.
pub fn parse_size(what: &str, s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let bad = || {
        usage(format!(
            "invalid {what} '{s}': expected a number with an optional unit \
             (s = 512-byte sectors, b, K, M, G; a bare number is KiB)"
        ))
    };
    if num.is_empty() {
        return Err(bad());
    }
    let n: u64 = num.parse().map_err(|_| bad())?;
    let mult = match unit.to_ascii_lowercase().as_str() {
        "" | "k" | "kb" | "kib" => 1024,
        "s" => SECTOR,
        "b" => 1,
        "m" | "mb" | "mib" => 1024 * 1024,
        "g" | "gb" | "gib" => 1024 * 1024 * 1024,
        _ => return Err(bad()),
    };
    n.checked_mul(mult).ok_or_else(bad)
}

/// `1536` -> `1.5 KiB`; exact values print without decimals (`4 KiB`).
pub fn fmt_bytes(b: u64) -> String {
    const U: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    if b < 1024 {
        return format!("{b} B");
    }
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if b % (1u64 << (10 * i)) == 0 {
        format!("{} {}", b >> (10 * i), U[i])
    } else {
        format!("{v:.1} {}", U[i])
    }
}

/// Seconds as `42s`, `3m07s`, `2h05m`.
pub fn fmt_duration(secs: f64) -> String {
    if !secs.is_finite() || secs < 0.0 {
        return "--".into();
    }
    let s = secs.round() as u64;
    if s < 60 {
        format!("{s}s")
    } else if s < 3600 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    }
}

/// Percentage with one decimal, `--` when the denominator is zero.
pub fn fmt_pct(num: u64, den: u64) -> String {
    if den == 0 {
        "--".into()
    } else {
        format!("{:.1}%", num as f64 * 100.0 / den as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("x", "4").unwrap(), 4096);
        assert_eq!(parse_size("x", "4k").unwrap(), 4096);
        assert_eq!(parse_size("x", "64KiB").unwrap(), 65536);
        assert_eq!(parse_size("x", "8s").unwrap(), 4096);
        assert_eq!(parse_size("x", "1M").unwrap(), 1 << 20);
        assert_eq!(parse_size("x", "512b").unwrap(), 512);
        assert_eq!(parse_size("x", "2g").unwrap(), 2 << 30);
        for bad in ["", "k", "4x", "-4", "4 k k", "1.5M", "99999999999999999999"] {
            let e = parse_size("block size", bad).unwrap_err();
            assert_eq!(e.kind, crate::error::Kind::Usage, "{bad}");
        }
    }

    #[test]
    fn bytes() {
        assert_eq!(fmt_bytes(0), "0 B");
        assert_eq!(fmt_bytes(1023), "1023 B");
        assert_eq!(fmt_bytes(4096), "4 KiB");
        assert_eq!(fmt_bytes(1536), "1.5 KiB");
        assert_eq!(fmt_bytes(32 << 20), "32 MiB");
        assert_eq!(fmt_bytes((32 << 20) + (1 << 19)), "32.5 MiB");
        assert_eq!(fmt_bytes(3 << 40), "3 TiB");
    }

    #[test]
    fn durations() {
        assert_eq!(fmt_duration(0.2), "0s");
        assert_eq!(fmt_duration(42.0), "42s");
        assert_eq!(fmt_duration(187.0), "3m07s");
        assert_eq!(fmt_duration(7500.0), "2h05m");
        assert_eq!(fmt_duration(f64::INFINITY), "--");
    }

    #[test]
    fn pct() {
        assert_eq!(fmt_pct(1, 8), "12.5%");
        assert_eq!(fmt_pct(0, 0), "--");
    }
}
