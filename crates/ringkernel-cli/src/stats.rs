//! Small helpers for the CLI's measurements: percentiles and human-readable numbers.

use std::time::Duration;

/// Percentiles of a set of nanosecond samples (exact, by sorting).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Percentiles {
    pub count: usize,
    pub p50: u64,
    pub p99: u64,
    pub max: u64,
}

impl Percentiles {
    /// Sorts `samples` in place and takes the nearest-rank percentiles.
    pub fn of(samples: &mut [u64]) -> Percentiles {
        if samples.is_empty() {
            return Percentiles::default();
        }
        samples.sort_unstable();
        let rank = |q: f64| {
            let i = ((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len());
            samples[i - 1]
        };
        Percentiles {
            count: samples.len(),
            p50: rank(0.50),
            p99: rank(0.99),
            max: samples[samples.len() - 1],
        }
    }
}

/// `1.23 µs`, `45.6 ms`, `789 ns`.
pub fn ns(v: u64) -> String {
    let v = v as f64;
    if v < 1e3 {
        format!("{v:.0} ns")
    } else if v < 1e6 {
        format!("{:.2} µs", v / 1e3)
    } else if v < 1e9 {
        format!("{:.2} ms", v / 1e6)
    } else {
        format!("{:.2} s", v / 1e9)
    }
}

/// `12.3 M/s`, `456 k/s`.
pub fn rate(per_s: f64) -> String {
    if per_s >= 1e9 {
        format!("{:.2} G/s", per_s / 1e9)
    } else if per_s >= 1e6 {
        format!("{:.2} M/s", per_s / 1e6)
    } else if per_s >= 1e3 {
        format!("{:.1} k/s", per_s / 1e3)
    } else {
        format!("{per_s:.1} /s")
    }
}

/// `1,000,000`.
pub fn count(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Seconds with millisecond precision.
pub fn secs(d: Duration) -> String {
    format!("{:.3} s", d.as_secs_f64())
}

/// A plain text table with a header row, columns padded to their widest cell.
/// The first column and any column marked with [`Table::left`] are left-aligned, the
/// others (numbers) right-aligned.
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
    left: Vec<bool>,
}

impl Table {
    pub fn new(header: &[&str]) -> Table {
        let mut left = vec![false; header.len()];
        if let Some(l) = left.first_mut() {
            *l = true;
        }
        Table {
            header: header.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
            left,
        }
    }

    /// Left-aligns column `col` (text rather than numbers).
    pub fn left(mut self, col: usize) -> Table {
        if let Some(l) = self.left.get_mut(col) {
            *l = true;
        }
        self
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let cols = self.header.len();
        let mut width = vec![0usize; cols];
        for r in std::iter::once(&self.header).chain(self.rows.iter()) {
            for (i, c) in r.iter().enumerate().take(cols) {
                width[i] = width[i].max(c.chars().count());
            }
        }
        let line = |r: &Vec<String>| {
            let mut s = String::new();
            for (i, w) in width.iter().enumerate() {
                let c = r.get(i).map(String::as_str).unwrap_or("");
                let pad = w - c.chars().count();
                if i > 0 {
                    s.push_str("  ");
                }
                if self.left[i] {
                    s.push_str(c);
                    s.push_str(&" ".repeat(pad));
                } else {
                    s.push_str(&" ".repeat(pad));
                    s.push_str(c);
                }
            }
            s.trim_end().to_string()
        };
        let mut out = line(&self.header);
        out.push('\n');
        out.push_str(&"-".repeat(width.iter().sum::<usize>() + 2 * (cols.saturating_sub(1))));
        for r in &self.rows {
            out.push('\n');
            out.push_str(&line(r));
        }
        out
    }
}

/// The 1-minute load average (Linux), for the record next to timings.
pub fn load_average() -> Option<String> {
    let s = std::fs::read_to_string("/proc/loadavg").ok()?;
    Some(s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
}

/// CPU model name and thread count, best effort.
pub fn machine() -> String {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    format!("{model}, {threads} threads, {}", std::env::consts::OS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_nearest_rank() {
        let mut v: Vec<u64> = (1..=100).rev().collect();
        let p = Percentiles::of(&mut v);
        assert_eq!((p.count, p.p50, p.p99, p.max), (100, 50, 99, 100));
        assert_eq!(Percentiles::of(&mut []), Percentiles::default());
        let mut one = [7];
        assert_eq!(Percentiles::of(&mut one).p99, 7);
    }

    #[test]
    fn numbers_read_well() {
        assert_eq!(count(1_000_000), "1,000,000");
        assert_eq!(count(999), "999");
        assert_eq!(ns(1500), "1.50 µs");
        assert_eq!(ns(12), "12 ns");
        assert_eq!(rate(2_500_000.0), "2.50 M/s");
    }

    #[test]
    fn table_aligns_columns() {
        let mut t = Table::new(&["a", "bb", "ccc"]).left(2);
        t.row(vec!["long".into(), "1".into(), "x".into()]);
        let r = t.render();
        let lines: Vec<_> = r.lines().collect();
        assert_eq!(lines[0], "a     bb  ccc");
        assert_eq!(lines[2], "long   1  x");
    }
}
