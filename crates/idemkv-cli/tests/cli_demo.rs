//! Runs the built `idemkv` binary: `idemkv demo` on a small, fast configuration, its three
//! columns (naive, idemkv memory only, idemkv durable) and their accounting in the JSON and
//! table reports, the temporary file's life cycle, and its usage errors and exit codes. Only
//! what holds on every schedule is asserted: how many duplicates the naive handler lets
//! through depends on timing, so it is bounded, never pinned.
//!
//! The JSON is checked with plain string search (serde_json is a dependency of the binary
//! only), which is enough for the flat numbers asserted here.

use std::path::Path;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_idemkv");

fn idemkv(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .output()
        .expect("the idemkv binary runs")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The JSON object that follows `"name":` in `json` (braces matched, strings skipped).
fn object<'a>(json: &'a str, name: &str) -> &'a str {
    let key = format!("\"{name}\":");
    let at = json
        .find(&key)
        .unwrap_or_else(|| panic!("no {key} in {json}"))
        + key.len();
    let start = at + json[at..].find('{').expect("an object follows");
    let (mut depth, mut in_string, mut escaped) = (0i32, false, false);
    for (i, ch) in json[start..].char_indices() {
        if in_string {
            match ch {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match ch {
            '"' => in_string = true,
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return &json[start..=start + i];
                }
            }
            _ => {}
        }
    }
    panic!("unbalanced object {name} in {json}")
}

/// The unsigned integer value of `"name":` in `json`.
fn number(json: &str, name: &str) -> u64 {
    let key = format!("\"{name}\":");
    let at = json
        .find(&key)
        .unwrap_or_else(|| panic!("no {key} in {json}"))
        + key.len();
    let digits: String = json[at..]
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("{key} is not a number in {json}"))
}

/// The string value of `"name":` in `json` (no escapes expected).
fn string<'a>(json: &'a str, name: &str) -> Option<&'a str> {
    let key = format!("\"{name}\":");
    let at = json.find(&key)? + key.len();
    let rest = json[at..].trim_start().strip_prefix('"')?;
    Some(&rest[..rest.find('"')?])
}

/// The accounting every idemkv column must show on every schedule: exactly one side effect
/// per message, every other delivery answered with the winner's stored response.
fn assert_exactly_once(column: &str, messages: u64, planned: u64) {
    assert_eq!(number(column, "side_effects"), messages, "{column}");
    assert_eq!(number(column, "double_charges"), 0, "{column}");
    assert_eq!(number(column, "extra_charges"), 0, "{column}");
    assert_eq!(number(column, "never_charged"), 0, "{column}");
    assert_eq!(number(column, "wrong_responses"), 0, "{column}");
    assert_eq!(number(column, "distinct_messages"), messages, "{column}");
    assert_eq!(number(column, "deliveries"), planned, "{column}");
    assert_eq!(
        number(column, "duplicates_absorbed"),
        planned - messages,
        "every duplicate got the winner's response: {column}"
    );
    assert_eq!(number(object(column, "engine"), "acquired"), messages);
}

/// The accounting the naive column must show on every schedule: every delivery either ran
/// the side effect or found the message recorded, every message ran at least once, and the
/// extra runs are exactly the side effects beyond one per message.
fn assert_naive_accounts(naive: &str, messages: u64, planned: u64) {
    let side_effects = number(naive, "side_effects");
    assert_eq!(number(naive, "deliveries"), planned, "{naive}");
    assert_eq!(
        side_effects + number(naive, "duplicates_absorbed"),
        planned,
        "{naive}"
    );
    assert!((messages..=planned).contains(&side_effects), "{naive}");
    assert_eq!(number(naive, "never_charged"), 0, "{naive}");
    assert_eq!(
        number(naive, "extra_charges"),
        side_effects - messages,
        "{naive}"
    );
    assert!(
        number(naive, "double_charges") <= number(naive, "extra_charges"),
        "{naive}"
    );
    let by_pattern = object(naive, "double_charges_by_pattern");
    let sum: u64 = ["redelivery", "rebalance", "storm"]
        .iter()
        .map(|k| number(by_pattern, k))
        .sum();
    assert_eq!(sum, number(naive, "double_charges"), "{naive}");
}

#[test]
fn demo_json_has_three_columns_and_exactly_once_in_both_idemkv_columns() {
    let out = idemkv(&[
        "demo",
        "--messages",
        "200",
        "--threads",
        "8",
        "--seed",
        "7",
        "--json",
    ]);
    let json = stdout(&out);
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {json}\nstderr: {}",
        out.status.code(),
        stderr(&out)
    );
    assert!(json.contains("\"ok\":true"), "{json}");
    let planned = number(object(&json, "config"), "planned_deliveries");
    let naive = object(&json, "naive");
    let memory = object(&json, "idemkv_memory");
    let durable = object(&json, "idemkv_durable");
    // Naive and the first idemkv column share a durability; the third is the default one.
    assert_eq!(string(naive, "handler"), Some("naive"));
    assert_eq!(string(naive, "durability"), Some("none"));
    assert_eq!(string(memory, "handler"), Some("idemkv"));
    assert_eq!(string(memory, "durability"), Some("none"));
    assert_eq!(string(durable, "handler"), Some("idemkv"));
    assert_eq!(string(durable, "durability"), Some("immediate"));
    assert_naive_accounts(naive, 200, planned);
    assert_exactly_once(memory, 200, planned);
    assert_exactly_once(durable, 200, planned);
    // Only the durable column writes records.
    assert_eq!(number(object(memory, "engine"), "commits"), 0, "{memory}");
    assert!(
        number(object(durable, "engine"), "commits") > 0,
        "{durable}"
    );
    assert!(json.contains("\"violations\":[]"), "{json}");
    // The temporary file is gone.
    let file = string(&json, "file").expect("an Immediate run uses a file");
    let dir = Path::new(file)
        .parent()
        .expect("the file is in a directory");
    assert!(!dir.exists(), "{} was not removed", dir.display());
}

/// The cells of the table row that starts with `name`, after the name.
fn cells<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    let row = text
        .lines()
        .find(|l| l.starts_with(name))
        .unwrap_or_else(|| panic!("no {name} row in {text}"));
    row[name.len()..]
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect()
}

#[test]
fn demo_table_shows_three_columns_and_one_side_effect_per_message_for_idemkv() {
    let out = idemkv(&[
        "demo",
        "--messages",
        "150",
        "--threads",
        "8",
        "--pattern",
        "storm",
        "--dup-rate",
        "4",
        "--durability",
        "buffered",
        "--no-progress",
    ]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    let header = text.lines().find(|l| l.contains("naive check-then-act"));
    let header = header.unwrap_or_else(|| panic!("no header in {text}"));
    let naive = header.find("naive check-then-act");
    let memory = header.find("idemkv memory only");
    let durable = header.find("idemkv buffered");
    assert!(
        naive < memory && memory < durable && naive.is_some(),
        "columns in order naive, memory only, durable: {header}"
    );
    assert_eq!(
        cells(&text, "durability"),
        ["memory only", "memory only", "fsync within 10 ms"],
        "{text}"
    );
    assert_eq!(cells(&text, "distinct messages"), ["150"; 3], "{text}");
    let effects = cells(&text, "side effects");
    assert_eq!(effects[1..], ["150", "150"], "{text}");
    let per_message = cells(&text, "  per message");
    assert_eq!(per_message[1..], ["1.00", "1.00"], "{text}");
    let naive_per_message: f64 = per_message[0].parse().expect("a number");
    assert!(naive_per_message >= 1.0, "{text}");
    assert_eq!(cells(&text, "double charges")[1..], ["0", "0"], "{text}");
    assert_eq!(cells(&text, "extra charges")[1..], ["0", "0"], "{text}");
    assert_eq!(cells(&text, "  vs naive")[0], "1.00x", "{text}");
    for column in ["idemkv memory only", "idemkv buffered"] {
        assert!(
            text.contains(&format!("{column}: every message was charged exactly once")),
            "{text}"
        );
    }
    assert!(text.contains("price of correctness"), "{text}");
    assert!(text.contains("price of durability"), "{text}");
}

/// One consumer handles deliveries one after another, so the naive handler's check always
/// sees the earlier copy's record: its double charges come from concurrency alone.
#[test]
fn demo_with_one_consumer_the_naive_handler_charges_once() {
    let out = idemkv(&[
        "demo",
        "--messages",
        "60",
        "--threads",
        "1",
        "--pattern",
        "storm",
        "--dup-rate",
        "4",
        "--durability",
        "none",
        "--seed",
        "3",
        "--json",
    ]);
    let json = stdout(&out);
    assert!(out.status.success(), "{json}\n{}", stderr(&out));
    let planned = number(object(&json, "config"), "planned_deliveries");
    assert!(planned > 60, "the plan has duplicates: {json}");
    let naive = object(&json, "naive");
    assert_naive_accounts(naive, 60, planned);
    assert_eq!(number(naive, "side_effects"), 60, "{naive}");
    assert_eq!(number(naive, "double_charges"), 0, "{naive}");
    assert_exactly_once(object(&json, "idemkv_memory"), 60, planned);
}

#[test]
fn demo_keep_file_keeps_the_file() {
    let out = idemkv(&[
        "demo",
        "--messages",
        "50",
        "--threads",
        "4",
        "--keep-file",
        "--json",
    ]);
    let json = stdout(&out);
    assert!(out.status.success(), "{json}\n{}", stderr(&out));
    assert!(json.contains("\"file_kept\":true"), "{json}");
    let file = string(&json, "file").expect("a file");
    let path = Path::new(file);
    assert!(path.is_file(), "{file} was not kept");
    let dir = path.parent().expect("a directory");
    assert!(
        dir.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("idemkv-demo-")),
        "only remove what the demo created: {}",
        dir.display()
    );
    std::fs::remove_dir_all(dir).expect("clean up");
}

#[test]
fn demo_in_memory_runs_without_a_file() {
    let out = idemkv(&[
        "demo",
        "--messages",
        "100",
        "--threads",
        "8",
        "--durability",
        "none",
        "--pattern",
        "rebalance",
        "--json",
    ]);
    let json = stdout(&out);
    assert!(out.status.success(), "{json}\n{}", stderr(&out));
    assert!(json.contains("\"file\":null"), "{json}");
    // The memory-only column already shows this durability: no third column.
    assert!(json.contains("\"idemkv_durable\":null"), "{json}");
    let planned = number(object(&json, "config"), "planned_deliveries");
    assert_naive_accounts(object(&json, "naive"), 100, planned);
    assert_exactly_once(object(&json, "idemkv_memory"), 100, planned);
}

#[test]
fn usage_errors_exit_2_with_one_line() {
    let cases: &[&[&str]] = &[
        &["demo", "--dup-rate", "0.5"],
        &["demo", "--dup-rate", "many"],
        &["demo", "--threads", "0"],
        &["demo", "--pattern", "sometimes"],
        &["demo", "--durability", "eventually"],
        &["demo", "--bogus"],
        &["demo", "--keep-file", "--durability", "none"],
        &[
            "demo",
            "--messages",
            "10",
            "--dir",
            "/nonexistent/idemkv-test-dir",
        ],
        &["no-such-command"],
    ];
    for args in cases {
        let out = idemkv(args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("idemkv: error: "), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(stdout(&out).is_empty(), "{args:?}");
    }
}

#[test]
fn help_works_everywhere() {
    for args in [
        &["--help"][..],
        &["demo", "--help"],
        &["help", "demo"],
        &["demo", "-h"],
    ] {
        let out = idemkv(args);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        let text = stdout(&out);
        assert!(text.contains("Usage: idemkv"), "{args:?}: {text}");
    }
    let text = stdout(&idemkv(&["demo", "--help"]));
    for option in [
        "--threads",
        "--messages",
        "--dup-rate",
        "--pattern",
        "--durability",
        "--seed",
        "--keep-file",
        "--json",
    ] {
        assert!(text.contains(option), "{option} missing from demo --help");
    }
}

/// With a deliberate check-then-act bug switched on in the engine (builds with
/// `--cfg idemkv_sabotage` only), the demo must catch the double charges, explain them, and
/// exit 1.
#[cfg(idemkv_sabotage)]
#[test]
fn demo_catches_a_sabotaged_engine_and_exits_1() {
    let out = idemkv(&[
        "demo",
        "--messages",
        "300",
        "--threads",
        "16",
        "--pattern",
        "storm",
        "--dup-rate",
        "6",
        "--durability",
        "none",
        "--seed",
        "11",
        "--sabotage",
        "check-then-act",
    ]);
    let (text, err) = (stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(1), "{text}\n{err}");
    assert!(text.contains("idemkv memory only: FAILED: "), "{text}");
    assert!(
        text.contains("was charged 2 times") || text.contains("times: copy"),
        "{text}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("idemkv memory only: "), "{err}");
    assert!(err.contains("charged more than once"), "{err}");
}
