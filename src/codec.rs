//! The on-disk record format: the only module that knows bincode.
//!
//! A stored value is `version (u32 LE) | bincode body | crc32c (u32 LE)`. The checksum covers
//! the record's token (its redb key) too, so a value copied under another key is caught.
//! Every value is checked after it is encoded and before it is trusted after a read (pair
//! assertions), so a damaged record is refused instead of replayed.

use crate::constants::FORMAT_VERSION;
use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use std::fmt;
use std::sync::Arc;

/// Bytes that serialize as one length-prefixed blob, not element by element.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Blob(pub(crate) Arc<[u8]>);

impl fmt::Debug for Blob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Blob({} bytes)", self.0.len())
    }
}

impl Serialize for Blob {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for Blob {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_byte_buf(BytesVisitor::<Arc<[u8]>>::default())
            .map(Blob)
    }
}

/// Reads one length-prefixed byte blob into any owned byte container.
struct BytesVisitor<T>(std::marker::PhantomData<T>);

impl<T> Default for BytesVisitor<T> {
    fn default() -> Self {
        Self(std::marker::PhantomData)
    }
}

impl<'de, T: for<'a> From<&'a [u8]> + From<Vec<u8>>> Visitor<'de> for BytesVisitor<T> {
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("bytes")
    }
    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<T, E> {
        Ok(T::from(v))
    }
    fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<T, E> {
        Ok(T::from(v))
    }
}

/// Progress a holder saved so that a takeover can resume instead of restarting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub(crate) phase: u32,
    pub(crate) data: Blob,
}

impl Checkpoint {
    /// A checkpoint of `phase` (the caller's step number) with its payload.
    pub fn new(phase: u32, data: &[u8]) -> Self {
        Self {
            phase,
            data: Blob(Arc::from(data)),
        }
    }

    /// The caller's step number.
    pub fn phase(&self) -> u32 {
        self.phase
    }

    /// The saved payload.
    pub fn data(&self) -> &[u8] {
        &self.data.0
    }
}

/// One key's durable state, as stored under its token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Record {
    pub(crate) key: Blob,
    pub(crate) fingerprint: Option<u64>,
    pub(crate) state: RecordState,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum RecordState {
    InFlight {
        /// Wall-clock end of the lease, in ms since the epoch.
        lease_deadline_wall_ms: u64,
        attempt: u32,
        checkpoint: Option<Checkpoint>,
    },
    /// The response comes last, so that recovery can decode the head and skip it.
    Completed {
        attempt: u32,
        completed_wall_ms: u64,
        /// Wall-clock end of retention, in ms since the epoch.
        expires_wall_ms: u64,
        response: Blob,
    },
}

/// A record without its response: what recovery needs to rebuild the index. Its fields
/// are a prefix of [`Record`]'s encoding, so it decodes from the same bytes.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub(crate) struct RecordHead {
    pub(crate) key: KeyBuf,
    pub(crate) fingerprint: Option<u64>,
    pub(crate) state: HeadState,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub(crate) enum HeadState {
    InFlight {
        lease_deadline_wall_ms: u64,
        attempt: u32,
        checkpoint: Option<Checkpoint>,
    },
    Completed {
        attempt: u32,
        completed_wall_ms: u64,
        expires_wall_ms: u64,
    },
}

/// Key bytes decoded straight into the box the index keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyBuf(pub(crate) Box<[u8]>);

impl<'de> Deserialize<'de> for KeyBuf {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_byte_buf(BytesVisitor::<Box<[u8]>>::default())
            .map(KeyBuf)
    }
}

/// Why a stored value could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DecodeError {
    TooShort(usize),
    Checksum { stored: u32, computed: u32 },
    Version(u32),
    Body(String),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::TooShort(n) => write!(f, "record of {n} bytes is too short"),
            DecodeError::Checksum { stored, computed } => write!(
                f,
                "checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
            ),
            DecodeError::Version(v) => write!(f, "unknown record version {v}"),
            DecodeError::Body(e) => write!(f, "undecodable record body: {e}"),
        }
    }
}

fn config() -> impl bincode::config::Config {
    // Fixed-width integers keep the encoding independent of values, and a limit bounds the
    // allocation a damaged length prefix could ask for.
    bincode::config::standard()
        .with_little_endian()
        .with_fixed_int_encoding()
        .with_limit::<{ 128 << 20 }>()
}

const HEADER_LEN: usize = 4;
const TRAILER_LEN: usize = 4;

/// Encodes `record` stored under `token`.
pub(crate) fn encode(token: u64, record: &Record) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + record.key.0.len() + response_len(record));
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    // Encoding into a Vec cannot fail for these types: no maps, no unsized sequences, and
    // the limit is far above the response and checkpoint ceilings enforced before queueing.
    if let Err(e) = bincode::serde::encode_into_std_write(record, &mut out, config()) {
        unreachable!("record encoding cannot fail: {e}");
    }
    let crc = crc32c_token(token, &out);
    out.extend_from_slice(&crc.to_le_bytes());
    debug_assert_eq!(decode(token, &out).as_ref(), Ok(record));
    out
}

/// Checks the checksum and version of a value read under `token`; returns the body.
fn verify(token: u64, bytes: &[u8]) -> Result<&[u8], DecodeError> {
    if bytes.len() < HEADER_LEN + TRAILER_LEN {
        return Err(DecodeError::TooShort(bytes.len()));
    }
    let (body, trailer) = bytes.split_at(bytes.len() - TRAILER_LEN);
    let stored = u32::from_le_bytes([trailer[0], trailer[1], trailer[2], trailer[3]]);
    let computed = crc32c_token(token, body);
    if stored != computed {
        return Err(DecodeError::Checksum { stored, computed });
    }
    let version = u32::from_le_bytes([body[0], body[1], body[2], body[3]]);
    if version != FORMAT_VERSION {
        return Err(DecodeError::Version(version));
    }
    Ok(&body[HEADER_LEN..])
}

/// Decodes and verifies a value read under `token`.
pub(crate) fn decode(token: u64, bytes: &[u8]) -> Result<Record, DecodeError> {
    let body = verify(token, bytes)?;
    let (record, used): (Record, usize) = bincode::serde::decode_from_slice(body, config())
        .map_err(|e| DecodeError::Body(e.to_string()))?;
    if used != body.len() {
        return Err(DecodeError::Body(format!(
            "{} trailing bytes",
            body.len() - used
        )));
    }
    Ok(record)
}

/// Decodes a value without checking its checksum or version: the sabotage of a replay,
/// which the corruption checks must catch.
#[cfg(idemkv_sabotage)]
pub(crate) fn decode_unverified(bytes: &[u8]) -> Result<Record, DecodeError> {
    if bytes.len() < HEADER_LEN + TRAILER_LEN {
        return Err(DecodeError::TooShort(bytes.len()));
    }
    let body = &bytes[HEADER_LEN..bytes.len() - TRAILER_LEN];
    bincode::serde::decode_from_slice(body, config())
        .map(|(record, _)| record)
        .map_err(|e| DecodeError::Body(e.to_string()))
}

/// Verifies a whole value but decodes only its head (recovery skips responses).
pub(crate) fn decode_head(token: u64, bytes: &[u8]) -> Result<RecordHead, DecodeError> {
    let body = verify(token, bytes)?;
    let (head, _): (RecordHead, usize) = bincode::serde::decode_from_slice(body, config())
        .map_err(|e| DecodeError::Body(e.to_string()))?;
    Ok(head)
}

/// Encodes a typed response for [`crate::Engine::run_typed`].
pub(crate) fn encode_value<T: Serialize>(value: &T) -> Result<Vec<u8>, String> {
    bincode::serde::encode_to_vec(value, config()).map_err(|e| e.to_string())
}

/// Decodes a typed response for [`crate::Engine::run_typed`].
pub(crate) fn decode_value<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    let (value, used) =
        bincode::serde::decode_from_slice(bytes, config()).map_err(|e| e.to_string())?;
    if used != bytes.len() {
        return Err(format!("{} trailing bytes", bytes.len() - used));
    }
    Ok(value)
}

fn response_len(record: &Record) -> usize {
    match &record.state {
        RecordState::Completed { response, .. } => response.0.len(),
        RecordState::InFlight { checkpoint, .. } => {
            checkpoint.as_ref().map_or(0, |c| c.data.0.len())
        }
    }
}

/// CRC-32C of `bytes`.
#[cfg(test)]
pub(crate) fn crc32c(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// CRC-32C of the token (8 bytes LE) followed by `body`: the checksum of a stored value.
fn crc32c_token(token: u64, body: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&token.to_le_bytes()), body)
}

/// A stable 64-bit FNV-1a hash, used for request fingerprints. Stable across versions and
/// platforms because fingerprints are persisted.
pub(crate) fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Record {
        Record {
            key: Blob(Arc::from(&b"order-42"[..])),
            fingerprint: Some(7),
            state: RecordState::Completed {
                attempt: 2,
                completed_wall_ms: 10,
                expires_wall_ms: 20,
                response: Blob(Arc::from(&b"charged"[..])),
            },
        }
    }

    #[test]
    fn crc32c_known_vector() {
        // RFC 3720 test vector.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn head_decodes_from_full_record() {
        let r = sample();
        let head = decode_head(5, &encode(5, &r)).unwrap();
        assert_eq!(&*head.key.0, &*r.key.0);
        assert_eq!(head.fingerprint, Some(7));
        assert_eq!(
            head.state,
            HeadState::Completed {
                attempt: 2,
                completed_wall_ms: 10,
                expires_wall_ms: 20
            }
        );
        let inflight = Record {
            key: Blob(Arc::from(&b"k"[..])),
            fingerprint: None,
            state: RecordState::InFlight {
                lease_deadline_wall_ms: 9,
                attempt: 3,
                checkpoint: Some(Checkpoint::new(4, b"cp")),
            },
        };
        let head = decode_head(6, &encode(6, &inflight)).unwrap();
        assert_eq!(
            head.state,
            HeadState::InFlight {
                lease_deadline_wall_ms: 9,
                attempt: 3,
                checkpoint: Some(Checkpoint::new(4, b"cp"))
            }
        );
    }

    #[test]
    fn round_trip() {
        let r = sample();
        let bytes = encode(5, &r);
        assert_eq!(decode(5, &bytes), Ok(r));
    }

    #[test]
    fn every_single_byte_flip_is_detected() {
        let bytes = encode(5, &sample());
        for i in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[i] ^= 0x40;
            assert!(decode(5, &damaged).is_err(), "flip at {i} not detected");
        }
    }

    #[test]
    fn value_under_another_token_is_refused() {
        let bytes = encode(5, &sample());
        assert!(matches!(
            decode(6, &bytes),
            Err(DecodeError::Checksum { .. })
        ));
    }

    #[test]
    fn truncated_values_are_refused() {
        let bytes = encode(5, &sample());
        for n in 0..bytes.len() {
            assert!(decode(5, &bytes[..n]).is_err());
        }
    }
}
