//! Consumers of a real Redis stream (examples/redis_streams) with idemkv: under
//! XAUTOCLAIM redelivery every message's side effect runs exactly once and every entry is
//! acknowledged, and a lease shorter than the slow work does not livelock.
//!
//! Redis: `IDEMKV_REDIS_URL` (`host:port`) when set, else a `redis-server` from PATH started
//! on a free loopback port for the test; with neither, the tests say so and pass.

#[allow(dead_code)]
#[path = "../examples/redis_streams/resp.rs"]
mod resp;
#[allow(dead_code)]
#[path = "../examples/redis_streams/scenario.rs"]
mod scenario;

use idemkv::Engine;
use scenario::{Config, Mode};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` of the test's own, killed on drop.
struct Server {
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The Redis address, and the server to keep alive while it is used (if the test started
/// one); `None` when there is no Redis to test against.
fn redis() -> Option<(String, Option<Server>)> {
    if let Ok(url) = std::env::var("IDEMKV_REDIS_URL") {
        return Some((url, None));
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let child = Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .args(["--save", "", "--appendonly", "no", "--dir"])
        .arg(dir.path())
        .stdout(Stdio::null())
        .spawn();
    let Ok(child) = child else {
        eprintln!("skipped: no redis-server on PATH and IDEMKV_REDIS_URL unset");
        return None;
    };
    let server = Server { child, _dir: dir };
    let addr = format!("127.0.0.1:{port}");
    // Waits for the server to accept connections (startup, not a timing assertion).
    let started = Instant::now();
    while resp::Conn::connect(&addr)
        .and_then(|mut c| c.cmd(&["PING"]))
        .is_err()
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "redis-server did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Some((addr, Some(server)))
}

fn config(redis: &str, name: &str) -> Config {
    let prefix = format!("test-{name}-{}", std::process::id());
    let mut cfg = Config::new(redis, &prefix);
    cfg.deadline = Duration::from_secs(120);
    cfg
}

fn run_idemkv(cfg: &Config) -> scenario::Report {
    let dir = tempfile::tempdir().expect("temp dir");
    let engine = Engine::builder()
        .path(dir.path().join("consumers.redb"))
        .open()
        .expect("open");
    let report =
        scenario::run_in_process(cfg, Mode::Idemkv, Some(&engine), "idemkv").expect("scenario");
    engine.close().expect("close");
    scenario::cleanup(cfg).expect("cleanup");
    report.print();
    report
}

#[test]
fn idemkv_consumers_run_each_message_once_and_ack_every_entry() {
    let Some((redis, _server)) = redis() else {
        return;
    };
    let mut cfg = config(&redis, "once");
    cfg.messages = 300;
    cfg.consumers = 4;
    cfg.work_ms = (1, 10);
    // The slow work outlasts the lease, so it is redelivered while it runs and the lease
    // is kept alive. The lease is long enough that the renewals (every third of it) keep
    // it on a loaded 2-core machine, whose scheduler has held a thread back for 70 ms.
    cfg.lease = Duration::from_millis(500);
    cfg.slow_ms = (600, 800);
    let r = run_idemkv(&cfg);
    assert!(r.done, "not every entry acknowledged before the deadline");
    assert_eq!(r.messages, 300);
    assert_eq!(
        r.effects,
        [0, 300, 0, 0],
        "side effects per message: {:?}",
        r.doubles
    );
    assert_eq!((r.unacked, r.pending), (0, 0));
    assert!(r.mismatched.is_empty(), "{:?}", r.mismatched);
    // One run per message; every other entry (a producer's duplicate) is acked as a replay.
    assert_eq!(r.fresh, 300);
    assert!(r.replays >= r.entries - 300);
    assert!(r.exactly_once());
}

/// Work of 1.5 s under a 500 ms lease and a 500 ms min-idle: the message is redelivered
/// while its first consumer works, and the lease is kept alive, so the work is neither
/// taken over nor run twice, and every message is done within a few deliveries. (The
/// lease leaves the renewals, every third of it, room for a loaded machine's scheduler.)
#[test]
fn lease_shorter_than_slow_work_finishes_without_livelock() {
    let Some((redis, _server)) = redis() else {
        return;
    };
    let mut cfg = config(&redis, "slow");
    cfg.messages = 40;
    cfg.consumers = 4;
    cfg.duplicate_pct = 0;
    cfg.slow_pct = 20;
    cfg.work_ms = (1, 5);
    cfg.slow_ms = (1500, 1500);
    cfg.lease = Duration::from_millis(500);
    cfg.min_idle = Duration::from_millis(500);
    let r = run_idemkv(&cfg);
    assert!(r.done, "not every entry acknowledged before the deadline");
    assert_eq!(
        r.effects,
        [0, 40, 0, 0],
        "side effects per message: {:?}",
        r.doubles
    );
    assert_eq!((r.unacked, r.pending), (0, 0));
    assert!(r.reclaimed > 0, "no slow message was redelivered");
    assert_eq!(r.takeovers, 0, "a live holder's claim was taken over");
    // A slow message is redelivered about every min-idle while it runs: a handful each.
    assert!(
        r.max_deliveries <= 10 && r.deliveries <= r.entries as u64 * 3,
        "{} deliveries of {} entries, at most {} of one",
        r.deliveries,
        r.entries,
        r.max_deliveries
    );
}
