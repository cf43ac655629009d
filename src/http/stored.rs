//! The stored form of a response: what a replay sends back.
//!
//! `b"idemkv-http"`, a version byte ([`HTTP_STORED_VERSION`]), then the status (u16), the
//! number of kept headers (u64), each header's lower-case name and raw value, and the body,
//! each of those as a length (u64) and its bytes; every integer little-endian. (The same
//! bytes as the crate's bincode encoding of that tuple, with which version 1 was written.)
//!
//! Stored values are untrusted: a damaged file, an `import`, a row of the shared table. The
//! decoder checks every count and length against the limits in `constants.rs` before it
//! reads or allocates, builds headers only through fallible calls, and refuses a value that
//! breaks any of them with a [`StoredError`] (answered with 500), never misreads or panics.
//! The encoder keeps to the same limits, so every response it stores decodes.

use crate::http::constants::{
    HTTP_STORED_HEADERS_LEN_MAX, HTTP_STORED_HEADERS_MAX, HTTP_STORED_HEADER_NAME_LEN_MAX,
    HTTP_STORED_HEADER_VALUE_LEN_MAX, HTTP_STORED_LEN_MAX, HTTP_STORED_VERSION,
};
use ::http::header::{HeaderName, HeaderValue};
use ::http::{HeaderMap, StatusCode};
use bytes::Bytes;
use std::fmt;

const MAGIC: &[u8] = b"idemkv-http";

/// A response as it is replayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredResponse {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

/// Why a response cannot be stored, or a stored value cannot be replayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StoredError {
    /// The value does not start with the magic bytes.
    NoMagic,
    /// The value is of an encoding version this build does not know.
    Version(u8),
    /// The value ends before what its lengths announce.
    Truncated,
    /// Bytes follow the body.
    TrailingBytes(usize),
    /// The value is larger than any stored response may be.
    TooLarge { len: usize, max: usize },
    /// The status is not an HTTP status code.
    Status(u16),
    /// More header values than a stored response may carry.
    TooManyHeaders { count: u64, max: usize },
    /// A header name over its limit.
    NameTooLong { len: u64, max: usize },
    /// A header value over its limit.
    ValueTooLong { len: u64, max: usize },
    /// Header names and values over their limit in all.
    HeadersTooLarge { max: usize },
    /// A header name no header may have.
    BadName,
    /// A header value no header may have.
    BadValue,
}

impl fmt::Display for StoredError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoMagic => f.write_str("not a stored HTTP response (no magic)"),
            Self::Version(v) => write!(f, "unknown stored-response version {v}"),
            Self::Truncated => f.write_str("the value ends early"),
            Self::TrailingBytes(n) => write!(f, "{n} bytes after the body"),
            Self::TooLarge { len, max } => {
                write!(f, "{len} bytes, over the limit of {max}")
            }
            Self::Status(s) => write!(f, "invalid status {s}"),
            Self::TooManyHeaders { count, max } => {
                write!(f, "{count} header values, over the limit of {max}")
            }
            Self::NameTooLong { len, max } => {
                write!(f, "a header name of {len} bytes, over the limit of {max}")
            }
            Self::ValueTooLong { len, max } => {
                write!(f, "a header value of {len} bytes, over the limit of {max}")
            }
            Self::HeadersTooLarge { max } => {
                write!(f, "headers over the limit of {max} bytes in all")
            }
            Self::BadName => f.write_str("an invalid header name"),
            Self::BadValue => f.write_str("an invalid header value"),
        }
    }
}

impl std::error::Error for StoredError {}

/// Encodes `status`, the headers of `headers` that `keep` accepts, and `body`; refused if
/// the headers are over a limit or the whole over [`HTTP_STORED_LEN_MAX`].
pub(crate) fn encode(
    status: StatusCode,
    headers: &HeaderMap,
    keep: impl Fn(&HeaderName) -> bool,
    body: &[u8],
) -> Result<Vec<u8>, StoredError> {
    let kept: Vec<(&HeaderName, &HeaderValue)> =
        headers.iter().filter(|(name, _)| keep(name)).collect();
    if kept.len() > HTTP_STORED_HEADERS_MAX {
        return Err(StoredError::TooManyHeaders {
            count: kept.len() as u64,
            max: HTTP_STORED_HEADERS_MAX,
        });
    }
    let mut headers_len = 0usize;
    for (name, value) in &kept {
        check_len(
            name.as_str().len() as u64,
            HTTP_STORED_HEADER_NAME_LEN_MAX,
            |len, max| StoredError::NameTooLong { len, max },
        )?;
        check_len(
            value.len() as u64,
            HTTP_STORED_HEADER_VALUE_LEN_MAX,
            |len, max| StoredError::ValueTooLong { len, max },
        )?;
        headers_len += name.as_str().len() + value.len();
    }
    if headers_len > HTTP_STORED_HEADERS_LEN_MAX {
        return Err(StoredError::HeadersTooLarge {
            max: HTTP_STORED_HEADERS_LEN_MAX,
        });
    }
    let len = MAGIC.len() + 1 + 2 + 8 + kept.len() * 16 + headers_len + 8 + body.len();
    if len > HTTP_STORED_LEN_MAX {
        return Err(StoredError::TooLarge {
            len,
            max: HTTP_STORED_LEN_MAX,
        });
    }
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(MAGIC);
    out.push(HTTP_STORED_VERSION);
    out.extend_from_slice(&status.as_u16().to_le_bytes());
    out.extend_from_slice(&(kept.len() as u64).to_le_bytes());
    for (name, value) in kept {
        put_bytes(&mut out, name.as_str().as_bytes());
        put_bytes(&mut out, value.as_bytes());
    }
    put_bytes(&mut out, body);
    Ok(out)
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// `len`, or the error `over` makes of it and `max` if it is over `max`.
fn check_len(
    len: u64,
    max: usize,
    over: impl FnOnce(u64, usize) -> StoredError,
) -> Result<usize, StoredError> {
    match usize::try_from(len) {
        Ok(n) if n <= max => Ok(n),
        _ => Err(over(len, max)),
    }
}

/// Reads a value front to back; every read is checked against what is left.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], StoredError> {
        if n > self.0.len() {
            return Err(StoredError::Truncated);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], StoredError> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u64(&mut self) -> Result<u64, StoredError> {
        self.array().map(u64::from_le_bytes)
    }

    /// A length-prefixed byte string of at most `max` bytes.
    fn bytes(
        &mut self,
        max: usize,
        over: impl FnOnce(u64, usize) -> StoredError,
    ) -> Result<&'a [u8], StoredError> {
        let len = check_len(self.u64()?, max, over)?;
        self.take(len)
    }
}

/// Decodes a stored response, checking every part.
pub(crate) fn decode(bytes: &[u8]) -> Result<StoredResponse, StoredError> {
    if bytes.len() > HTTP_STORED_LEN_MAX {
        return Err(StoredError::TooLarge {
            len: bytes.len(),
            max: HTTP_STORED_LEN_MAX,
        });
    }
    let rest = bytes.strip_prefix(MAGIC).ok_or(StoredError::NoMagic)?;
    let mut r = Reader(rest);
    let [version] = r.array()?;
    if version != HTTP_STORED_VERSION {
        return Err(StoredError::Version(version));
    }
    let status = u16::from_le_bytes(r.array()?);
    let status = StatusCode::from_u16(status).map_err(|_| StoredError::Status(status))?;
    let count = r.u64()?;
    let count = check_len(count, HTTP_STORED_HEADERS_MAX, |count, max| {
        StoredError::TooManyHeaders { count, max }
    })?;
    // No capacity is taken from the record: the map grows as headers are read.
    let mut headers = HeaderMap::new();
    let mut headers_len = 0usize;
    for _ in 0..count {
        let name = r.bytes(HTTP_STORED_HEADER_NAME_LEN_MAX, |len, max| {
            StoredError::NameTooLong { len, max }
        })?;
        let value = r.bytes(HTTP_STORED_HEADER_VALUE_LEN_MAX, |len, max| {
            StoredError::ValueTooLong { len, max }
        })?;
        headers_len += name.len() + value.len();
        if headers_len > HTTP_STORED_HEADERS_LEN_MAX {
            return Err(StoredError::HeadersTooLarge {
                max: HTTP_STORED_HEADERS_LEN_MAX,
            });
        }
        let raw = name;
        let name = HeaderName::from_bytes(raw).map_err(|_| StoredError::BadName)?;
        // A name is stored lower-case (as the map keeps it); one that parsing had to change
        // was not written by the encoder.
        if name.as_str().as_bytes() != raw {
            return Err(StoredError::BadName);
        }
        let value = HeaderValue::from_bytes(value).map_err(|_| StoredError::BadValue)?;
        headers
            .try_append(name, value)
            .map_err(|_| StoredError::TooManyHeaders {
                count: count as u64,
                max: HTTP_STORED_HEADERS_MAX,
            })?;
    }
    let body = r.bytes(HTTP_STORED_LEN_MAX, |len, _| StoredError::TooLarge {
        len: usize::try_from(len).unwrap_or(usize::MAX),
        max: HTTP_STORED_LEN_MAX,
    })?;
    if !r.0.is_empty() {
        return Err(StoredError::TrailingBytes(r.0.len()));
    }
    Ok(StoredResponse {
        status,
        headers,
        body: Bytes::copy_from_slice(body),
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

    /// Version 1 was written through the crate's bincode encoding of a struct; values written
    /// then still decode (and the encoder still writes the same bytes).
    #[test]
    fn values_written_through_bincode_still_decode() {
        use crate::model::codec::{encode_value, Blob};
        use std::sync::Arc;
        #[derive(serde::Serialize)]
        struct Envelope {
            status: u16,
            headers: Vec<(String, Blob)>,
            body: Blob,
        }
        let old = Envelope {
            status: 201,
            headers: vec![
                ("content-type".into(), Blob(Arc::from(&b"text/plain"[..]))),
                ("x-a".into(), Blob(Arc::from(&b"1"[..]))),
            ],
            body: Blob(Arc::from(&b"body"[..])),
        };
        let mut bytes = MAGIC.to_vec();
        bytes.push(1);
        bytes.extend_from_slice(&encode_value(&old).unwrap());
        let back = decode(&bytes).unwrap();
        assert_eq!(back.status, StatusCode::CREATED);
        assert_eq!(back.headers["x-a"], "1");
        assert_eq!(back.body, &b"body"[..]);
        assert_eq!(
            encode(back.status, &back.headers, |_| true, b"body").unwrap(),
            bytes
        );
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
        assert_eq!(
            decode(&other),
            Err(StoredError::Version(HTTP_STORED_VERSION + 1))
        );
        // Every single-byte change decodes to an error or to a valid response, never panics.
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0xff;
            let _ = decode(&b);
        }
    }

    /// A value of `count` headers (as announced) followed by `headers` and an empty body.
    fn by_hand(count: u64, headers: &[(&[u8], &[u8])]) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.push(HTTP_STORED_VERSION);
        out.extend_from_slice(&200u16.to_le_bytes());
        out.extend_from_slice(&count.to_le_bytes());
        for (name, value) in headers {
            put_bytes(&mut out, name);
            put_bytes(&mut out, value);
        }
        put_bytes(&mut out, b"");
        out
    }

    #[test]
    fn counts_and_lengths_are_checked_before_they_are_used() {
        let many = vec![(&b"x-a"[..], &b"1"[..]); 40_000];
        assert!(matches!(
            decode(&by_hand(many.len() as u64, &many)),
            Err(StoredError::TooManyHeaders { count: 40_000, .. })
        ));
        assert!(matches!(
            decode(&by_hand(u64::MAX, &[])),
            Err(StoredError::TooManyHeaders { .. })
        ));
        assert_eq!(decode(&by_hand(3, &[])), Err(StoredError::Truncated));
        let long = vec![b'a'; HTTP_STORED_HEADER_NAME_LEN_MAX + 1];
        assert!(matches!(
            decode(&by_hand(1, &[(&long, b"v")])),
            Err(StoredError::NameTooLong { .. })
        ));
        let long = vec![b'v'; HTTP_STORED_HEADER_VALUE_LEN_MAX + 1];
        assert!(matches!(
            decode(&by_hand(1, &[(b"x-a", &long)])),
            Err(StoredError::ValueTooLong { .. })
        ));
        let big = vec![b'v'; HTTP_STORED_HEADER_VALUE_LEN_MAX];
        let all = vec![(&b"x-a"[..], &big[..]); HTTP_STORED_HEADERS_MAX];
        assert!(matches!(
            decode(&by_hand(all.len() as u64, &all)),
            Err(StoredError::HeadersTooLarge { .. })
        ));
        for (name, value) in [
            (&b"bad name"[..], &b"v"[..]),
            (b"", b"v"),
            (b"X-Upper", b"v"),
            (b"x-a", b"\n"),
            (b"x-a", b"\0"),
        ] {
            assert!(decode(&by_hand(1, &[(name, value)])).is_err());
        }
        let mut status = by_hand(0, &[]);
        status[MAGIC.len() + 1..MAGIC.len() + 3].copy_from_slice(&1000u16.to_le_bytes());
        assert_eq!(decode(&status), Err(StoredError::Status(1000)));
        let mut trailing = by_hand(0, &[]);
        trailing.push(0);
        assert_eq!(decode(&trailing), Err(StoredError::TrailingBytes(1)));
        // At the limits exactly, it decodes.
        let fine = vec![(&b"x-a"[..], &b"1"[..]); HTTP_STORED_HEADERS_MAX];
        let back = decode(&by_hand(fine.len() as u64, &fine)).unwrap();
        assert_eq!(back.headers.len(), HTTP_STORED_HEADERS_MAX);
    }

    #[test]
    fn the_encoder_keeps_to_the_decoders_limits() {
        let mut h = HeaderMap::new();
        for _ in 0..=HTTP_STORED_HEADERS_MAX {
            h.append("x-a", HeaderValue::from_static("1"));
        }
        assert!(matches!(
            encode(StatusCode::OK, &h, |_| true, b""),
            Err(StoredError::TooManyHeaders { .. })
        ));
        let mut h = HeaderMap::new();
        let long = "v".repeat(HTTP_STORED_HEADER_VALUE_LEN_MAX + 1);
        h.insert("x-a", HeaderValue::from_str(&long).unwrap());
        assert!(matches!(
            encode(StatusCode::OK, &h, |_| true, b""),
            Err(StoredError::ValueTooLong { .. })
        ));
        // A header the response does not keep does not count.
        assert!(encode(StatusCode::OK, &h, |_| false, b"").is_ok());
    }

    /// The decoder never panics, whatever the bytes: random bytes, random bytes behind the
    /// magic and version, and valid values with random bytes changed, cut or appended.
    /// Seeded, so a failure replays; the fuzz target `stored_response` explores further.
    #[test]
    fn random_bytes_never_panic_the_decoder() {
        let mut rng = fastrand::Rng::with_seed(0x1de3_0a7e);
        let mut h = HeaderMap::new();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        h.append("x-a", HeaderValue::from_static("1"));
        let valid = encode(StatusCode::CREATED, &h, |_| true, b"{\"id\":1}").unwrap();
        let mut decoded = 0;
        for round in 0..20_000 {
            let len = rng.usize(0..96);
            let mut bytes: Vec<u8> = match round % 3 {
                0 => (0..len).map(|_| rng.u8(..)).collect(),
                1 => {
                    let mut b = valid[..MAGIC.len() + 1].to_vec();
                    b.extend((0..len).map(|_| rng.u8(..)));
                    b
                }
                _ => valid.clone(),
            };
            if round % 3 == 2 {
                for _ in 0..rng.usize(1..4) {
                    let i = rng.usize(0..bytes.len());
                    bytes[i] = rng.u8(..);
                }
                match rng.u8(0..3) {
                    0 => bytes.truncate(rng.usize(0..=bytes.len())),
                    1 => bytes.extend((0..rng.usize(0..8)).map(|_| rng.u8(..))),
                    _ => {}
                }
            }
            if let Ok(back) = decode(&bytes) {
                decoded += 1;
                // What decodes encodes and decodes back to the same response.
                let again = encode(back.status, &back.headers, |_| true, &back.body).unwrap();
                assert_eq!(decode(&again), Ok(back));
            }
        }
        assert!(decoded > 0, "some changed values still decode");
    }
}
