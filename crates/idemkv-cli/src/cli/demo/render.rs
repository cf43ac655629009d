//! The report: a table with one column per handler and the sentences under it, or one JSON
//! object for scripts.

use super::accounting::ColumnResult;
use super::workload::{self, Kind, Pattern, Plan};
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

    fn file_note(&self) -> String {
        match self.file {
            None => "no file (durability none: memory only)".into(),
            Some(p) if self.args.keep_file => format!("{} (kept)", p.display()),
            Some(p) => format!("{} (removed at exit; --keep-file keeps it)", p.display()),
        }
    }

    /// The table and the sentences under it.
    pub(super) fn text(&self) -> String {
        let mut out = String::new();
        out.push_str(&format!(
            "idemkv demo: {} messages, {:.1} copies each on average ({} pattern), {} deliveries \
             over {} consumer threads, seed {}\n",
            count(self.plan.messages.len() as u64),
            self.plan.deliveries as f64 / self.plan.messages.len().max(1) as f64,
            self.args.pattern.name(),
            count(self.plan.deliveries),
            self.args.threads,
            self.seed
        ));
        out.push_str(&format!(
            "each message charges a card once. naive: check a processed-set, work ({} to {}), \
             charge, then record it; idemkv: the same work and charge inside Engine::run.\n",
            duration(Duration::from_secs_f64(workload::WORK_MIN_US / 1e6)),
            duration(Duration::from_secs_f64(workload::WORK_MAX_US / 1e6)),
        ));
        out.push_str(
            "naive and idemkv memory only keep everything in memory: they differ in correctness \
             alone.\n",
        );
        if let Some(durable) = self.columns.iter().find(|c| c.column.durable()) {
            out.push_str(&format!(
                "{} adds durability ({}), file {}\n",
                durable.column.heading(),
                durable.column.durability_note(),
                self.file_note()
            ));
        }
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
        row("deliveries", &|r| count(r.deliveries));
        row("distinct messages", &|r| count(r.messages));
        row("side effects executed", &|r| count(r.side_effects));
        row("  per message", &|r| {
            format!("{:.2}", r.side_effects as f64 / r.messages.max(1) as f64)
        });
        row("double charges", &|r| count(r.double_charged));
        if self.args.pattern == Pattern::Mixed {
            for kind in Kind::ALL {
                row(&format!("  during a {}", kind.name()), &|r| {
                    count(r.double_by_kind[kind as usize])
                });
            }
        }
        row("extra charges", &|r| count(r.extra_charges));
        row("duplicates absorbed", &|r| count(r.absorbed));
        row("latency p50 / delivery", &|r| duration(r.p50));
        row("latency p99 / delivery", &|r| duration(r.p99));
        row("throughput (deliveries)", &|r| {
            output::rate(r.deliveries, r.elapsed)
        });
        let naive = self.column(Column::Naive).map(ColumnResult::throughput);
        row("  relative to naive", &|r| match naive {
            Some(n) if n > 0.0 => format!("{:.2}x", r.throughput() / n),
            _ => "-".into(),
        });
        row("wall time", &|r| duration(r.elapsed));
        t
    }

    /// One paragraph per column, then the price of correctness and of durability.
    fn notes(&self) -> String {
        let mut out = String::new();
        for r in &self.columns {
            if r.column == Column::Naive {
                out.push_str(&naive_note(r));
            } else {
                out.push_str(&idemkv_note(r));
            }
        }
        let naive = self.column(Column::Naive);
        let memory = self.column(Column::Idemkv(super::DurabilityArg::None));
        if let (Some(n), Some(m)) = (naive, memory) {
            out.push_str(&format!(
                "price of correctness (idemkv memory only vs naive, both in memory): \
                 {:.2}x the throughput, p50 {} vs {}.\n",
                m.throughput() / n.throughput().max(1e-9),
                duration(m.p50),
                duration(n.p50)
            ));
        }
        if let (Some(m), Some(d)) = (memory, self.columns.iter().find(|c| c.column.durable())) {
            out.push_str(&format!(
                "price of durability ({} vs memory only, both exactly once): {:.2}x the \
                 throughput, p50 {} vs {}.\n",
                d.column.heading(),
                d.throughput() / m.throughput().max(1e-9),
                duration(d.p50),
                duration(m.p50)
            ));
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

fn naive_note(n: &ColumnResult) -> String {
    if n.double_charged > 0 {
        format!(
            "{}: {} of {} messages ({:.1}%) were charged more than once ({} extra charges): \
             copies that arrived while the first was still working checked the processed-set, \
             found nothing, and charged again.\n",
            n.column.heading(),
            count(n.double_charged),
            count(n.messages),
            100.0 * n.double_charged as f64 / n.messages.max(1) as f64,
            count(n.extra_charges)
        )
    } else {
        format!(
            "{}: no double charge this time; the race needs overlapping copies (try more \
             --threads or --messages, or a higher --dup-rate).\n",
            n.column.heading()
        )
    }
}

fn idemkv_note(g: &ColumnResult) -> String {
    let mut out = String::new();
    match g.failure_summary() {
        None => out.push_str(&format!(
            "{}: every message was charged exactly once; {} duplicate deliveries got the \
             winner's stored receipt (claim and record are one atomic step).\n",
            g.column.heading(),
            count(g.absorbed)
        )),
        Some(summary) => {
            out.push_str(&format!(
                "{}: FAILED: {summary}. This must never happen; the first cases:\n",
                g.column.heading()
            ));
            for v in &g.violations {
                out.push_str(&format!("  - {v}\n"));
            }
        }
    }
    if g.lease_lost > 0 {
        out.push_str(&format!(
            "    {} handler runs had their completion refused (lease lost): another token had \
             taken their key while they worked.\n",
            count(g.lease_lost)
        ));
    }
    if let Some(s) = g.engine.as_ref().filter(|s| s.commits > 0) {
        out.push_str(&format!(
            "    {} group commits wrote {} records ({:.1} per commit, at most {}); {} waits \
             for a winner; {} retries after back-pressure.\n",
            count(s.commits),
            count(s.committed_ops),
            s.committed_ops as f64 / s.commits as f64,
            count(s.batch_max),
            count(s.waits),
            count(g.retries)
        ));
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
