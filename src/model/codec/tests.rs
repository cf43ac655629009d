//! Every record version round-trips, reads as the version that wrote it, and refuses
//! damage: flipped bytes, truncation, another token, an unknown version.

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
    // The longest scoped key kept inline, and the shortest one that is not.
    let inline_max = &long_key[..crate::model::constants::SCOPED_INLINE_LEN - 1];
    let shared_min = &long_key[..crate::model::constants::SCOPED_INLINE_LEN];
    for (scope, key) in [
        (&b""[..], &b"order-42"[..]),
        (b"tenant-7", b"order-42"),
        (b"t", b""),
        (&long_scope[..], b"k"),
        (b"tenant-7", &long_key[..]),
        (b"", inline_max),
        (b"", shared_min),
    ] {
        let rk = RecordKey::from_parts(scope, key).expect("a scope within the limit");
        assert_eq!((rk.scope(), rk.key()), (scope, key));
        let as_pair =
            bincode::serde::encode_to_vec((Blob(Arc::from(key)), Blob(Arc::from(scope))), config())
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
