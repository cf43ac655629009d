//! TLS for the backend's connections: the URL's `sslmode` decides whether a connection is
//! encrypted, `PostgresConfig::tls_root_cert` (or the system's trust store) what it trusts.
//!
//! Architecture Invariant: there is no unverified TLS. Every encrypted connection checks the
//! server's certificate chain and its name against the URL's host (libpq's
//! `sslmode=verify-full`); a connection that would not be verified is plain text and says so
//! in the docs, rather than encrypted to whoever answers.

use super::config::PostgresConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use tokio_postgres::config::SslMode;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::Socket;
use tokio_postgres_rustls::MakeRustlsConnect;

/// The connector of every connection of an engine (the pool's and the listener's): rustls
/// where the host has a name to verify the server against, and a refusal to encrypt where
/// it has none (a Unix socket, `hostaddr` without `host`). The client asks for a connector
/// before it looks at `sslmode`, so without this a missing name would fail even plain
/// connections; with it they connect, and only a TLS handshake with no name to check fails.
#[derive(Clone)]
pub(crate) struct Connector(MakeRustlsConnect);

type Verified = <MakeRustlsConnect as MakeTlsConnect<Socket>>::TlsConnect;
type Stream = <MakeRustlsConnect as MakeTlsConnect<Socket>>::Stream;

/// One connection's TLS: verified against a host name, or refused.
pub(crate) enum Connect {
    Verified(Verified),
    NoName,
}

impl MakeTlsConnect<Socket> for Connector {
    type Stream = Stream;
    type TlsConnect = Connect;
    type Error = std::convert::Infallible;

    fn make_tls_connect(&mut self, domain: &str) -> Result<Connect, Self::Error> {
        Ok(
            match MakeTlsConnect::<Socket>::make_tls_connect(&mut self.0, domain) {
                Ok(verified) => Connect::Verified(verified),
                Err(_) => Connect::NoName,
            },
        )
    }
}

impl TlsConnect<Socket> for Connect {
    type Stream = Stream;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<Stream>> + Send>>;

    fn connect(self, socket: Socket) -> Self::Future {
        match self {
            Connect::Verified(verified) => Box::pin(verified.connect(socket)),
            Connect::NoName => Box::pin(std::future::ready(Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "TLS refused: the host (a Unix socket, or hostaddr without host) has no name \
                 to verify the server's certificate against",
            )))),
        }
    }
}

/// Where the certificates that verify the server come from.
#[derive(Debug, PartialEq, Eq)]
enum Roots {
    /// The connection is plain text: nothing to verify.
    Unused,
    /// `PostgresConfig::tls_root_cert`.
    File,
    /// The system's trust store (`SSL_CERT_FILE` / `SSL_CERT_DIR` when set).
    System,
}

/// The mode the client runs with, and what verifies the server. `prefer` without a root
/// certificate stays plain text, as before TLS existed here: libpq would encrypt without
/// verifying, which this backend does not do, and encrypting only when verification is
/// possible would make a server's self-signed certificate (Debian's default) refuse every
/// connection that used to work.
fn plan(mode: SslMode, root_cert: bool) -> (SslMode, Roots) {
    match (mode, root_cert) {
        (SslMode::Disable, _) => (SslMode::Disable, Roots::Unused),
        (SslMode::Prefer, false) => (SslMode::Disable, Roots::Unused),
        (mode, true) => (mode, Roots::File),
        // `require`, and any mode a newer client adds: encrypted and verified.
        (mode, false) => (mode, Roots::System),
    }
}

/// The connector every connection of the engine uses (the pool's and the listener's), after
/// setting the client's `sslmode` to what is decided here. The files are read once, at open;
/// the message of an error names the setting and the file.
pub(crate) fn connector(
    client: &mut tokio_postgres::Config,
    cfg: &PostgresConfig,
) -> Result<Connector, String> {
    let (mode, roots) = plan(client.get_ssl_mode(), cfg.tls_root_cert.is_some());
    client.ssl_mode(mode);
    if roots == Roots::Unused && cfg.tls_client_cert.is_some() {
        // The certificate would never be presented: refused, rather than have the server's
        // certificate authentication fail later for a reason nobody can see.
        return Err(
            "tls_client_cert is presented over TLS only, and this connection is \
                    plain text: set sslmode=require, or tls_root_cert for sslmode=prefer"
                .to_string(),
        );
    }
    let mut store = RootCertStore::empty();
    // The files are checked even when the connection is plain, so that a wrong path is
    // found at open and not when the URL is changed.
    if let Some(path) = &cfg.tls_root_cert {
        for cert in certificates(path, "tls_root_cert")? {
            store
                .add(cert)
                .map_err(|e| format!("tls_root_cert {}: {e}", path.display()))?;
        }
    }
    if roots == Roots::System {
        let found = rustls_native_certs::load_native_certs();
        let (added, _unparsable) = store.add_parsable_certificates(found.certs);
        if added == 0 {
            let first = found
                .errors
                .first()
                .map(|e| format!(" (first error: {e})"))
                .unwrap_or_default();
            return Err(format!(
                "sslmode=require verifies the server against the system's trust store, which \
                 has no usable certificate{first}; set tls_root_cert"
            ));
        }
    }
    // ring is named here rather than taken from rustls's process-wide default, which an
    // application that also links aws-lc-rs may leave ambiguous.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(store);
    let mut config = match &cfg.tls_client_cert {
        Some((cert, key)) => {
            let chain = certificates(cert, "tls_client_cert")?;
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| format!("tls_client_cert key {}: {e}", key.display()))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("tls_client_cert {}: {e}", cert.display()))?
        }
        None => builder.with_no_client_auth(),
    };
    // The protocol name PostgreSQL 17 expects in ALPN (required for `sslnegotiation=direct`,
    // ignored by older servers).
    config.alpn_protocols = vec![b"postgresql".to_vec()];
    Ok(Connector(MakeRustlsConnect::new(config)))
}

/// Every certificate of a PEM file; at least one.
fn certificates(path: &Path, setting: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{setting} {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{setting} {}: no PEM certificate in the file",
            path.display()
        ));
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_is_encrypted_only_where_it_is_verified() {
        use SslMode::*;
        assert_eq!(plan(Disable, false), (Disable, Roots::Unused));
        assert_eq!(plan(Disable, true), (Disable, Roots::Unused));
        assert_eq!(plan(Prefer, false), (Disable, Roots::Unused));
        assert_eq!(plan(Prefer, true), (Prefer, Roots::File));
        assert_eq!(plan(Require, false), (Require, Roots::System));
        assert_eq!(plan(Require, true), (Require, Roots::File));
    }

    #[test]
    fn unreadable_or_empty_files_are_refused_by_name() {
        let dir = std::env::temp_dir().join(format!("idemkv-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").expect("write");
        let mut client: tokio_postgres::Config =
            "host=localhost sslmode=require".parse().expect("url");
        let cfg = PostgresConfig::new("").tls_root_cert(&empty);
        let err = connector(&mut client, &cfg).err().expect("refused");
        assert!(
            err.contains("tls_root_cert") && err.contains("no PEM"),
            "{err}"
        );
        let cfg = PostgresConfig::new("").tls_root_cert(dir.join("missing.pem"));
        let err = connector(&mut client, &cfg).err().expect("refused");
        assert!(err.contains("missing.pem"), "{err}");
        // A client certificate on a connection that stays plain would never be presented.
        let mut plain: tokio_postgres::Config = "host=localhost".parse().expect("url");
        let cfg = PostgresConfig::new("").tls_client_cert(&empty, &empty);
        let err = connector(&mut plain, &cfg).err().expect("refused");
        assert!(
            err.contains("tls_client_cert") && err.contains("plain"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
