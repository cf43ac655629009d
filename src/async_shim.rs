//! TEMPORARY stand-in for the engine's async API (`claim_async`, `claim_or_wait_async`,
//! `Lease::complete_async`, `Lease::release_async`), with the final signatures, built over
//! the synchronous calls. The real implementation replaces this whole file.
//!
//! Waiting never blocks a thread: `claim_or_wait_async` polls `claim` and, while the key is
//! InProgress, yields once to the executor. The synchronous calls it wraps may still wait
//! for an fsync under `Immediate`.

use crate::clock::duration_ns;
use crate::constants::WAIT_DEFAULT;
use crate::engine::Engine;
use crate::error::{ClaimError, LeaseError};
use crate::lease::{Claim, Lease};
use crate::options::ClaimOptions;
use crate::stats::bump;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

impl Engine {
    /// Like [`Engine::claim`]; under Immediate resolves once the InFlight record is durable.
    pub async fn claim_async(&self, key: &[u8], opts: &ClaimOptions) -> Result<Claim, ClaimError> {
        self.claim(key, opts)
    }

    /// Like [`Engine::claim_or_wait`]: waits (without blocking a thread) for the holder's
    /// completion or release or lease end, up to `opts.wait` (default 60 s).
    pub async fn claim_or_wait_async(
        &self,
        key: &[u8],
        opts: &ClaimOptions,
    ) -> Result<Claim, ClaimError> {
        let time = &self.shared().time;
        let wait = opts.wait.unwrap_or(WAIT_DEFAULT);
        let deadline = time.mono_ns().saturating_add(duration_ns(wait));
        let mut waited = false;
        loop {
            match self.claim(key, opts)? {
                Claim::InProgress(busy) => {
                    if time.mono_ns() >= deadline {
                        return Ok(Claim::InProgress(busy));
                    }
                    if !waited {
                        // Counted once per caller that waits, as the synchronous wait counts
                        // a caller that sleeps.
                        bump(&self.shared().counters.waits);
                        waited = true;
                    }
                    YieldOnce(false).await;
                }
                other => return Ok(other),
            }
        }
    }
}

impl Lease {
    /// Like [`Lease::complete`]; under Immediate resolves once durable.
    pub async fn complete_async(self, response: &[u8]) -> Result<(), LeaseError> {
        self.complete(response)
    }

    /// Like [`Lease::release`].
    pub async fn release_async(self) -> Result<bool, LeaseError> {
        self.release()
    }
}

/// Returns Pending once (waking itself at once), then Ready: gives the executor a turn.
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}
