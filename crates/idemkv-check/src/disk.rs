//! [`SimDisk`]: an in-memory [`Storage`] that keeps a *live* image (every
//! successful write, what the OS page cache holds) and a *durable* image (the bytes as of the
//! last successful `sync_data`), and can fail or lose power at the Nth I/O.
//!
//! I/O points are `write`, `set_len` and `sync_data`, counted from 1 over the backend's life.
//! - [`Fault::Error`] makes that one call fail (ENOSPC for a write or `set_len`, EIO for a
//!   sync); later calls succeed. The process lives on, so the file after a restart is the
//!   live image.
//! - [`Fault::PowerLoss`] makes that call and every later one fail: the machine is gone.
//!   After the reboot the file is the durable image plus any subset of the writes made
//!   since the last sync (a disk may persist them in any order); [`SimDisk::crash_image`]
//!   builds that image from a choice of the subset.
//!
//! Reopen from an image with [`SimDisk::from_image`] and `EngineBuilder::backend`.

use idemkv::Storage;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// When and how the simulated disk fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The I/O numbered `at` (from 1) fails once; later ones succeed.
    Error {
        /// Which I/O.
        at: u64,
    },
    /// Power is lost at the I/O numbered `at`: it and every later one fail.
    PowerLoss {
        /// Which I/O.
        at: u64,
    },
}

#[derive(Debug, Clone)]
enum Pending {
    Write(u64, Vec<u8>),
    SetLen(u64),
}

#[derive(Debug, Default)]
struct State {
    live: Vec<u8>,
    durable: Vec<u8>,
    /// Changes since the last successful sync, in order.
    pending: Vec<Pending>,
    ios: u64,
    fault: Option<Fault>,
    dead: bool,
    /// The I/O number at which the fault struck, once it has.
    struck_at: Option<u64>,
}

/// A simulated disk. Clones share the same disk.
#[derive(Debug, Clone, Default)]
pub struct SimDisk(Arc<Mutex<State>>);

fn apply(image: &mut Vec<u8>, change: &Pending) {
    match change {
        Pending::Write(offset, data) => {
            let start = usize::try_from(*offset).unwrap_or(usize::MAX);
            let end = start.saturating_add(data.len());
            if image.len() < end {
                image.resize(end, 0);
            }
            image[start..end].copy_from_slice(data);
        }
        Pending::SetLen(len) => image.resize(usize::try_from(*len).unwrap_or(usize::MAX), 0),
    }
}

impl SimDisk {
    /// An empty disk without faults.
    pub fn new() -> Self {
        Self::default()
    }

    /// A disk holding `image` (both live and durable).
    pub fn from_image(image: Vec<u8>) -> Self {
        let disk = Self::default();
        {
            let mut s = disk.lock();
            s.durable = image.clone();
            s.live = image;
        }
        disk
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Arms a fault (replacing any other).
    pub fn set_fault(&self, fault: Option<Fault>) {
        self.lock().fault = fault;
    }

    /// I/O calls (`write`, `set_len`, `sync_data`) made so far.
    pub fn ios(&self) -> u64 {
        self.lock().ios
    }

    /// The I/O number at which the armed fault struck, if it has.
    pub fn struck_at(&self) -> Option<u64> {
        self.lock().struck_at
    }

    /// What the OS holds now: every successful write (a process crash keeps it).
    pub fn live_image(&self) -> Vec<u8> {
        self.lock().live.clone()
    }

    /// The bytes as of the last successful sync.
    pub fn durable_image(&self) -> Vec<u8> {
        self.lock().durable.clone()
    }

    /// Changes made since the last successful sync.
    pub fn pending(&self) -> usize {
        self.lock().pending.len()
    }

    /// The durable image plus the pending changes for which `keep(i)` is true, applied in
    /// order: what a disk that reorders unsynced writes may hold after a power loss.
    pub fn crash_image(&self, mut keep: impl FnMut(usize) -> bool) -> Vec<u8> {
        let s = self.lock();
        let mut image = s.durable.clone();
        for (i, change) in s.pending.iter().enumerate() {
            if keep(i) {
                apply(&mut image, change);
            }
        }
        image
    }

    /// Counts one I/O and decides whether it fails.
    fn io(s: &mut State, what: &str) -> io::Result<()> {
        if s.dead {
            return Err(io::Error::other(format!("{what}: the power is off")));
        }
        s.ios += 1;
        match s.fault {
            Some(Fault::Error { at }) if at == s.ios => {
                s.struck_at = Some(at);
                Err(if what == "sync_data" {
                    io::Error::other("injected EIO on sync_data")
                } else {
                    io::Error::other(format!("injected ENOSPC on {what}"))
                })
            }
            Some(Fault::PowerLoss { at }) if at == s.ios => {
                s.struck_at = Some(at);
                s.dead = true;
                Err(io::Error::other(format!("{what}: power lost")))
            }
            _ => Ok(()),
        }
    }
}

impl Storage for SimDisk {
    fn len(&self) -> Result<u64, io::Error> {
        Ok(self.lock().live.len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        let s = self.lock();
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        let end = start.saturating_add(out.len());
        match s.live.get(start..end) {
            Some(src) => {
                out.copy_from_slice(src);
                Ok(())
            }
            None => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "read past the end",
            )),
        }
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        let mut s = self.lock();
        Self::io(&mut s, "set_len")?;
        let change = Pending::SetLen(len);
        apply(&mut s.live, &change);
        s.pending.push(change);
        Ok(())
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        let mut s = self.lock();
        Self::io(&mut s, "sync_data")?;
        let pending = std::mem::take(&mut s.pending);
        for change in &pending {
            apply(&mut s.durable, change);
        }
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        let mut s = self.lock();
        Self::io(&mut s, "write")?;
        let change = Pending::Write(offset, data.to_vec());
        apply(&mut s.live, &change);
        s.pending.push(change);
        Ok(())
    }
}
