//! The commit log (every `Immediate` engine with a file): a group commit made durable by
//! one durable append to a pre-written log file (`log_file.rs`: a direct, synchronous write
//! on Linux, else a write and an fdatasync), instead of a two-phase redb commit (two
//! fsyncs). The acknowledged batches then reach the redb file in the applier's durable
//! commits (`apply.rs`); a *checkpoint* (a durable redb commit that also starts a new log
//! epoch) restarts the log when it is full, at close, and at every open.
//!
//! Definitions:
//! - An *epoch* numbers the log's lives. Every checkpoint makes the next epoch current in
//!   the same durable commit, then the log is written again from offset 0.
//! - A *frame* is one batch: a 32-byte header (magic, payload length, epoch, sequence
//!   number, MAC) and the payload (the batch's writes, table writes and token mark),
//!   followed by zeros up to a multiple of the log's block when it has one (the log file's
//!   direct writes take whole blocks); a replay finds the next frame at either place.
//! - The file's meta row `log_state` ([`LogState`]) holds the epoch, how many of its frames
//!   the file holds, and whether an engine is appending to the log.
//!
//! Invariants:
//! - A frame is acknowledged only after it is durable (its direct synchronous write or its
//!   fdatasync returned), and the next frame is written only after that: at most one
//!   frame, the last, can be torn.
//! - The file's records are the state of a prefix of the current epoch's frames, and
//!   `log_state` says which: each commit that applies frames records the last of them in
//!   the same commit. Replay applies the frames after that prefix, in order: the same
//!   computation the writer did, never a frame twice.
//! - A frame is accepted only with the current epoch, the next sequence number and a MAC
//!   keyed by the file's secret. Keys and responses are client bytes: a keyed MAC, unlike a
//!   plain checksum, cannot be matched by crafted bytes, so a torn frame is never mistaken
//!   for a whole one.
//! - The log file is written in place over bytes written at creation, so making a frame
//!   durable flushes data only, never the file's size or block map.

use crate::base::limits::HASH_SECRET_LEN;
use crate::base::sync::Arc;
use crate::model::error::OpenError;
use crate::store::backend::Storage;
use crate::store::batch::Batch;
use crate::store::config::StoreConfig;
use crate::store::constants::{LOG_BLOCK_BYTES, LOG_BYTES, LOG_ZERO_CHUNK_BYTES};
use crate::store::log_file::{Access, LogFile};
pub(crate) use crate::store::log_state::LogState;
use crate::store::log_state::{Cursor, Decoded};
use crate::store::storage::Write;
use crate::store::storage::{Durable, Store};
use std::hash::Hasher;
use std::io;
use std::path::{Path, PathBuf};

const FRAME_MAGIC: u32 = u32::from_le_bytes(*b"IKVL");
pub(crate) const FRAME_HEADER_BYTES: usize = 32;

const TAG_PUT: u8 = 1;
const TAG_DELETE: u8 = 2;
const TAG_FORGET: u8 = 3;
const TAG_DROP_MARKER: u8 = 4;

/// The MAC key: two words derived from the file's hash secret by SipHash keyed with the
/// secret itself, over a label of their own, so the key differs from the index's keyed
/// hashes (which use the secret's words directly) and reveals nothing of them.
#[derive(Clone, Copy)]
pub(crate) struct MacKey(u64, u64);

impl MacKey {
    pub(crate) fn from_secret(secret: &[u8; HASH_SECRET_LEN]) -> Self {
        let [w0, w1, w2, w3] = crate::base::hash::secret_words(secret);
        let derive = |k0: u64, k1: u64, label: &[u8]| {
            let mut h = sip(k0, k1);
            h.write(label);
            h.finish()
        };
        MacKey(
            derive(w0, w1, b"idemkv commit log mac, word 0"),
            derive(w2, w3, b"idemkv commit log mac, word 1"),
        )
    }

    fn mac(&self, header: &[u8], payload: &[u8]) -> u64 {
        let mut h = sip(self.0, self.1);
        h.write(header);
        h.write(payload);
        h.finish()
    }
}

/// SipHash-2-4, a keyed PRF: std's implementation, deprecated only in favour of
/// `DefaultHasher`, whose algorithm is not promised to stay the same across releases.
#[allow(deprecated)]
fn sip(k0: u64, k1: u64) -> std::hash::SipHasher {
    std::hash::SipHasher::new_with_keys(k0, k1)
}

/// The log a writer appends to.
pub(crate) struct CommitLog {
    storage: Box<dyn Storage>,
    key: MacKey,
    epoch: u64,
    seq: u64,
    offset: u64,
    /// Each frame is padded with zeros to a multiple of this, so that its write is whole
    /// blocks (the log file's direct writes, `log_file.rs`); 1 (no padding) only in tests.
    block_bytes: u64,
    /// Reused frame buffer.
    frame: Vec<u8>,
}

impl std::fmt::Debug for CommitLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommitLog")
            .field("epoch", &self.epoch)
            .field("seq", &self.seq)
            .field("offset", &self.offset)
            .finish()
    }
}

/// What appending a batch did.
#[derive(Debug, PartialEq, Eq)]
enum Appended {
    /// The frame, numbered `seq` in its epoch, is durable in the log.
    Logged { seq: u64 },
    /// The frame does not fit in what is left of the log: the batch must be committed as a
    /// checkpoint instead.
    Full,
}

impl CommitLog {
    /// A log whose current epoch is `epoch` and which holds no frame of it yet. The storage
    /// must already be `LOG_BYTES` long (see [`prepare`]). Its frames are padded to whole
    /// `LOG_BLOCK_BYTES` blocks whatever the storage: the log file writes them directly
    /// (`log_file.rs`), and one layout for every storage keeps the fault-injection suites
    /// (custom storages) on the layout the file writes.
    pub(crate) fn new(storage: Box<dyn Storage>, key: MacKey, epoch: u64) -> Self {
        Self::with_block(storage, key, epoch, LOG_BLOCK_BYTES)
    }

    /// [`CommitLog::new`] with frames padded to multiples of `block_bytes` (1: back to back,
    /// as logs were written before the padding, which replay must still read).
    fn with_block(storage: Box<dyn Storage>, key: MacKey, epoch: u64, block_bytes: u64) -> Self {
        debug_assert!(block_bytes.is_power_of_two() && LOG_BYTES.is_multiple_of(block_bytes));
        debug_assert!(
            block_bytes <= LOG_BLOCK_BYTES,
            "replay looks for frames at its blocks"
        );
        CommitLog {
            storage,
            key,
            epoch,
            seq: 0,
            offset: 0,
            block_bytes,
            frame: Vec::new(),
        }
    }

    /// Makes the writer's batch durable in the log, or says it must be a checkpoint (it
    /// does not fit, or the engine closes: `closing`). The `Err` is the reason to poison
    /// the engine.
    pub(crate) fn stage(
        &mut self,
        writes: &[Write<'_>],
        tables: &[&Batch],
        hwm: Option<u64>,
        closing: bool,
    ) -> Result<Durable, String> {
        let appended = match closing {
            true => Appended::Full,
            false => self
                .append(writes, tables, hwm)
                .map_err(|e| format!("the commit log: {e}"))?,
        };
        match appended {
            Appended::Logged { seq } => Ok(Durable::Logged {
                epoch: self.epoch,
                seq,
            }),
            // A close's checkpoint leaves the file complete without its log.
            Appended::Full => match self.epoch.checked_add(1) {
                Some(epoch) => Ok(Durable::Checkpoint {
                    epoch,
                    active: !closing,
                }),
                None => Err("the commit log's epoch is at its limit".into()),
            },
        }
    }

    /// After the commit of a batch staged as `how`: a checkpoint starts the next epoch,
    /// and the log is written from the start again. Whether it was a checkpoint.
    pub(crate) fn committed(&mut self, how: Durable) -> bool {
        let Durable::Checkpoint { epoch, .. } = how else {
            return false;
        };
        self.restart(epoch);
        true
    }

    /// Appends the batch as one frame and makes it durable, or reports that it does not
    /// fit. Nothing is written when it does not fit.
    fn append(
        &mut self,
        writes: &[Write<'_>],
        tables: &[&Batch],
        hwm: Option<u64>,
    ) -> io::Result<Appended> {
        // Sized before it is built: a batch that cannot fit (large responses under
        // `Buffered`) is never copied into a frame.
        let room = LOG_BYTES.saturating_sub(self.offset);
        if encoded_len(writes, tables).next_multiple_of(self.block_bytes) > room {
            return Ok(Appended::Full);
        }
        let mut frame = std::mem::take(&mut self.frame);
        frame.clear();
        frame.resize(FRAME_HEADER_BYTES, 0);
        encode_payload(&mut frame, writes, tables, hwm);
        let seq = self.seq;
        seal(&mut frame, &self.key, self.epoch, seq);
        // Zeros after the frame, which its MAC does not cover: a replay steps over them
        // (`next_frame`).
        let padded = (frame.len() as u64).next_multiple_of(self.block_bytes);
        frame.resize(padded as usize, 0);
        debug_assert!(frame.len() as u64 <= room, "encoded_len is a bound");
        let result = self.write_frame(&frame).map(|()| Appended::Logged { seq });
        self.frame = frame;
        result
    }

    fn write_frame(&mut self, frame: &[u8]) -> io::Result<()> {
        debug_assert!(
            self.offset.is_multiple_of(self.block_bytes)
                && (frame.len() as u64).is_multiple_of(self.block_bytes)
        );
        self.storage.write(self.offset, frame)?;
        self.storage.sync_data()?;
        self.offset += frame.len() as u64;
        self.seq += 1;
        Ok(())
    }

    /// Starts epoch `epoch` (just made current by a checkpoint): the log is written from
    /// the start again, over the previous epoch's frames, which no longer verify.
    fn restart(&mut self, epoch: u64) {
        debug_assert!(epoch > self.epoch, "epochs only grow");
        self.epoch = epoch;
        self.seq = 0;
        self.offset = 0;
    }

    /// Bytes of the log in use by the current epoch.
    #[cfg(test)]
    pub(crate) fn offset(&self) -> u64 {
        self.offset
    }
}

/// Makes the storage `LOG_BYTES` long with every byte written (zeros where it was shorter)
/// and durable, so that appends never change the file's size or block map.
pub(crate) fn prepare(storage: &dyn Storage) -> io::Result<()> {
    let len = storage.len()?;
    if len >= LOG_BYTES {
        return Ok(());
    }
    // Set first: a storage may refuse writes past its end. The zeros are written anyway,
    // so that no block stays unallocated.
    storage.set_len(LOG_BYTES)?;
    let zeros = vec![0u8; LOG_ZERO_CHUNK_BYTES];
    let mut at = len;
    while at < LOG_BYTES {
        let n = (LOG_BYTES - at).min(zeros.len() as u64) as usize;
        storage.write(at, &zeros[..n])?;
        at += n as u64;
    }
    storage.sync_data()
}

/// Fills in a frame's header (its payload follows it in `frame`, at most `LOG_BYTES` long).
fn seal(frame: &mut [u8], key: &MacKey, epoch: u64, seq: u64) {
    debug_assert!(frame.len() as u64 <= LOG_BYTES);
    let payload_len = (frame.len() - FRAME_HEADER_BYTES) as u32;
    frame[0..4].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
    frame[4..8].copy_from_slice(&payload_len.to_le_bytes());
    frame[8..16].copy_from_slice(&epoch.to_le_bytes());
    frame[16..24].copy_from_slice(&seq.to_le_bytes());
    let (head, payload) = frame.split_at(FRAME_HEADER_BYTES);
    let mac = key.mac(&head[..24], payload);
    frame[24..32].copy_from_slice(&mac.to_le_bytes());
}

/// A bound on a batch's frame length (header included), computed without encoding it.
fn encoded_len(writes: &[Write<'_>], tables: &[&Batch]) -> u64 {
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

fn encode_payload(out: &mut Vec<u8>, writes: &[Write<'_>], tables: &[&Batch], hwm: Option<u64>) {
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

fn decode_payload(payload: &[u8]) -> Decoded<Replayed> {
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

/// Why a log could not be replayed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ReplayError {
    /// A frame that was followed by a whole frame of a later number, so was whole and
    /// acknowledged once, fails its MAC or does not decode: the log is damaged. Nothing
    /// may be dropped silently.
    Damaged(String),
}

/// Reads the frames of `state.epoch` from the log `image` (its whole content), in order,
/// handing each decoded batch the file does not hold yet (numbered `state.applied` on) to
/// `apply` with its number. Stops at the first position that holds no whole frame of this
/// epoch with the next number: the end of the log, or a frame torn by a crash (only the
/// last frame can be). Returns the number of frames applied.
pub(crate) fn replay<E>(
    image: &[u8],
    key: &MacKey,
    state: LogState,
    mut apply: impl FnMut(Replayed, u64) -> Result<(), E>,
) -> Result<Result<u64, ReplayError>, E> {
    let epoch = state.epoch;
    let (mut end, mut seq, mut applied) = (0usize, 0u64, 0u64);
    loop {
        let (at, frame) = next_frame(image, end, key, epoch, seq);
        match frame {
            Frame::Valid { payload, next } => {
                if seq >= state.applied {
                    match decode_payload(payload) {
                        Ok(batch) => {
                            apply(batch, seq)?;
                            applied += 1;
                        }
                        Err(why) => {
                            return Ok(Err(ReplayError::Damaged(format!(
                                "frame {seq} of epoch {epoch} at byte {at}: {why}"
                            ))))
                        }
                    }
                }
                end = next;
                seq += 1;
            }
            // A whole frame of another epoch (an earlier life of the log): the end, as a
            // clean stop leaves it.
            Frame::Stale => return Ok(Ok(applied)),
            // Zeros (never written since the log was created), or bytes that are not a
            // whole frame (a torn last frame): the end, unless a whole frame of this epoch
            // numbered `seq` or later lies anywhere from the end of the last one (then the
            // frame that belongs here was written before it, was acknowledged, and is
            // damaged, zeroed included).
            Frame::Zeros | Frame::Torn => {
                if let Some((later, found)) = later_frame(image, end, key, epoch, seq) {
                    return Ok(Err(ReplayError::Damaged(format!(
                        "the bytes at {at}, where frame {seq} of epoch {epoch} belongs, are \
                         not a whole frame, yet frame {later} is whole at byte {found}: an \
                         acknowledged commit was damaged"
                    ))));
                }
                return Ok(Ok(applied));
            }
        }
    }
}

/// Whether the log `image` holds commits a file in `state` does not have: frames it would
/// apply, or damage that an open must report.
pub(crate) fn pending(image: &[u8], key: &MacKey, state: LogState) -> bool {
    !matches!(replay(image, key, state, |_, _| Ok::<_, ()>(())), Ok(Ok(0)))
}

/// The frame numbered `seq` after the one that ends at `end` (0 for the first), and where
/// it was looked for. Frames are written back to back (the next one starts at `end`) or
/// padded with zeros to whole blocks (`CommitLog::block_bytes`; the next one starts at the
/// first multiple of `LOG_BLOCK_BYTES` from `end`), and a log of either kind replays the
/// same: a whole frame of this epoch and number is taken at either place (its MAC says it
/// is the one written there). Otherwise the log ends, or is damaged, where its layout puts
/// the next frame: after zeros up to the boundary, at the boundary (a frame starts with its
/// magic, never with a zero byte); at `end` otherwise.
fn next_frame<'a>(
    image: &'a [u8],
    end: usize,
    key: &MacKey,
    epoch: u64,
    seq: u64,
) -> (usize, Frame<'a>) {
    let at_end = frame_at(image, end, key, epoch, seq);
    let boundary = end.next_multiple_of(LOG_BLOCK_BYTES as usize);
    if boundary == end || matches!(at_end, Frame::Valid { .. }) {
        return (end, at_end);
    }
    let at_boundary = frame_at(image, boundary, key, epoch, seq);
    let padded = image
        .get(end..boundary)
        .is_some_and(|gap| gap.iter().all(|&b| b == 0));
    match (at_boundary, padded) {
        (valid @ Frame::Valid { .. }, _) | (valid, true) => (boundary, valid),
        (_, false) => (end, at_end),
    }
}

enum Frame<'a> {
    /// A whole frame of this epoch with the expected number.
    Valid { payload: &'a [u8], next: usize },
    /// A header of zeros (never written), or too few bytes left for a header.
    Zeros,
    /// A whole frame of another epoch (an earlier life of the log).
    Stale,
    /// Anything else.
    Torn,
}

/// A frame header's fields, as read (nothing verified).
struct Header {
    magic: u32,
    payload_len: usize,
    epoch: u64,
    seq: u64,
    mac: u64,
}

fn header_at(image: &[u8], at: usize) -> Option<(Header, &[u8])> {
    let head = image.get(at..at.checked_add(FRAME_HEADER_BYTES)?)?;
    let mut c = Cursor(head);
    let header = Header {
        magic: c.u32().ok()?,
        payload_len: c.u32().ok()? as usize,
        epoch: c.u64().ok()?,
        seq: c.u64().ok()?,
        mac: c.u64().ok()?,
    };
    Some((header, head))
}

/// The payload and the end of the frame at `at` if its MAC verifies, whatever its epoch
/// and number.
fn whole_at<'a>(image: &'a [u8], at: usize, key: &MacKey) -> Option<(Header, &'a [u8], usize)> {
    let (header, head) = header_at(image, at)?;
    if header.magic != FRAME_MAGIC {
        return None;
    }
    let start = at + FRAME_HEADER_BYTES;
    let next = start.checked_add(header.payload_len)?;
    let payload = image.get(start..next)?;
    (key.mac(&head[..24], payload) == header.mac).then_some((header, payload, next))
}

fn frame_at<'a>(image: &'a [u8], at: usize, key: &MacKey, epoch: u64, seq: u64) -> Frame<'a> {
    let Some((_, head)) = header_at(image, at) else {
        return Frame::Zeros;
    };
    if head.iter().all(|&b| b == 0) {
        return Frame::Zeros;
    }
    match whole_at(image, at, key) {
        Some((h, payload, next)) if h.epoch == epoch && h.seq == seq => {
            Frame::Valid { payload, next }
        }
        Some((h, _, _)) if h.epoch != epoch => Frame::Stale,
        _ => Frame::Torn,
    }
}

/// A whole frame of `epoch` numbered `seq` or later anywhere from `at` on: its number and
/// position. Looked for only when a replay stops at bytes that are not a whole frame of
/// this epoch (at most once per open: it reads the rest of the log).
fn later_frame(
    image: &[u8],
    at: usize,
    key: &MacKey,
    epoch: u64,
    seq: u64,
) -> Option<(u64, usize)> {
    let magic = FRAME_MAGIC.to_le_bytes();
    let last = image.len().checked_sub(FRAME_HEADER_BYTES)?;
    let mut i = at;
    while i <= last {
        // Candidates start with the magic's first byte.
        i += image[i..=last].iter().position(|&b| b == magic[0])?;
        if image[i..i + 4] == magic {
            if let Some((h, _, _)) = whole_at(image, i, key) {
                if h.epoch == epoch && h.seq >= seq {
                    return Some((h.seq, i));
                }
            }
        }
        i += 1;
    }
    None
}

/// The commit log's file for the database file at `path`: `<path>-log`.
pub(crate) fn log_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push("-log");
    PathBuf::from(name)
}

/// Opens the commit log of a freshly opened store: applies the frames of the current epoch
/// that it holds, then starts a new epoch with a checkpoint (so an open never writes
/// frames of an epoch that earlier frames may share). Returns the log for the writer when
/// the builder asks for one; otherwise a log found is applied, and a file's log removed.
pub(crate) fn open(b: &StoreConfig, store: &Store) -> Result<Option<CommitLog>, OpenError> {
    let state = store.log_state()?;
    let file = match (&b.log_backend, &b.path, b.backend.is_some()) {
        (Some(slot), _, _) => Some((slot.take()?, None)),
        (None, Some(path), false) => {
            let path = log_path(path);
            // A log the file says an engine was appending to is never created afresh: its
            // frames may be the only copy of acknowledged commits.
            let access = match b.logged && (!state.active || path.exists()) {
                true => Access::Create,
                false => Access::Write,
            };
            LogFile::open(&path, access, b.file_mode)?.map(|f| {
                let storage: Box<dyn Storage> = Box::new(f);
                (storage, Some(path))
            })
        }
        _ => None,
    };
    let Some((storage, path)) = file else {
        return match state.active {
            true => Err(missing(b.path.as_deref().map(log_path))),
            false => Ok(None),
        };
    };
    let named = path
        .clone()
        .unwrap_or_else(|| PathBuf::from("<log backend>"));
    let key = MacKey::from_secret(&store.hash_secret()?);
    let image = read_all(&*storage).map_err(OpenError::Io)?;
    let epoch = state.epoch;
    // The frames the file misses (at most the log's size of them, in memory), applied in
    // order in the checkpoint's own commit: one durable commit for the whole replay.
    let mut missed = Vec::new();
    let applied = replay(&image, &key, state, |batch, _| {
        missed.push(batch);
        Ok::<_, OpenError>(())
    })?;
    if let Err(ReplayError::Damaged(why)) = applied {
        return Err(OpenError::Corrupted {
            detail: format!("the commit log {}: {why}", named.display()),
        });
    }
    let next = epoch.checked_add(1).ok_or_else(|| OpenError::Corrupted {
        detail: "the commit log's epoch is at its limit".into(),
    })?;
    let checkpoint = Durable::Checkpoint {
        epoch: next,
        active: b.logged,
    };
    let writes: Vec<Write> = missed
        .iter()
        .flat_map(|batch| batch.writes.iter().map(OwnedWrite::borrow))
        .collect();
    let tables: Vec<&Batch> = missed
        .iter()
        .flat_map(|batch| batch.tables.iter())
        .collect();
    // The token mark only rises: the last frame's that carries one is the highest.
    let hwm = missed.iter().filter_map(|batch| batch.hwm).max();
    store.commit_on_open(&writes, &tables, hwm, checkpoint)?;
    if b.logged {
        match prepare(&*storage) {
            Ok(()) => {
                if let Some(path) = &path {
                    // The log's directory entry must be durable before a frame in it is
                    // acknowledged.
                    crate::store::storage::sync_dir(path).map_err(OpenError::Io)?;
                }
                return Ok(Some(CommitLog::new(storage, key, next)));
            }
            // No room for the log's 16 MiB: the engine runs without it, its group commits
            // durable redb commits, where redb alone would open. The file must say so
            // before the log goes (a file whose active log is missing is refused).
            Err(e) if e.kind() == io::ErrorKind::StorageFull => {
                let inactive = Durable::Checkpoint {
                    epoch: next,
                    active: false,
                };
                store.commit_on_open(&[], &[], None, inactive)?;
            }
            Err(e) => return Err(OpenError::Io(e)),
        }
    }
    let _ = storage.close();
    drop(storage);
    if let Some(path) = path {
        // Everything the log held is in the file, under a checkpoint: the log is empty (or
        // was never filled).
        std::fs::remove_file(&path).map_err(OpenError::Io)?;
        crate::store::storage::sync_dir(&path).map_err(OpenError::Io)?;
    }
    Ok(None)
}

/// The file says an engine was writing a commit log that cannot be found: acknowledged
/// commits may be in it alone.
fn missing(path: Option<PathBuf>) -> OpenError {
    let log = match &path {
        Some(path) => path.display().to_string(),
        None => "(a log_backend)".to_string(),
    };
    OpenError::Corrupted {
        detail: format!(
            "the file was last written by an engine with a commit log that was not closed, \
             and its log {log} is missing: acknowledged commits may be in the log alone; \
             nothing was changed: put the log back beside the file (or pass it as \
             log_backend), then open again"
        ),
    }
}

/// Refuses a read-only open of the file at `path` (in `state`) when its commit log holds
/// commits the file does not have, or is missing while the file says it was in use.
pub(crate) fn check_beside(
    path: &Path,
    store_secret: &[u8; HASH_SECRET_LEN],
    state: LogState,
) -> Result<(), OpenError> {
    let log = log_path(path);
    let Some(file) = LogFile::open(&log, Access::Read, 0)? else {
        return match state.active {
            true => Err(missing(Some(log))),
            false => Ok(()),
        };
    };
    let image = read_all(&file).map_err(OpenError::Io)?;
    match pending(&image, &MacKey::from_secret(store_secret), state) {
        true => Err(OpenError::UnappliedLog { path: log }),
        false => Ok(()),
    }
}

fn read_all(storage: &dyn Storage) -> io::Result<Vec<u8>> {
    let len = usize::try_from(storage.len()?.min(LOG_BYTES)).unwrap_or(0);
    let mut image = vec![0u8; len];
    storage.read(0, &mut image)?;
    Ok(image)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Debug, Clone, Default)]
    struct MemoryStorage(Arc<Mutex<Vec<u8>>>);

    impl Storage for MemoryStorage {
        fn len(&self) -> io::Result<u64> {
            Ok(self.0.lock().unwrap().len() as u64)
        }
        fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
            let d = self.0.lock().unwrap();
            out.copy_from_slice(&d[offset as usize..offset as usize + out.len()]);
            Ok(())
        }
        fn set_len(&self, len: u64) -> io::Result<()> {
            self.0.lock().unwrap().resize(len as usize, 0);
            Ok(())
        }
        fn sync_data(&self) -> io::Result<()> {
            Ok(())
        }
        fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
            let mut d = self.0.lock().unwrap();
            let end = offset as usize + data.len();
            if d.len() < end {
                d.resize(end, 0);
            }
            d[offset as usize..end].copy_from_slice(data);
            Ok(())
        }
    }

    fn key() -> MacKey {
        MacKey::from_secret(&[7u8; HASH_SECRET_LEN])
    }

    /// Frames back to back, and frames padded to whole blocks (the log file's direct
    /// writes): every layout test runs on both.
    const BLOCKS: [u64; 2] = [1, LOG_BLOCK_BYTES];

    fn log(epoch: u64) -> (CommitLog, MemoryStorage) {
        log_in(epoch, 1)
    }

    fn log_in(epoch: u64, block_bytes: u64) -> (CommitLog, MemoryStorage) {
        let storage = MemoryStorage::default();
        prepare(&storage).unwrap();
        (
            CommitLog::with_block(Box::new(storage.clone()), key(), epoch, block_bytes),
            storage,
        )
    }

    /// The length of the frame at `at` without its padding.
    fn unpadded_len(img: &[u8], at: usize) -> usize {
        let len = u32::from_le_bytes(img[at + 4..at + 8].try_into().unwrap());
        FRAME_HEADER_BYTES + len as usize
    }

    /// The log's content up to 4 KiB past its last write (the rest is zeros, and scanning
    /// 16 MiB for every case would only slow the tests).
    fn image(s: &MemoryStorage) -> Vec<u8> {
        let d = s.0.lock().unwrap();
        let used = d.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        d[..(used + 4096).min(d.len())].to_vec()
    }

    fn at(epoch: u64) -> LogState {
        LogState {
            epoch,
            applied: 0,
            active: true,
        }
    }

    fn all(image: &[u8], epoch: u64) -> Result<Vec<Replayed>, ReplayError> {
        from(image, at(epoch))
    }

    fn from(image: &[u8], state: LogState) -> Result<Vec<Replayed>, ReplayError> {
        let mut got = Vec::new();
        replay(image, &key(), state, |b, _| {
            got.push(b);
            Ok::<_, ()>(())
        })
        .unwrap()
        .map(|_| got)
    }

    fn batch() -> Batch {
        let mut b = Batch::default();
        b.rows
            .push((b"t\0row".as_slice().into(), Some(b"v".as_slice().into())));
        b.rows.push((b"t\0gone".as_slice().into(), None));
        b.messages.push((9, b"msg".as_slice().into()));
        b.sent.push(4);
        b
    }

    #[test]
    fn every_kind_of_write_comes_back_as_written() {
        let (mut log, s) = log(3);
        let writes = [
            Write::Put {
                token: 5,
                old: Some(2),
                value: b"rec",
            },
            Write::Delete { token: 6 },
            Write::Forget {
                token: 7,
                hash: 8,
                check: 9,
                marker_retention_ms: 10,
            },
            Write::DropMarker {
                hash: 11,
                token: 12,
            },
        ];
        let b = batch();
        assert_eq!(
            log.append(&writes, &[&b], Some(99)).unwrap(),
            Appended::Logged { seq: 0 }
        );
        // The size bound that decides `Full` before encoding never undercounts.
        let bound = encoded_len(&writes, &[&b]);
        assert!(bound >= log.offset(), "{bound} < {}", log.offset());
        assert!(
            bound < log.offset() + 64,
            "{bound} is loose: {}",
            log.offset()
        );
        assert_eq!(
            log.append(&[], &[], None).unwrap(),
            Appended::Logged { seq: 1 }
        );
        let got = all(&image(&s), 3).unwrap();
        assert_eq!(got.len(), 2);
        let first = &got[0];
        assert_eq!(first.hwm, Some(99));
        let back: Vec<String> = first
            .writes
            .iter()
            .map(|w| format!("{:?}", w.borrow()))
            .collect();
        let sent: Vec<String> = writes.iter().map(|w| format!("{w:?}")).collect();
        assert_eq!(back, sent);
        assert_eq!(first.tables.len(), 1);
        assert_eq!(first.tables[0].rows, b.rows);
        assert_eq!(first.tables[0].messages, b.messages);
        assert_eq!(first.tables[0].sent, b.sent);
        assert!(got[1].writes.is_empty() && got[1].hwm.is_none());
    }

    #[test]
    fn frames_of_another_epoch_or_key_are_not_replayed() {
        for block in BLOCKS {
            let (mut log, s) = log_in(4, block);
            log.append(&[Write::Delete { token: 1 }], &[], None)
                .unwrap();
            let img = image(&s);
            assert_eq!(all(&img, 4).unwrap().len(), 1);
            assert_eq!(all(&img, 5).unwrap().len(), 0);
            assert!(pending(&img, &key(), at(4)));
            assert!(!pending(&img, &key(), at(5)));
            let other = MacKey::from_secret(&[8u8; HASH_SECRET_LEN]);
            assert!(!pending(&img, &other, at(4)));
        }
    }

    #[test]
    fn a_restarted_epoch_overwrites_the_old_frames_and_replays_only_its_own() {
        for block in BLOCKS {
            let (mut log, s) = log_in(1, block);
            for t in 0..3 {
                log.append(&[Write::Delete { token: t }], &[], None)
                    .unwrap();
            }
            log.restart(2);
            log.append(&[Write::Delete { token: 50 }], &[], None)
                .unwrap();
            let got = all(&image(&s), 2).unwrap();
            assert_eq!(got.len(), 1);
            assert_eq!(got[0].writes, vec![OwnedWrite::Delete { token: 50 }]);
            // The first epoch's later frames are still there, but epoch 1 starts with a
            // frame of epoch 2 now: nothing of epoch 1 replays.
            assert_eq!(all(&image(&s), 1).unwrap().len(), 0);
        }
    }

    #[test]
    fn a_torn_last_frame_ends_the_log_at_every_cut() {
        for block in BLOCKS {
            let (mut log, s) = log_in(1, block);
            let value = vec![0xabu8; 300];
            let put = |t| Write::Put {
                token: t,
                old: None,
                value: &value,
            };
            log.append(&[put(1)], &[], None).unwrap();
            let whole = log.offset() as usize;
            log.append(&[put(2)], &[], None).unwrap();
            let img = image(&s);
            let end = whole + unpadded_len(&img, whole);
            // Every prefix of the second frame (the rest zeros, as pre-written) keeps the
            // first.
            for cut in whole..end {
                let mut torn = img.clone();
                torn[cut..end].fill(0);
                if torn == img {
                    // The frame's last bytes are zeros themselves: nothing was cut.
                    continue;
                }
                assert_eq!(
                    all(&torn, 1).unwrap().len(),
                    1,
                    "cut at {cut}, block {block}"
                );
            }
            // Every single-byte change of the second frame drops it, never the first.
            for at in whole..end {
                let mut flipped = img.clone();
                flipped[at] ^= 0x40;
                assert_eq!(
                    all(&flipped, 1).unwrap().len(),
                    1,
                    "flip at {at}, block {block}"
                );
            }
        }
    }

    #[test]
    fn padded_frames_start_on_blocks_and_replay_as_frames_back_to_back_do() {
        let value = vec![0x5au8; 700];
        let mut replayed = Vec::new();
        for block in BLOCKS {
            let (mut log, s) = log_in(1, block);
            for t in 0..9 {
                let start = log.offset();
                assert_eq!(start % block, 0, "frame {t} starts at {start}");
                let put = Write::Put {
                    token: t,
                    old: t.checked_sub(1),
                    value: &value[..(t as usize * 77) % 700],
                };
                log.append(&[put], &[], Some(t)).unwrap();
            }
            let got = all(&image(&s), 1).unwrap();
            assert_eq!(got.len(), 9);
            replayed.push(format!(
                "{:?}",
                got.iter().map(|r| (&r.writes, r.hwm)).collect::<Vec<_>>()
            ));
        }
        assert_eq!(replayed[0], replayed[1]);
    }

    #[test]
    fn a_zeroed_frame_followed_by_a_whole_one_is_refused() {
        for block in BLOCKS {
            let (img, starts) = frames_in(3, block);
            // The second frame's bytes (and padding) wiped, as a lost write would leave them.
            let mut zeroed = img.clone();
            zeroed[starts[1]..starts[2]].fill(0);
            assert!(
                matches!(all(&zeroed, 1), Err(ReplayError::Damaged(_))),
                "block {block}"
            );
            // The last frame wiped is a log that ends before it.
            let mut last = img.clone();
            let end = starts[2] + unpadded_len(&img, starts[2]);
            last[starts[2]..end].fill(0);
            assert_eq!(all(&last, 1).unwrap().len(), 2, "block {block}");
        }
    }

    #[test]
    fn damaged_padding_before_a_damaged_frame_is_refused_and_before_a_torn_last_one_ends() {
        let (img, starts) = frames_in(3, LOG_BLOCK_BYTES);
        let first_end = unpadded_len(&img, 0);
        let mut damaged = img.clone();
        damaged[first_end + 5] = 0x49;
        damaged[starts[1] + FRAME_HEADER_BYTES + 1] ^= 1;
        assert!(matches!(all(&damaged, 1), Err(ReplayError::Damaged(_))));
        let second_end = starts[1] + unpadded_len(&img, starts[1]);
        let mut torn = img.clone();
        torn[second_end + 5] = 0x49;
        torn[starts[2] + FRAME_HEADER_BYTES + 1] ^= 1;
        assert_eq!(all(&torn, 1).unwrap().len(), 2);
    }

    #[test]
    fn damaged_padding_neither_hides_the_next_frame_nor_counts_as_one() {
        let (img, starts) = frames_in(3, LOG_BLOCK_BYTES);
        let first_end = unpadded_len(&img, 0);
        assert!(first_end < starts[1], "the first frame is padded");
        for at in [first_end, (first_end + starts[1]) / 2, starts[1] - 1] {
            let mut damaged = img.clone();
            damaged[at] = 0x49; // the magic's first byte
            assert_eq!(all(&damaged, 1).unwrap().len(), 3, "padding byte {at}");
        }
    }

    /// A log of epoch 1 holding `n` one-write frames, and where each frame starts.
    fn frames(n: u64) -> (Vec<u8>, Vec<usize>) {
        frames_in(n, 1)
    }

    fn frames_in(n: u64, block_bytes: u64) -> (Vec<u8>, Vec<usize>) {
        let (mut log, s) = log_in(1, block_bytes);
        let mut starts = Vec::new();
        for t in 0..n {
            starts.push(log.offset() as usize);
            log.append(&[Write::Delete { token: t }], &[], None)
                .unwrap();
        }
        (image(&s), starts)
    }

    #[test]
    fn a_damaged_frame_followed_by_a_whole_one_is_refused() {
        for block in BLOCKS {
            let (mut img, starts) = frames_in(3, block);
            // A payload byte of the second frame.
            img[starts[1] + FRAME_HEADER_BYTES + 3] ^= 1;
            assert!(matches!(all(&img, 1), Err(ReplayError::Damaged(_))));
        }
    }

    #[test]
    fn a_batch_larger_than_what_is_left_is_reported_full_and_not_written() {
        let (mut log, s) = log(1);
        let big = vec![1u8; (LOG_BYTES / 2) as usize];
        let put = || Write::Put {
            token: 1,
            old: None,
            value: &big,
        };
        assert_eq!(
            log.append(&[put()], &[], None).unwrap(),
            Appended::Logged { seq: 0 }
        );
        let before = image(&s);
        assert_eq!(log.append(&[put()], &[], None).unwrap(), Appended::Full);
        assert_eq!(image(&s), before);
        log.restart(2);
        assert_eq!(
            log.append(&[put()], &[], None).unwrap(),
            Appended::Logged { seq: 0 }
        );
    }

    #[test]
    fn a_damaged_header_followed_by_a_whole_frame_is_refused() {
        for block in BLOCKS {
            let (img, starts) = frames_in(3, block);
            // Every byte of the second frame's header: magic, length, epoch, number, MAC.
            for byte in 0..FRAME_HEADER_BYTES {
                let mut damaged = img.clone();
                damaged[starts[1] + byte] ^= 0x10;
                assert!(
                    matches!(all(&damaged, 1), Err(ReplayError::Damaged(_))),
                    "header byte {byte}, block {block}"
                );
                assert!(pending(&damaged, &key(), at(1)), "header byte {byte}");
            }
            // The last frame's header damaged: a torn tail, the frames before it replay.
            let mut torn = img.clone();
            torn[starts[2] + 4] ^= 0x10;
            assert_eq!(all(&torn, 1).unwrap().len(), 2);
        }
    }

    #[test]
    fn frames_the_file_already_holds_are_skipped() {
        let (img, _) = frames_in(4, LOG_BLOCK_BYTES);
        let state = LogState {
            epoch: 1,
            applied: 3,
            active: true,
        };
        assert_eq!(from(&img, state).unwrap().len(), 1);
        let (img, _) = frames(4);
        let state = LogState {
            epoch: 1,
            applied: 3,
            active: true,
        };
        let got = from(&img, state).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].writes, vec![OwnedWrite::Delete { token: 3 }]);
        let all_held = LogState {
            applied: 4,
            ..state
        };
        assert!(!pending(&img, &key(), all_held));
        assert!(pending(&img, &key(), state));
    }

    #[test]
    fn damaged_counts_are_refused_without_allocating() {
        let mut payload = vec![0u8];
        payload.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode_payload(&payload).is_err());
        assert!(decode_payload(&[2]).is_err());
        assert!(decode_payload(&[]).is_err());
    }
}

#[cfg(test)]
mod log_file_tests {
    //! The commit log's own file, with the frames the log writes (they live here, beside
    //! the log, so that the file's module needs nothing of the log's).
    use super::{prepare, replay, CommitLog, LogState, MacKey, FRAME_HEADER_BYTES};
    use crate::base::limits::HASH_SECRET_LEN;
    use crate::base::sync::Ordering;
    use crate::store::backend::Storage;
    use crate::store::constants::{LOG_BLOCK_BYTES, LOG_BYTES};
    use crate::store::log_file::*;
    use crate::store::storage::Write;

    fn key() -> MacKey {
        MacKey::from_secret(&[3u8; HASH_SECRET_LEN])
    }

    fn read_all(file: &LogFile) -> Vec<u8> {
        let mut image = vec![0u8; file.len().unwrap() as usize];
        file.read(0, &mut image).unwrap();
        image
    }

    /// A new log file, prepared as an engine prepares it, in a directory that lives as long
    /// as the first value.
    fn created() -> (tempfile::TempDir, std::path::PathBuf, LogFile) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db-log");
        let file = LogFile::open(&path, Access::Create, 0o600)
            .unwrap()
            .unwrap();
        prepare(&file).unwrap();
        assert_eq!(file.len().unwrap(), LOG_BYTES);
        (dir, path, file)
    }

    #[test]
    fn frames_written_to_the_file_replay_after_it_is_opened_again() {
        frames_replay_after_a_reopen(false);
    }

    /// The same frames on a file system that refuses direct I/O (tmpfs before Linux 6.6,
    /// some network and FUSE file systems): the direct path is off, as after an `EINVAL`,
    /// and every frame goes through the page cache and an fdatasync.
    #[test]
    fn without_direct_io_frames_go_through_the_page_cache_and_replay() {
        frames_replay_after_a_reopen(true);
    }

    fn frames_replay_after_a_reopen(refused: bool) {
        let (_dir, path, file) = created();
        if refused {
            if let Some(direct) = &file.direct {
                direct.on.store(false, Ordering::Release);
            }
        }
        let mut log = CommitLog::new(Box::new(file), key(), 1);
        let value = vec![0x77u8; 9000];
        for t in 0..6u64 {
            let put = Write::Put {
                token: t,
                old: None,
                value: &value[..(t as usize * 1500)],
            };
            log.stage(&[put], &[], None, false).unwrap();
        }
        drop(log);
        let again = LogFile::open(&path, Access::Read, 0).unwrap().unwrap();
        assert!(
            again.direct.is_none(),
            "only an appending engine writes directly"
        );
        let image = read_all(&again);
        // Each frame starts on a block, right after the previous one's padding.
        let mut at = 0;
        for t in 0..6 {
            assert_eq!(&image[at..at + 4], b"IKVL", "frame {t} at {at}");
            let len = u32::from_le_bytes(image[at + 4..at + 8].try_into().unwrap()) as usize;
            at = (at + FRAME_HEADER_BYTES + len).next_multiple_of(LOG_BLOCK_BYTES as usize);
        }
        let state = LogState {
            epoch: 1,
            applied: 0,
            active: true,
        };
        let mut tokens = Vec::new();
        let replayed = replay(&image, &key(), state, |batch, _| {
            for w in &batch.writes {
                tokens.push(w.borrow().token());
            }
            Ok::<_, ()>(())
        })
        .unwrap()
        .unwrap();
        assert_eq!(replayed, 6);
        assert_eq!(tokens, (0..6).collect::<Vec<_>>());
    }

    #[test]
    fn writes_that_are_not_whole_blocks_go_through_the_page_cache_and_are_synced() {
        let (_dir, _path, file) = created();
        assert!(
            !file.dirty.load(Ordering::Acquire),
            "prepare ends with a sync"
        );
        let block = LOG_BLOCK_BYTES as usize;
        let whole = vec![0xa5u8; 2 * block];
        file.write(LOG_BLOCK_BYTES, &whole).unwrap();
        // Written directly, or through the cache and due for a flush: never neither.
        let direct = file
            .direct
            .as_ref()
            .is_some_and(|d| d.on.load(Ordering::Acquire));
        assert_eq!(file.dirty.load(Ordering::Acquire), !direct);
        eprintln!("the log file's whole blocks were written directly: {direct}");
        let odd = b"not a whole block";
        file.write(100, odd).unwrap();
        assert!(file.dirty.load(Ordering::Acquire));
        file.sync_data().unwrap();
        assert!(!file.dirty.load(Ordering::Acquire));
        let image = read_all(&file);
        assert_eq!(&image[100..100 + odd.len()], odd);
        assert_eq!(&image[block..3 * block], &whole[..]);
    }
}
