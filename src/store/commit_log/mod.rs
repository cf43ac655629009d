//! The commit log (every `Immediate` engine with a file): a group commit made durable by
//! one durable append to a pre-written log file (`log_file.rs`: a direct, synchronous write
//! on Linux, else a write and an fdatasync), instead of a two-phase redb commit (two
//! fsyncs). The acknowledged batches then reach the redb file in the applier's durable
//! commits (`apply.rs`); a *checkpoint* (a durable redb commit that also starts a new log
//! epoch) restarts the log when it is full, at close, and at every open.
//!
//! Here: the log a writer appends to. A frame's payload is `payload.rs`, reading the log
//! back `replay.rs`, the log beside its file and its open `open.rs`.
//!
//! Definitions:
//! - An *epoch* numbers the log's lives. Every checkpoint makes the next epoch current in
//!   the same durable commit, then the log is written again from offset 0.
//! - A *frame* is one batch: a 32-byte header (magic, payload length, epoch, sequence
//!   number, MAC) and the payload (the batch's writes, table writes and token mark),
//!   followed by zeros up to a multiple of the log's block when it has one (the log file's
//!   direct writes take whole blocks); a replay finds the next frame at either place.
//! - The file's meta row `log_state` (`LogState`) holds the epoch, how many of its frames
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
use crate::store::backend::Storage;
use crate::store::batch::Batch;
use crate::store::constants::{LOG_BLOCK_BYTES, LOG_BYTES, LOG_ZERO_CHUNK_BYTES};
use crate::store::storage::Durable;
use crate::store::storage::Write;
use std::hash::Hasher;
use std::io;

#[cfg(test)]
mod log_file_tests;
mod open;
mod payload;
mod replay;
#[cfg(test)]
mod tests;

pub(crate) use open::{check_beside, open};
use payload::{encode_payload, encoded_len};
pub(crate) use replay::ReplayError;

const FRAME_MAGIC: u32 = u32::from_le_bytes(*b"IKVL");
pub(crate) const FRAME_HEADER_BYTES: usize = 32;

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
