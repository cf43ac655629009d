//! The commit log's own file, with the frames the log writes (they live here, beside
//! the log, so that the file's module needs nothing of the log's).

use super::replay::replay;
use super::{prepare, CommitLog, MacKey, FRAME_HEADER_BYTES};
use crate::base::limits::HASH_SECRET_LEN;
use crate::base::sync::Ordering;
use crate::store::backend::Storage;
use crate::store::constants::{LOG_BLOCK_BYTES, LOG_BYTES};
use crate::store::log_file::*;
use crate::store::log_state::LogState;
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
