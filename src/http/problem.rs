//! Error responses as RFC 9457 problem details (`application/problem+json`).

use crate::http::constants::HTTP_OVERLOADED_RETRY_AFTER_SECS;
use ::http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use ::http::{Response, StatusCode};
use bytes::Bytes;
use http_body_util::Full;
use std::time::Duration;

/// The media type of every error body the layer writes.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// One kind of problem the layer reports: its `type` URI, `title` and status.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Kind {
    pub(crate) slug: &'static str,
    pub(crate) title: &'static str,
    pub(crate) status: StatusCode,
}

macro_rules! kinds {
    ($($name:ident = ($slug:literal, $title:literal, $status:ident);)*) => {
        $(pub(crate) const $name: Kind = Kind {
            slug: $slug,
            title: $title,
            status: StatusCode::$status,
        };)*
    };
}

kinds! {
    KEY_MISSING = ("key-missing", "Idempotency-Key is missing", BAD_REQUEST);
    KEY_MALFORMED = ("key-malformed", "Idempotency-Key is malformed", BAD_REQUEST);
    KEY_TOO_LONG = ("key-too-long", "Idempotency-Key is too long", BAD_REQUEST);
    BODY_UNREADABLE = ("body-unreadable", "The request body could not be read", BAD_REQUEST);
    BODY_TOO_LARGE = ("body-too-large", "The request body is too large", PAYLOAD_TOO_LARGE);
    IN_FLIGHT = ("in-flight", "A request with this Idempotency-Key is being processed", CONFLICT);
    KEY_REUSED = ("key-reused", "Idempotency-Key reused with a different request", UNPROCESSABLE_ENTITY);
    RESPONSE_FORGOTTEN = ("response-forgotten", "The response to this Idempotency-Key is no longer kept", GONE);
    OVERLOADED = ("overloaded", "The idempotency store is overloaded", SERVICE_UNAVAILABLE);
    UNAVAILABLE = ("unavailable", "The idempotency store is unavailable", SERVICE_UNAVAILABLE);
    OUTCOME_UNKNOWN = ("outcome-unknown", "The idempotency store failed before confirming", INTERNAL_SERVER_ERROR);
    CORRUPTED = ("stored-response-corrupted", "The stored response could not be read", INTERNAL_SERVER_ERROR);
    MISCONFIGURED = ("misconfigured", "The idempotency layer is misconfigured", INTERNAL_SERVER_ERROR);
    INTERNAL = ("internal", "The idempotency store failed", INTERNAL_SERVER_ERROR);
}

/// The `type` URI of a problem: `urn:idemkv:problem:` followed by its slug.
pub(crate) const TYPE_PREFIX: &str = "urn:idemkv:problem:";

/// A problem response; `retry_after` adds a `Retry-After` header (seconds, rounded up).
pub(crate) fn response(
    kind: Kind,
    detail: &str,
    retry_after: Option<Duration>,
) -> Response<Full<Bytes>> {
    let status = kind.status.as_u16();
    let mut json = String::with_capacity(160 + detail.len());
    json.push_str("{\"type\":");
    push_json_string(&mut json, &format!("{TYPE_PREFIX}{}", kind.slug));
    json.push_str(",\"title\":");
    push_json_string(&mut json, kind.title);
    json.push_str(&format!(",\"status\":{status},\"detail\":"));
    push_json_string(&mut json, detail);
    json.push('}');
    let mut res = Response::new(Full::new(Bytes::from(json)));
    *res.status_mut() = kind.status;
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    if let Some(after) = retry_after {
        res.headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(retry_after_secs(after)));
    }
    res
}

/// A 503 for an engine limit, which carries no hint of its own.
pub(crate) fn overloaded(detail: &str) -> Response<Full<Bytes>> {
    response(
        OVERLOADED,
        detail,
        Some(Duration::from_secs(HTTP_OVERLOADED_RETRY_AFTER_SECS)),
    )
}

/// Whole seconds, rounded up (Retry-After has a resolution of one second).
pub(crate) fn retry_after_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// Appends `s` as a JSON string (RFC 8259 §7): quotes, backslashes and control characters
/// escaped; everything else, including non-ASCII, as UTF-8.
pub(crate) fn push_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_escaped() {
        let mut s = String::new();
        push_json_string(&mut s, "a\"b\\c\nd\u{1}é");
        assert_eq!(s, r#""a\"b\\c\nd\u0001é""#);
    }

    #[test]
    fn retry_after_rounds_up() {
        assert_eq!(retry_after_secs(Duration::ZERO), 0);
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(30)), 30);
        assert_eq!(retry_after_secs(Duration::from_millis(29_001)), 30);
    }
}
