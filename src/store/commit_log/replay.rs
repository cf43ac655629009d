//! Reading a log back: the frames of the current epoch after those the file holds, in
//! order, each verified by its MAC; a torn last frame ends the log, a damaged one before a
//! whole one is refused.

use super::payload::{decode_payload, Replayed};
use super::{MacKey, FRAME_HEADER_BYTES, FRAME_MAGIC};
use crate::store::constants::LOG_BLOCK_BYTES;
use crate::store::log_state::Cursor;
use crate::store::log_state::LogState;

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
