//! The stored form of a response: what a replay sends back.
//!
//! `b"idemkv-http"`, a version byte ([`HTTP_STORED_VERSION`]), then the crate's bincode
//! encoding (`codec::encode_value`) of the status, the kept headers and the body. A value
//! that does not decode, or decodes to an impossible status or header, is refused with an
//! error (answered with 500), never misread.

use crate::codec::{decode_value, encode_value, Blob};
use crate::constants::HTTP_STORED_VERSION;
use ::http::header::{HeaderName, HeaderValue};
use ::http::{HeaderMap, StatusCode};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

const MAGIC: &[u8] = b"idemkv-http";

#[derive(Serialize, Deserialize)]
struct Envelope {
    status: u16,
    /// Lower-case header names and raw values, in the order the response had them.
    headers: Vec<(String, Blob)>,
    body: Blob,
}

/// A response as it is replayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredResponse {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

/// Encodes `status`, the headers of `headers` that `keep` accepts, and `body`.
pub(crate) fn encode(
    status: StatusCode,
    headers: &HeaderMap,
    keep: impl Fn(&HeaderName) -> bool,
    body: &[u8],
) -> Result<Vec<u8>, String> {
    let envelope = Envelope {
        status: status.as_u16(),
        headers: headers
            .iter()
            .filter(|(name, _)| keep(name))
            .map(|(name, value)| (name.as_str().to_owned(), Blob(Arc::from(value.as_bytes()))))
            .collect(),
        body: Blob(Arc::from(body)),
    };
    let encoded = encode_value(&envelope)?;
    let mut out = Vec::with_capacity(MAGIC.len() + 1 + encoded.len());
    out.extend_from_slice(MAGIC);
    out.push(HTTP_STORED_VERSION);
    out.extend_from_slice(&encoded);
    Ok(out)
}

/// Decodes a stored response, checking every part.
pub(crate) fn decode(bytes: &[u8]) -> Result<StoredResponse, String> {
    let rest = bytes
        .strip_prefix(MAGIC)
        .ok_or("not a stored HTTP response (no magic)")?;
    let (&version, body) = rest.split_first().ok_or("no version byte")?;
    if version != HTTP_STORED_VERSION {
        return Err(format!("unknown stored-response version {version}"));
    }
    let envelope: Envelope = decode_value(body)?;
    let status = StatusCode::from_u16(envelope.status)
        .map_err(|_| format!("invalid status {}", envelope.status))?;
    let mut headers = HeaderMap::with_capacity(envelope.headers.len());
    for (name, value) in envelope.headers {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("invalid header name {name:?}"))?;
        let value = HeaderValue::from_bytes(&value.0)
            .map_err(|_| format!("invalid value of header {name}"))?;
        headers.append(name, value);
    }
    Ok(StoredResponse {
        status,
        headers,
        body: Bytes::copy_from_slice(&envelope.body.0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::http::header::{CONTENT_TYPE, SET_COOKIE};

    #[test]
    fn round_trip_keeps_only_allowed_headers() {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        h.append("x-a", HeaderValue::from_static("1"));
        h.append("x-a", HeaderValue::from_static("2"));
        h.insert(SET_COOKIE, HeaderValue::from_static("s=1"));
        let bytes = encode(StatusCode::CREATED, &h, |n| n != SET_COOKIE, b"body").unwrap();
        let back = decode(&bytes).unwrap();
        assert_eq!(back.status, StatusCode::CREATED);
        assert_eq!(back.body, &b"body"[..]);
        assert_eq!(back.headers.get_all("x-a").iter().count(), 2);
        assert!(back.headers.get(SET_COOKIE).is_none());
        assert_eq!(back.headers[CONTENT_TYPE], "text/plain");
    }

    #[test]
    fn damaged_values_are_refused_not_misread() {
        let h = HeaderMap::new();
        let bytes = encode(StatusCode::OK, &h, |_| true, b"hello").unwrap();
        assert!(decode(b"").is_err());
        assert!(decode(b"charged").is_err());
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut other = bytes.clone();
        other[MAGIC.len()] = HTTP_STORED_VERSION + 1;
        assert!(decode(&other).is_err());
        // Every single-byte change decodes to an error or to a valid response, never panics.
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0xff;
            let _ = decode(&b);
        }
    }
}
