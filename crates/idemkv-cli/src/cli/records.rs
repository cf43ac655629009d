//! Records as the operator subcommands show and move them: hex, printable keys, UTC
//! timestamps, time left, durations like `10m`, and the JSON line of `export`/`import`.
//!
//! The JSON line of a record (one object per line, fields in this order):
//!
//! ```text
//! {"key":"6f726465722d3432","key_text":"order-42","token":7,"fingerprint":"0123456789abcdef",
//!  "attempt":1,"state":"completed","response":"6f6b","expires_at_ms":1767225600000}
//! {"key":"6a6f622d31","key_text":"job-1","token":9,"fingerprint":null,"attempt":2,
//!  "state":"inflight","lease_deadline_ms":1767139230000,"checkpoint":{"phase":3,"data":"00ff"},
//!  "first_claimed_ms":1767139000000,"attempt_started_ms":1767139200000,"failed":true,
//!  "lease_ms":600000,"claim_id":"000000000000000000000000c1a1001d"}
//! ```
//!
//! `first_claimed_ms` (any record) and `attempt_started_ms` (inflight) are left out when
//! unknown (records of the first file format), `failed` (inflight) when false, `lease_ms`
//! (inflight: the lease length the holder was given) when unknown (records of formats 1
//! and 2; it then reads as the engine's lease), `claim_id` (inflight: the claim identity
//! the holder presented, 32 hex digits) when none; lines without them import as such.
//!
//! `key`, `response` and checkpoint `data` are lowercase hex, so any bytes round-trip;
//! `key_text` is the key decoded as UTF-8 (lossy), for people, and ignored on import. A
//! scoped key's line has `scope` (hex) and `scope_text` after `key_text`; an unscoped key's
//! has neither, and a line without `scope` imports as unscoped. The
//! fingerprint is a hex string rather than a number (16 digits for a 64-bit fingerprint, 32
//! for a 128-bit one), because JSON tools that read numbers as doubles (jq, JavaScript)
//! would round it. Times are milliseconds
//! since the UNIX epoch. `checkpoint` is `null` when the claim saved none.

use idemkv::admin::{RecordInfo, RecordInfoState};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Bytes from hex (either case, an even number of digits).
pub(crate) fn unhex(s: &str) -> Result<Vec<u8>, String> {
    let s = s.trim();
    if s.len() % 2 != 0 {
        return Err(format!("odd number of hex digits ({})", s.len()));
    }
    let digit = |c: u8| -> Result<u8, String> {
        match c {
            b'0'..=b'9' => Ok(c - b'0'),
            b'a'..=b'f' => Ok(c - b'a' + 10),
            b'A'..=b'F' => Ok(c - b'A' + 10),
            _ => Err(format!("{:?} is not a hex digit", c as char)),
        }
    };
    s.as_bytes()
        .chunks(2)
        .map(|pair| Ok(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

/// A key (or any bytes) as printable text: valid UTF-8 stays as it is, except that a
/// backslash is doubled and control characters are escaped (`\n`, `\t`, `\x00`); bytes that
/// are not UTF-8 are shown as `\xNN`.
pub(crate) fn printable(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                c if c.is_control() => {
                    let mut buf = [0u8; 4];
                    for b in c.encode_utf8(&mut buf).bytes() {
                        let _ = write!(out, "\\x{b:02x}");
                    }
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out
}

/// `text` shortened to `max` characters, with an ellipsis if cut.
pub(crate) fn truncate(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut s: String = text.chars().take(max.saturating_sub(1)).collect();
    s.push('…');
    s
}

/// A fingerprint as 16 hex digits when it is 64 bits wide (its high half zero), else 32.
pub(crate) fn fingerprint(fp: Option<u128>) -> Option<String> {
    fp.map(|f| match u64::try_from(f) {
        Ok(narrow) => format!("{narrow:016x}"),
        Err(_) => format!("{f:032x}"),
    })
}

/// Milliseconds since the epoch as a UTC timestamp: `2025-01-02T03:04:05Z`, or with
/// milliseconds (`…05.678Z`) if `millis`.
pub(crate) fn utc(ms: u64, millis: bool) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss) = (rem / 3600, rem % 3600 / 60, rem % 60);
    if millis {
        format!(
            "{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}.{:03}Z",
            ms % 1000
        )
    } else {
        format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}Z")
    }
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

/// A span in the two largest units: `2d 03h`, `3h 05m`, `4m 10s`, `12s`, `850ms`.
pub(crate) fn span(ms: u64) -> String {
    let (d, h, m, s) = (
        ms / 86_400_000,
        ms / 3_600_000 % 24,
        ms / 60_000 % 60,
        ms / 1000 % 60,
    );
    if d > 0 {
        format!("{d}d {h:02}h")
    } else if h > 0 {
        format!("{h}h {m:02}m")
    } else if m > 0 {
        format!("{m}m {s:02}s")
    } else if ms >= 1000 {
        format!("{s}s")
    } else {
        format!("{ms}ms")
    }
}

/// Time from `now_ms` to `deadline_ms`: `3h 05m`, or `4m 10s ago` once it has passed.
pub(crate) fn left(deadline_ms: u64, now_ms: u64) -> String {
    if deadline_ms > now_ms {
        span(deadline_ms - now_ms)
    } else {
        format!("{} ago", span(now_ms - deadline_ms))
    }
}

/// Milliseconds from `now_ms` to `deadline_ms`, negative once it has passed.
pub(crate) fn signed_left_ms(deadline_ms: u64, now_ms: u64) -> i64 {
    let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    clamp(deadline_ms).saturating_sub(clamp(now_ms))
}

/// Parses `10m`, `2h`, `1d`, `90s`, `500ms`, `1w`, or a sum like `1h30m`.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let text = s.trim();
    if text.is_empty() {
        return Err("empty duration".into());
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(format!(
                "'{s}' is not a duration; use a number and a unit: 500ms, 90s, 10m, 2h, 1d, 1w"
            ));
        }
        let n: u64 = rest[..digits]
            .parse()
            .map_err(|_| format!("'{s}': number too large"))?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit_ms: u64 = match rest[..unit_len].trim() {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "w" => 7 * 86_400_000,
            "" => {
                return Err(format!(
                    "'{s}' needs a unit: ms, s, m, h, d or w (for example 10m)"
                ))
            }
            other => return Err(format!("'{s}': unknown unit '{other}' (ms, s, m, h, d, w)")),
        };
        rest = &rest[unit_len..];
        let ms = n
            .checked_mul(unit_ms)
            .ok_or_else(|| format!("'{s}' is too long"))?;
        total = total
            .checked_add(Duration::from_millis(ms))
            .ok_or_else(|| format!("'{s}' is too long"))?;
    }
    Ok(total)
}

/// A checkpoint in a JSON line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CheckpointLine {
    pub(crate) phase: u32,
    /// Hex.
    pub(crate) data: String,
}

/// One record as a JSON line of `export` / `import` (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RecordLine {
    /// Hex.
    pub(crate) key: String,
    /// Lossy UTF-8, for people; ignored on import.
    #[serde(default)]
    pub(crate) key_text: String,
    /// Hex; absent (empty) for an unscoped key.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) scope: String,
    /// Lossy UTF-8, for people; ignored on import.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) scope_text: String,
    pub(crate) token: u64,
    /// 16 hex digits, or null.
    pub(crate) fingerprint: Option<String>,
    pub(crate) attempt: u32,
    /// `inflight` or `completed`.
    pub(crate) state: String,
    /// Completed: the response, hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) response: Option<String>,
    /// Completed: end of retention.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) expires_at_ms: Option<u64>,
    /// InFlight: end of the lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) lease_deadline_ms: Option<u64>,
    /// InFlight: the saved checkpoint (`null` if none). Absent on completed records.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub(crate) checkpoint: Option<Option<CheckpointLine>>,
    /// When the key was first claimed; absent when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) first_claimed_ms: Option<u64>,
    /// InFlight: when the attempt started; absent when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) attempt_started_ms: Option<u64>,
    /// InFlight: the holder failed the attempt; absent when false.
    #[serde(default, skip_serializing_if = "is_false")]
    pub(crate) failed: bool,
    /// InFlight: the lease length the holder was given, in ms; absent when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) lease_ms: Option<u64>,
    /// InFlight: the claim identity the holder presented, 32 hex digits; absent when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) claim_id: Option<String>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// A field that is present, even as `null`, deserializes to `Some`.
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

impl RecordLine {
    /// The line of a record. A completion not yet durable cannot be exported (the engine
    /// never reports one for a file it has just opened); it is refused.
    pub(crate) fn from_record(r: &RecordInfo) -> Result<RecordLine, String> {
        let mut line = RecordLine {
            key: hex(&r.key),
            key_text: String::from_utf8_lossy(&r.key).into_owned(),
            scope: hex(&r.scope),
            scope_text: String::from_utf8_lossy(&r.scope).into_owned(),
            token: r.token,
            fingerprint: fingerprint(r.fingerprint),
            attempt: r.attempt,
            state: String::new(),
            response: None,
            expires_at_ms: None,
            lease_deadline_ms: None,
            checkpoint: None,
            first_claimed_ms: opt_ms(r.first_claimed_at),
            attempt_started_ms: None,
            failed: false,
            lease_ms: None,
            claim_id: None,
        };
        match &r.state {
            RecordInfoState::InFlight {
                lease_deadline,
                checkpoint,
                attempt_started_at,
                failed,
                lease,
                claim_id,
            } => {
                line.state = "inflight".into();
                line.lease_ms = lease.map(|l| u64::try_from(l.as_millis()).unwrap_or(u64::MAX));
                line.claim_id = claim_id.map(|id| format!("{id:032x}"));
                line.attempt_started_ms = opt_ms(*attempt_started_at);
                line.failed = *failed;
                line.lease_deadline_ms = Some(wall_ms(*lease_deadline));
                line.checkpoint = Some(checkpoint.as_ref().map(|(phase, data)| CheckpointLine {
                    phase: *phase,
                    data: hex(data),
                }));
            }
            RecordInfoState::Completed {
                response,
                expires_at,
                published: true,
            } => {
                line.state = "completed".into();
                line.response = Some(hex(response));
                line.expires_at_ms = Some(wall_ms(*expires_at));
            }
            _ => {
                return Err(format!(
                    "record under token {} is {}, which cannot be exported",
                    r.token,
                    r.state_name()
                ))
            }
        }
        Ok(line)
    }

    /// The record a line describes, checked for the fields its state needs.
    pub(crate) fn to_record(&self) -> Result<RecordInfo, String> {
        let key = unhex(&self.key).map_err(|e| format!("key: {e}"))?;
        if key.is_empty() {
            return Err("key: empty".into());
        }
        let scope = unhex(&self.scope).map_err(|e| format!("scope: {e}"))?;
        let fingerprint = match &self.fingerprint {
            None => None,
            Some(f) => Some(
                u128::from_str_radix(f.trim(), 16)
                    .map_err(|_| format!("fingerprint: {f:?} is not 1 to 32 hex digits"))?,
            ),
        };
        let state = match self.state.as_str() {
            "inflight" => {
                if self.response.is_some() || self.expires_at_ms.is_some() {
                    return Err(
                        "an inflight record has no response or expires_at_ms (completed fields)"
                            .into(),
                    );
                }
                let lease_deadline_ms = self
                    .lease_deadline_ms
                    .ok_or("an inflight record needs lease_deadline_ms")?;
                let checkpoint = match self.checkpoint.clone().flatten() {
                    None => None,
                    Some(c) => Some((
                        c.phase,
                        unhex(&c.data).map_err(|e| format!("checkpoint data: {e}"))?,
                    )),
                };
                let claim_id = match &self.claim_id {
                    None => None,
                    Some(id) => Some(
                        u128::from_str_radix(id.trim(), 16)
                            .map_err(|_| format!("claim_id: {id:?} is not 1 to 32 hex digits"))?,
                    ),
                };
                RecordInfoState::InFlight {
                    lease_deadline: wall_time(lease_deadline_ms),
                    checkpoint,
                    attempt_started_at: self.attempt_started_ms.map(wall_time),
                    failed: self.failed,
                    lease: self.lease_ms.map(Duration::from_millis),
                    claim_id,
                }
            }
            "completed" => {
                if self.lease_deadline_ms.is_some()
                    || self.checkpoint.is_some()
                    || self.attempt_started_ms.is_some()
                    || self.failed
                    || self.lease_ms.is_some()
                    || self.claim_id.is_some()
                {
                    return Err("a completed record has no lease_deadline_ms, checkpoint, \
                         attempt_started_ms, failed, lease_ms or claim_id (inflight fields)"
                        .into());
                }
                let response = self
                    .response
                    .as_deref()
                    .ok_or("a completed record needs response")?;
                let response = unhex(response).map_err(|e| format!("response: {e}"))?;
                let expires_at_ms = self
                    .expires_at_ms
                    .ok_or("a completed record needs expires_at_ms")?;
                RecordInfoState::Completed {
                    response,
                    expires_at: wall_time(expires_at_ms),
                    published: true,
                }
            }
            other => {
                return Err(format!(
                    "state {other:?} is not \"inflight\" or \"completed\""
                ))
            }
        };
        Ok(RecordInfo {
            key,
            scope,
            token: self.token,
            fingerprint,
            attempt: self.attempt,
            state,
            first_claimed_at: self.first_claimed_ms.map(wall_time),
        })
    }
}

/// Milliseconds since the UNIX epoch of a wall-clock time: the unit of every time in the
/// record lines and the command output. A time before the epoch reads as 0; saturates at
/// `u64::MAX`.
pub(crate) fn wall_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The wall-clock time `ms` milliseconds after the UNIX epoch (a record line's time). A
/// platform whose `SystemTime` cannot hold it gets a time it can (halving until one fits).
pub(crate) fn wall_time(ms: u64) -> SystemTime {
    let mut d = Duration::from_millis(ms);
    loop {
        if let Some(t) = UNIX_EPOCH.checked_add(d) {
            return t;
        }
        d /= 2;
    }
}

/// A known instant in ms since the epoch; `None` stays `None` (unknown).
pub(crate) fn opt_ms(t: Option<SystemTime>) -> Option<u64> {
    t.map(wall_ms)
}

/// A known instant as `2025-01-02T03:04:05.678Z (4m 10s ago)`, or `unknown`.
pub(crate) fn instant(t: Option<SystemTime>, now_ms: u64) -> String {
    match t {
        Some(t) => {
            let ms = wall_ms(t);
            format!("{} ({})", utc(ms, true), left(ms, now_ms))
        }
        None => "unknown".into(),
    }
}

/// Where a record's clock runs to, in ms since the epoch: the end of its lease (InFlight)
/// or of its retention.
pub(crate) fn deadline_ms(r: &RecordInfo) -> u64 {
    match &r.state {
        RecordInfoState::InFlight { lease_deadline, .. } => wall_ms(*lease_deadline),
        RecordInfoState::Completed { expires_at, .. } => wall_ms(*expires_at),
        _ => 0,
    }
}

/// The state as the operator commands name it: `inflight`, `completed`, `completing`, or
/// `expired` (a completion past its retention that is still in the file: Absent to every
/// call, reclaimed by the next sweep or open).
pub(crate) fn state_name(r: &RecordInfo, now_ms: u64) -> &'static str {
    match &r.state {
        RecordInfoState::Completed { expires_at, .. } if wall_ms(*expires_at) <= now_ms => {
            "expired"
        }
        _ => r.state_name(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips() {
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(unhex(&hex(&bytes)).unwrap(), bytes);
        assert_eq!(unhex("0A0b").unwrap(), vec![10, 11]);
        assert!(unhex("abc").is_err());
        assert!(unhex("zz").is_err());
    }

    #[test]
    fn printable_escapes_what_is_not_text() {
        assert_eq!(printable(b"order-42"), "order-42");
        assert_eq!(printable(b"a\\b\n\x00\xff"), "a\\\\b\\n\\x00\\xff");
        assert_eq!(printable("café".as_bytes()), "café");
    }

    #[test]
    fn times_and_durations() {
        assert_eq!(utc(0, false), "1970-01-01T00:00:00Z");
        assert_eq!(utc(1_704_067_200_000, false), "2024-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400_123, true), "2000-02-29T00:00:00.123Z");
        assert_eq!(utc(4_102_444_799_000, false), "2099-12-31T23:59:59Z");
        assert_eq!(span(850), "850ms");
        assert_eq!(span(12_000), "12s");
        assert_eq!(span(250_000), "4m 10s");
        assert_eq!(span(3 * 3_600_000 + 5 * 60_000), "3h 05m");
        assert_eq!(span(2 * 86_400_000 + 3_600_000), "2d 01h");
        assert_eq!(left(1_000, 61_000), "1m 00s ago");
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("1d").unwrap(), Duration::from_secs(86_400));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("10y").is_err());
        assert!(parse_duration("m").is_err());
    }

    #[test]
    fn record_lines_round_trip() {
        let records = [
            RecordInfo {
                key: b"k\x00\xff".to_vec(),
                scope: Vec::new(),
                token: 7,
                fingerprint: Some(u128::from(u64::MAX)),
                attempt: 1,
                state: RecordInfoState::Completed {
                    response: b"ok".to_vec(),
                    expires_at: UNIX_EPOCH + Duration::from_millis(1_767_225_600_000),
                    published: true,
                },
                first_claimed_at: Some(UNIX_EPOCH + Duration::from_millis(1_767_000_000_000)),
            },
            RecordInfo {
                key: b"job".to_vec(),
                scope: b"tenant\x00\xff".to_vec(),
                token: 9,
                fingerprint: None,
                attempt: 2,
                state: RecordInfoState::InFlight {
                    lease_deadline: UNIX_EPOCH + Duration::from_millis(5),
                    checkpoint: Some((3, vec![0, 255])),
                    attempt_started_at: Some(UNIX_EPOCH + Duration::from_millis(4)),
                    failed: true,
                    lease: Some(Duration::from_secs(600)),
                    claim_id: Some(0xc1a1_001d),
                },
                first_claimed_at: Some(UNIX_EPOCH + Duration::from_millis(2)),
            },
            RecordInfo {
                key: b"job2".to_vec(),
                scope: Vec::new(),
                token: 10,
                fingerprint: None,
                attempt: 1,
                state: RecordInfoState::InFlight {
                    lease_deadline: UNIX_EPOCH + Duration::from_millis(5),
                    checkpoint: None,
                    attempt_started_at: None,
                    failed: false,
                    lease: None,
                    claim_id: None,
                },
                first_claimed_at: None,
            },
        ];
        for r in &records {
            let line = serde_json::to_string(&RecordLine::from_record(r).unwrap()).unwrap();
            let back: RecordLine = serde_json::from_str(&line).unwrap();
            assert_eq!(&back.to_record().unwrap(), r, "{line}");
        }
        let line = serde_json::to_string(&RecordLine::from_record(&records[1]).unwrap()).unwrap();
        assert!(
            line.ends_with(
                "\"first_claimed_ms\":2,\"attempt_started_ms\":4,\"failed\":true,\
                 \"lease_ms\":600000,\"claim_id\":\"000000000000000000000000c1a1001d\"}"
            ),
            "{line}"
        );
        let line = serde_json::to_string(&RecordLine::from_record(&records[2]).unwrap()).unwrap();
        assert!(line.contains("\"checkpoint\":null"), "{line}");
        // Unknown instants and a claim not failed are left out (older exports read alike).
        assert!(!line.contains("first_claimed_ms"), "{line}");
        assert!(!line.contains("failed"), "{line}");
        assert!(!line.contains("lease_ms"), "{line}");
        assert!(!line.contains("claim_id"), "{line}");
        assert!(line.contains("\"lease_deadline_ms\":5,"), "{line}");
        let line = serde_json::to_string(&RecordLine::from_record(&records[0]).unwrap()).unwrap();
        assert!(line.contains("\"expires_at_ms\":1767225600000"), "{line}");
        // An unscoped key's line has no scope; a scoped one's names it.
        assert!(!line.contains("scope"), "{line}");
        let line = serde_json::to_string(&RecordLine::from_record(&records[1]).unwrap()).unwrap();
        assert!(
            line.contains(r#""key_text":"job","scope":"74656e616e7400ff","#),
            "{line}"
        );
        let bad: RecordLine = serde_json::from_str(
            r#"{"key":"6b","token":1,"fingerprint":null,"attempt":1,"state":"completed","expires_at_ms":1}"#,
        )
        .unwrap();
        assert!(bad.to_record().unwrap_err().contains("needs response"));
    }
}
