//! The on-disk record format: the only module that knows bincode.
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

/// A record's key and scope, held as the engine's scoped key (`scope.rs`): a claim's
/// records share the one allocation its call and its lease hold. On disk it is the key, then
/// the scope: two byte blobs, as formats 2 and 3 lay them out (a tuple adds no bytes).
#[derive(Clone)]
pub(crate) struct RecordKey(Arc<[u8]>);

/// Two record keys are equal when their scopes and keys are, what the file holds of them:
/// the scoped encoding is injective, so that is when their scoped keys' bytes are.
impl PartialEq for RecordKey {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl Eq for RecordKey {}

impl RecordKey {
    /// Shares `scoped`, a scoped key the engine built (`scope::scoped_shared`).
    pub(crate) fn shared(scoped: &Arc<[u8]>) -> Self {
        debug_assert!(
            crate::model::scope::is_scoped(scoped),
            "a record key is a scoped key"
        );
        Self(Arc::clone(scoped))
    }

    /// A copy of `scoped`, a scoped key.
    pub(crate) fn copied(scoped: &[u8]) -> Self {
        debug_assert!(
            crate::model::scope::is_scoped(scoped),
            "a record key is a scoped key"
        );
        Self(Arc::from(scoped))
    }

    /// `key` without a scope (a format-1 record's).
    fn unscoped(key: &[u8]) -> Self {
        Self(crate::model::scope::unscoped_shared(key))
    }

    /// The key `key` within `scope`; `None` for a scope past `SCOPE_LEN_MAX`.
    pub(crate) fn from_parts(scope: &[u8], key: &[u8]) -> Option<Self> {
        crate::model::scope::scoped_shared(scope, key).map(Self)
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

/// The records of format version 1, read (never written) so that files written by an older
/// format keep working; each converts to its version-3 form.
mod v1 {
    use super::{Blob, Checkpoint, HeadState, KeyBuf, Record, RecordHead, RecordKey, RecordState};
    use serde::Deserialize;

    #[derive(Deserialize)]
    pub(super) struct Record1 {
        key: Blob,
        fingerprint: Option<u64>,
        state: State1,
    }

    #[derive(Deserialize)]
    enum State1 {
        InFlight {
            lease_deadline_wall_ms: u64,
            attempt: u32,
            checkpoint: Option<Checkpoint>,
        },
        Completed {
            attempt: u32,
            completed_wall_ms: u64,
            expires_wall_ms: u64,
            response: Blob,
        },
    }

    #[derive(Deserialize)]
    pub(super) struct Head1 {
        key: KeyBuf,
        fingerprint: Option<u64>,
        state: HeadState1,
    }

    #[derive(Deserialize)]
    enum HeadState1 {
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

    impl From<Record1> for Record {
        fn from(r: Record1) -> Self {
            let state = match r.state {
                State1::InFlight {
                    lease_deadline_wall_ms,
                    attempt,
                    checkpoint,
                } => RecordState::InFlight {
                    lease_deadline_wall_ms,
                    attempt,
                    attempt_started_wall_ms: 0,
                    failed: false,
                    checkpoint,
                    lease_ms: None,
                    claim_id: None,
                },
                State1::Completed {
                    attempt,
                    completed_wall_ms,
                    expires_wall_ms,
                    response,
                } => RecordState::Completed {
                    attempt,
                    completed_wall_ms,
                    expires_wall_ms,
                    response,
                },
            };
            Record {
                key: RecordKey::unscoped(&r.key.0),
                fingerprint: r.fingerprint.map(u128::from),
                first_claimed_wall_ms: 0,
                retention_ms: None,
                state,
            }
        }
    }

    impl From<Head1> for RecordHead {
        fn from(h: Head1) -> Self {
            let state = match h.state {
                HeadState1::InFlight {
                    lease_deadline_wall_ms,
                    attempt,
                    checkpoint,
                } => HeadState::InFlight {
                    lease_deadline_wall_ms,
                    attempt,
                    attempt_started_wall_ms: 0,
                    failed: false,
                    checkpoint,
                    lease_ms: None,
                    claim_id: None,
                },
                HeadState1::Completed {
                    attempt,
                    completed_wall_ms,
                    expires_wall_ms,
                } => HeadState::Completed {
                    attempt,
                    completed_wall_ms,
                    expires_wall_ms,
                },
            };
            RecordHead {
                key: h.key,
                scope: KeyBuf(Box::default()),
                fingerprint: h.fingerprint.map(u128::from),
                first_claimed_wall_ms: 0,
                retention_ms: None,
                state,
            }
        }
    }

    /// Encodes a version-1 record, as the previous format wrote it: the tests' fixture
    /// for reading old files.
    #[cfg(test)]
    pub(crate) fn encode(token: u64, r: &Record) -> Vec<u8> {
        #[derive(serde::Serialize)]
        struct R1<'a> {
            key: &'a Blob,
            fingerprint: Option<u64>,
            state: S1<'a>,
        }
        #[derive(serde::Serialize)]
        enum S1<'a> {
            InFlight {
                lease_deadline_wall_ms: u64,
                attempt: u32,
                checkpoint: &'a Option<Checkpoint>,
            },
            Completed {
                attempt: u32,
                completed_wall_ms: u64,
                expires_wall_ms: u64,
                response: &'a Blob,
            },
        }
        let state = match &r.state {
            RecordState::InFlight {
                lease_deadline_wall_ms,
                attempt,
                checkpoint,
                ..
            } => S1::InFlight {
                lease_deadline_wall_ms: *lease_deadline_wall_ms,
                attempt: *attempt,
                checkpoint,
            },
            RecordState::Completed {
                attempt,
                completed_wall_ms,
                expires_wall_ms,
                response,
            } => S1::Completed {
                attempt: *attempt,
                completed_wall_ms: *completed_wall_ms,
                expires_wall_ms: *expires_wall_ms,
                response,
            },
        };
        let key = Blob(std::sync::Arc::from(r.key.key()));
        let body = R1 {
            key: &key,
            // A version-1 fingerprint is 64 bits wide.
            fingerprint: r.fingerprint.map(|f| f as u64),
            state,
        };
        super::frame(token, 1, &body)
    }
}

#[cfg(test)]
pub(crate) use v1::encode as encode_v1;

/// The records of format version 2, read (never written) so that files written by the
/// previous format keep working; each converts to its version-3 form, the InFlight fields
/// version 3 added unknown (`lease_ms` and `claim_id` are `None`: an honoured lease is then
/// capped by the engine's lease at reopen, and no claim resumes it).
mod v2 {
    use super::{Blob, Checkpoint, HeadState, KeyBuf, Record, RecordHead, RecordKey, RecordState};
    use serde::Deserialize;

    #[derive(Deserialize)]
    pub(super) struct Record2 {
        key: RecordKey,
        fingerprint: Option<u128>,
        first_claimed_wall_ms: u64,
        retention_ms: Option<u64>,
        state: State2,
    }

    #[derive(Deserialize)]
    enum State2 {
        InFlight {
            lease_deadline_wall_ms: u64,
            attempt: u32,
            attempt_started_wall_ms: u64,
            failed: bool,
            checkpoint: Option<Checkpoint>,
        },
        Completed {
            attempt: u32,
            completed_wall_ms: u64,
            expires_wall_ms: u64,
            response: Blob,
        },
    }

    #[derive(Deserialize)]
    pub(super) struct Head2 {
        key: KeyBuf,
        scope: KeyBuf,
        fingerprint: Option<u128>,
        first_claimed_wall_ms: u64,
        retention_ms: Option<u64>,
        state: HeadState2,
    }

    #[derive(Deserialize)]
    enum HeadState2 {
        InFlight {
            lease_deadline_wall_ms: u64,
            attempt: u32,
            attempt_started_wall_ms: u64,
            failed: bool,
            checkpoint: Option<Checkpoint>,
        },
        Completed {
            attempt: u32,
            completed_wall_ms: u64,
            expires_wall_ms: u64,
        },
    }

    impl From<Record2> for Record {
        fn from(r: Record2) -> Self {
            let state = match r.state {
                State2::InFlight {
                    lease_deadline_wall_ms,
                    attempt,
                    attempt_started_wall_ms,
                    failed,
                    checkpoint,
                } => RecordState::InFlight {
                    lease_deadline_wall_ms,
                    attempt,
                    attempt_started_wall_ms,
                    failed,
                    checkpoint,
                    lease_ms: None,
                    claim_id: None,
                },
                State2::Completed {
                    attempt,
                    completed_wall_ms,
                    expires_wall_ms,
                    response,
                } => RecordState::Completed {
                    attempt,
                    completed_wall_ms,
                    expires_wall_ms,
                    response,
                },
            };
            Record {
                key: r.key,
                fingerprint: r.fingerprint,
                first_claimed_wall_ms: r.first_claimed_wall_ms,
                retention_ms: r.retention_ms,
                state,
            }
        }
    }

    impl From<Head2> for RecordHead {
        fn from(h: Head2) -> Self {
            let state = match h.state {
                HeadState2::InFlight {
                    lease_deadline_wall_ms,
                    attempt,
                    attempt_started_wall_ms,
                    failed,
                    checkpoint,
                } => HeadState::InFlight {
                    lease_deadline_wall_ms,
                    attempt,
                    attempt_started_wall_ms,
                    failed,
                    checkpoint,
                    lease_ms: None,
                    claim_id: None,
                },
                HeadState2::Completed {
                    attempt,
                    completed_wall_ms,
                    expires_wall_ms,
                } => HeadState::Completed {
                    attempt,
                    completed_wall_ms,
                    expires_wall_ms,
                },
            };
            RecordHead {
                key: h.key,
                scope: h.scope,
                fingerprint: h.fingerprint,
                first_claimed_wall_ms: h.first_claimed_wall_ms,
                retention_ms: h.retention_ms,
                state,
            }
        }
    }

    /// Encodes a version-2 record, as the previous format wrote it: the tests' fixture for
    /// reading old files.
    #[cfg(test)]
    pub(crate) fn encode(token: u64, r: &Record) -> Vec<u8> {
        #[derive(serde::Serialize)]
        struct R2<'a> {
            key: &'a RecordKey,
            fingerprint: Option<u128>,
            first_claimed_wall_ms: u64,
            retention_ms: Option<u64>,
            state: S2<'a>,
        }
        #[derive(serde::Serialize)]
        enum S2<'a> {
            InFlight {
                lease_deadline_wall_ms: u64,
                attempt: u32,
                attempt_started_wall_ms: u64,
                failed: bool,
                checkpoint: &'a Option<Checkpoint>,
            },
            Completed {
                attempt: u32,
                completed_wall_ms: u64,
                expires_wall_ms: u64,
                response: &'a Blob,
            },
        }
        let state = match &r.state {
            RecordState::InFlight {
                lease_deadline_wall_ms,
                attempt,
                attempt_started_wall_ms,
                failed,
                checkpoint,
                ..
            } => S2::InFlight {
                lease_deadline_wall_ms: *lease_deadline_wall_ms,
                attempt: *attempt,
                attempt_started_wall_ms: *attempt_started_wall_ms,
                failed: *failed,
                checkpoint,
            },
            RecordState::Completed {
                attempt,
                completed_wall_ms,
                expires_wall_ms,
                response,
            } => S2::Completed {
                attempt: *attempt,
                completed_wall_ms: *completed_wall_ms,
                expires_wall_ms: *expires_wall_ms,
                response,
            },
        };
        let body = R2 {
            key: &r.key,
            fingerprint: r.fingerprint,
            first_claimed_wall_ms: r.first_claimed_wall_ms,
            retention_ms: r.retention_ms,
            state,
        };
        super::frame(token, 2, &body)
    }
}

#[cfg(test)]
pub(crate) use v2::encode as encode_v2;

/// Encodes a version-3 record, as the previous format wrote it: the tests' fixture for
/// reading files of format 3.
#[cfg(test)]
pub(crate) fn encode_v3(token: u64, r: &Record) -> Vec<u8> {
    frame(token, 3, r)
}

/// The records of format version 4: varint integers (bincode's `standard` config), and
/// wall-clock instants as deltas where that pays. `first_claimed_wall_ms` is the record's
/// one absolute instant (8 bytes LE: a varint of a ms timestamp takes 9); every other
/// instant is the wrapping difference from an earlier one, zigzag-encoded (a wall clock may
/// step back), so every `u64` round-trips exactly:
/// - completed: from first claimed; expires: from completed (the retention);
/// - attempt started: from first claimed; lease deadline: from attempt started.
///
/// The head's fields are a prefix of the record's (the response comes last), so recovery
/// decodes the head from the same bytes.
mod v4 {
    use super::{Blob, Checkpoint, HeadState, KeyBuf, Record, RecordHead, RecordKey, RecordState};
    use serde::{Deserialize, Serialize};

    /// `to - from` as a zigzag-encoded signed delta.
    fn delta(from: u64, to: u64) -> i64 {
        to.wrapping_sub(from) as i64
    }

    /// The instant `delta` after `from` (the inverse of [`delta`]).
    fn after(from: u64, delta: i64) -> u64 {
        from.wrapping_add(delta as u64)
    }

    /// An InFlight state's instants from its deltas: the attempt's start is relative to the
    /// first claim, the lease deadline to the attempt's start (as `R4` writes them).
    /// Returns `(attempt_started_wall_ms, lease_deadline_wall_ms)`.
    fn attempt_instants(first: u64, started_delta_ms: i64, deadline_delta_ms: i64) -> (u64, u64) {
        let started = after(first, started_delta_ms);
        (started, after(started, deadline_delta_ms))
    }

    /// A completion's instants from its deltas: the completion is relative to the first
    /// claim, the expiry to the completion. Returns `(completed_wall_ms, expires_wall_ms)`.
    fn completion_instants(
        first: u64,
        completed_delta_ms: i64,
        expires_delta_ms: i64,
    ) -> (u64, u64) {
        let completed = after(first, completed_delta_ms);
        (completed, after(completed, expires_delta_ms))
    }

    #[derive(Serialize)]
    pub(super) struct R4<'a> {
        key: &'a RecordKey,
        fingerprint: Option<u128>,
        first_claimed_wall_ms: [u8; 8],
        retention_ms: Option<u64>,
        state: S4<'a>,
    }

    #[derive(Serialize)]
    enum S4<'a> {
        InFlight {
            lease_deadline_delta_ms: i64,
            attempt: u32,
            attempt_started_delta_ms: i64,
            failed: bool,
            checkpoint: &'a Option<Checkpoint>,
            lease_ms: Option<u64>,
            claim_id: Option<u128>,
        },
        Completed {
            attempt: u32,
            completed_delta_ms: i64,
            expires_delta_ms: i64,
            response: &'a Blob,
        },
    }

    impl<'a> From<&'a Record> for R4<'a> {
        fn from(r: &'a Record) -> Self {
            let first = r.first_claimed_wall_ms;
            let state = match &r.state {
                RecordState::InFlight {
                    lease_deadline_wall_ms,
                    attempt,
                    attempt_started_wall_ms,
                    failed,
                    checkpoint,
                    lease_ms,
                    claim_id,
                } => S4::InFlight {
                    lease_deadline_delta_ms: delta(
                        *attempt_started_wall_ms,
                        *lease_deadline_wall_ms,
                    ),
                    attempt: *attempt,
                    attempt_started_delta_ms: delta(first, *attempt_started_wall_ms),
                    failed: *failed,
                    checkpoint,
                    lease_ms: *lease_ms,
                    claim_id: *claim_id,
                },
                RecordState::Completed {
                    attempt,
                    completed_wall_ms,
                    expires_wall_ms,
                    response,
                } => S4::Completed {
                    attempt: *attempt,
                    completed_delta_ms: delta(first, *completed_wall_ms),
                    expires_delta_ms: delta(*completed_wall_ms, *expires_wall_ms),
                    response,
                },
            };
            R4 {
                key: &r.key,
                fingerprint: r.fingerprint,
                first_claimed_wall_ms: first.to_le_bytes(),
                retention_ms: r.retention_ms,
                state,
            }
        }
    }

    #[derive(Deserialize)]
    pub(super) struct Record4 {
        key: RecordKey,
        fingerprint: Option<u128>,
        first_claimed_wall_ms: [u8; 8],
        retention_ms: Option<u64>,
        state: State4,
    }

    #[derive(Deserialize)]
    enum State4 {
        InFlight {
            lease_deadline_delta_ms: i64,
            attempt: u32,
            attempt_started_delta_ms: i64,
            failed: bool,
            checkpoint: Option<Checkpoint>,
            lease_ms: Option<u64>,
            claim_id: Option<u128>,
        },
        Completed {
            attempt: u32,
            completed_delta_ms: i64,
            expires_delta_ms: i64,
            response: Blob,
        },
    }

    #[derive(Deserialize)]
    pub(super) struct Head4 {
        key: KeyBuf,
        scope: KeyBuf,
        fingerprint: Option<u128>,
        first_claimed_wall_ms: [u8; 8],
        retention_ms: Option<u64>,
        state: HeadState4,
    }

    #[derive(Deserialize)]
    enum HeadState4 {
        InFlight {
            lease_deadline_delta_ms: i64,
            attempt: u32,
            attempt_started_delta_ms: i64,
            failed: bool,
            checkpoint: Option<Checkpoint>,
            lease_ms: Option<u64>,
            claim_id: Option<u128>,
        },
        Completed {
            attempt: u32,
            completed_delta_ms: i64,
            expires_delta_ms: i64,
        },
    }

    impl From<Record4> for Record {
        fn from(r: Record4) -> Self {
            let first = u64::from_le_bytes(r.first_claimed_wall_ms);
            let state = match r.state {
                State4::InFlight {
                    lease_deadline_delta_ms,
                    attempt,
                    attempt_started_delta_ms,
                    failed,
                    checkpoint,
                    lease_ms,
                    claim_id,
                } => {
                    let (started, deadline) =
                        attempt_instants(first, attempt_started_delta_ms, lease_deadline_delta_ms);
                    RecordState::InFlight {
                        lease_deadline_wall_ms: deadline,
                        attempt,
                        attempt_started_wall_ms: started,
                        failed,
                        checkpoint,
                        lease_ms,
                        claim_id,
                    }
                }
                State4::Completed {
                    attempt,
                    completed_delta_ms,
                    expires_delta_ms,
                    response,
                } => {
                    let (completed, expires) =
                        completion_instants(first, completed_delta_ms, expires_delta_ms);
                    RecordState::Completed {
                        attempt,
                        completed_wall_ms: completed,
                        expires_wall_ms: expires,
                        response,
                    }
                }
            };
            Record {
                key: r.key,
                fingerprint: r.fingerprint,
                first_claimed_wall_ms: first,
                retention_ms: r.retention_ms,
                state,
            }
        }
    }

    impl From<Head4> for RecordHead {
        fn from(h: Head4) -> Self {
            let first = u64::from_le_bytes(h.first_claimed_wall_ms);
            let state = match h.state {
                HeadState4::InFlight {
                    lease_deadline_delta_ms,
                    attempt,
                    attempt_started_delta_ms,
                    failed,
                    checkpoint,
                    lease_ms,
                    claim_id,
                } => {
                    let (started, deadline) =
                        attempt_instants(first, attempt_started_delta_ms, lease_deadline_delta_ms);
                    HeadState::InFlight {
                        lease_deadline_wall_ms: deadline,
                        attempt,
                        attempt_started_wall_ms: started,
                        failed,
                        checkpoint,
                        lease_ms,
                        claim_id,
                    }
                }
                HeadState4::Completed {
                    attempt,
                    completed_delta_ms,
                    expires_delta_ms,
                } => {
                    let (completed, expires) =
                        completion_instants(first, completed_delta_ms, expires_delta_ms);
                    HeadState::Completed {
                        attempt,
                        completed_wall_ms: completed,
                        expires_wall_ms: expires,
                    }
                }
            };
            RecordHead {
                key: h.key,
                scope: h.scope,
                fingerprint: h.fingerprint,
                first_claimed_wall_ms: first,
                retention_ms: h.retention_ms,
                state,
            }
        }
    }
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

/// [`encode`] for the writer's queue: the same bytes, inline when they fit.
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
mod tests {
    use super::*;

    fn sample() -> Record {
        Record {
            key: RecordKey::from_parts(b"tenant-7", b"order-42").expect("a short scope"),
            fingerprint: Some(7 << 64 | 3),
            first_claimed_wall_ms: 4,
            retention_ms: Some(30_000),
            state: RecordState::Completed {
                attempt: 2,
                completed_wall_ms: 10,
                expires_wall_ms: 20,
                response: Blob(Arc::from(&b"charged"[..])),
            },
        }
    }

    /// A completion whose encoding is `len` bytes long.
    fn completion_of_len(len: usize) -> Record {
        let base = encode(5, &sample()).len() - b"charged".len();
        Record {
            state: RecordState::Completed {
                attempt: 2,
                completed_wall_ms: 10,
                expires_wall_ms: 20,
                response: Blob(Arc::from(vec![b'r'; len - base])),
            },
            ..sample()
        }
    }

    #[test]
    fn a_queued_record_is_the_same_bytes_inline_up_to_the_limit_and_on_the_heap_past_it() {
        let sample_len = encode(5, &sample()).len();
        for len in [sample_len, RECORD_INLINE_BYTES - 1, RECORD_INLINE_BYTES] {
            let r = completion_of_len(len);
            let queued = encode_queued(5, &r);
            assert!(matches!(queued, Encoded::Inline { .. }), "{len} bytes fit");
            assert_eq!(queued.as_slice(), encode(5, &r).as_slice());
            assert_eq!(queued.as_slice().len(), len);
            assert_eq!(decode(5, queued.as_slice()).unwrap(), r);
        }
        for len in [RECORD_INLINE_BYTES + 1, 4096] {
            let r = completion_of_len(len);
            let queued = encode_queued(5, &r);
            assert!(matches!(queued, Encoded::Heap(_)), "{len} bytes do not fit");
            assert_eq!(queued.as_slice(), encode(5, &r).as_slice());
        }
        // An InFlight record fits as well.
        let inflight = inflight();
        let queued = encode_queued(9, &inflight);
        assert!(matches!(queued, Encoded::Inline { .. }));
        assert_eq!(queued.as_slice(), encode(9, &inflight).as_slice());
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
        assert_eq!(&*head.key.0, r.key.key());
        assert_eq!(&*head.scope.0, r.key.scope());
        assert_eq!(head.fingerprint, Some(7 << 64 | 3));
        assert_eq!(head.first_claimed_wall_ms, 4);
        assert_eq!(head.retention_ms, Some(30_000));
        assert_eq!(
            head.state,
            HeadState::Completed {
                attempt: 2,
                completed_wall_ms: 10,
                expires_wall_ms: 20
            }
        );
        let head = decode_head(6, &encode(6, &inflight())).unwrap();
        assert_eq!(
            head.state,
            HeadState::InFlight {
                lease_deadline_wall_ms: 9,
                attempt: 3,
                attempt_started_wall_ms: 8,
                failed: true,
                checkpoint: Some(Checkpoint::new(4, b"cp")),
                lease_ms: Some(600_000),
                claim_id: Some(0xC1A1 << 64 | 0x1D),
            }
        );
    }

    fn inflight() -> Record {
        Record {
            key: RecordKey::from_parts(b"", b"k").expect("no scope"),
            fingerprint: None,
            first_claimed_wall_ms: 2,
            retention_ms: None,
            state: RecordState::InFlight {
                lease_deadline_wall_ms: 9,
                attempt: 3,
                attempt_started_wall_ms: 8,
                failed: true,
                checkpoint: Some(Checkpoint::new(4, b"cp")),
                lease_ms: Some(600_000),
                claim_id: Some(0xC1A1 << 64 | 0x1D),
            },
        }
    }

    /// `r` without what format 3 added: as a record of format 2 reads.
    fn as_v2(r: &Record) -> Record {
        let mut r = r.clone();
        if let RecordState::InFlight {
            lease_ms, claim_id, ..
        } = &mut r.state
        {
            *lease_ms = None;
            *claim_id = None;
        }
        r
    }

    /// A record's key is held as the scoped key but written as format 2 always wrote it:
    /// the key's bytes, then the scope's, each a length-prefixed blob.
    #[test]
    fn a_record_key_is_written_as_the_key_then_the_scope() {
        let long_key = vec![b'k'; 300];
        let long_scope = vec![b's'; crate::model::constants::SCOPE_LEN_MAX];
        for (scope, key) in [
            (&b""[..], &b"order-42"[..]),
            (b"tenant-7", b"order-42"),
            (b"t", b""),
            (&long_scope[..], b"k"),
            (b"tenant-7", &long_key[..]),
        ] {
            let rk = RecordKey::from_parts(scope, key).expect("a scope within the limit");
            assert_eq!((rk.scope(), rk.key()), (scope, key));
            let as_pair = bincode::serde::encode_to_vec(
                (Blob(Arc::from(key)), Blob(Arc::from(scope))),
                config(),
            )
            .expect("encodes");
            let as_key = bincode::serde::encode_to_vec(&rk, config()).expect("encodes");
            assert_eq!(as_key, as_pair);
            let back: (RecordKey, usize) =
                bincode::serde::decode_from_slice(&as_key, config()).expect("decodes");
            assert_eq!(back, (rk, as_key.len()));
        }
        // A stored scope past the limit is a decoding error, not a panic or a wrong key.
        let over = vec![b's'; crate::model::constants::SCOPE_LEN_MAX + 1];
        let bytes = bincode::serde::encode_to_vec(
            (Blob(Arc::from(&b"k"[..])), Blob(Arc::from(&over[..]))),
            config(),
        )
        .expect("encodes");
        let decoded: Result<(RecordKey, usize), _> =
            bincode::serde::decode_from_slice(&bytes, config());
        assert!(decoded.is_err());
    }

    /// What a version-1 record becomes: its fields kept, the new ones at "unknown".
    fn as_v1(r: &Record) -> Record {
        let mut r = as_v2(r);
        r.key = RecordKey::unscoped(r.key.key());
        r.fingerprint = r.fingerprint.map(|f| u128::from(f as u64));
        r.first_claimed_wall_ms = 0;
        r.retention_ms = None;
        if let RecordState::InFlight {
            attempt_started_wall_ms,
            failed,
            ..
        } = &mut r.state
        {
            *attempt_started_wall_ms = 0;
            *failed = false;
        }
        r
    }

    /// Format 2's bytes, as the engine of format 2 wrote them for these two records (a
    /// scoped completion, an unscoped failed InFlight record): the version-2 encoder the
    /// tests keep writes the same bytes, and today's decoder reads them back, the InFlight
    /// record without the fields format 3 added.
    #[test]
    fn format_2_bytes_are_read_as_format_2_wrote_them() {
        #[rustfmt::skip]
        let completed: &[u8] = &[
            2, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 111, 114, 100, 101, 114, 45, 52, 50, 8, 0, 0, 0,
            0, 0, 0, 0, 116, 101, 110, 97, 110, 116, 45, 55, 1, 3, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0,
            0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 1, 48, 117, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2,
            0, 0, 0, 10, 0, 0, 0, 0, 0, 0, 0, 20, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0,
            99, 104, 97, 114, 103, 101, 100, 170, 133, 122, 183,
        ];
        #[rustfmt::skip]
        let inflight_failed: &[u8] = &[
            2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 107, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0,
            0, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0,
            1, 1, 4, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 99, 112, 124, 17, 204, 253,
        ];
        assert_eq!(encode_v2(5, &sample()), completed);
        assert_eq!(decode(5, completed), Ok(sample()));
        assert_eq!(encode_v2(9, &inflight()), inflight_failed);
        assert_eq!(decode(9, inflight_failed), Ok(as_v2(&inflight())));
        let head = decode_head(9, inflight_failed).unwrap();
        assert!(matches!(
            head.state,
            HeadState::InFlight {
                attempt: 3,
                lease_ms: None,
                claim_id: None,
                ..
            }
        ));
        // A completion's body is the same in formats 2 and 3; only the version differs.
        let current = encode_v3(5, &sample());
        assert_eq!(&current[..4], &3u32.to_le_bytes());
        assert_eq!(
            current[4..current.len() - 4],
            completed[4..completed.len() - 4]
        );
    }

    /// Format 3 appends the holder's lease length and claim identity to an InFlight record:
    /// both round-trip, absent or present, in the record and in its head.
    #[test]
    fn format_3_keeps_the_lease_length_and_the_claim_id() {
        for (lease_ms, claim_id) in [
            (None, None),
            (Some(1), Some(u128::MAX)),
            (Some(30_000), None),
        ] {
            let mut r = inflight();
            if let RecordState::InFlight {
                lease_ms: l,
                claim_id: c,
                ..
            } = &mut r.state
            {
                (*l, *c) = (lease_ms, claim_id);
            }
            // Format 4 keeps them as format 3 did.
            for bytes in [encode_v3(9, &r), encode(9, &r)] {
                assert_eq!(decode(9, &bytes).as_ref(), Ok(&r));
                match decode_head(9, &bytes).unwrap().state {
                    HeadState::InFlight {
                        lease_ms: l,
                        claim_id: c,
                        ..
                    } => assert_eq!((l, c), (lease_ms, claim_id)),
                    other => panic!("{other:?}"),
                }
            }
        }
    }

    #[test]
    fn version_2_records_decode_to_their_version_3_form() {
        for r in [sample(), inflight()] {
            let old = encode_v2(11, &r);
            assert_eq!(&old[..4], &2u32.to_le_bytes());
            assert_eq!(decode(11, &old), Ok(as_v2(&r)));
            for i in 0..old.len() {
                let mut damaged = old.clone();
                damaged[i] ^= 0x40;
                assert!(decode(11, &damaged).is_err(), "flip at {i} not detected");
            }
        }
    }

    #[test]
    fn version_1_records_decode_to_their_version_3_form() {
        for r in [sample(), inflight()] {
            let old = encode_v1(11, &r);
            assert_eq!(&old[..4], &1u32.to_le_bytes());
            let want = as_v1(&r);
            assert_eq!(decode(11, &old), Ok(want.clone()));
            let head = decode_head(11, &old).unwrap();
            assert_eq!(&*head.key.0, want.key.key());
            assert!(head.scope.0.is_empty());
            assert_eq!(head.fingerprint, want.fingerprint);
            assert_eq!(head.first_claimed_wall_ms, 0);
            // Re-encoded, an old record is a current one that decodes to the same value.
            let new = encode(11, &want);
            assert_eq!(new[0], FORMAT_VERSION as u8);
            assert_eq!(decode(11, &new), Ok(want));
        }
    }

    #[test]
    fn version_1_records_are_checked_like_current_ones() {
        let old = encode_v1(11, &sample());
        assert!(matches!(
            decode(12, &old),
            Err(DecodeError::Checksum { .. })
        ));
        for i in 0..old.len() {
            let mut damaged = old.clone();
            damaged[i] ^= 0x40;
            assert!(decode(11, &damaged).is_err(), "flip at {i} not detected");
        }
    }

    /// `bytes` (a value under `token`) with its checksum recomputed.
    fn rechecked(token: u64, mut bytes: Vec<u8>) -> Vec<u8> {
        let n = bytes.len();
        bytes.truncate(n - TRAILER_LEN);
        let crc = crc32c_token(token, &bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        bytes
    }

    #[test]
    fn unknown_versions_are_refused() {
        // A valid checksum over an unknown version: refused for the version. An old-style
        // version (a u32 LE) whose first byte is not 1, 2 or 3 is refused for that byte.
        for version in [0u32, 5, u32::MAX] {
            let bytes = rechecked(5, frame(5, version, &sample()));
            assert_eq!(decode(5, &bytes), Err(DecodeError::Version(version & 0xFF)));
        }
        // A first byte of an old format followed by non-zero bytes is no old version.
        let bytes = rechecked(5, frame(5, 0x0100_0003, &sample()));
        assert_eq!(decode(5, &bytes), Err(DecodeError::Version(0x0100_0003)));
        // A one-byte version past the current one.
        for version in [5u8, 0xFF] {
            let mut bytes = encode(5, &sample());
            bytes[0] = version;
            let bytes = rechecked(5, bytes);
            assert_eq!(
                decode(5, &bytes),
                Err(DecodeError::Version(u32::from(version)))
            );
        }
    }

    /// Format 4 stores what format 3 did: the same record from the same bytes' meaning,
    /// every wall-clock instant exact (deltas wrap, so a clock that stepped back, 0 and
    /// `u64::MAX` round-trip), and the head decodes from the same bytes.
    #[test]
    fn format_4_round_trips_every_instant_and_reads_like_format_3() {
        let instants = [0, 1, 1_700_000_000_000, u64::MAX / 2, u64::MAX];
        for &a in &instants {
            for &b in &instants {
                let mut done = sample();
                done.first_claimed_wall_ms = a;
                done.state = RecordState::Completed {
                    attempt: 7,
                    completed_wall_ms: b,
                    expires_wall_ms: a,
                    response: Blob(Arc::from(&b"r"[..])),
                };
                let mut held = inflight();
                held.first_claimed_wall_ms = b;
                if let RecordState::InFlight {
                    lease_deadline_wall_ms,
                    attempt_started_wall_ms,
                    ..
                } = &mut held.state
                {
                    (*lease_deadline_wall_ms, *attempt_started_wall_ms) = (a, b.wrapping_add(a));
                }
                for r in [done, held] {
                    let bytes = encode(5, &r);
                    assert_eq!(bytes[0], 4);
                    assert_eq!(decode(5, &bytes).as_ref(), Ok(&r));
                    assert_eq!(decode(5, &encode_v3(5, &r)).as_ref(), Ok(&r));
                    assert_eq!(decode_head(5, &bytes), decode_head(5, &encode_v3(5, &r)));
                }
            }
        }
    }

    /// What format 4 saves on the engine's usual completion (a 16-byte key, a 64-byte
    /// response, a retention of a day, a handler of a few ms): one version byte, one-byte
    /// lengths and tags, and the instants after the first as small deltas.
    #[test]
    fn format_4_is_compact() {
        let r = Record {
            key: RecordKey::from_parts(b"", &[0xA5; 16]).expect("no scope"),
            fingerprint: None,
            first_claimed_wall_ms: 1_700_000_000_000,
            retention_ms: None,
            state: RecordState::Completed {
                attempt: 1,
                completed_wall_ms: 1_700_000_000_004,
                expires_wall_ms: 1_700_000_000_004 + 86_400_000,
                response: Blob(Arc::from(&[b'r'; 64][..])),
            },
        };
        let v4 = encode(5, &r);
        let v3 = encode_v3(5, &r);
        // version 1 | key 1+16 | scope 1 | fingerprint 1 | first claimed 8 | retention 1 |
        // variant 1 | attempt 1 | completed 1 | expires 5 | response 1+64 | crc 4
        assert_eq!(v4.len(), 106);
        assert_eq!(v3.len(), 146);
        for i in 0..v4.len() {
            let mut damaged = v4.clone();
            damaged[i] ^= 0x01;
            assert!(decode(5, &damaged).is_err(), "flip at {i} not detected");
        }
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
    fn marker_rows_round_trip_and_every_damage_is_refused() {
        let m = MarkerRecord {
            check: 0xDEAD_BEEF,
            token: 42,
            attempt: 3,
            fingerprint: Some(7 << 64 | 1),
            completed_wall_ms: 1_700_000_000_000,
            end_wall_ms: 1_700_000_999_000,
        };
        let bytes = encode_marker(9, &m);
        assert_eq!(decode_marker(9, &bytes), Ok(m));
        assert!(matches!(
            decode_marker(10, &bytes),
            Err(DecodeError::Checksum { .. })
        ));
        for i in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[i] ^= 0x40;
            assert!(decode_marker(9, &damaged).is_err(), "flip at {i}");
        }
        for n in 0..bytes.len() {
            assert!(decode_marker(9, &bytes[..n]).is_err());
        }
        // A record is not a marker, even under the same key.
        assert!(decode_marker(5, &encode(5, &sample())).is_err());
    }

    #[test]
    fn truncated_values_are_refused() {
        let bytes = encode(5, &sample());
        for n in 0..bytes.len() {
            assert!(decode(5, &bytes[..n]).is_err());
        }
    }
}
