//! What the first bytes of a file say before redb reads it: empty, redb's, another
//! format, or a redb file whose creation was cut short; an open refuses all but the first
//! two with the error that names the case.

use crate::base::sync::{Arc, Mutex};
use crate::model::error::OpenError;
use crate::store::constants::READER_CACHE_BYTES;
use crate::store::redb_io::{contain, io_open_error, open_error, panicked};
use redb::{Database, StorageBackend};
use std::io;
use std::path::Path;

/// redb's file magic, to tell a foreign file from a damaged redb file.
pub(crate) const REDB_MAGIC: [u8; 9] = [b'r', b'e', b'd', b'b', 0x1A, 0x0A, 0xA9, 0x0D, 0x0A];

/// What the first bytes of a file say about it.
#[derive(Debug)]
pub(crate) enum Head {
    /// Nothing in it.
    Empty,
    /// redb's magic: for redb to open.
    Redb,
    /// A creation that a crash or an I/O error cut short before redb wrote its magic. It
    /// provably never held a commit (see [`creation_cut_short`]).
    CutShort,
    /// Not openable, but not provably a creation cut short: it may have held commits.
    Damaged(String),
    /// Not a redb file.
    Foreign(String),
}

/// redb's header: the magic, a god byte, padding, then the page size (u32 LE) at 12; the
/// two commit slots end at byte 320.
const REDB_HEADER_LEN: u64 = 320;
const REDB_PAGE_SIZE_OFFSET: usize = 12;
const REDB_PAGE_SIZE: u32 = 4096;

/// Reads the head of the storage and classifies it. Reads the whole storage only when it is
/// small enough to be a creation cut short.
pub(crate) fn inspect(backend: &dyn StorageBackend, what: &Path) -> Result<Head, OpenError> {
    let len = backend.len().map_err(OpenError::Io)?;
    if len == 0 {
        return Ok(Head::Empty);
    }
    let mut head = vec![0u8; len.min(REDB_HEADER_LEN) as usize];
    backend.read(0, &mut head).map_err(io_open_error)?;
    if head.starts_with(&REDB_MAGIC) {
        return Ok(Head::Redb);
    }
    let magic = &head[..head.len().min(REDB_MAGIC.len())];
    if magic.iter().all(|&b| b == 0) {
        let reference = reference_creation()?;
        if len <= reference.len() as u64 {
            let mut image = vec![0u8; len as usize];
            backend.read(0, &mut image).map_err(io_open_error)?;
            if creation_cut_short(&image, &reference) {
                return Ok(Head::CutShort);
            }
            return Ok(Head::Damaged(format!(
                "redb's magic (bytes 0..9) is zero, and the file ({len} bytes) holds bytes that \
                 redb's creation never writes before its magic: it held data"
            )));
        }
        return Ok(Head::Damaged(format!(
            "redb's magic (bytes 0..9) is zero, and the file ({len} bytes) is longer than any \
             creation cut short leaves ({} bytes): it held data",
            reference.len()
        )));
    }
    let page_size = head
        .get(REDB_PAGE_SIZE_OFFSET..REDB_PAGE_SIZE_OFFSET + 4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    if page_size == Some(REDB_PAGE_SIZE) {
        return Ok(Head::Damaged(format!(
            "redb's magic is damaged (found {magic:02x?}) in a header that is otherwise \
             redb's ({len} bytes)"
        )));
    }
    Ok(Head::Foreign(format!(
        "{} is not a redb file",
        what.display()
    )))
}

/// The proof that a storage never held a commit. redb creates a database in this order
/// (redb 4.6, `TransactionalMemory::new`): size the storage to its initial layout (zeros),
/// write the 320-byte header *without* the magic, sync, then write the header again *with*
/// the magic, sync; only after that can anything be committed, and every commit writes the
/// header with its magic. So a storage whose magic is zero and which equals a prefix of the
/// image redb leaves at its first sync (or is all zeros, no longer than it) was cut short
/// before redb finished its creation: it never held a commit. `reference` is that image,
/// made by running redb's own creation in memory (so the proof follows the linked redb).
pub(crate) fn creation_cut_short(image: &[u8], reference: &[u8]) -> bool {
    image.len() <= reference.len()
        && image.iter().take(REDB_MAGIC.len()).all(|&b| b == 0)
        && (image.iter().all(|&b| b == 0) || image == &reference[..image.len()])
}

/// Runs redb's creation on an in-memory backend and returns the image as of its first sync:
/// the initial layout with the header not yet carrying the magic.
pub(crate) fn reference_creation() -> Result<Vec<u8>, OpenError> {
    let recorder = Recorder::default();
    let mut builder = Database::builder();
    builder.set_cache_size(READER_CACHE_BYTES);
    let created = contain("reference creation", || {
        builder.create_with_backend(recorder.clone()).map(drop)
    })
    .map_err(panicked)?;
    created.map_err(|e| open_error(Path::new("<memory>"), e))?;
    let first = recorder.0.lock().first_sync.take();
    first.ok_or_else(|| OpenError::Corrupted {
        detail: "redb's creation did not sync before writing its magic".into(),
    })
}

#[derive(Debug, Default)]
struct RecorderState {
    image: Vec<u8>,
    first_sync: Option<Vec<u8>>,
}

/// An in-memory backend that keeps its image as of the first `sync_data`.
#[derive(Debug, Default, Clone)]
struct Recorder(Arc<Mutex<RecorderState>>);

impl StorageBackend for Recorder {
    fn len(&self) -> Result<u64, io::Error> {
        Ok(self.0.lock().image.len() as u64)
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        let s = self.0.lock();
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        let src = s
            .image
            .get(start..start.saturating_add(out.len()))
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "read past the end"))?;
        out.copy_from_slice(src);
        Ok(())
    }
    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        let len = usize::try_from(len).map_err(io::Error::other)?;
        self.0.lock().image.resize(len, 0);
        Ok(())
    }
    fn sync_data(&self) -> Result<(), io::Error> {
        let mut s = self.0.lock();
        if s.first_sync.is_none() {
            s.first_sync = Some(s.image.clone());
        }
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        let mut s = self.0.lock();
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        let end = start.saturating_add(data.len());
        if s.image.len() < end {
            s.image.resize(end, 0);
        }
        s.image[start..end].copy_from_slice(data);
        Ok(())
    }
}

/// The error for a head that is not redb's, or `Ok` for one the open may go on with.
pub(crate) fn refuse(head: Head, path: &Path) -> Result<Head, OpenError> {
    match head {
        Head::Damaged(detail) => Err(OpenError::HeaderDamaged {
            path: path.to_path_buf(),
            detail,
        }),
        Head::Foreign(detail) => Err(OpenError::Foreign { detail }),
        other => Ok(other),
    }
}
