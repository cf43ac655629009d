//! The log's frames: every kind of write comes back as written; frames of another epoch
//! or key, torn, damaged or padded frames, and a full log.

use super::payload::{decode_payload, OwnedWrite, Replayed};
use super::replay::{pending, replay};
use super::*;
use crate::base::sync::Arc;
use crate::store::log_state::LogState;
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
