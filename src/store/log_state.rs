//! What the file records of its commit log (the meta row `log_state`): the epoch, how many
//! of its frames the file holds, whether an engine was appending. The store reads and writes
//! it; the commit log (`commit_log/`) decides what it means.

/// The commit log's state as the file records it (the meta row `log_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct LogState {
    /// The current epoch.
    pub(crate) epoch: u64,
    /// Frames of `epoch` the file holds (those a replay skips).
    pub(crate) applied: u64,
    /// Whether an engine was appending to the log when the file was last written: then
    /// the log may hold acknowledged commits that the file lacks.
    pub(crate) active: bool,
}

impl LogState {
    pub(crate) fn encode(self) -> [u8; 17] {
        let mut out = [0u8; 17];
        out[..8].copy_from_slice(&self.epoch.to_le_bytes());
        out[8..16].copy_from_slice(&self.applied.to_le_bytes());
        out[16] = u8::from(self.active);
        out
    }

    pub(crate) fn decode(bytes: &[u8]) -> Option<LogState> {
        let mut c = Cursor(bytes);
        let state = LogState {
            epoch: c.u64().ok()?,
            applied: c.u64().ok()?,
            active: match c.u8().ok()? {
                0 => false,
                1 => true,
                _ => return None,
            },
        };
        c.0.is_empty().then_some(state)
    }
}

/// A cursor over a verified payload. Every read is bounds-checked: a payload that verified
/// its MAC but does not decode was written by a different format, and is refused as damage.
pub(crate) struct Cursor<'a>(pub(crate) &'a [u8]);

pub(crate) type Decoded<T> = Result<T, &'static str>;

impl<'a> Cursor<'a> {
    pub(crate) fn take(&mut self, n: usize) -> Decoded<&'a [u8]> {
        if n > self.0.len() {
            return Err("a frame's payload ends early");
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    pub(crate) fn u8(&mut self) -> Decoded<u8> {
        Ok(self.take(1)?[0])
    }

    pub(crate) fn u32(&mut self) -> Decoded<u32> {
        let mut w = [0u8; 4];
        w.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(w))
    }

    pub(crate) fn u64(&mut self) -> Decoded<u64> {
        let mut w = [0u8; 8];
        w.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(w))
    }

    pub(crate) fn opt_u64(&mut self) -> Decoded<Option<u64>> {
        match self.u8()? {
            0 => Ok(None),
            1 => Ok(Some(self.u64()?)),
            _ => Err("a frame holds an unknown option tag"),
        }
    }

    /// A count of items each at least `min_bytes` long: bounded by what is left, so a
    /// damaged count cannot make a huge allocation.
    pub(crate) fn len(&mut self, min_bytes: usize) -> Decoded<usize> {
        let n = self.u64()?;
        match usize::try_from(n) {
            Ok(n) if n.saturating_mul(min_bytes.max(1)) <= self.0.len() => Ok(n),
            _ => Err("a frame holds a count larger than its payload"),
        }
    }

    pub(crate) fn bytes(&mut self) -> Decoded<&'a [u8]> {
        let n = self.len(1)?;
        self.take(n)
    }
}
