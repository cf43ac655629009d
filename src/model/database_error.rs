//! `DatabaseError`: what the database (or the way to it) refused, typed for a caller that
//! acts on it.

use std::fmt;
use std::sync::Arc;

/// What kind of refusal a [`DatabaseError`] is: what a caller can do about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DatabaseErrorKind {
    /// No connection could be had (the server is down or unreachable, the pool stayed
    /// exhausted for the connect timeout, authentication failed). Nothing was sent:
    /// nothing changed. Retry later.
    Unavailable,
    /// The role lacks a privilege on the backend's tables, sequence or schema
    /// (SQLSTATE 42501), or may not log in. Nothing changed; grant it (docs/shared.md
    /// lists what the backend needs).
    PermissionDenied,
    /// The server ran out of disk, memory or connections (SQLSTATE class 53). Nothing
    /// changed; free the resource and retry.
    DiskFull,
    /// The server cancelled the statement at its `statement_timeout` (SQLSTATE 57014),
    /// usually behind a lock another transaction holds on the row. Nothing changed; retry.
    StatementTimeout,
    /// The backend's tables are missing, of another schema version, or not what it
    /// expects. Nothing changed; see docs/shared.md ("Schema").
    Schema,
    /// Any other error the server answered with (its SQLSTATE is [`DatabaseError::code`]).
    /// The statement failed, so nothing changed.
    Rejected,
}

/// A refusal by the database, or of the way to it, after which nothing changed (an
/// answer that may have been lost after the statement ran is `OutcomeUnknown` instead).
/// [`DatabaseError::kind`] says what a caller can do; the client's error is the
/// [`std::error::Error::source`].
#[derive(Clone)]
pub struct DatabaseError {
    pub(crate) kind: DatabaseErrorKind,
    pub(crate) code: Option<String>,
    pub(crate) message: String,
    pub(crate) source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl DatabaseError {
    /// The kind of refusal: what a caller can do about it.
    pub fn kind(&self) -> DatabaseErrorKind {
        self.kind
    }

    /// The server's SQLSTATE, when the server answered with an error.
    pub fn code(&self) -> Option<&str> {
        self.code.as_deref()
    }

    /// What happened, in words.
    pub fn message(&self) -> &str {
        &self.message
    }

    pub(crate) fn new(kind: DatabaseErrorKind, message: impl Into<String>) -> Self {
        DatabaseError {
            kind,
            code: None,
            message: message.into(),
            source: None,
        }
    }

    /// Classifies a client error the server answered with (`code` its SQLSTATE).
    pub(crate) fn from_client(e: tokio_postgres::Error, context: &str) -> Self {
        let (kind, code, message) = match e.as_db_error() {
            Some(db) => {
                let code = db.code().code().to_string();
                (
                    kind_of(&code),
                    Some(code),
                    format!("{context}: {}", db.message()),
                )
            }
            // The client's message leaves out its causes (e.g. why a TLS handshake failed).
            None => (
                DatabaseErrorKind::Unavailable,
                None,
                format!("{context}: {e}{}", causes(&e)),
            ),
        };
        DatabaseError {
            kind,
            code,
            message,
            source: Some(Arc::new(e)),
        }
    }
}

/// The messages of an error's sources, each after ": ", a message its predecessor already
/// shows left out.
fn causes(e: &dyn std::error::Error) -> String {
    let mut out = String::new();
    let mut shown = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        let text = s.to_string();
        if !shown.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        shown = text;
        next = s.source();
    }
    out
}

/// The kind of a SQLSTATE.
pub(crate) fn kind_of(code: &str) -> DatabaseErrorKind {
    match code {
        "42501" | "28000" | "28P01" | "42P06" => DatabaseErrorKind::PermissionDenied,
        "57014" => DatabaseErrorKind::StatementTimeout,
        // 42883: the claim function is missing (a copy of the tables without it).
        "42P01" | "3F000" | "42703" | "42P07" | "42804" | "42883" => DatabaseErrorKind::Schema,
        c if c.starts_with("53") => DatabaseErrorKind::DiskFull,
        c if c.starts_with("08") || c.starts_with("57P") => DatabaseErrorKind::Unavailable,
        _ => DatabaseErrorKind::Rejected,
    }
}

impl PartialEq for DatabaseError {
    /// Equal when the kind, the SQLSTATE and the message are (the sources are not compared).
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind && self.code == other.code && self.message == other.message
    }
}

impl Eq for DatabaseError {}

impl fmt::Debug for DatabaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatabaseError")
            .field("kind", &self.kind)
            .field("code", &self.code)
            .field("message", &self.message)
            .finish()
    }
}

impl fmt::Display for DatabaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            DatabaseErrorKind::Unavailable => "the database is unavailable",
            DatabaseErrorKind::PermissionDenied => "the database refused permission",
            DatabaseErrorKind::DiskFull => "the database is out of disk, memory or connections",
            DatabaseErrorKind::StatementTimeout => {
                "the database cancelled the statement at its timeout"
            }
            DatabaseErrorKind::Schema => "the database's idemkv schema is missing or different",
            DatabaseErrorKind::Rejected => "the database refused the statement",
        };
        write!(f, "{what}: {}", self.message)?;
        if let Some(code) = &self.code {
            write!(f, " (SQLSTATE {code})")?;
        }
        f.write_str("; nothing changed")
    }
}

impl std::error::Error for DatabaseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}
