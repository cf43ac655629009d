//! The on-disk record format: with its version files (`v1.rs`, `v2.rs`, `v4.rs`), the only
//! module that knows bincode.
//!
//! A stored value is `version | bincode body | crc32c (u32 LE)`. The checksum covers the
//! record's token (its redb key) too, so a value copied under another key is caught. Format 4
//! (written today) has a 1-byte version and bincode's varint integers, with one absolute
//! wall-clock instant per record and the others as deltas from it; formats 1 to 3 (read,
//! never written) have a 4-byte LE version and fixed-width integers. An old version's first
//! byte is 1, 2 or 3 (its other three are zero), so the first byte alone tells them apart.
//! Every value is checked after it is encoded and before it is trusted after a read (pair
//! assertions), so a damaged record is refused instead of replayed.

pub(crate) use crate::base::hash::fnv1a64;
use crate::model::constants::{
    FORMAT_VERSION, FORMAT_VERSION_FIXED_MAX, FORMAT_VERSION_READ_MIN, MARKER_FORMAT_VERSION,
    RECORD_INLINE_BYTES,
};
use crate::model::scope::ScopedKey;
use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use std::fmt;
use std::sync::Arc;

// Each format version's records; format 3's are this module's `Record` itself.
mod v1;
mod v2;
mod v4;

#[cfg(test)]
pub(crate) use v1::encode as encode_v1;
#[cfg(test)]
pub(crate) use v2::encode as encode_v2;

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

/// One key's durable state, as stored under its token. Its derived encoding (with
/// [`config`]) is format 3's body; format 4 writes it through `v4`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Record {
    /// The key and the namespace it lives in (tenant, client, operation; empty: unscoped).
    pub(crate) key: RecordKey,
    /// The request's fingerprint. One whose high 64 bits are zero is a 64-bit fingerprint:
    /// a caller's `u64`, or a version-1 record's FNV-1a of the payload.
    pub(crate) fingerprint: Option<u128>,
    /// Wall-clock instant of the key's first claim, in ms since the epoch; 0: unknown (a
    /// version-1 record).
    pub(crate) first_claimed_wall_ms: u64,
    /// The key's own retention, when its claim or completion chose one; `None`: the
    /// engine's. A completion's `expires_wall_ms` already applies it.
    pub(crate) retention_ms: Option<u64>,
    pub(crate) state: RecordState,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum RecordState {
    InFlight {
        /// Wall-clock end of the lease, in ms since the epoch.
        lease_deadline_wall_ms: u64,
        attempt: u32,
        /// Wall-clock start of this attempt; 0: unknown (a version-1 record).
        attempt_started_wall_ms: u64,
        /// The attempt was ended by its holder's failure (progress kept), not abandoned.
        failed: bool,
        checkpoint: Option<Checkpoint>,
        /// The lease length in ms the current holder was given (its claim's, or its last
        /// extension's or keep-alive renewal's): recovery caps an honoured lease by it.
        /// `None`: unknown (a record of format 1 or 2), read as the engine's lease at reopen.
        lease_ms: Option<u64>,
        /// The claim identity the current holder presented (`ClaimOptions::claim_id`): a
        /// claim presenting it again resumes this lease.
        claim_id: Option<u128>,
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
    pub(crate) scope: KeyBuf,
    pub(crate) fingerprint: Option<u128>,
    pub(crate) first_claimed_wall_ms: u64,
    pub(crate) retention_ms: Option<u64>,
    pub(crate) state: HeadState,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub(crate) enum HeadState {
    InFlight {
        lease_deadline_wall_ms: u64,
        attempt: u32,
        attempt_started_wall_ms: u64,
        failed: bool,
        checkpoint: Option<Checkpoint>,
        lease_ms: Option<u64>,
        claim_id: Option<u128>,
    },
    Completed {
        attempt: u32,
        completed_wall_ms: u64,
        expires_wall_ms: u64,
    },
}

/// A record's key and scope, held as the engine's scoped key (`scope.rs`): inline when it
/// is short, so a claim's record costs no allocation for its key, else sharing the one
/// allocation its call and its lease hold. On disk it is the key, then the scope: two byte
/// blobs, as formats 2 and 3 lay them out (a tuple adds no bytes).
#[derive(Clone)]
pub(crate) struct RecordKey(ScopedKey);

/// Two record keys are equal when their scopes and keys are, what the file holds of them:
/// the scoped encoding is injective, so that is when their scoped keys' bytes are.
impl PartialEq for RecordKey {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl Eq for RecordKey {}

impl RecordKey {
    /// `scoped`, a scoped key the engine built: a copy of its inline bytes, or another
    /// reference to its allocation.
    pub(crate) fn from_scoped(scoped: &ScopedKey) -> Self {
        debug_assert!(
            crate::model::scope::is_scoped(scoped),
            "a record key is a scoped key"
        );
        Self(scoped.clone())
    }

    /// A copy of `scoped`, a scoped key.
    pub(crate) fn copied(scoped: &[u8]) -> Self {
        debug_assert!(
            crate::model::scope::is_scoped(scoped),
            "a record key is a scoped key"
        );
        Self(ScopedKey::copied(scoped))
    }

    /// `key` without a scope (a format-1 record's).
    fn unscoped(key: &[u8]) -> Self {
        Self(ScopedKey::unscoped(key))
    }

    /// The key `key` within `scope`; `None` for a scope past `SCOPE_LEN_MAX`.
    pub(crate) fn from_parts(scope: &[u8], key: &[u8]) -> Option<Self> {
        ScopedKey::new(scope, key).map(Self)
    }

    pub(crate) fn key(&self) -> &[u8] {
        crate::model::scope::split(&self.0).1
    }

    pub(crate) fn scope(&self) -> &[u8] {
        crate::model::scope::split(&self.0).0
    }

    /// The scoped key: the index's name for the key.
    pub(crate) fn scoped(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for RecordKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "RecordKey(key {} bytes, scope {} bytes)",
            self.key().len(),
            self.scope().len()
        )
    }
}

/// Bytes serialized as one length-prefixed blob, borrowed.
struct BytesRef<'a>(&'a [u8]);

impl Serialize for BytesRef<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self.0)
    }
}

impl Serialize for RecordKey {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeTuple;
        let (scope, key) = crate::model::scope::split(&self.0);
        let mut t = s.serialize_tuple(2)?;
        t.serialize_element(&BytesRef(key))?;
        t.serialize_element(&BytesRef(scope))?;
        t.end()
    }
}

impl<'de> Deserialize<'de> for RecordKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyThenScope;
        impl<'de> Visitor<'de> for KeyThenScope {
            type Value = RecordKey;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key, then its scope")
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<RecordKey, A::Error> {
                let key: KeyBuf = seq
                    .next_element()?
                    .ok_or_else(|| de::Error::invalid_length(0, &self))?;
                let scope: KeyBuf = seq
                    .next_element()?
                    .ok_or_else(|| de::Error::invalid_length(1, &self))?;
                RecordKey::from_parts(&scope.0, &key.0).ok_or_else(|| {
                    de::Error::custom(format_args!("scope of {} bytes", scope.0.len()))
                })
            }
        }
        d.deserialize_tuple(2, KeyThenScope)
    }
}

/// Encodes a version-3 record, as the previous format wrote it: the tests' fixture for
/// reading files of format 3.
#[cfg(test)]
pub(crate) fn encode_v3(token: u64, r: &Record) -> Vec<u8> {
    frame(token, 3, r)
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
    // allocation a damaged length prefix could ask for. (Formats 1 to 3, marker rows, and
    // typed responses.)
    bincode::config::standard()
        .with_little_endian()
        .with_fixed_int_encoding()
        .with_limit::<{ 128 << 20 }>()
}

/// Format 4's config: varint integers (a value below 251 takes one byte), the same limit.
fn config_v4() -> impl bincode::config::Config {
    bincode::config::standard()
        .with_little_endian()
        .with_variable_int_encoding()
        .with_limit::<{ 128 << 20 }>()
}

/// The version of formats 1 to 3 and of marker rows: a u32 LE.
const HEADER_LEN: usize = 4;
/// The version of format 4: one byte.
const HEADER_V4_LEN: usize = 1;
const TRAILER_LEN: usize = 4;

// Format 4's version byte must not be the first byte of an older version.
const _: () = assert!(FORMAT_VERSION > FORMAT_VERSION_FIXED_MAX && FORMAT_VERSION <= 0xFF);

/// Encodes `record` stored under `token`, in the current format (the engine queues
/// [`encode_queued`]'s form of the same bytes).
#[cfg(any(test, idemkv_sabotage))]
pub(crate) fn encode(token: u64, record: &Record) -> Vec<u8> {
    let out = frame_v4(token, record);
    debug_assert_eq!(decode(token, &out).as_ref(), Ok(record));
    out
}

/// An encoded record as a queued operation carries it: inline when it fits in
/// [`RECORD_INLINE_BYTES`], so the caller allocates nothing and the writer frees nothing,
/// otherwise on the heap. The bytes are the same either way.
// Large on purpose: boxing the inline variant would be the allocation it exists to avoid.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Encoded {
    Inline {
        len: u8,
        bytes: [u8; RECORD_INLINE_BYTES],
    },
    Heap(Vec<u8>),
}

// The inline length is a `u8`.
const _: () = assert!(RECORD_INLINE_BYTES <= u8::MAX as usize);

impl Encoded {
    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            Encoded::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Encoded::Heap(bytes) => bytes,
        }
    }
}

/// `encode` for the writer's queue: the same bytes, inline when they fit.
pub(crate) fn encode_queued(token: u64, record: &Record) -> Encoded {
    let out = match frame_inline(token, record) {
        Some(inline) => inline,
        None => Encoded::Heap(frame_v4(token, record)),
    };
    debug_assert_eq!(decode(token, out.as_slice()).as_ref(), Ok(record));
    out
}

/// [`frame_v4`] into an inline buffer; `None` if the frame does not fit (the encoder stops
/// at the buffer's end, so a large record costs at most a buffer's worth of wasted work).
fn frame_inline(token: u64, record: &Record) -> Option<Encoded> {
    let mut bytes = [0u8; RECORD_INLINE_BYTES];
    *bytes.first_mut()? = FORMAT_VERSION as u8;
    let body = v4::R4::from(record);
    let n = bincode::serde::encode_into_slice(&body, bytes.get_mut(HEADER_V4_LEN..)?, config_v4())
        .ok()?;
    let end = HEADER_V4_LEN + n;
    let crc = crc32c_token(token, bytes.get(..end)?);
    bytes
        .get_mut(end..end + TRAILER_LEN)?
        .copy_from_slice(&crc.to_le_bytes());
    let len = u8::try_from(end + TRAILER_LEN).ok()?;
    Some(Encoded::Inline { len, bytes })
}

/// `4 | body | crc32c(token, 4 | body)`: a record in format 4.
fn frame_v4(token: u64, record: &Record) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    out.push(FORMAT_VERSION as u8);
    // Encoding into a Vec cannot fail for these types: no maps, no unsized sequences, and
    // the limit is far above the response and checkpoint ceilings enforced before queueing.
    let body = v4::R4::from(record);
    if let Err(e) = bincode::serde::encode_into_std_write(&body, &mut out, config_v4()) {
        unreachable!("record encoding cannot fail: {e}");
    }
    let crc = crc32c_token(token, &out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// `version (u32 LE) | body | crc32c(token, version | body)`, fixed-width: marker rows, and
/// the records of formats 1 to 3 (which only the tests still write).
fn frame<T: Serialize>(token: u64, version: u32, body: &T) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(&version.to_le_bytes());
    // As in `frame_v4`: cannot fail for these types.
    if let Err(e) = bincode::serde::encode_into_std_write(body, &mut out, config()) {
        unreachable!("record encoding cannot fail: {e}");
    }
    let crc = crc32c_token(token, &out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Checks the checksum and version of a value read under `token`; returns the version and
/// the body. The first byte tells format 4 (one byte) from formats 1 to 3 (a u32 LE).
fn verify(token: u64, bytes: &[u8]) -> Result<(u32, &[u8]), DecodeError> {
    if bytes.len() < HEADER_V4_LEN + TRAILER_LEN {
        return Err(DecodeError::TooShort(bytes.len()));
    }
    let (body, trailer) = bytes.split_at(bytes.len() - TRAILER_LEN);
    let stored = u32::from_le_bytes([trailer[0], trailer[1], trailer[2], trailer[3]]);
    let computed = crc32c_token(token, body);
    if stored != computed {
        return Err(DecodeError::Checksum { stored, computed });
    }
    let first = u32::from(body[0]);
    if first == FORMAT_VERSION {
        return Ok((FORMAT_VERSION, &body[HEADER_V4_LEN..]));
    }
    if !(FORMAT_VERSION_READ_MIN..=FORMAT_VERSION_FIXED_MAX).contains(&first) {
        return Err(DecodeError::Version(first));
    }
    let Some(header) = body.get(..HEADER_LEN) else {
        return Err(DecodeError::TooShort(bytes.len()));
    };
    let version = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    if !(FORMAT_VERSION_READ_MIN..=FORMAT_VERSION_FIXED_MAX).contains(&version) {
        return Err(DecodeError::Version(version));
    }
    Ok((version, &body[HEADER_LEN..]))
}

/// Decodes `body` as a `T` with `config`, which must use every byte.
fn decode_whole_with<T: serde::de::DeserializeOwned>(
    body: &[u8],
    config: impl bincode::config::Config,
) -> Result<T, DecodeError> {
    let (value, used): (T, usize) = bincode::serde::decode_from_slice(body, config)
        .map_err(|e| DecodeError::Body(e.to_string()))?;
    if used != body.len() {
        return Err(DecodeError::Body(format!(
            "{} trailing bytes",
            body.len() - used
        )));
    }
    Ok(value)
}

/// Decodes `body` as a `T` of the fixed-width formats, which must use every byte.
fn decode_whole<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, DecodeError> {
    decode_whole_with(body, config())
}

/// Decodes and verifies a value read under `token`, in the current format or a previous
/// one.
pub(crate) fn decode(token: u64, bytes: &[u8]) -> Result<Record, DecodeError> {
    match verify(token, bytes)? {
        (FORMAT_VERSION, body) => {
            decode_whole_with::<v4::Record4>(body, config_v4()).map(Record::from)
        }
        (3, body) => decode_whole(body),
        (2, body) => decode_whole::<v2::Record2>(body).map(Record::from),
        (_, body) => decode_whole::<v1::Record1>(body).map(Record::from),
    }
}

/// Decodes a value without checking its checksum or version: the sabotage of a replay,
/// which the corruption checks must catch.
#[cfg(idemkv_sabotage)]
pub(crate) fn decode_unverified(bytes: &[u8]) -> Result<Record, DecodeError> {
    if bytes.len() < HEADER_V4_LEN + TRAILER_LEN {
        return Err(DecodeError::TooShort(bytes.len()));
    }
    let unchecked = |e: bincode::error::DecodeError| DecodeError::Body(e.to_string());
    if u32::from(bytes[0]) == FORMAT_VERSION {
        let body = &bytes[HEADER_V4_LEN..bytes.len() - TRAILER_LEN];
        return bincode::serde::decode_from_slice::<v4::Record4, _>(body, config_v4())
            .map(|(record, _)| Record::from(record))
            .map_err(unchecked);
    }
    let body = bytes
        .get(HEADER_LEN..bytes.len() - TRAILER_LEN)
        .ok_or(DecodeError::TooShort(bytes.len()))?;
    bincode::serde::decode_from_slice(body, config())
        .map(|(record, _)| record)
        .map_err(unchecked)
}

/// Verifies a whole value but decodes only its head (recovery skips responses).
pub(crate) fn decode_head(token: u64, bytes: &[u8]) -> Result<RecordHead, DecodeError> {
    fn decode_prefix<T: serde::de::DeserializeOwned>(
        body: &[u8],
        config: impl bincode::config::Config,
    ) -> Result<T, DecodeError> {
        match bincode::serde::decode_from_slice(body, config) {
            Ok((head, _)) => Ok(head),
            Err(e) => Err(DecodeError::Body(e.to_string())),
        }
    }
    match verify(token, bytes)? {
        (FORMAT_VERSION, body) => {
            decode_prefix::<v4::Head4>(body, config_v4()).map(RecordHead::from)
        }
        (3, body) => decode_prefix(body, config()),
        (2, body) => decode_prefix::<v2::Head2>(body, config()).map(RecordHead::from),
        (_, body) => decode_prefix::<v1::Head1>(body, config()).map(RecordHead::from),
    }
}

/// A marker row (docs/retention.md, "Markers: the second tier"), stored under the key's
/// keyed hash in the markers table: what is left of a completion after its retention. It
/// holds no key bytes and no response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct MarkerRecord {
    /// The second keyed hash of the key (see `marker.rs`).
    pub(crate) check: u64,
    /// The token of the completion it stands for.
    pub(crate) token: u64,
    pub(crate) attempt: u32,
    pub(crate) fingerprint: Option<u128>,
    pub(crate) completed_wall_ms: u64,
    /// Wall-clock end of the marker, ms since the epoch: the completion's end of retention
    /// plus the marker retention.
    pub(crate) end_wall_ms: u64,
}

/// Encodes a marker row stored under `hash`: `version | body | crc32c(hash, version | body)`,
/// framed as records are (the checksum covers its key, so a row copied under another hash is
/// caught).
pub(crate) fn encode_marker(hash: u64, marker: &MarkerRecord) -> Vec<u8> {
    let out = frame(hash, MARKER_FORMAT_VERSION, marker);
    debug_assert_eq!(decode_marker(hash, &out), Ok(*marker));
    out
}

/// The marker row a completion leaves, from its record stored under `token`: its
/// fingerprint, attempt and completion time, ending `marker_retention_ms` after the record's
/// end of retention. `None` for a value that is not a completion or does not decode (a
/// damaged record leaves no marker: the key is then new, as without markers).
pub(crate) fn marker_of_record(
    token: u64,
    bytes: &[u8],
    check: u64,
    marker_retention_ms: u64,
) -> Option<MarkerRecord> {
    let head = decode_head(token, bytes).ok()?;
    let HeadState::Completed {
        attempt,
        completed_wall_ms,
        expires_wall_ms,
    } = head.state
    else {
        return None;
    };
    Some(MarkerRecord {
        check,
        token,
        attempt,
        fingerprint: head.fingerprint,
        completed_wall_ms,
        end_wall_ms: expires_wall_ms.saturating_add(marker_retention_ms),
    })
}

/// Decodes and verifies a marker row read under `hash`.
pub(crate) fn decode_marker(hash: u64, bytes: &[u8]) -> Result<MarkerRecord, DecodeError> {
    if bytes.len() < HEADER_LEN + TRAILER_LEN {
        return Err(DecodeError::TooShort(bytes.len()));
    }
    let (body, trailer) = bytes.split_at(bytes.len() - TRAILER_LEN);
    let stored = u32::from_le_bytes([trailer[0], trailer[1], trailer[2], trailer[3]]);
    let computed = crc32c_token(hash, body);
    if stored != computed {
        return Err(DecodeError::Checksum { stored, computed });
    }
    let version = u32::from_le_bytes([body[0], body[1], body[2], body[3]]);
    if version != MARKER_FORMAT_VERSION {
        return Err(DecodeError::Version(version));
    }
    decode_whole(&body[HEADER_LEN..])
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

/// CRC-32C of `bytes`.
#[cfg(test)]
pub(crate) fn crc32c(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// CRC-32C of the token (8 bytes LE) followed by `body`: the checksum of a stored value.
fn crc32c_token(token: u64, body: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&token.to_le_bytes()), body)
}

#[cfg(test)]
mod tests;
