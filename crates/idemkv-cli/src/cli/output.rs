//! Output helpers shared by the subcommands: aligned text tables, human-readable numbers and
//! durations, and writing to stdout without panicking on a closed pipe.

use std::fmt::Write as _;
use std::io::Write as _;
use std::time::Duration;

/// A text table: a header row, then rows; the first column is left-aligned, the others
/// right unless [`Table::left_align`] says otherwise.
#[derive(Debug, Default)]
pub(crate) struct Table {
    rows: Vec<Vec<String>>,
    left: Vec<usize>,
}

impl Table {
    pub(crate) fn new(header: &[&str]) -> Self {
        Table {
            rows: vec![header.iter().map(|s| s.to_string()).collect()],
            left: vec![0],
        }
    }

    /// Left-aligns these columns too (text rather than numbers).
    pub(crate) fn left_align(mut self, cols: &[usize]) -> Self {
        self.left.extend_from_slice(cols);
        self
    }

    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub(crate) fn render(&self) -> String {
        let cols = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..cols)
            .map(|c| {
                self.rows
                    .iter()
                    .filter_map(|r| r.get(c))
                    .map(|s| s.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for (i, row) in self.rows.iter().enumerate() {
            let mut line = String::new();
            for (c, cell) in row.iter().enumerate() {
                let gap = if c == 0 { "" } else { "  " };
                if self.left.contains(&c) {
                    let _ = write!(line, "{gap}{cell:<w$}", w = widths[c]);
                } else {
                    let _ = write!(line, "{gap}{cell:>w$}", w = widths[c]);
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
            if i == 0 {
                let total = widths.iter().sum::<usize>() + 2 * cols.saturating_sub(1);
                out.push_str(&"-".repeat(total));
                out.push('\n');
            }
        }
        out
    }
}

/// 1234567 → "1,234,567".
pub(crate) fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// A duration with a unit that suits it: "870 µs", "1.24 ms", "3.05 s".
pub(crate) fn duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns < 1_000 {
        format!("{ns} ns")
    } else if ns < 1_000_000 {
        format!("{:.0} µs", ns as f64 / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.2} ms", ns as f64 / 1e6)
    } else {
        format!("{:.2} s", ns as f64 / 1e9)
    }
}

/// Per-second rate, rounded: "45,210/s".
pub(crate) fn rate(n: u64, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64();
    if secs <= 0.0 {
        return "-".into();
    }
    format!("{}/s", count((n as f64 / secs).round() as u64))
}

/// Writes `text` to stdout; a closed pipe ends quietly.
pub(crate) fn print(text: &str) -> Result<(), crate::cli::error::CliError> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) => match crate::cli::error::write_failed(e) {
            Some(err) => Err(err),
            None => Ok(()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1_000), "1,000");
        assert_eq!(count(1_234_567), "1,234,567");
        assert_eq!(duration(Duration::from_micros(870)), "870 µs");
        assert_eq!(duration(Duration::from_micros(1_240)), "1.24 ms");
        let mut t = Table::new(&["", "a", "bb"]);
        t.row(vec!["row".into(), "1".into(), "22".into()]);
        assert_eq!(t.render(), "     a  bb\n----------\nrow  1  22\n");
        let mut t = Table::new(&["k", "state", "n"]).left_align(&[1]);
        t.row(vec!["key".into(), "ok".into(), "10".into()]);
        assert_eq!(
            t.render(),
            "k    state   n\n--------------\nkey  ok     10\n"
        );
    }
}
