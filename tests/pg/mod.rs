//! What the PostgreSQL suites (`shared.rs`, `shared_tls.rs`, `shared_processes.rs`) share:
//! the server's URL from `scripts/pg.sh`, and raw SQL through `psql`, which the server's
//! package installs. Each suite uses a part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Lines, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// An environment variable `scripts/pg.sh` sets; without it the test fails and says how
/// to run the suite (no test passes by skipping when PostgreSQL is absent).
pub fn env(name: &str, suite: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name} is not set: this suite needs the throwaway PostgreSQL of scripts/pg.sh. \
             Run it with `scripts/pg.sh test` (starts a server on 127.0.0.1, runs the \
             suites, stops it), or start one with `eval \"$(scripts/pg.sh start)\"` and run \
             `cargo test --features postgres --test {suite}` yourself."
        )
    })
}

/// Runs SQL through psql on the server at `url` and returns its unaligned output.
pub fn psql(url: &str, sql: &str) -> String {
    let out = Command::new("psql")
        .args([
            url,
            "-X",
            "-q",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            sql,
        ])
        .output()
        .expect("run psql (installed with the PostgreSQL server)");
    assert!(
        out.status.success(),
        "psql failed on {sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A psql session that has run `LISTEN` on `channel` (and said so): its output lines carry
/// the notifications it receives.
pub struct Listener {
    pub child: Child,
    pub stdin: ChildStdin,
    pub lines: Lines<BufReader<ChildStdout>>,
}

pub fn listen(url: &str, channel: &str) -> Listener {
    let mut child = Command::new("psql")
        .args([url, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run psql");
    let mut stdin = child.stdin.take().expect("psql stdin");
    let mut lines = BufReader::new(child.stdout.take().expect("psql stdout")).lines();
    writeln!(stdin, "LISTEN \"{channel}\"; \\echo listening").expect("write to psql");
    stdin.flush().expect("flush psql");
    assert!(lines.by_ref().any(|l| l.expect("read psql") == "listening"));
    Listener {
        child,
        stdin,
        lines,
    }
}

impl Listener {
    /// Runs `sql` in the session and returns the lines it printed, notifications received
    /// meanwhile included.
    pub fn run(&mut self, sql: &str) -> Vec<String> {
        writeln!(self.stdin, "{sql} \\echo idemkv-test-done").expect("write to psql");
        self.stdin.flush().expect("flush psql");
        let mut seen = Vec::new();
        for line in self.lines.by_ref() {
            let line = line.expect("read psql");
            if line == "idemkv-test-done" {
                break;
            }
            seen.push(line);
        }
        seen
    }

    /// Ends the session.
    pub fn close(self) {
        let Listener {
            mut child, stdin, ..
        } = self;
        drop(stdin);
        let _ = child.wait();
    }
}
