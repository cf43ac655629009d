//! Runs the built `idemkv` binary: `idemkv demo` on a small, fast configuration, its JSON and
//! table reports, the temporary file's life cycle, and its usage errors and exit codes.
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

#[test]
fn demo_json_reports_no_double_charge_for_idemkv() {
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
    let guarded = object(&json, "idemkv");
    let naive = object(&json, "naive");
    assert_eq!(number(guarded, "double_charges"), 0, "{guarded}");
    assert_eq!(number(guarded, "extra_charges"), 0, "{guarded}");
    assert_eq!(number(guarded, "distinct_messages"), 200);
    // Exactly one side effect per message, and every delivery accounted for.
    assert_eq!(number(guarded, "side_effects"), 200, "{guarded}");
    let planned = number(object(&json, "config"), "planned_deliveries");
    assert_eq!(number(guarded, "deliveries"), planned);
    assert_eq!(number(naive, "deliveries"), planned);
    assert_eq!(
        number(guarded, "duplicates_absorbed"),
        planned - 200,
        "every duplicate got the winner's response"
    );
    assert_eq!(number(object(guarded, "engine"), "acquired"), 200);
    assert!(json.contains("\"violations\":[]"), "{json}");
    // The temporary file is gone.
    let file = string(&json, "file").expect("an Immediate run uses a file");
    let dir = Path::new(file)
        .parent()
        .expect("the file is in a directory");
    assert!(!dir.exists(), "{} was not removed", dir.display());
}

#[test]
fn demo_table_shows_both_handlers_and_zero_idemkv_double_charges() {
    let out = idemkv(&[
        "demo",
        "--messages",
        "150",
        "--threads",
        "8",
        "--pattern",
        "storm",
        "--durability",
        "buffered",
        "--no-progress",
    ]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    assert!(text.contains("naive check-then-act"), "{text}");
    assert!(text.contains("idemkv Engine::run"), "{text}");
    let row = text
        .lines()
        .find(|l| l.starts_with("double charges"))
        .unwrap_or_else(|| panic!("no double charges row in {text}"));
    assert_eq!(row.split_whitespace().last(), Some("0"), "{row}");
    assert!(
        text.contains("every message was charged exactly once"),
        "{text}"
    );
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
    assert_eq!(number(object(&json, "idemkv"), "double_charges"), 0);
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
    assert!(text.contains("idemkv: FAILED: "), "{text}");
    assert!(
        text.contains("was charged 2 times") || text.contains("times: copy"),
        "{text}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("charged more than once"), "{err}");
}
