//! Fencing tokens: issued in strictly increasing order over the engine's whole life.
//!
//! Every token handed out is below `limit`, the high-water mark the writer has made durable.
//! After a crash the engine resumes above the durable mark, so a token issued but never
//! written can never be issued again. Tokens never wrap: `u64::MAX` is never issued.

use crate::base::sync::{AtomicU64, Ordering};
use crate::model::constants::TOKEN_RESERVE;

/// Aligned to its own cache lines: every acquiring claim writes `next`, and nothing read on
/// every call shares its line.
#[derive(Debug)]
#[repr(align(128))]
pub(crate) struct Tokens {
    next: AtomicU64,
    limit: AtomicU64,
}

/// Why a token could not be issued now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shortage {
    /// The durable reservation is used up; the writer must raise it first.
    NeedReserve,
    /// Every token has been issued.
    Exhausted,
}

impl Tokens {
    /// Tokens from `next` (at least 1) up to, not including, `limit`.
    pub(crate) fn new(next: u64, limit: u64) -> Self {
        Self {
            next: AtomicU64::new(next.max(1)),
            limit: AtomicU64::new(limit),
        }
    }

    /// Issues the next token.
    pub(crate) fn issue(&self) -> Result<u64, Shortage> {
        let mut n = self.next.load(Ordering::Acquire);
        loop {
            if n == u64::MAX {
                return Err(Shortage::Exhausted);
            }
            if n >= self.limit.load(Ordering::Acquire) {
                return Err(Shortage::NeedReserve);
            }
            match self
                .next
                .compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Ok(n),
                Err(seen) => n = seen,
            }
        }
    }

    /// Moves the counter past an imported `token`; false if that would pass `u64::MAX`.
    /// The next commit raises the durable mark above it (see `reserve_target`).
    pub(crate) fn advance_to(&self, token: u64) -> bool {
        match token.checked_add(1) {
            Some(next) if next < u64::MAX => {
                self.next.fetch_max(next, Ordering::AcqRel);
                true
            }
            _ => false,
        }
    }

    /// The next token that would be issued; every issued token is below it.
    pub(crate) fn next(&self) -> u64 {
        self.next.load(Ordering::Acquire)
    }

    pub(crate) fn limit(&self) -> u64 {
        self.limit.load(Ordering::Acquire)
    }

    /// The mark to persist in a commit that reads `next` now, if the reservation is below half.
    pub(crate) fn reserve_target(&self) -> Option<u64> {
        let next = self.next();
        let limit = self.limit();
        (next.saturating_add(TOKEN_RESERVE / 2) > limit).then(|| next.saturating_add(TOKEN_RESERVE))
    }

    /// Publishes a mark that is now durable.
    pub(crate) fn raise_limit(&self, durable: u64) {
        self.limit.fetch_max(durable, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issues_strictly_increasing_tokens_below_the_limit() {
        let t = Tokens::new(5, 8);
        assert_eq!(t.issue(), Ok(5));
        assert_eq!(t.issue(), Ok(6));
        assert_eq!(t.issue(), Ok(7));
        assert_eq!(t.issue(), Err(Shortage::NeedReserve));
        t.raise_limit(9);
        assert_eq!(t.issue(), Ok(8));
    }

    #[test]
    fn never_issues_zero() {
        let t = Tokens::new(0, 10);
        assert_eq!(t.issue(), Ok(1));
    }

    #[test]
    fn overflow_is_refused_never_wrapped() {
        let t = Tokens::new(u64::MAX - 2, u64::MAX);
        assert_eq!(t.issue(), Ok(u64::MAX - 2));
        assert_eq!(t.issue(), Ok(u64::MAX - 1));
        assert_eq!(t.issue(), Err(Shortage::Exhausted));
        assert_eq!(t.issue(), Err(Shortage::Exhausted));
        assert_eq!(t.next(), u64::MAX);
    }

    #[test]
    fn reserve_target_saturates() {
        let t = Tokens::new(u64::MAX - 10, u64::MAX - 5);
        assert_eq!(t.reserve_target(), Some(u64::MAX));
        let t = Tokens::new(1, 1 + TOKEN_RESERVE);
        assert_eq!(t.reserve_target(), None);
    }

    #[test]
    fn concurrent_issue_is_unique() {
        let t = std::sync::Arc::new(Tokens::new(1, 1 << 40));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let t = t.clone();
                std::thread::spawn(move || (0..10_000).map(|_| t.issue()).collect::<Vec<_>>())
            })
            .collect();
        let mut all: Vec<u64> = handles
            .into_iter()
            .flat_map(|h| h.join().expect("thread"))
            .map(|r| r.expect("token"))
            .collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 40_000);
    }
}
