//! The markdown table, the goal check and the SVG chart, from the measured rows.

use crate::workload::Measured;
use std::fmt::Write as _;

/// The durability class a row belongs to; idemkv's mode of the same class is its match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// fsynced before the call returns.
    Immediate,
    /// fsynced shortly after the call returns.
    Buffered,
    /// memory only.
    Memory,
}

impl Class {
    /// The idemkv row id of this class.
    pub fn idemkv_id(self) -> &'static str {
        match self {
            Class::Immediate => "idemkv-immediate",
            Class::Buffered => "idemkv-buffered",
            Class::Memory => "idemkv-none",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Class::Immediate => "fsync before ack",
            Class::Buffered => "fsync soon after ack",
            Class::Memory => "memory only",
        }
    }

    fn color(self) -> &'static str {
        match self {
            Class::Immediate => "#1f5fa8",
            Class::Buffered => "#d9822b",
            Class::Memory => "#3a9a5b",
        }
    }
}

/// One system of the comparison.
#[derive(Debug, Clone)]
pub struct Row {
    /// Stable id (`idemkv-immediate`, `redis-always`, …).
    pub id: &'static str,
    /// Display name.
    pub name: &'static str,
    /// Durability class, for the ratio.
    pub class: Class,
    /// What the configuration promises about an acknowledged call.
    pub promise: &'static str,
    /// The measurement, or why the system was not run.
    pub result: Result<Measured, String>,
}

impl Row {
    fn is_idemkv(&self) -> bool {
        self.id.starts_with("idemkv-")
    }
}

/// Formats nanoseconds as µs or ms with three significant digits.
pub fn fmt_ns(ns: u64) -> String {
    let us = ns as f64 / 1000.0;
    if us < 10.0 {
        format!("{us:.2} µs")
    } else if us < 1000.0 {
        format!("{us:.0} µs")
    } else if us < 10_000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{:.1} ms", us / 1000.0)
    }
}

/// Formats a rate with thousands separators.
pub fn fmt_rate(r: f64) -> String {
    let v = r.round() as u64;
    let s = v.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

fn fmt_ratio(r: f64) -> String {
    if r >= 100.0 {
        format!("{r:.0}×")
    } else if r >= 10.0 {
        format!("{r:.1}×")
    } else {
        format!("{r:.2}×")
    }
}

fn throughput_of(rows: &[Row], id: &str) -> Option<f64> {
    rows.iter()
        .find(|r| r.id == id)
        .and_then(|r| r.result.as_ref().ok())
        .map(|m| m.throughput())
}

/// idemkv's throughput in the row's class divided by the row's throughput.
pub fn ratio(rows: &[Row], row: &Row) -> Option<f64> {
    let m = row.result.as_ref().ok()?;
    let idem = throughput_of(rows, row.class.idemkv_id())?;
    Some(idem / m.throughput())
}

/// The markdown table.
pub fn table(rows: &[Row]) -> String {
    let mut s = String::new();
    s.push_str(
        "| system | class | durability promised | deliveries/s | claim+complete/s | \
         claim+complete p50 | p99 | duplicate p50 | p99 | idemkv ÷ this | \
         double executions (all rounds) | notes (best round unless said) |\n",
    );
    s.push_str("|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|---|\n");
    for row in rows {
        let name = if row.is_idemkv() {
            format!("**{}**", row.name)
        } else {
            row.name.to_string()
        };
        match &row.result {
            Ok(m) => {
                let ratio = if row.is_idemkv() {
                    "1×".to_string()
                } else {
                    ratio(rows, row)
                        .map(fmt_ratio)
                        .unwrap_or_else(|| "—".into())
                };
                let mut notes = Vec::new();
                if m.round_rates.len() > 1 {
                    let rates: Vec<String> = m.round_rates.iter().map(|r| fmt_rate(*r)).collect();
                    notes.push(format!("rounds: {}/s", rates.join(" · ")));
                }
                if m.cut_short {
                    notes.push(format!(
                        "best round hit the time limit after {} deliveries",
                        fmt_rate(m.deliveries as f64)
                    ));
                }
                if m.errors_all > 0 || m.rounds_failed > 0 {
                    notes.push(format!(
                        "{} errors, {} failed rounds (first: {})",
                        m.errors_all,
                        m.rounds_failed,
                        m.first_error.as_deref().unwrap_or("?").replace('|', "/")
                    ));
                }
                if m.retries > 0 {
                    notes.push(format!("{} back-pressure retries", m.retries));
                }
                if m.double_keys_all > 0 {
                    notes.push(format!("{} extra side-effect runs", m.extra_runs_all));
                }
                if let Some(note) = &m.note {
                    notes.push(note.clone());
                }
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    name,
                    row.class.label(),
                    row.promise,
                    fmt_rate(m.throughput()),
                    fmt_rate(m.completes_per_sec()),
                    fmt_ns(m.p50_ns),
                    fmt_ns(m.p99_ns),
                    fmt_ns(m.dup_p50_ns),
                    fmt_ns(m.dup_p99_ns),
                    ratio,
                    m.double_keys_all,
                    notes.join("; ")
                );
            }
            Err(why) => {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | — | — | — | — | — | — | — | — | not run: {} |",
                    name,
                    row.class.label(),
                    row.promise,
                    why.replace('|', "/")
                );
            }
        }
    }
    s
}

/// The shared backend's table: deliveries/s and database round trips per delivery, next to
/// the naive PostgreSQL baseline (`round_trips`: statements the client sent).
pub fn round_trip_table(rows: &[Row]) -> String {
    let mut s = String::new();
    s.push_str(
        "| system | deliveries/s | round trips per delivery | claim+complete p50 | p99 | \
         duplicate p50 | p99 | double executions (all rounds) | notes (best round) |\n",
    );
    s.push_str("|---|--:|--:|--:|--:|--:|--:|--:|---|\n");
    for row in rows {
        let name = if row.is_idemkv() {
            format!("**{}**", row.name)
        } else {
            row.name.to_string()
        };
        match &row.result {
            Ok(m) => {
                let per = m
                    .round_trips
                    .map(|r| format!("{:.3}", r as f64 / m.deliveries.max(1) as f64))
                    .unwrap_or_else(|| "—".into());
                let mut notes = Vec::new();
                if m.round_rates.len() > 1 {
                    let rates: Vec<String> = m.round_rates.iter().map(|r| fmt_rate(*r)).collect();
                    notes.push(format!("rounds: {}/s", rates.join(" · ")));
                }
                if m.cut_short {
                    notes.push(format!(
                        "hit the time limit after {} deliveries",
                        fmt_rate(m.deliveries as f64)
                    ));
                }
                if m.errors_all > 0 || m.rounds_failed > 0 {
                    notes.push(format!(
                        "{} errors, {} failed rounds (first: {})",
                        m.errors_all,
                        m.rounds_failed,
                        m.first_error.as_deref().unwrap_or("?").replace('|', "/")
                    ));
                }
                if let Some(note) = &m.note {
                    notes.push(note.clone());
                }
                let _ = writeln!(
                    s,
                    "| {name} | {} | {per} | {} | {} | {} | {} | {} | {} |",
                    fmt_rate(m.throughput()),
                    fmt_ns(m.p50_ns),
                    fmt_ns(m.p99_ns),
                    fmt_ns(m.dup_p50_ns),
                    fmt_ns(m.dup_p99_ns),
                    m.double_keys_all,
                    notes.join("; ")
                );
            }
            Err(why) => {
                let _ = writeln!(
                    s,
                    "| {name} | — | — | — | — | — | — | — | not run: {} |",
                    why.replace('|', "/")
                );
            }
        }
    }
    s
}

/// The `Immediate` rows, each held to the same goals.
const IMMEDIATE_ROWS: [&str; 2] = ["idemkv-immediate", "idemkv-immediate-async"];

/// The `Buffered` rows the goals are checked for.
const BUFFERED_ROWS: [&str; 2] = ["idemkv-buffered", "idemkv-buffered-async"];

/// The product's goals against this run: ratios to the peers of the same class
/// (deliveries/s), then absolute claim+complete/s, then (given the calibration's
/// single-insert redb commit p50, in ns) the `Immediate` rows' claim+complete p50 against
/// three such commits.
pub fn targets(rows: &[Row], redb_commit_p50_ns: Option<u64>) -> String {
    let mut s = String::new();
    let mut pairs: Vec<(&str, &str, f64, &str)> = Vec::new();
    for idem in IMMEDIATE_ROWS {
        pairs.push((
            idem,
            "redis-always",
            3.0,
            "Redis `SET NX`, appendfsync always",
        ));
        pairs.push((
            idem,
            "pg-sync-on",
            15.0,
            "PostgreSQL, synchronous_commit on",
        ));
        pairs.push((idem, "redb-naive", 40.0, "naive redb"));
    }
    for idem in BUFFERED_ROWS {
        pairs.push((
            idem,
            "redis-everysec",
            10.0,
            "Redis `SET NX`, appendfsync everysec",
        ));
        pairs.push((
            idem,
            "pg-sync-off",
            10.0,
            "PostgreSQL, synchronous_commit off",
        ));
    }
    pairs.push((
        "idemkv-none",
        "redis-none",
        10.0,
        "Redis `SET NX`, no persistence",
    ));
    s.push_str("| idemkv mode | against | goal | measured | verdict |\n|---|---|--:|--:|---|\n");
    for (idem, peer, target, label) in pairs {
        let (Some(a), Some(b)) = (throughput_of(rows, idem), throughput_of(rows, peer)) else {
            let _ = writeln!(
                s,
                "| `{idem}` | {label} | ≥ {target:.0}× | — | not measured |"
            );
            continue;
        };
        let r = a / b;
        let _ = writeln!(
            s,
            "| `{idem}` | {label} | ≥ {target:.0}× | {} | {} |",
            fmt_ratio(r),
            verdict(r, target)
        );
    }
    // The goals of the durability modes' throughput, sustained, with 64 callers.
    let absolute = IMMEDIATE_ROWS
        .iter()
        .map(|&id| (id, 100_000.0))
        .chain(BUFFERED_ROWS.iter().map(|&id| (id, 500_000.0)))
        .chain([("idemkv-none", 2_000_000.0)]);
    for (idem, goal) in absolute {
        let measured = rows
            .iter()
            .find(|r| r.id == idem)
            .and_then(|r| r.result.as_ref().ok())
            .map(|m| m.completes_per_sec());
        match measured {
            Some(m) => {
                let _ = writeln!(
                    s,
                    "| `{idem}` | claim+complete/s | ≥ {} | {} | {} |",
                    fmt_rate(goal),
                    fmt_rate(m),
                    verdict(m, goal)
                );
            }
            None => {
                let _ = writeln!(
                    s,
                    "| `{idem}` | claim+complete/s | ≥ {} | — | not measured |",
                    fmt_rate(goal)
                );
            }
        }
    }
    for idem in IMMEDIATE_ROWS {
        let p50 = rows
            .iter()
            .find(|r| r.id == idem)
            .and_then(|r| r.result.as_ref().ok())
            .map(|m| m.p50_ns);
        match (p50, redb_commit_p50_ns) {
            (Some(p50), Some(commit)) if commit > 0 => {
                let goal = 3 * commit;
                let verdict = if p50 <= goal {
                    "met".to_string()
                } else {
                    format!(
                        "missed: {:.1} commits, the goal is 3",
                        p50 as f64 / commit as f64
                    )
                };
                let _ = writeln!(
                    s,
                    "| `{idem}` | claim+complete p50 ÷ one single-insert redb commit ({}) | ≤ 3 × = {} | {} | {verdict} |",
                    fmt_ns(commit),
                    fmt_ns(goal),
                    fmt_ns(p50)
                );
            }
            _ => {
                let _ = writeln!(
                    s,
                    "| `{idem}` | claim+complete p50 ÷ one single-insert redb commit | ≤ 3× | — | not measured |"
                );
            }
        }
    }
    s
}

fn verdict(measured: f64, goal: f64) -> String {
    if measured >= goal {
        return "met".to_string();
    }
    let short = goal / measured;
    if short < 1.5 {
        format!(
            "missed by {:.0}% (the goal is {short:.2}× the measured value)",
            (1.0 - measured / goal) * 100.0
        )
    } else {
        format!("missed: the goal is {short:.1}× the measured value")
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Position of `v` on a log axis from 10^lo to 10^hi over `width` pixels.
fn log_x(v: f64, lo: i32, hi: i32, width: f64) -> f64 {
    let v = v.max(10f64.powi(lo));
    ((v.log10() - lo as f64) / (hi - lo) as f64 * width).clamp(0.0, width)
}

fn decades(values: impl Iterator<Item = f64>) -> (i32, i32) {
    let (mut lo, mut hi) = (f64::MAX, f64::MIN);
    for v in values.filter(|v| *v > 0.0) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if lo > hi {
        return (0, 1);
    }
    let lo = lo.log10().floor() as i32;
    let hi = (hi.log10().ceil() as i32).max(lo + 1);
    (lo, hi)
}

fn rate_tick(exp: i32) -> String {
    match exp {
        e if e < 3 => format!("{}", 10u64.pow(e.max(0) as u32)),
        e if e < 6 => format!("{}k", 10u64.pow((e - 3) as u32)),
        e => format!("{}M", 10u64.pow((e - 6) as u32)),
    }
}

fn time_tick(exp_ns: i32) -> String {
    match exp_ns {
        e if e < 3 => format!("{} ns", 10u64.pow(e.max(0) as u32)),
        e if e < 6 => format!("{} µs", 10u64.pow((e - 3) as u32)),
        e if e < 9 => format!("{} ms", 10u64.pow((e - 6) as u32)),
        e => format!("{} s", 10u64.pow((e - 9) as u32)),
    }
}

/// The chart: throughput bars, then p50 bars with a p99 whisker, on log axes, one row per
/// system, colored by durability class.
pub fn svg(rows: &[Row], subtitle: &str) -> String {
    let measured: Vec<(&Row, &Measured)> = rows
        .iter()
        .filter_map(|r| r.result.as_ref().ok().map(|m| (r, m)))
        .collect();
    let label_w = 250.0;
    let plot_w = 560.0;
    let value_w = 150.0;
    let width = label_w + plot_w + value_w;
    let row_h = 22.0;
    let panel_h = measured.len() as f64 * row_h;
    let top1 = 104.0;
    let top2 = top1 + panel_h + 80.0;
    let height = top2 + panel_h + 70.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r##"<rect width="100%" height="100%" fill="#ffffff"/>
<text x="12" y="22" font-size="16" font-weight="bold">idemkv and its peers: one workload, same machine, same run</text>
<text x="12" y="40" fill="#555">{}</text>"##,
        esc(subtitle)
    );
    // Legend.
    let mut lx = 12.0;
    for class in [Class::Immediate, Class::Buffered, Class::Memory] {
        let _ = writeln!(
            s,
            r#"<rect x="{lx}" y="50" width="12" height="12" fill="{}"/><text x="{}" y="60">{}</text>"#,
            class.color(),
            lx + 16.0,
            class.label()
        );
        lx += 170.0;
    }
    let _ = writeln!(
        s,
        r##"<text x="{lx}" y="60" fill="#555">bold: idemkv · lighter bar: p50 → p99</text>"##
    );

    // Panel 1: throughput.
    let (lo, hi) = decades(measured.iter().map(|(_, m)| m.throughput()));
    panel_axis(
        &mut s,
        top1,
        panel_h,
        label_w,
        plot_w,
        lo,
        hi,
        "deliveries per second (log scale; longer is better)",
        rate_tick,
    );
    for (i, (row, m)) in measured.iter().enumerate() {
        let y = top1 + i as f64 * row_h;
        row_label(&mut s, row, y, row_h, label_w);
        let w = log_x(m.throughput(), lo, hi, plot_w);
        let _ = writeln!(
            s,
            r#"<rect x="{label_w}" y="{:.1}" width="{w:.1}" height="{:.1}" fill="{}"/>"#,
            y + 4.0,
            row_h - 8.0,
            row.class.color()
        );
        let doubles = m.double_keys_all.max(m.double_keys);
        let warning = if doubles > 0 {
            format!(
                r##" <tspan fill="#c0392b" font-weight="bold">{doubles} keys double-executed</tspan>"##
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}">{}/s{warning}</text>"#,
            label_w + w + 5.0,
            y + row_h - 7.0,
            fmt_rate(m.throughput())
        );
    }

    // Panel 2: latency.
    let (lo, hi) = decades(
        measured
            .iter()
            .flat_map(|(_, m)| [m.p50_ns as f64, m.p99_ns as f64]),
    );
    panel_axis(
        &mut s,
        top2,
        panel_h,
        label_w,
        plot_w,
        lo,
        hi,
        "winning delivery (claim + effect + complete): p50 solid, p99 light (log; shorter is better)",
        time_tick,
    );
    for (i, (row, m)) in measured.iter().enumerate() {
        let y = top2 + i as f64 * row_h;
        row_label(&mut s, row, y, row_h, label_w);
        let w50 = log_x(m.p50_ns as f64, lo, hi, plot_w);
        let w99 = log_x(m.p99_ns as f64, lo, hi, plot_w);
        let _ = writeln!(
            s,
            r#"<rect x="{label_w}" y="{:.1}" width="{w99:.1}" height="{:.1}" fill="{}" fill-opacity="0.3"/>"#,
            y + 4.0,
            row_h - 8.0,
            row.class.color()
        );
        let _ = writeln!(
            s,
            r#"<rect x="{label_w}" y="{:.1}" width="{w50:.1}" height="{:.1}" fill="{}"/>"#,
            y + 4.0,
            row_h - 8.0,
            row.class.color()
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}">{} / {}</text>"#,
            label_w + w99 + 5.0,
            y + row_h - 7.0,
            fmt_ns(m.p50_ns),
            fmt_ns(m.p99_ns)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn row_label(s: &mut String, row: &Row, y: f64, row_h: f64, label_w: f64) {
    let weight = if row.is_idemkv() { "bold" } else { "normal" };
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="end" font-weight="{weight}">{}</text>"#,
        label_w - 8.0,
        y + row_h - 7.0,
        esc(row.name)
    );
}

#[allow(clippy::too_many_arguments)]
fn panel_axis(
    s: &mut String,
    top: f64,
    panel_h: f64,
    label_w: f64,
    plot_w: f64,
    lo: i32,
    hi: i32,
    title: &str,
    tick: fn(i32) -> String,
) {
    let _ = writeln!(
        s,
        r#"<text x="{label_w}" y="{:.1}" font-weight="bold">{}</text>"#,
        top - 10.0,
        esc(title)
    );
    for e in lo..=hi {
        let x = label_w + log_x(10f64.powi(e), lo, hi, plot_w);
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{top:.1}" x2="{x:.1}" y2="{:.1}" stroke="#dddddd"/>
<text x="{x:.1}" y="{:.1}" text-anchor="middle" fill="#555">{}</text>"##,
            top + panel_h,
            top + panel_h + 15.0,
            tick(e)
        );
    }
    let _ = writeln!(
        s,
        r##"<line x1="{label_w}" y1="{top:.1}" x2="{label_w}" y2="{:.1}" stroke="#888888"/>"##,
        top + panel_h
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(fmt_rate(1234567.4), "1,234,567");
        assert_eq!(fmt_rate(999.0), "999");
        assert_eq!(fmt_ns(420), "0.42 µs");
        assert_eq!(fmt_ns(123_456), "123 µs");
        assert_eq!(fmt_ns(4_100_000), "4.10 ms");
        assert_eq!(decades([150.0, 2.5e6].into_iter()), (2, 7));
        assert_eq!(rate_tick(5), "100k");
        assert_eq!(time_tick(6), "1 ms");
    }

    fn row(id: &'static str, class: Class, deliveries: u64, p50_ns: u64) -> Row {
        Row {
            id,
            name: id,
            class,
            promise: "",
            result: Ok(Measured {
                deliveries,
                executed: deliveries / 2,
                elapsed: std::time::Duration::from_secs(1),
                p50_ns,
                ..Measured::default()
            }),
        }
    }

    /// The async rows are held to the same peers as their blocking twins, and the p50 goal
    /// compares each `Immediate` row with three calibration commits.
    #[test]
    fn goals_cover_the_async_rows_and_the_p50() {
        let rows = [
            row("idemkv-immediate", Class::Immediate, 20_000, 4_000_000),
            row("idemkv-immediate-async", Class::Immediate, 80_000, 600_000),
            row("redis-always", Class::Immediate, 25_000, 3_000_000),
        ];
        let t = targets(&rows, Some(250_000));
        let line = |prefix: &str| {
            t.lines()
                .find(|l| l.starts_with(prefix))
                .unwrap_or_else(|| panic!("no line {prefix} in\n{t}"))
                .to_string()
        };
        assert!(line("| `idemkv-immediate-async` | Redis").contains("| 3.20× | met |"));
        assert!(line("| `idemkv-immediate` | Redis").contains("| 0.80× | missed"));
        let p50 = line("| `idemkv-immediate-async` | claim+complete p50");
        assert!(p50.contains("≤ 3 × = 750 µs | 600 µs | met |"), "{p50}");
        let p50 = line("| `idemkv-immediate` | claim+complete p50");
        assert!(p50.contains("missed: 16.0 commits"), "{p50}");
        assert!(line("| `idemkv-buffered` | claim+complete/s").contains("not measured"));
        assert!(targets(&rows, None).contains("| ≤ 3× | — | not measured |"));
    }
}
