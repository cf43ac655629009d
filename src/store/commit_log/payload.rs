//! A frame's payload: a batch's writes, table rows and token mark, encoded for the log and
//! decoded back when it is replayed.

use super::FRAME_HEADER_BYTES;
use crate::base::sync::Arc;
use crate::store::batch::Batch;
use crate::store::log_state::{Cursor, Decoded};
use crate::store::storage::Write;

const TAG_PUT: u8 = 1;
const TAG_DELETE: u8 = 2;
const TAG_FORGET: u8 = 3;
const TAG_DROP_MARKER: u8 = 4;

/// A bound on a batch's frame length (header included), computed without encoding it.
pub(super) fn encoded_len(writes: &[Write<'_>], tables: &[&Batch]) -> u64 {
    let bytes = |b: &[u8]| 8 + b.len() as u64;
    let mut n = (FRAME_HEADER_BYTES + 9 + 8 + 8) as u64;
    for w in writes {
        n += 1 + 4 * 8 + 1;
        if let Write::Put { value, .. } = w {
            n += bytes(value);
        }
    }
    for batch in tables {
        n += 3 * 8;
        for (row, value) in &batch.rows {
            n += bytes(row) + 1 + value.as_deref().map_or(0, bytes);
        }
        for (_, message) in &batch.messages {
            n += 8 + bytes(message);
        }
        n += 8 * batch.sent.len() as u64;
    }
    n
}

pub(super) fn encode_payload(
    out: &mut Vec<u8>,
    writes: &[Write<'_>],
    tables: &[&Batch],
    hwm: Option<u64>,
) {
    match hwm {
        Some(hwm) => {
            out.push(1);
            put_u64(out, hwm);
        }
        None => out.push(0),
    }
    put_len(out, writes.len());
    for w in writes {
        match w {
            Write::Put { token, old, value } => {
                out.push(TAG_PUT);
                put_u64(out, *token);
                put_opt_u64(out, *old);
                put_bytes(out, value);
            }
            Write::Delete { token } => {
                out.push(TAG_DELETE);
                put_u64(out, *token);
            }
            Write::Forget {
                token,
                hash,
                check,
                marker_retention_ms,
            } => {
                out.push(TAG_FORGET);
                for v in [*token, *hash, *check, *marker_retention_ms] {
                    put_u64(out, v);
                }
            }
            Write::DropMarker { hash, token } => {
                out.push(TAG_DROP_MARKER);
                put_u64(out, *hash);
                put_u64(out, *token);
            }
        }
    }
    put_len(out, tables.len());
    for batch in tables {
        put_len(out, batch.rows.len());
        for (row, value) in &batch.rows {
            put_bytes(out, row);
            match value {
                Some(value) => {
                    out.push(1);
                    put_bytes(out, value);
                }
                None => out.push(0),
            }
        }
        put_len(out, batch.messages.len());
        for (id, message) in &batch.messages {
            put_u64(out, *id);
            put_bytes(out, message);
        }
        put_len(out, batch.sent.len());
        for id in &batch.sent {
            put_u64(out, *id);
        }
    }
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_opt_u64(out: &mut Vec<u8>, v: Option<u64>) {
    match v {
        Some(v) => {
            out.push(1);
            put_u64(out, v);
        }
        None => out.push(0),
    }
}

/// Lengths are u64 on the wire: a count never needs a cast that could truncate.
fn put_len(out: &mut Vec<u8>, n: usize) {
    put_u64(out, n as u64);
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_len(out, bytes.len());
    out.extend_from_slice(bytes);
}

/// A batch read back from the log, owning its bytes.
#[derive(Debug, Default)]
pub(crate) struct Replayed {
    pub(crate) writes: Vec<OwnedWrite>,
    pub(crate) tables: Vec<Batch>,
    pub(crate) hwm: Option<u64>,
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum OwnedWrite {
    Put {
        token: u64,
        old: Option<u64>,
        value: Vec<u8>,
    },
    Delete {
        token: u64,
    },
    Forget {
        token: u64,
        hash: u64,
        check: u64,
        marker_retention_ms: u64,
    },
    DropMarker {
        hash: u64,
        token: u64,
    },
}

impl OwnedWrite {
    pub(crate) fn borrow(&self) -> Write<'_> {
        match self {
            OwnedWrite::Put { token, old, value } => Write::Put {
                token: *token,
                old: *old,
                value,
            },
            OwnedWrite::Delete { token } => Write::Delete { token: *token },
            OwnedWrite::Forget {
                token,
                hash,
                check,
                marker_retention_ms,
            } => Write::Forget {
                token: *token,
                hash: *hash,
                check: *check,
                marker_retention_ms: *marker_retention_ms,
            },
            OwnedWrite::DropMarker { hash, token } => Write::DropMarker {
                hash: *hash,
                token: *token,
            },
        }
    }
}

pub(super) fn decode_payload(payload: &[u8]) -> Decoded<Replayed> {
    let mut c = Cursor(payload);
    let hwm = c.opt_u64()?;
    let n = c.len(9)?;
    let mut writes = Vec::with_capacity(n);
    for _ in 0..n {
        writes.push(match c.u8()? {
            TAG_PUT => OwnedWrite::Put {
                token: c.u64()?,
                old: c.opt_u64()?,
                value: c.bytes()?.to_vec(),
            },
            TAG_DELETE => OwnedWrite::Delete { token: c.u64()? },
            TAG_FORGET => OwnedWrite::Forget {
                token: c.u64()?,
                hash: c.u64()?,
                check: c.u64()?,
                marker_retention_ms: c.u64()?,
            },
            TAG_DROP_MARKER => OwnedWrite::DropMarker {
                hash: c.u64()?,
                token: c.u64()?,
            },
            _ => return Err("a frame holds an unknown write tag"),
        });
    }
    let n = c.len(24)?;
    let mut tables = Vec::with_capacity(n);
    for _ in 0..n {
        let mut batch = Batch::default();
        for _ in 0..c.len(9)? {
            let row: Arc<[u8]> = c.bytes()?.into();
            let value: Option<Arc<[u8]>> = match c.u8()? {
                0 => None,
                1 => Some(c.bytes()?.into()),
                _ => return Err("a frame holds an unknown option tag"),
            };
            batch.rows.push((row, value));
        }
        for _ in 0..c.len(16)? {
            let id = c.u64()?;
            batch.messages.push((id, c.bytes()?.into()));
        }
        for _ in 0..c.len(8)? {
            batch.sent.push(c.u64()?);
        }
        tables.push(batch);
    }
    if !c.0.is_empty() {
        return Err("a frame's payload has bytes past its end");
    }
    Ok(Replayed {
        writes,
        tables,
        hwm,
    })
}
