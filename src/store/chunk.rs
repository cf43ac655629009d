//! Records packed into chunks: the layout of the `idemkv_chunks` table (file format 5).
//!
//! A chunk holds the records of consecutive tokens, stored under its first token:
//! `version (1) | entries | crc32c(first token ‖ version ‖ entries) (u32 LE)`, each entry
//! `token delta | length | record` (LEB128 varints; the first entry's delta is from the
//! chunk's key, so 0), in strictly increasing token order. The checksum covers the framing
//! and the key, so a damaged length or a chunk under another key is caught as corruption
//! before any entry is parsed; each record keeps its own checksum bound to its token.
//!
//! Chunks are sized so that one fills one redb leaf page ([`CHUNK_BYTES_MAX`]): records are
//! appended in token order, so a B-tree keyed by token would split its right-edge leaf in
//! half on every overflow and leave every leaf half full; a full chunk is never split.

use crate::store::constants::CHUNK_BYTES_MAX;
use std::fmt;

/// The chunk encoding's version byte.
const CHUNK_VERSION: u8 = 1;
const HEADER_LEN: usize = 1;
const TRAILER_LEN: usize = 4;
/// Bytes of a chunk around its entries.
pub(crate) const CHUNK_OVERHEAD_BYTES: usize = HEADER_LEN + TRAILER_LEN;

/// Why a chunk could not be parsed: the file is damaged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ChunkError(pub(crate) String);

impl fmt::Display for ChunkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn varint_len(v: u64) -> usize {
    let bits = 64 - v.leading_zeros() as usize;
    bits.div_ceil(7).max(1)
}

/// Reads a varint at `*at`, moving past it; `None` if it runs past the end or past 64 bits.
fn get_varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *bytes.get(*at)?;
        *at += 1;
        let low = u64::from(b & 0x7F);
        if shift == 63 && low > 1 {
            return None;
        }
        v |= low << shift;
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// Bytes an entry takes: its delta, its length and its record.
pub(crate) fn entry_bytes(delta: u64, record_len: usize) -> usize {
    varint_len(delta) + varint_len(record_len as u64) + record_len
}

fn checksum(key: u64, body: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&key.to_le_bytes()), body)
}

/// Encodes `entries` (strictly increasing tokens, at least one) as the chunk stored under
/// the first one's token.
pub(crate) fn encode(entries: &[(u64, Vec<u8>)]) -> Vec<u8> {
    let key = entries.first().map_or(0, |e| e.0);
    let mut out = Vec::with_capacity(CHUNK_BYTES_MAX);
    out.push(CHUNK_VERSION);
    let mut prev = key;
    for (token, record) in entries {
        debug_assert!(*token >= prev, "chunk entries in token order");
        put_varint(&mut out, token.wrapping_sub(prev));
        put_varint(&mut out, record.len() as u64);
        out.extend_from_slice(record);
        prev = *token;
    }
    let crc = checksum(key, &out);
    out.extend_from_slice(&crc.to_le_bytes());
    debug_assert_eq!(decode(key, &out).as_ref(), Ok(&entries.to_vec()));
    out
}

/// Calls `f` with each entry of the chunk stored under `key`, in token order, after checking
/// the whole chunk; stops when `f` returns false.
pub(crate) fn for_each<'a>(
    key: u64,
    bytes: &'a [u8],
    mut f: impl FnMut(u64, &'a [u8]) -> bool,
) -> Result<(), ChunkError> {
    let damaged = |what: &str| ChunkError(format!("the chunk under token {key} {what}"));
    if bytes.len() < CHUNK_OVERHEAD_BYTES {
        return Err(damaged(&format!("is {} bytes: too short", bytes.len())));
    }
    let (body, trailer) = bytes.split_at(bytes.len() - TRAILER_LEN);
    let stored = u32::from_le_bytes([trailer[0], trailer[1], trailer[2], trailer[3]]);
    if stored != checksum(key, body) {
        return Err(damaged("fails its checksum"));
    }
    if body[0] != CHUNK_VERSION {
        return Err(damaged(&format!("has unknown version {}", body[0])));
    }
    let mut at = HEADER_LEN;
    let mut prev: Option<u64> = None;
    while at < body.len() {
        let delta = get_varint(body, &mut at).ok_or_else(|| damaged("has a damaged delta"))?;
        let token = match prev {
            None if delta == 0 => key,
            Some(p) if delta > 0 => p
                .checked_add(delta)
                .ok_or_else(|| damaged("has a token past u64"))?,
            _ => return Err(damaged("has tokens out of order")),
        };
        let len = get_varint(body, &mut at).ok_or_else(|| damaged("has a damaged length"))?;
        let end = usize::try_from(len)
            .ok()
            .and_then(|len| at.checked_add(len))
            .filter(|&end| end <= body.len())
            .ok_or_else(|| damaged("has a length past its end"))?;
        if !f(token, &body[at..end]) {
            return Ok(());
        }
        at = end;
        prev = Some(token);
    }
    if prev.is_none() {
        return Err(damaged("is empty"));
    }
    Ok(())
}

/// Every entry of the chunk stored under `key`.
pub(crate) fn decode(key: u64, bytes: &[u8]) -> Result<Vec<(u64, Vec<u8>)>, ChunkError> {
    let mut entries = Vec::new();
    for_each(key, bytes, |token, record| {
        entries.push((token, record.to_vec()));
        true
    })?;
    Ok(entries)
}

/// The record under `token` in the chunk stored under `key`, if it holds one.
pub(crate) fn find(key: u64, bytes: &[u8], token: u64) -> Result<Option<&[u8]>, ChunkError> {
    let mut found = None;
    for_each(key, bytes, |t, record| {
        if t == token {
            found = Some(record);
        }
        t < token
    })?;
    Ok(found)
}

/// The last token of the chunk stored under `key`.
pub(crate) fn last_token(key: u64, bytes: &[u8]) -> Result<u64, ChunkError> {
    let mut last = key;
    for_each(key, bytes, |t, _| {
        last = t;
        true
    })?;
    Ok(last)
}

/// Packs entries (in strictly increasing token order) greedily into chunks of at most
/// [`CHUNK_BYTES_MAX`] bytes: each chunk is filled before the next is started, so every
/// chunk but the last is full to within one entry. An entry larger than a chunk gets a
/// chunk of its own.
#[derive(Debug, Default)]
pub(crate) struct Packer {
    entries: Vec<(u64, Vec<u8>)>,
    bytes: usize,
}

impl Packer {
    /// Adds the next entry; returns the chunk it closed, if it did not fit beside it.
    pub(crate) fn push(&mut self, token: u64, record: Vec<u8>) -> Option<Vec<(u64, Vec<u8>)>> {
        let delta = self.entries.last().map_or(0, |(prev, _)| token - prev);
        let bytes = entry_bytes(delta, record.len());
        let full = !self.entries.is_empty() && self.bytes + bytes > CHUNK_BYTES_MAX;
        let closed = full.then(|| std::mem::take(&mut self.entries));
        if self.entries.is_empty() {
            self.bytes = CHUNK_OVERHEAD_BYTES + entry_bytes(0, record.len());
        } else {
            self.bytes += bytes;
        }
        self.entries.push((token, record));
        closed
    }

    /// The last, partly filled chunk, if any entry is left.
    pub(crate) fn finish(self) -> Option<Vec<(u64, Vec<u8>)>> {
        (!self.entries.is_empty()).then_some(self.entries)
    }
}

/// The bytes the chunk of `entries` takes once encoded.
#[cfg(test)]
fn encoded_bytes(entries: &[(u64, Vec<u8>)]) -> usize {
    let mut prev = entries.first().map_or(0, |e| e.0);
    let mut total = CHUNK_OVERHEAD_BYTES;
    for (token, record) in entries {
        total += entry_bytes(token - prev, record.len());
        prev = *token;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(tokens: &[u64], len: usize) -> Vec<(u64, Vec<u8>)> {
        tokens.iter().map(|&t| (t, vec![t as u8; len])).collect()
    }

    #[test]
    fn varints_round_trip_at_every_width() {
        for v in [
            0,
            1,
            127,
            128,
            16_383,
            16_384,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            assert_eq!(out.len(), varint_len(v));
            let mut at = 0;
            assert_eq!(get_varint(&out, &mut at), Some(v));
            assert_eq!(at, out.len());
        }
        // Eleven continuation bytes, or a tenth byte past bit 63: not a u64.
        assert_eq!(get_varint(&[0xFF; 11], &mut 0), None);
        assert_eq!(
            get_varint(
                &[0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x02],
                &mut 0
            ),
            None
        );
    }

    #[test]
    fn a_chunk_round_trips_and_finds_each_token() {
        let e = entries(&[7, 8, 10, 300, 70_000], 20);
        let bytes = encode(&e);
        assert_eq!(bytes.len(), encoded_bytes(&e));
        assert_eq!(decode(7, &bytes), Ok(e.clone()));
        for (t, r) in &e {
            assert_eq!(find(7, &bytes, *t), Ok(Some(&r[..])));
        }
        assert_eq!(find(7, &bytes, 9), Ok(None));
        assert_eq!(find(7, &bytes, 70_001), Ok(None));
        assert_eq!(last_token(7, &bytes), Ok(70_000));
    }

    /// Every flipped bit, every truncation and the chunk under another key are refused:
    /// a damaged length is never parsed into a wrong record.
    #[test]
    fn every_damage_to_a_chunk_is_refused() {
        let bytes = encode(&entries(&[7, 8, 10], 5));
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut damaged = bytes.clone();
                damaged[i] ^= 1 << bit;
                assert!(decode(7, &damaged).is_err(), "flip at {i}.{bit}");
            }
        }
        for n in 0..bytes.len() {
            assert!(decode(7, &bytes[..n]).is_err(), "cut at {n}");
        }
        assert!(decode(8, &bytes).is_err());
    }

    #[test]
    fn packing_fills_each_chunk_before_the_next() {
        let mut packer = Packer::default();
        let mut chunks = Vec::new();
        for t in 1..=1000u64 {
            chunks.extend(packer.push(t, vec![0; 100]));
        }
        chunks.extend(packer.finish());
        let all: Vec<u64> = chunks.iter().flatten().map(|e| e.0).collect();
        assert_eq!(all, (1..=1000).collect::<Vec<_>>());
        let (last, full) = chunks.split_last().expect("chunks");
        for c in full {
            let n = encoded_bytes(c);
            assert!(n <= CHUNK_BYTES_MAX && n + entry_bytes(1, 100) > CHUNK_BYTES_MAX);
        }
        assert!(encoded_bytes(last) <= CHUNK_BYTES_MAX);
        // A record larger than a chunk gets one of its own.
        let mut packer = Packer::default();
        assert!(packer.push(1, vec![0; 10]).is_none());
        assert_eq!(
            packer
                .push(2, vec![0; 3 * CHUNK_BYTES_MAX])
                .map(|c| c.len()),
            Some(1)
        );
        assert_eq!(packer.push(3, vec![0; 10]).map(|c| c.len()), Some(1));
        assert_eq!(packer.finish().map(|c| c.len()), Some(1));
    }
}
