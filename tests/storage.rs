//! A custom [`Storage`]: the engine keeps its file in it, and honours its lock.

use idemkv::fault::WithStorage;
use idemkv::fault::{LockKind, Storage};
use idemkv::*;
use std::io;
use std::sync::{Arc, Mutex};

/// A byte array in memory, shared by its clones; `locked` is a lock held by someone else.
#[derive(Debug, Clone, Default)]
struct Memory {
    bytes: Arc<Mutex<Vec<u8>>>,
    locked: bool,
}

impl Storage for Memory {
    fn len(&self) -> io::Result<u64> {
        Ok(self.bytes.lock().unwrap().len() as u64)
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let bytes = self.bytes.lock().unwrap();
        let start = offset as usize;
        let src = bytes
            .get(start..start + out.len())
            .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        out.copy_from_slice(src);
        Ok(())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.bytes.lock().unwrap().resize(len as usize, 0);
        Ok(())
    }
    fn sync_data(&self) -> io::Result<()> {
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut bytes = self.bytes.lock().unwrap();
        let end = offset as usize + data.len();
        if bytes.len() < end {
            bytes.resize(end, 0);
        }
        bytes[offset as usize..end].copy_from_slice(data);
        Ok(())
    }
    fn try_lock(&self, _kind: LockKind) -> io::Result<bool> {
        Ok(!self.locked)
    }
}

#[test]
fn the_engine_keeps_its_records_in_a_custom_storage() {
    let memory = Memory::default();
    let engine = Engine::builder().backend(memory.clone()).open().unwrap();
    let opts = ClaimOptions::default();
    let out = engine
        .run(b"k", &opts, |_| Ok::<_, io::Error>(b"v".to_vec()))
        .unwrap();
    assert!(!out.replayed());
    engine.close().unwrap();
    drop(engine);
    assert!(
        memory.len().unwrap() > 0,
        "the engine wrote into the storage"
    );
    // A new engine over the same bytes replays the stored response.
    let engine = Engine::builder().backend(memory).open().unwrap();
    let out = engine
        .run(b"k", &opts, |_| Ok::<_, io::Error>(b"other".to_vec()))
        .unwrap();
    assert_eq!((out.response(), out.replayed()), (&b"v"[..], true));
}

#[test]
fn a_storage_locked_elsewhere_is_already_open() {
    let memory = Memory {
        locked: true,
        ..Memory::default()
    };
    let r = Engine::builder().backend(memory).open();
    assert!(matches!(r, Err(OpenError::AlreadyOpen { .. })), "{r:?}");
}
