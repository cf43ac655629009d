//! The report: a table with one column per handler and the sentences under it, or one JSON
//! object for scripts.

use super::accounting::ColumnResult;
use super::workload::{Kind, Plan};
use super::{Column, DemoArgs};
use crate::cli::error::EXIT_VIOLATION;
use crate::cli::output::{self, count, duration, Table};
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

/// Everything the report needs.
pub(super) struct Report<'a> {
    pub(super) args: &'a DemoArgs,
    pub(super) seed: u64,
    pub(super) plan: &'a Plan,
    /// The durable column's file, if it has one.
    pub(super) file: Option<&'a Path>,
    /// Naive first, then idemkv memory only, then idemkv durable (unless `--durability none`).
    pub(super) columns: Vec<ColumnResult>,
}

impl Report<'_> {
    /// What went wrong in the idemkv columns, if anything did, naming each failing column.
    pub(super) fn failure_summary(&self) -> Option<String> {
        let parts: Vec<String> = self
            .columns
            .iter()
            .filter_map(|c| {
                c.failure_summary()
                    .map(|f| format!("{}: {f}", c.column.heading()))
            })
            .collect();
        (!parts.is_empty()).then(|| parts.join("; "))
    }

    fn column(&self, which: Column) -> Option<&ColumnResult> {
        self.columns.iter().find(|c| c.column == which)
    }

    /// The report for a terminal, within 80 columns and about 22 lines: what ran, the
    /// table, then three short paragraphs: the race and its cost, the price of correctness,
    /// the price of durability.
    pub(super) fn text(&self) -> String {
        let mut out = wrap(&format!(
            "idemkv demo: {} messages, {} deliveries ({}), {} threads, seed {}",
            count(self.plan.messages.len() as u64),
            count(self.plan.deliveries),
            self.args.pattern.name(),
            self.args.threads,
            self.seed
        ));
        out.push_str(&wrap(
            "naive: look up, work, charge, record; idemkv: Engine::run, default settings.",
        ));
        out.push('\n');
        out.push_str(&self.table().render());
        out.push('\n');
        out.push_str(&self.notes());
        out
    }

    fn table(&self) -> Table {
        let mut header = vec![""];
        header.extend(self.columns.iter().map(|c| c.column.heading()));
        let mut t = Table::new(&header);
        let mut row = |name: &str, cell: &dyn Fn(&ColumnResult) -> String| {
            let mut r = vec![name.to_string()];
            r.extend(self.columns.iter().map(cell));
            t.row(r);
        };
        row("durability", &|r| r.column.durability_cell().to_string());
        row("distinct messages", &|r| count(r.messages));
        row("side effects", &|r| count(r.side_effects));
        row("  per message", &|r| {
            format!("{:.2}", r.side_effects as f64 / r.messages.max(1) as f64)
        });
        row("double charges", &|r| count(r.double_charged));
        row("extra charges", &|r| count(r.extra_charges));
        row("latency p50", &|r| duration(r.p50));
        row("throughput", &|r| output::rate(r.deliveries, r.elapsed));
        let naive = self.column(Column::Naive).map(ColumnResult::throughput);
        row("  vs naive", &|r| match naive {
            Some(n) if n > 0.0 => format!("{:.2}x", r.throughput() / n),
            _ => "-".into(),
        });
        t
    }

    /// One paragraph per column: the race (naive), the price of correctness (memory only),
    /// the price of durability (the file).
    fn notes(&self) -> String {
        let naive = self.column(Column::Naive);
        let memory = self.column(Column::Idemkv(super::DurabilityArg::None));
        let mut out = String::new();
        for r in &self.columns {
            let paragraph = match r.column {
                Column::Naive => naive_note(r),
                Column::Idemkv(super::DurabilityArg::None) => {
                    let price = naive.map(|n| price("correctness", r, n));
                    idemkv_note(r, &price.unwrap_or_default(), None)
                }
                Column::Idemkv(_) => {
                    let price = memory.map(|m| price("durability", r, m));
                    let kept = self
                        .file
                        .filter(|_| self.args.keep_file)
                        .map(|p| format!(" File kept: {}.", p.display()));
                    idemkv_note(r, &price.unwrap_or_default(), kept)
                }
            };
            match paragraph.contains('\n') {
                true => out.push_str(&paragraph),
                false => out.push_str(&wrap(&paragraph)),
            }
        }
        out
    }

    /// The report as one JSON object.
    pub(super) fn json(&self) -> Value {
        let failure = self.failure_summary();
        let ok = failure.is_none();
        let violations: Vec<String> = self
            .columns
            .iter()
            .flat_map(|c| {
                c.violations
                    .iter()
                    .map(|v| format!("{}: {v}", c.column.heading()))
            })
            .collect();
        let durable = self
            .columns
            .iter()
            .find(|c| c.column.durable())
            .map(column_json);
        json!({
            "ok": ok,
            "exit_code": if ok { 0 } else { EXIT_VIOLATION },
            "failure": failure,
            "config": {
                "threads": self.args.threads,
                "messages": self.args.messages,
                "dup_rate": self.args.dup_rate,
                "pattern": self.args.pattern.name(),
                "durability": self.args.durability.name(),
                "seed": self.seed,
                "planned_deliveries": self.plan.deliveries,
                "file": self.file.map(|p| p.display().to_string()),
                "file_kept": self.file.is_some() && self.args.keep_file,
            },
            "naive": self.column(Column::Naive).map(column_json),
            "idemkv_memory": self.column(Column::Idemkv(super::DurabilityArg::None)).map(column_json),
            "idemkv_durable": durable,
            "violations": violations,
        })
    }
}

/// "; price of WHAT: 0.29x the throughput, 2.2x the p50." of `r` against `base`.
fn price(what: &str, r: &ColumnResult, base: &ColumnResult) -> String {
    format!(
        "; price~of~{what}: {:.2}x the throughput, {:.1}x the p50.",
        r.throughput() / base.throughput().max(1e-9),
        r.p50.as_secs_f64() / base.p50.as_secs_f64().max(1e-9)
    )
}

/// Wraps a paragraph at 80 columns, continuation lines indented by two spaces. A `~` joins
/// two words that must stay on one line (it prints as a space).
fn wrap(paragraph: &str) -> String {
    const WIDTH: usize = 80;
    let mut out = String::new();
    let mut line = String::new();
    for word in paragraph.split(' ').filter(|w| !w.is_empty()) {
        let word = word.replace('~', " ");
        if !line.trim().is_empty() && line.chars().count() + 1 + word.chars().count() > WIDTH {
            out.push_str(line.trim_end());
            out.push('\n');
            line = "  ".to_string();
        } else if !line.trim().is_empty() {
            line.push(' ');
        }
        line.push_str(&word);
    }
    out.push_str(line.trim_end());
    out.push('\n');
    out
}

fn naive_note(n: &ColumnResult) -> String {
    if n.double_charged > 0 {
        format!(
            "The~race: {} charged {} of {} messages ({:.1}%) twice or more, {} extra \
             charges: copies that came while the first still worked found no record.",
            n.column.heading().replace(' ', "~"),
            count(n.double_charged),
            count(n.messages),
            100.0 * n.double_charged as f64 / n.messages.max(1) as f64,
            count(n.extra_charges)
        )
    } else {
        format!(
            "The~race: {} charged nothing twice this time; the race needs overlapping copies \
             (more --threads or --messages, or a higher --dup-rate).",
            n.column.heading().replace(' ', "~"),
        )
    }
}

/// An idemkv column's paragraph: exactly once (or what failed), how the engine got there,
/// and `price`, the sentence that compares it with the column before.
fn idemkv_note(g: &ColumnResult, price: &str, kept: Option<String>) -> String {
    let heading = g.column.heading().replace(' ', "~");
    let how = match g.column.durable() {
        true => g.column.durability_note().to_string(),
        false => format!("{} duplicates replayed", count(g.absorbed)),
    };
    let mut out = match g.failure_summary() {
        None => format!("{heading}:~every~message~was~charged~exactly~once, {how}"),
        Some(summary) => {
            // The failure and its first cases, one per line and never wrapped.
            let mut s = format!(
                "{}: FAILED: {summary}. This must never happen; the first cases:\n",
                g.column.heading()
            );
            for v in &g.violations {
                s.push_str(&format!("  - {v}\n"));
            }
            return s;
        }
    };
    match price.is_empty() {
        true => out.push('.'),
        false => out.push_str(price),
    }
    if g.lease_lost > 0 {
        out.push_str(&format!(
            " {} completions were refused (lease lost): another token had taken the key.",
            count(g.lease_lost)
        ));
    }
    if g.retries > 0 {
        out.push_str(&format!(
            " {} claims retried after back-pressure.",
            count(g.retries)
        ));
    }
    if let Some(k) = kept {
        out.push_str(&k);
    }
    out
}

fn column_json(r: &ColumnResult) -> Value {
    let by_kind: serde_json::Map<String, Value> = Kind::ALL
        .iter()
        .map(|k| (k.name().to_string(), json!(r.double_by_kind[*k as usize])))
        .collect();
    let mut v = json!({
        "handler": r.column.handler(),
        "durability": r.column.durability_name(),
        "deliveries": r.deliveries,
        "distinct_messages": r.messages,
        "side_effects": r.side_effects,
        "double_charges": r.double_charged,
        "double_charges_by_pattern": by_kind,
        "extra_charges": r.extra_charges,
        "duplicates_absorbed": r.absorbed,
        "retries": r.retries,
        "leases_lost": r.lease_lost,
        "wrong_responses": r.wrong_responses,
        "never_charged": r.never_charged,
        "latency_us": {
            "p50": micros(r.p50),
            "p99": micros(r.p99),
            "max": micros(r.max),
        },
        "throughput_per_s": r.throughput().round(),
        "elapsed_s": (r.elapsed.as_secs_f64() * 1e3).round() / 1e3,
    });
    if let Some(s) = &r.engine {
        v["engine"] = json!({
            "commits": s.commits,
            "committed_records": s.committed_ops,
            "batch_max": s.batch_max,
            "claims": s.claims,
            "acquired": s.acquired,
            "takeovers": s.takeovers,
            "replays": s.replays,
            "waits": s.waits,
        });
    }
    v
}

/// Microseconds with one decimal, for JSON.
fn micros(d: Duration) -> f64 {
    (d.as_nanos() as f64 / 100.0).round() / 10.0
}
