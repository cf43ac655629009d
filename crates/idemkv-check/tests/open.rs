//! Opening a file: what is refused and why, and how a file is created.
//!
//! - A file is started afresh only when it provably never held a commit: a damaged header
//!   (a torn write of the first sector) is refused with `HeaderDamaged` and the file is left
//!   byte for byte as it was, whatever it held.
//! - Every I/O failure during an open is reported as I/O (a full disk, a refused permission,
//!   any other error), with the `io::Error` as the source, never as damage.
//! - A file whose table definitions do not decode is refused at open, never accepted to
//!   fail (or spin) on each read later.
//! - A new file is created under a temporary name beside the path and renamed into place,
//!   owner-only by default.

use idemkv::admin::FileReader;
use idemkv::error::OpenErrorKind;
use idemkv::fault::{Fault, FaultyStorage, WithStorage};
use idemkv::*;
use std::error::Error as _;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

fn opts() -> ClaimOptions {
    ClaimOptions::default()
}

fn response(i: usize) -> Vec<u8> {
    format!("receipt {i:05}").into_bytes()
}

/// Completes `n` keys `k00000..` in `engine` (`Immediate` calls are acknowledged durable).
fn complete(engine: &Engine, n: usize) {
    for i in 0..n {
        let key = format!("k{i:05}");
        match engine.claim(key.as_bytes(), &opts()).expect("claim") {
            Claim::Acquired(lease) => lease.complete(&response(i)).expect("complete"),
            other => panic!("{key}: {other:?}"),
        }
    }
}

/// Writes a file of `n` acknowledged completions (a mock clock, so that nothing expires
/// when it is reopened with one) and returns its bytes.
fn fixture(path: &Path, n: usize, durability: Durability) -> Vec<u8> {
    let engine = Engine::builder()
        .path(path)
        .clock(MockClock::new())
        .durability(durability)
        .open()
        .expect("open");
    complete(&engine, n);
    engine.close().expect("close");
    drop(engine);
    std::fs::read(path).expect("read")
}

fn open_path(path: &Path) -> Result<Engine, OpenError> {
    Engine::builder().path(path).clock(MockClock::new()).open()
}

fn open_backend(b: &FaultyStorage) -> Result<Engine, OpenError> {
    Engine::builder()
        .path("backend.redb")
        .backend(b.clone())
        .clock(MockClock::new())
        .tuning(idemkv::Tuning::default().sweep_interval(None))
        .open()
}

fn expect_header_damaged(r: Result<Engine, OpenError>, what: &str) {
    match r {
        Err(e @ OpenError::HeaderDamaged { .. }) => {
            assert_eq!(e.kind(), OpenErrorKind::HeaderDamaged);
            assert!(e.to_string().contains("backup"), "{what}: {e}");
        }
        other => panic!("{what}: expected HeaderDamaged, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------
// A damaged header
// ---------------------------------------------------------------------------------------

/// A torn write of the header sector used to make the engine start the file afresh: every
/// acknowledged completion was lost and every duplicate would have run again.
#[test]
fn a_damaged_header_is_refused_and_the_file_left_unchanged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = dir.path().join("good.redb");
    let original = fixture(&good, 500, Durability::Immediate);
    type Damage<'a> = (&'a str, &'a dyn Fn(&mut Vec<u8>));
    let damages: [Damage; 4] = [
        ("first 64 bytes zeroed", &|b| b[..64].fill(0)),
        ("first 4 KiB zeroed", &|b| b[..4096].fill(0)),
        ("magic zeroed", &|b| b[..9].fill(0)),
        ("magic torn", &|b| {
            b[..4].copy_from_slice(&[0xde, 0xad, 0xbe, 0xef])
        }),
    ];
    for (what, damage) in damages {
        let mut bytes = original.clone();
        damage(&mut bytes);
        let path = dir.path().join(format!("{}.redb", what.replace(' ', "-")));
        std::fs::write(&path, &bytes).expect("write");
        let r = Engine::builder().path(&path).clock(MockClock::new()).open();
        expect_header_damaged(r, what);
        assert!(
            std::fs::read(&path).expect("read") == bytes,
            "{what}: the file was changed"
        );
        // A backend holding the same bytes: no rename protects it, its content decides.
        let b = FaultyStorage::from_image(&bytes);
        expect_header_damaged(open_backend(&b), what);
        assert!(b.live_image() == bytes, "{what}: the backend was changed");
        assert_eq!(
            b.writes() + b.set_lens(),
            0,
            "{what}: the backend was written"
        );
        // The operator's reader says the same.
        match FileReader::open(&path) {
            Err(OpenError::HeaderDamaged { .. }) => {}
            other => panic!("{what}: reader: {other:?}"),
        }
        assert!(std::fs::read(&path).expect("read") == bytes, "{what}");
    }
    // The undamaged file still holds every acknowledged completion.
    let engine = open_path(&good).expect("open");
    for i in (0..500).step_by(37) {
        match engine.get(format!("k{i:05}").as_bytes()).expect("get") {
            Some(KeyState::Completed { response: r, .. }) => assert_eq!(&r[..], response(i)),
            other => panic!("k{i:05}: {other:?}"),
        }
    }
    engine.close().expect("close");
}

/// The image a power loss leaves when redb sized the file and wrote its header without the
/// magic: a creation cut short, which never held a commit.
fn creation_cut_short() -> Vec<u8> {
    let disk = FaultyStorage::memory();
    // I/O 1 sizes the file, 2 writes the header without the magic, 3 syncs it.
    disk.set_fault(Some(Fault::PowerLoss { at: 3 }));
    let r = Engine::builder()
        .path("x.redb")
        .backend(disk.clone())
        .open();
    assert!(r.is_err(), "the power loss stops the open");
    let image = disk.crash_image(|_| true);
    assert!(image.len() > 4096 && image[..9].iter().all(|&b| b == 0));
    assert!(
        image[9..320].iter().any(|&b| b != 0),
        "the header was written"
    );
    image
}

/// Through a backend, a creation cut short is recognised by its content and started afresh;
/// a file at a path never holds one (creations are renamed into place once complete), so
/// there it is refused like any other damaged header.
#[test]
fn a_creation_cut_short_restarts_a_backend_but_is_refused_at_a_path() {
    let image = creation_cut_short();
    let b = FaultyStorage::from_image(&image);
    let engine = open_backend(&b).expect("a creation cut short is started afresh");
    complete(&engine, 3);
    engine.close().expect("close");

    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("cut.redb");
    std::fs::write(&path, &image).expect("write");
    expect_header_damaged(open_path(&path), "a creation cut short at a path");
    assert!(std::fs::read(&path).expect("read") == image);

    // One byte past the header that redb's creation does not write: it held data.
    let mut held = image.clone();
    held[8192] = 1;
    let b = FaultyStorage::from_image(&held);
    expect_header_damaged(open_backend(&b), "a cut-short image with data");
    assert!(b.live_image() == held);
}

// ---------------------------------------------------------------------------------------
// I/O errors
// ---------------------------------------------------------------------------------------

fn assert_io(e: &OpenError, kind: OpenErrorKind, io_kind: std::io::ErrorKind, what: &str) {
    assert_eq!(e.kind(), kind, "{what}: {e}");
    assert!(matches!(e, OpenError::Io(_)), "{what}: {e:?}");
    let source = e
        .source()
        .and_then(|s| s.downcast_ref::<std::io::Error>())
        .unwrap_or_else(|| panic!("{what}: no io::Error source: {e:?}"));
    assert_eq!(source.kind(), io_kind, "{what}: {source}");
    assert!(!e.to_string().contains("corrupted"), "{what}: {e}");
}

/// An I/O error during an open (creation, recovery, the format check) used to be reported as
/// `Corrupted`, with advice to restore a backup.
#[test]
fn io_errors_during_open_are_reported_as_io() {
    let dir = tempfile::tempdir().expect("tempdir");
    let image = fixture(&dir.path().join("f.redb"), 20, Durability::Immediate);
    for base in [None, Some(&image)] {
        let fresh = || match base {
            None => FaultyStorage::memory(),
            Some(image) => FaultyStorage::from_image(image),
        };
        let what = if base.is_some() {
            "existing file"
        } else {
            "creation"
        };
        // ENOSPC at each write of the open in turn, then EIO at each sync.
        for (sync, kind, io_kind) in [
            (
                false,
                OpenErrorKind::DiskFull,
                std::io::ErrorKind::StorageFull,
            ),
            (
                true,
                OpenErrorKind::Io,
                std::io::Error::from_raw_os_error(5).kind(),
            ),
        ] {
            let mut failed = 0;
            for n in 1..200 {
                let b = fresh();
                if sync {
                    b.fail_sync_in(n);
                } else {
                    b.fail_write_in(n);
                }
                let r = open_backend(&b);
                if b.injected() == 0 {
                    // Past the open's last write or sync.
                    r.expect("opens without a fault").close().expect("close");
                    break;
                }
                match r {
                    Err(e) => {
                        failed += 1;
                        assert_io(&e, kind, io_kind, &format!("{what}, I/O {n}"));
                    }
                    Ok(engine) => drop(engine),
                }
                // The failure damaged nothing: the file opens once the disk works again.
                let healed = FaultyStorage::from_image(b.live_image());
                open_backend(&healed)
                    .unwrap_or_else(|e| panic!("{what}, I/O {n}, after healing: {e}"))
                    .close()
                    .expect("close");
            }
            assert!(failed >= 2, "{what}: only {failed} failing opens");
        }
        // A read refused by the OS (permission taken away), and a dead disk.
        let b = fresh();
        b.fail_reads_with(Some(13));
        if base.is_some() {
            let e = open_backend(&b).expect_err("reads are refused");
            assert_io(
                &e,
                OpenErrorKind::PermissionDenied,
                std::io::ErrorKind::PermissionDenied,
                what,
            );
            assert!(e.to_string().contains("permission"), "{e}");
        }
        let b = fresh();
        b.fail_all(true);
        let e = open_backend(&b).expect_err("a dead disk");
        // (Its first failing call may be a write: ENOSPC.)
        assert!(matches!(e, OpenError::Io(_)), "{what}: {e:?}");
        assert!(e.source().is_some(), "{what}: {e:?}");
    }
}

/// A directory the process may not write to. Only checked where permissions are enforced
/// (not as root, which may write anyway); the backend test above covers the rest.
#[cfg(unix)]
#[test]
fn a_directory_without_write_permission_is_permission_denied() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let locked = dir.path().join("locked");
    std::fs::create_dir(&locked).expect("mkdir");
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o500)).expect("chmod");
    let enforced = std::fs::write(locked.join("probe"), b"x").is_err();
    let r = open_path(&locked.join("x.redb"));
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    if enforced {
        let e = r.expect_err("the directory is not writable");
        assert_eq!(e.kind(), OpenErrorKind::PermissionDenied, "{e}");
    } else {
        r.expect("root may write anywhere").close().expect("close");
    }
}

// ---------------------------------------------------------------------------------------
// Creating a file
// ---------------------------------------------------------------------------------------

fn temporary(path: &Path) -> std::path::PathBuf {
    let name = path
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    path.with_file_name(format!(".{name}.idemkv-creating"))
}

#[test]
fn a_new_file_is_renamed_into_place_complete_and_leftovers_are_removed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("new.redb");
    // A temporary file left by a creation that a crash cut short: junk, never a commit.
    std::fs::write(temporary(&path), vec![0x5a; 100_000]).expect("write");
    let engine = open_path(&path).expect("open");
    assert!(!temporary(&path).exists(), "the temporary file was left");
    let bytes = std::fs::read(&path).expect("read");
    assert_eq!(&bytes[..4], b"redb", "a complete redb file is in place");
    complete(&engine, 2);
    engine.close().expect("close");

    // A leftover beside an existing file is removed when the file is opened.
    std::fs::write(temporary(&path), b"junk").expect("write");
    let engine = open_path(&path).expect("open");
    assert!(!temporary(&path).exists());
    engine.close().expect("close");

    // An empty file (made by `touch` or a temp-file helper) is replaced by a new one.
    let empty = dir.path().join("empty.redb");
    std::fs::write(&empty, b"").expect("write");
    let engine = open_path(&empty).expect("open");
    complete(&engine, 1);
    engine.close().expect("close");
    assert!(std::fs::metadata(&empty).expect("metadata").len() > 0);
}

#[cfg(unix)]
#[test]
fn new_files_are_owner_only_unless_configured() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).expect("metadata").permissions().mode() & 0o777;
    let dir = tempfile::tempdir().expect("tempdir");
    let default = dir.path().join("default.redb");
    open_path(&default).expect("open").close().expect("close");
    assert_eq!(mode(&default), 0o600);

    let shared = dir.path().join("shared.redb");
    Engine::builder()
        .path(&shared)
        .file_mode(0o660)
        .open()
        .expect("open")
        .close()
        .expect("close");
    assert_eq!(
        mode(&shared),
        0o660,
        "the umask does not narrow the chosen mode"
    );

    // An existing file's mode is the operator's: left alone.
    std::fs::set_permissions(&default, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    open_path(&default).expect("open").close().expect("close");
    assert_eq!(mode(&default), 0o644);

    for bad in [0o400, 0o200, 0o10600] {
        match Engine::builder()
            .path(dir.path().join("bad.redb"))
            .file_mode(bad)
            .open()
        {
            Err(OpenError::InvalidConfig { .. }) => {}
            other => panic!("{bad:o}: {other:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Damaged table definitions
// ---------------------------------------------------------------------------------------

/// What one open of a damaged image did: refused (with the error), or opened and served
/// every key's exact bytes; anything else is a problem.
fn open_and_read_all(image: Vec<u8>, keys: usize) -> Result<String, String> {
    let engine = match Engine::builder()
        .path("damaged.redb")
        .backend(FaultyStorage::from_image(image))
        .clock(MockClock::new())
        .tuning(idemkv::Tuning::default().sweep_interval(None))
        .open()
    {
        Ok(engine) => engine,
        Err(e) => {
            return match e.kind() {
                OpenErrorKind::Corrupted
                | OpenErrorKind::Foreign
                | OpenErrorKind::HeaderDamaged => Ok(format!("refused {:?}", e.kind())),
                _ => Err(format!("refused as {:?}, not as damage: {e}", e.kind())),
            }
        }
    };
    for i in 0..keys {
        let key = format!("k{i:05}");
        match engine.get(key.as_bytes()) {
            Ok(Some(KeyState::Completed { response: r, .. })) if r[..] == response(i)[..] => {}
            other => return Err(format!("opened, but {key} gave {other:?}")),
        }
    }
    let _ = engine.close();
    Ok("served".into())
}

/// Flips one bit of every byte of the table definitions (the table tree's leaf: both
/// tables' names, entry counts, root pages and checksums, key and value types) of a closed
/// file with 2,000 completions. Every flip must be refused at open or leave every key
/// served with its exact bytes; an open that accepts damage and then fails or spins on
/// each read is the failure this guards against. Each open runs on its own thread with a
/// deadline, so a spin fails the test instead of hanging it.
#[test]
fn damaged_table_definitions_are_refused_at_open_or_harmless() {
    const KEYS: usize = 2000;
    let disk = FaultyStorage::memory();
    let engine = Engine::builder()
        .path("fixture.redb")
        .backend(disk.clone())
        .clock(MockClock::new())
        .open()
        .expect("open");
    complete(&engine, KEYS);
    engine.close().expect("close");
    drop(engine);
    let original = disk.live_image();

    // The table tree's leaves: a leaf page (type 1) with one entry per table, naming each.
    // Its header is the type, a reserved byte, the entry count (u16), then the end offsets
    // of the keys and of the values (u32 each); the last one ends the definitions.
    let ours: [&[u8]; 4] = [
        b"idemkv_chunks",
        b"idemkv_meta",
        b"idemkv_outbox",
        b"idemkv_tables",
    ];
    let mut damage = Vec::new();
    for (p, page) in original.chunks(4096).enumerate() {
        let names = |n: &[u8]| page.windows(n.len()).any(|w| w == n);
        let entries = u16::from_le_bytes([page[2], page[3]]) as usize;
        if page[0] == 1 && entries == ours.len() && ours.iter().all(|n| names(n)) {
            let last = 4 + 4 * (2 * entries - 1);
            let end =
                u32::from_le_bytes([page[last], page[last + 1], page[last + 2], page[last + 3]])
                    as usize;
            assert!((64..=1024).contains(&end), "definitions end at {end}");
            damage.extend((0..end).map(|o| (p * 4096 + o, 1u8 << (o % 8))));
        }
    }
    assert!(damage.len() >= 100, "table definitions not found");
    let mut outcomes = std::collections::BTreeMap::<String, usize>::new();
    let mut problems = Vec::new();
    for &(pos, mask) in &damage {
        let mut image = original.clone();
        image[pos] ^= mask;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let r = std::panic::catch_unwind(|| open_and_read_all(image, KEYS))
                .unwrap_or_else(|_| Err("a panic escaped".into()));
            let _ = tx.send(r);
        });
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(Ok(outcome)) => *outcomes.entry(outcome).or_default() += 1,
            Ok(Err(problem)) => problems.push(format!("offset {pos} xor {mask:#04x}: {problem}")),
            Err(_) => problems.push(format!("offset {pos} xor {mask:#04x}: no answer in 20 s")),
        }
    }
    eprintln!(
        "table definition damage over {} flips: {outcomes:?}",
        damage.len()
    );
    assert!(problems.is_empty(), "{problems:#?}");
    assert!(
        outcomes.keys().any(|k| k.starts_with("refused")),
        "no flip was refused: the damage missed the definitions"
    );
}
