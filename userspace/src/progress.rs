// SPDX-License-Identifier: GPL-2.0-only
//! Flush progress: dirty data left, rate and ETA.

use crate::units::{fmt_bytes, fmt_duration};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgressMode {
    /// A bar redrawn in place on a terminal, a line every few seconds
    /// otherwise.
    Auto,
    /// Always a line every few seconds (logs).
    Lines,
    /// Nothing.
    Quiet,
}

/// Rate estimation over a sliding window of (time, bytes written back).
pub struct Meter {
    samples: Vec<(f64, u64)>,
    window: f64,
}

impl Meter {
    pub fn new(window: f64) -> Meter {
        Meter {
            samples: vec![],
            window,
        }
    }

    /// Record the cumulative number of bytes written back at time `t`.
    /// A counter that goes backwards (stats reset) restarts the window.
    pub fn add(&mut self, t: f64, bytes: u64) {
        if let Some(&(_, last)) = self.samples.last() {
            if bytes < last {
                self.samples.clear();
            }
        }
        self.samples.push((t, bytes));
        let keep_from = t - self.window;
        while self.samples.len() > 2 && self.samples[1].0 <= keep_from {
            self.samples.remove(0);
        }
    }

    /// Bytes per second, if measurable.
    pub fn rate(&self) -> Option<f64> {
        let (t0, b0) = *self.samples.first()?;
        let (t1, b1) = *self.samples.last()?;
        if t1 - t0 < 0.05 {
            return None;
        }
        Some((b1 - b0) as f64 / (t1 - t0))
    }
}

/// One progress report.
pub fn line(name: &str, done: u64, total: u64, left: u64, rate: Option<f64>, bar: bool) -> String {
    let pct = if total == 0 {
        100.0
    } else {
        done as f64 * 100.0 / total as f64
    };
    let pct = pct.clamp(0.0, 100.0);
    let rate_s = match rate {
        Some(r) => format!("{}/s", fmt_bytes(r as u64)),
        None => "--/s".into(),
    };
    let eta = match rate {
        Some(r) if r > 0.0 => fmt_duration(left as f64 / r),
        _ if left == 0 => "0s".into(),
        _ => "--".into(),
    };
    if bar {
        const W: usize = 24;
        let fill = ((pct / 100.0) * W as f64).round() as usize;
        format!(
            "{name}: [{}{}] {pct:5.1}%  {} left  {rate_s}  ETA {eta}",
            "#".repeat(fill),
            "-".repeat(W - fill),
            fmt_bytes(left)
        )
    } else {
        format!(
            "{name}: flush {pct:.1}% done, {} left, {rate_s}, ETA {eta}",
            fmt_bytes(left)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meter() {
        let mut m = Meter::new(5.0);
        assert_eq!(m.rate(), None);
        m.add(0.0, 0);
        assert_eq!(m.rate(), None);
        m.add(1.0, 1000);
        assert_eq!(m.rate(), Some(1000.0));
        for i in 2..20 {
            m.add(i as f64, 1000 + (i as u64 - 1) * 2000);
        }
        assert_eq!(m.rate(), Some(2000.0));
        m.add(20.0, 5); // stats reset
        assert_eq!(m.rate(), None);
    }

    #[test]
    fn lines() {
        let l = line(
            "slow",
            1 << 20,
            4 << 20,
            3 << 20,
            Some((1 << 20) as f64),
            true,
        );
        assert_eq!(
            l,
            "slow: [######------------------]  25.0%  3 MiB left  1 MiB/s  ETA 3s"
        );
        let l = line("slow", 0, 0, 0, None, false);
        assert_eq!(l, "slow: flush 100.0% done, 0 B left, --/s, ETA 0s");
        let l = line("slow", 0, 10, 10, None, false);
        assert!(l.ends_with("ETA --"));
    }
}
