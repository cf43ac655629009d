//! TLS between the shared backend and PostgreSQL (feature `postgres`, docs/shared.md, "TLS"):
//! which connections are encrypted under each `sslmode`, that a server the configured CA
//! does not vouch for is refused, and that a client certificate authenticates.
//!
//! Run with `scripts/pg.sh test`: its server accepts TLS with a certificate from a throwaway
//! CA and sets `IDEMKV_PG_URL` and `IDEMKV_PG_TLS_DIR` (the CA, an unrelated CA, a client
//! certificate for the role `idemkv_tls_client`). Without them every test fails and says so.
//! What the server saw is read from `pg_stat_ssl` through `psql`.
#![cfg(feature = "postgres")]

mod pg;

use idemkv::error::DatabaseErrorKind;
use idemkv::{Claim, Engine, OpenError, PostgresConfig};
use std::path::PathBuf;

fn url() -> String {
    pg::env("IDEMKV_PG_URL", "shared_tls")
}

fn tls_file(name: &str) -> PathBuf {
    PathBuf::from(pg::env("IDEMKV_PG_TLS_DIR", "shared_tls")).join(name)
}

/// A name no other test (or earlier run) uses: the table prefix, and the connections'
/// `application_name`, which is how the server's view of them is found.
fn unique(name: &str) -> String {
    format!("t{:08x}_{name}_", fastrand::u32(..))
}

/// `url()` as the role `user`, with `sslmode` and the connections' `application_name`.
fn url_with(user: &str, sslmode: &str, app: &str) -> String {
    let base = url().replacen("postgres://postgres@", &format!("postgres://{user}@"), 1);
    format!("{base}?sslmode={sslmode}&application_name={app}")
}

fn psql(sql: &str) -> String {
    pg::psql(&url(), sql)
}

/// The engine's connections as the server sees them: (count, how many use TLS, the client
/// certificates' distinguished names).
fn connections(app: &str) -> (usize, usize, String) {
    let row = psql(&format!(
        "SELECT count(*), count(*) FILTER (WHERE s.ssl), \
         coalesce(string_agg(DISTINCT s.client_dn, ','), '') \
         FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
         WHERE a.application_name = '{app}'"
    ));
    let mut parts = row.split('|');
    let mut number = || {
        parts
            .next()
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or_else(|| panic!("psql answered {row:?}"))
    };
    let (all, tls) = (number(), number());
    let dn = row.split('|').nth(2).unwrap_or_default().to_string();
    (all, tls, dn)
}

fn open(cfg: PostgresConfig) -> Result<Engine, OpenError> {
    Engine::builder().postgres(cfg).open()
}

/// A claim and its completion, so that the pool has opened a connection; the listener
/// opened its own at open.
fn exercise(e: &Engine) {
    match e
        .claim(b"k", &idemkv::ClaimOptions::default())
        .expect("claim")
    {
        Claim::Acquired(lease) => lease.complete(b"done").expect("complete"),
        other => panic!("a fresh key was {other:?}"),
    }
}

#[test]
fn require_with_the_servers_ca_encrypts_every_connection() {
    let app = unique("require");
    let e = open(
        PostgresConfig::new(url_with("postgres", "require", &app))
            .table_prefix(&app)
            .tls_root_cert(tls_file("ca.crt")),
    )
    .expect("open over TLS");
    exercise(&e);
    let (all, tls, _) = connections(&app);
    // One connection of the pool at least, and the listener's.
    assert!(all >= 2, "{all} connections");
    assert_eq!(tls, all, "every connection is encrypted");
}

#[test]
fn prefer_encrypts_when_a_root_cert_is_set_and_stays_plain_without_one() {
    let app = unique("prefer_root");
    let e = open(
        PostgresConfig::new(url_with("postgres", "prefer", &app))
            .table_prefix(&app)
            .tls_root_cert(tls_file("ca.crt")),
    )
    .expect("open");
    exercise(&e);
    let (all, tls, _) = connections(&app);
    assert!(all >= 2 && tls == all, "{tls} of {all} encrypted");

    // Without a root certificate nothing could be verified, so nothing is encrypted.
    let app = unique("prefer_plain");
    let e = open(PostgresConfig::new(url_with("postgres", "prefer", &app)).table_prefix(&app))
        .expect("open");
    exercise(&e);
    let (all, tls, _) = connections(&app);
    assert!(all >= 2, "{all} connections");
    assert_eq!(
        tls, 0,
        "a connection that could not be verified is plain text"
    );
}

#[test]
fn a_server_the_root_cert_does_not_vouch_for_is_refused_in_every_encrypting_mode() {
    for mode in ["require", "prefer"] {
        let app = unique(mode);
        let err = open(
            PostgresConfig::new(url_with("postgres", mode, &app))
                .table_prefix(&app)
                .tls_root_cert(tls_file("other-ca.crt")),
        )
        .err()
        .unwrap_or_else(|| panic!("sslmode={mode}: a server signed by another CA was trusted"));
        match &err {
            OpenError::Database(db) => {
                assert_eq!(db.kind(), DatabaseErrorKind::Unavailable, "{err}");
                // The message carries the handshake's cause, not only "TLS failed".
                let text = err.to_string();
                assert!(
                    text.contains("certificate"),
                    "the refusal names the certificate: {text}"
                );
            }
            other => panic!("sslmode={mode}: {other}"),
        }
        // Refused before any statement: the tables were never created.
        assert_eq!(
            psql(&format!(
                "SELECT count(*) FROM pg_tables WHERE tablename LIKE '{app}%'"
            )),
            "0"
        );
    }
}

#[test]
fn a_client_certificate_authenticates_a_certificate_role() {
    let app = unique("client_cert");
    let e = open(
        PostgresConfig::new(url_with("idemkv_tls_client", "require", &app))
            .table_prefix(&app)
            .tls_root_cert(tls_file("ca.crt"))
            .tls_client_cert(tls_file("client.crt"), tls_file("client.key")),
    )
    .expect("open with a client certificate");
    exercise(&e);
    let (all, tls, dn) = connections(&app);
    assert!(all >= 2 && tls == all, "{tls} of {all} encrypted");
    assert!(dn.contains("idemkv_tls_client"), "client DN {dn:?}");

    // The same role without its certificate is refused by the server (cert authentication).
    let app = unique("no_client_cert");
    let err = open(
        PostgresConfig::new(url_with("idemkv_tls_client", "require", &app))
            .table_prefix(&app)
            .tls_root_cert(tls_file("ca.crt")),
    )
    .expect_err("a certificate role without its certificate was let in");
    assert!(matches!(err, OpenError::Database(_)), "{err}");
}

#[test]
fn tls_files_that_do_not_load_are_invalid_config_at_open() {
    let missing = tls_file("no-such-file.pem");
    let not_a_key = tls_file("ca.crt");
    let cases = [
        PostgresConfig::new(url_with("postgres", "require", "x")).tls_root_cert(&missing),
        // Checked even when the connection would be plain, so a wrong path shows at once.
        PostgresConfig::new(url_with("postgres", "disable", "x")).tls_root_cert(&missing),
        // A client certificate that a plain connection would never present.
        PostgresConfig::new(url_with("postgres", "prefer", "x"))
            .tls_client_cert(tls_file("client.crt"), tls_file("client.key")),
        PostgresConfig::new(url_with("postgres", "require", "x"))
            .tls_root_cert(tls_file("ca.crt"))
            .tls_client_cert(tls_file("client.crt"), &not_a_key),
    ];
    for cfg in cases {
        match open(cfg) {
            Err(OpenError::InvalidConfig { detail }) => {
                assert!(detail.contains("tls_"), "the setting is named: {detail}")
            }
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("opened with a TLS file that does not load"),
        }
    }
}

/// The port of the test server, from its URL (`postgres://user@127.0.0.1:PORT/db`).
fn port() -> String {
    let url = url();
    let after_host = url.rsplit_once(':').map(|(_, p)| p).unwrap_or_default();
    after_host.split('/').next().unwrap_or_default().to_string()
}

/// A host with no name to verify against (a Unix socket, or `hostaddr` alone) connects in
/// plain text where the mode allows it, and is refused where TLS is required: it is never
/// encrypted unverified, and asking for TLS does not break the plain connection.
#[test]
fn hosts_without_a_name_connect_in_plain_text_and_refuse_required_tls() {
    let socket = pg::env("IDEMKV_PG_SOCKET_DIR", "shared_tls");
    let port = port();
    let kv = |host: &str, mode: &str, app: &str| {
        format!("{host} port={port} user=postgres dbname=postgres sslmode={mode} application_name={app}")
    };
    let socket_host = format!("host={socket}");
    for (host, mode, root) in [
        (socket_host.as_str(), "disable", false),
        (socket_host.as_str(), "prefer", false),
        // The server offers no TLS on its socket: prefer goes on in plain text.
        (socket_host.as_str(), "prefer", true),
        ("hostaddr=127.0.0.1", "disable", false),
        ("hostaddr=127.0.0.1", "prefer", false),
    ] {
        let app = unique("noname");
        let mut cfg = PostgresConfig::new(kv(host, mode, &app)).table_prefix(&app);
        if root {
            cfg = cfg.tls_root_cert(tls_file("ca.crt"));
        }
        let e = open(cfg).unwrap_or_else(|err| panic!("{host} sslmode={mode}: {err}"));
        exercise(&e);
        let (all, tls, _) = connections(&app);
        assert!(all >= 2, "{host} sslmode={mode}: {all} connections");
        assert_eq!(tls, 0, "{host} sslmode={mode}");
    }
    for host in [socket_host.as_str(), "hostaddr=127.0.0.1"] {
        let app = unique("noname_require");
        let err = open(
            PostgresConfig::new(kv(host, "require", &app))
                .table_prefix(&app)
                .tls_root_cert(tls_file("ca.crt")),
        )
        .expect_err("TLS required with no name to verify");
        assert!(matches!(err, OpenError::Database(_)), "{host}: {err}");
    }
}
