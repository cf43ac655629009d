use super::commit::apply_writes;
use super::*;
use crate::store::chunk_set::value_pages;
use crate::store::constants::CHUNK_BYTES_MAX;
use std::collections::BTreeMap;

fn db() -> Database {
    Database::builder()
        .create_with_backend(redb::backends::InMemoryBackend::new())
        .expect("an in-memory database")
}

fn commit(db: &Database, writes: &[Write]) {
    let txn = db.begin_write().expect("a write transaction");
    apply_writes(&txn, writes, &mut Vec::new()).expect("the writes apply");
    txn.commit().expect("the commit");
}

/// Every chunk (key and encoded size) after checking the layout's invariants against
/// `want`, the records the file must hold: each chunk stored under its first token and
/// within its budget (unless it holds one record), the records in token order.
fn chunks(db: &Database, want: &BTreeMap<u64, Vec<u8>>) -> Vec<(u64, usize)> {
    let txn = db.begin_read().expect("a read transaction");
    let table = txn.open_table(CHUNKS).expect("the chunks table");
    let mut found = BTreeMap::new();
    let mut sizes = Vec::new();
    for entry in table.iter().expect("iterates") {
        let (k, v) = entry.expect("an entry");
        let entries = chunk::decode(k.value(), v.value()).expect("a valid chunk");
        assert_eq!(entries.first().map(|e| e.0), Some(k.value()));
        assert!(v.value().len() <= CHUNK_BYTES_MAX || entries.len() == 1);
        assert!(found.last_key_value().is_none_or(|(&l, _)| l < k.value()));
        found.extend(entries);
        sizes.push((k.value(), v.value().len()));
    }
    assert_eq!(&found, want);
    let meta = txn.open_table(META).expect("the meta table");
    let count = meta
        .get(META_RECORD_COUNT)
        .expect("reads")
        .map(|v| v.value().to_vec());
    let count = count.map_or(0, |v| u64::from_le_bytes(v.try_into().expect("8 bytes")));
    assert_eq!(count, want.len() as u64);
    sizes
}

/// A leaf takes a page up to a full chunk, then a power of two of pages.
#[test]
fn a_chunk_takes_the_pages_redb_allocates_for_its_leaf() {
    assert_eq!(value_pages(0), 1);
    assert_eq!(value_pages(CHUNK_BYTES_MAX), 1);
    assert_eq!(value_pages(CHUNK_BYTES_MAX + 1), 2);
    assert_eq!(value_pages(2 * 4096 - 16), 2);
    assert_eq!(value_pages(2 * 4096 - 15), 4);
    assert_eq!(value_pages(100_000), 32);
}

/// The pages the commits count as they change the chunks are the pages of the chunks
/// they leave, through appends, records larger than a chunk, growth in place and
/// deletions; an open's count starts from its scans, and commits before them are not
/// counted.
#[test]
fn commits_keep_the_count_of_the_chunks_pages() {
    let db = db();
    let mut counted = ChunkPages {
        known: Some(0),
        ..ChunkPages::default()
    };
    let mut commit = |writes: &[Write]| {
        let txn = db.begin_write().expect("a write transaction");
        let pages = apply_writes(&txn, writes, &mut Vec::new()).expect("the writes apply");
        txn.commit().expect("the commit");
        counted.committed(pages);
    };
    let values: Vec<Vec<u8>> = (0..400u64)
        .map(|t| value(t, if t % 50 == 7 { 9_000 } else { 120 }))
        .collect();
    for (batch, chunk) in values.chunks(9).enumerate() {
        let writes: Vec<Write> = chunk
            .iter()
            .enumerate()
            .map(|(i, v)| Write::Put {
                token: (batch * 9 + i) as u64,
                old: None,
                value: v,
            })
            .collect();
        commit(&writes);
    }
    let grown: Vec<Vec<u8>> = (100..140u64).map(|t| value(t, 700)).collect();
    let writes: Vec<Write> = grown
        .iter()
        .zip(100u64..)
        .map(|(v, t)| Write::Put {
            token: t,
            old: Some(t),
            value: v,
        })
        .collect();
    commit(&writes);
    let deletes: Vec<Write> = (0..250u64).map(|token| Write::Delete { token }).collect();
    commit(&deletes);
    let txn = db.begin_read().expect("a read transaction");
    let table = txn.open_table(CHUNKS).expect("the chunks table");
    let mut pages = 0;
    for entry in table.iter().expect("iterates") {
        pages += value_pages(entry.expect("an entry").1.value().len());
    }
    assert!(pages > 10, "{pages}");
    assert_eq!(counted.known, Some(pages));
    // An open: commits before its scans are not counted, the scans add up, and the
    // commits after them count on from there.
    let mut open = ChunkPages::default();
    open.committed(5);
    assert_eq!(open.known, None);
    open.scanned(30);
    open.scanned(12);
    open.committed(-2);
    assert_eq!(open.known, Some(40));
    open.scanned(7);
    open.committed(1);
    assert_eq!(open.known, Some(41));
}

fn value(token: u64, len: usize) -> Vec<u8> {
    vec![token as u8; len]
}

/// The writes that store each `(token, value)`, replacing the record under `old(token)`.
fn puts(values: &[(u64, Vec<u8>)], old: impl Fn(u64) -> Option<u64>) -> Vec<Write<'_>> {
    values
        .iter()
        .map(|(t, v)| Write::Put {
            token: *t,
            old: old(*t),
            value: v,
        })
        .collect()
}

/// Appends fill each chunk before the next; a record that grows in the middle spills
/// into the next chunk; a record larger than a chunk gets one of its own.
#[test]
fn appends_fill_chunks_and_growth_spills() {
    let db = db();
    let mut want = BTreeMap::new();
    for batch in 0..300u64 {
        let values: Vec<(u64, Vec<u8>)> = (1..=7)
            .map(|i| (batch * 7 + i, value(batch * 7 + i, 100)))
            .collect();
        commit(&db, &puts(&values, |_| None));
        want.extend(values);
    }
    let sizes = chunks(&db, &want);
    let (_, full) = sizes.split_last().expect("chunks");
    assert!(
        full.iter().all(|&(_, n)| n + 103 > CHUNK_BYTES_MAX),
        "{sizes:?}"
    );
    // InFlight records completed in place, in the middle: they grow.
    let grown: Vec<(u64, Vec<u8>)> = (500..540).map(|t| (t, value(t, 300))).collect();
    commit(&db, &puts(&grown, Some));
    want.extend(grown);
    chunks(&db, &want);
    // A record larger than a chunk.
    let big = value(5000, 3 * CHUNK_BYTES_MAX);
    commit(
        &db,
        &[Write::Put {
            token: 5000,
            old: Some(1000),
            value: &big,
        }],
    );
    want.remove(&1000);
    want.insert(5000, big);
    let sizes = chunks(&db, &want);
    assert_eq!(sizes.last().map(|s| s.0), Some(5000));
}

/// Writes in any order within a commit (new tokens, completions behind them, removals
/// of old ones, tokens below every chunk, an empty table's first chunk) find the chunk
/// a search of the tree would: each located range is checked against the search in
/// debug builds, and the file against a model after every commit.
#[test]
fn located_ranges_answer_as_the_search_does() {
    let db = db();
    let mut want: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let mut top = 1_000u64;
    for _ in 0..120 {
        let mut puts: BTreeMap<u64, (Option<u64>, Vec<u8>)> = BTreeMap::new();
        let mut deletes = Vec::new();
        for _ in 0..next(80) {
            let token = match next(6) {
                // A new claim, or a completion of a recent one (grown in place).
                0..=2 => {
                    top += 1 + next(3);
                    top
                }
                3 => top.saturating_sub(next(200)),
                // Below everything so far, or anywhere.
                4 => next(1_000),
                _ => next(top + 1),
            };
            if next(4) == 0 && want.contains_key(&token) && !puts.contains_key(&token) {
                deletes.push(token);
            } else if !deletes.contains(&token) {
                let old = want.contains_key(&token).then_some(token);
                puts.insert(token, (old, value(token, 20 + next(150) as usize)));
            }
        }
        // Interleaved: the puts in a shuffled order, the deletes among them.
        let mut writes: Vec<Write> = puts
            .iter()
            .map(|(t, (old, v))| Write::Put {
                token: *t,
                old: *old,
                value: v,
            })
            .chain(deletes.iter().map(|&token| Write::Delete { token }))
            .collect();
        for i in (1..writes.len()).rev() {
            writes.swap(i, next(i as u64 + 1) as usize);
        }
        commit(&db, &writes);
        for t in &deletes {
            want.remove(t);
        }
        want.extend(puts.into_iter().map(|(t, (_, v))| (t, v)));
        chunks(&db, &want);
    }
    assert!(
        want.len() > 500,
        "the test fills many chunks: {}",
        want.len()
    );
}

/// Deletions from the left edge remove emptied chunks; a chunk left under half full
/// merges with a neighbour when both fit; a record found below every chunk joins the
/// first one.
#[test]
fn deletions_remove_and_merge_chunks() {
    let db = db();
    let mut want = BTreeMap::new();
    let values: Vec<(u64, Vec<u8>)> = (10..2010).map(|t| (t, value(t, 60))).collect();
    for part in values.chunks(50) {
        commit(&db, &puts(part, |_| None));
    }
    want.extend(values);
    let before = chunks(&db, &want).len();
    // Expiry from the left edge.
    for start in (10..1010).step_by(100) {
        let writes: Vec<Write> = (start..start + 100)
            .map(|token| Write::Delete { token })
            .collect();
        commit(&db, &writes);
        want.retain(|&t, _| t >= start + 100);
    }
    let after = chunks(&db, &want);
    assert!(after.len() <= before / 2 + 1, "{before} → {}", after.len());
    // Three of every four records of the rest go, in one commit each per chunk.
    let gone: Vec<u64> = want.keys().copied().filter(|t| t % 4 != 0).collect();
    for part in gone.chunks(64) {
        let writes: Vec<Write> = part.iter().map(|&token| Write::Delete { token }).collect();
        commit(&db, &writes);
    }
    want.retain(|t, _| t % 4 == 0);
    let sizes = chunks(&db, &want);
    let bytes: usize = sizes.iter().map(|s| s.1).sum();
    assert!(bytes * 2 > sizes.len() * CHUNK_BYTES_MAX, "{sizes:?}");
    // Below every chunk.
    let low = value(3, 10);
    commit(
        &db,
        &[Write::Put {
            token: 3,
            old: None,
            value: &low,
        }],
    );
    want.insert(3, low);
    chunks(&db, &want);
    // Everything goes: no chunk is left.
    let writes: Vec<Write> = want.keys().map(|&token| Write::Delete { token }).collect();
    commit(&db, &writes);
    assert!(chunks(&db, &BTreeMap::new()).is_empty());
}
