//! The chunks a commit changes: loaded from the file once per range of tokens, changed in
//! memory (records inserted, replaced and removed, neighbours merged), and written back
//! whole (`chunk.rs` has the chunk format).

use crate::model::codec::DecodeError;
use crate::model::error::OpenError;
use crate::store::chunk::{self, Packer};
use crate::store::constants::{CHUNK_BYTES_MAX, REDB_PAGE_BYTES};
use redb::{ReadableTable, Table};
use std::collections::BTreeMap;
use std::ops::Bound;

/// A chunk's records by token.
pub(crate) type Entries = BTreeMap<u64, Vec<u8>>;

/// A damaged chunk met inside a commit: the commit fails (and the engine is poisoned), as
/// for any page redb finds damaged.
pub(crate) fn chunk_damage(e: chunk::ChunkError) -> redb::Error {
    redb::StorageError::Corrupted(e.to_string()).into()
}

/// A damaged chunk met by an open or a scan.
pub(crate) fn damaged_chunk(e: chunk::ChunkError) -> OpenError {
    OpenError::Corrupted {
        detail: e.to_string(),
    }
}

/// The chunks one commit changes, decoded, by the key each is stored under in the file (a
/// chunk the commit starts: under its first token). Chunk boundaries stay where they are
/// until [`ChunkSet::write`], so every write of the commit finds a token's chunk the same
/// way: the last chunk whose key is at or below the token, else the first chunk.
#[derive(Default)]
pub(crate) struct ChunkSet {
    loaded: BTreeMap<u64, Entries>,
    /// The records the loaded chunks held in the file.
    stored: u64,
    /// The pages the loaded chunks took in the file ([`value_pages`]).
    stored_pages: u64,
    /// The token ranges located so far, by first token: the range's end (exclusive) and
    /// the chunk its tokens belong in. A commit's writes mostly land in a few chunks (new
    /// tokens in the last ones, completions just behind, expiries in the oldest), so most
    /// writes find their chunk here instead of in a search of the file's tree (a third of
    /// an apply's CPU before). Valid while the set of chunk keys stays the same, which it
    /// does from a commit's first write to [`ChunkSet::write`], except when a write starts
    /// the first chunk of an empty table ([`ChunkSet::load`] then clears it).
    located: BTreeMap<u64, (u64, u64)>,
}

impl ChunkSet {
    /// The chunk stored under `key` (empty if none is: a chunk this commit starts).
    pub(crate) fn load(
        &mut self,
        table: &impl ReadableTable<u64, &'static [u8]>,
        key: u64,
    ) -> Result<&mut Entries, redb::Error> {
        if !self.loaded.contains_key(&key) {
            let entries = match table.get(key)? {
                Some(v) => {
                    self.stored_pages += value_pages(v.value().len());
                    chunk::decode(key, v.value()).map_err(chunk_damage)?
                }
                None => {
                    // A chunk key the file does not hold: the ranges located may now end
                    // at it.
                    self.located.clear();
                    Vec::new()
                }
            };
            self.stored += entries.len() as u64;
            self.loaded.insert(key, entries.into_iter().collect());
        }
        Ok(self.loaded.entry(key).or_default())
    }

    /// The key of the chunk `token` belongs in; `None` if there is no chunk at all. Asks
    /// the file's tree only for a token outside every range located before, and then
    /// remembers the range of tokens that share its answer: from its chunk's key (from 0
    /// below the first chunk) to the next chunk's key.
    pub(crate) fn locate(
        &mut self,
        table: &impl ReadableTable<u64, &'static [u8]>,
        token: u64,
    ) -> Result<Option<u64>, redb::Error> {
        if let Some((_, &(end, key))) = self.located.range(..=token).next_back() {
            if token < end {
                debug_assert_eq!(self.search(table, token).ok(), Some(Some(key)));
                return Ok(Some(key));
            }
        }
        let Some(key) = self.search(table, token)? else {
            return Ok(None);
        };
        let after = (Bound::Excluded(key), Bound::Unbounded);
        let next_stored = match table.range::<u64>(after)?.next() {
            Some(entry) => Some(entry?.0.value()),
            None => None,
        };
        let next_started = self.loaded.range(after).next().map(|(k, _)| *k);
        let end = match (next_stored, next_started) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).unwrap_or(u64::MAX),
        };
        let start = if key <= token { key } else { 0 };
        self.located.insert(start, (end, key));
        Ok(Some(key))
    }

    /// [`ChunkSet::locate`] without the ranges: the last chunk whose key is at or below
    /// `token`, else the first chunk, in the file or started by this commit.
    pub(crate) fn search(
        &self,
        table: &impl ReadableTable<u64, &'static [u8]>,
        token: u64,
    ) -> Result<Option<u64>, redb::Error> {
        let stored = match table.range(..=token)?.next_back() {
            Some(entry) => Some(entry?.0.value()),
            None => None,
        };
        let started = self.loaded.range(..=token).next_back().map(|(k, _)| *k);
        if let Some(key) = stored.max(started) {
            return Ok(Some(key));
        }
        // Below every chunk: the first one (repacked under its new first token).
        let stored = table.first()?.map(|(k, _)| k.value());
        let started = self.loaded.keys().next().copied();
        Ok(match (stored, started) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        })
    }

    pub(crate) fn remove(
        &mut self,
        table: &impl ReadableTable<u64, &'static [u8]>,
        token: u64,
    ) -> Result<Option<Vec<u8>>, redb::Error> {
        let Some(key) = self.locate(table, token)? else {
            return Ok(None);
        };
        Ok(self.load(table, key)?.remove(&token))
    }

    pub(crate) fn insert(
        &mut self,
        table: &impl ReadableTable<u64, &'static [u8]>,
        token: u64,
        record: &[u8],
    ) -> Result<(), redb::Error> {
        let key = self.locate(table, token)?.unwrap_or(token);
        self.load(table, key)?.insert(token, record.to_vec());
        Ok(())
    }

    /// Adds to the set, for [`ChunkSet::write`] to merge, the stored neighbour of each
    /// changed chunk left under half full (the right-hand one, else the left-hand one) when
    /// both fit in one chunk.
    pub(crate) fn add_merges(
        &mut self,
        table: &impl ReadableTable<u64, &'static [u8]>,
    ) -> Result<(), redb::Error> {
        let small: Vec<(u64, usize)> = self
            .loaded
            .iter()
            .filter(|(_, entries)| !entries.is_empty())
            .map(|(key, entries)| (*key, encoded_bytes(entries)))
            .filter(|(_, bytes)| *bytes < CHUNK_BYTES_MAX / 2)
            .collect();
        for (key, bytes) in small {
            let right = match table.range(key.saturating_add(1)..)?.next() {
                Some(entry) => Some(entry?),
                None => None,
            };
            let left = match table.range(..key)?.next_back() {
                Some(entry) => Some(entry?),
                None => None,
            };
            let fits = |(k, v): &(redb::AccessGuard<u64>, redb::AccessGuard<&[u8]>)| {
                (bytes + v.value().len() <= CHUNK_BYTES_MAX).then_some(k.value())
            };
            let neighbour = right
                .as_ref()
                .and_then(fits)
                .or(left.as_ref().and_then(fits));
            if let Some(neighbour) = neighbour {
                self.load(table, neighbour)?;
            }
        }
        Ok(())
    }

    /// Writes the changed chunks back. Each run of changed chunks with no unchanged stored
    /// chunk between them is repacked greedily ([`Packer`]): every chunk of a run but its
    /// last is full, a chunk that outgrew its budget spills into the next, a chunk left
    /// under half full merges with a neighbour ([`ChunkSet::add_merges`]), and a chunk left
    /// empty is removed. Every chunk is stored under its first token. Returns the change in
    /// the number of records the file holds.
    pub(crate) fn write(
        mut self,
        table: &mut Table<u64, &'static [u8]>,
    ) -> Result<(i64, i64), redb::Error> {
        self.add_merges(table)?;
        let mut runs: Vec<Vec<u64>> = Vec::new();
        let mut prev: Option<u64> = None;
        for &key in self.loaded.keys() {
            let joins = match prev {
                Some(p) => table.range(p.saturating_add(1)..key)?.next().is_none(),
                None => false,
            };
            match runs.last_mut() {
                Some(run) if joins => run.push(key),
                _ => runs.push(vec![key]),
            }
            prev = Some(key);
        }
        let mut written = 0u64;
        let mut written_pages = 0u64;
        for run in runs {
            let mut packer = Packer::default();
            let mut packed = Vec::new();
            for key in run {
                table.remove(key)?;
                for (token, record) in self.loaded.remove(&key).unwrap_or_default() {
                    packed.extend(packer.push(token, record));
                }
            }
            packed.extend(packer.finish());
            for entries in packed {
                if let Some(&(first, _)) = entries.first() {
                    written += entries.len() as u64;
                    let value = chunk::encode(&entries);
                    written_pages += value_pages(value.len());
                    table.insert(first, value.as_slice())?;
                }
            }
        }
        Ok((
            written.wrapping_sub(self.stored) as i64,
            written_pages.wrapping_sub(self.stored_pages) as i64,
        ))
    }
}

/// The bytes the chunk of `entries` takes once encoded.
pub(crate) fn encoded_bytes(entries: &Entries) -> usize {
    let mut prev = entries.keys().next().copied().unwrap_or(0);
    let mut total = chunk::CHUNK_OVERHEAD_BYTES;
    for (token, record) in entries {
        total += chunk::entry_bytes(token - prev, record.len());
        prev = *token;
    }
    total
}

/// Calls `f` with the record under `token` in the chunks `table`: `None` if no chunk holds
/// it, `Some(Err)` if its chunk is damaged.
pub(crate) fn chunk_get<T>(
    table: &impl ReadableTable<u64, &'static [u8]>,
    token: u64,
    f: impl FnOnce(&[u8]) -> Result<T, DecodeError>,
) -> Result<Option<Result<T, DecodeError>>, redb::StorageError> {
    let Some(entry) = table.range(..=token)?.next_back() else {
        return Ok(None);
    };
    let (key, value) = entry?;
    match chunk::find(key.value(), value.value(), token) {
        Ok(Some(bytes)) => Ok(Some(f(bytes))),
        Ok(None) => Ok(None),
        Err(e) => Ok(Some(Err(DecodeError::Body(e.to_string())))),
    }
}

/// The pages a redb leaf holding one chunk of `bytes` takes: one for a chunk of at most
/// `CHUNK_BYTES_MAX`, else the power of two of pages that holds the chunk and the leaf's 16
/// bytes of framing (redb allocates pages in powers of two). A smaller chunk may share a
/// leaf with another: counted as a page of its own, which errs towards a fuller file.
pub(crate) fn value_pages(bytes: usize) -> u64 {
    let framing = REDB_PAGE_BYTES - CHUNK_BYTES_MAX as u64;
    let framed = (bytes as u64).saturating_add(framing);
    framed.div_ceil(REDB_PAGE_BYTES).max(1).next_power_of_two()
}
