//! The spans and events of the API calls (feature `tracing`): a debug span per `claim`,
//! `claim_or_wait`, `complete`, `release` and `fail`, and one event in it with the answer.
//! The rest of the engine's observability is in `runtime/observe.rs`.

use crate::api::lease::Claim;
#[cfg(feature = "tracing")]
use crate::base::hash::key_hash;
use crate::model::error::{ClaimError, LeaseError};
use crate::runtime::observe::Observer;
#[cfg(feature = "tracing")]
use crate::runtime::observe::{Hex, TARGET};

impl Observer {
    /// Runs a claim (`wait`: `claim_or_wait`) in its span and reports its answer.
    #[inline]
    pub(crate) fn claim(
        &self,
        key: &[u8],
        wait: bool,
        call: impl FnOnce() -> Result<Claim, ClaimError>,
    ) -> Result<Claim, ClaimError> {
        #[cfg(feature = "tracing")]
        {
            let span = if wait {
                tracing::debug_span!(target: TARGET, "claim_or_wait", key_hash = %Hex(key_hash(key)), key = tracing::field::Empty)
            } else {
                tracing::debug_span!(target: TARGET, "claim", key_hash = %Hex(key_hash(key)), key = tracing::field::Empty)
            };
            if !span.is_disabled() {
                self.record_key(&span, key);
                let answer = span.in_scope(call);
                span.in_scope(|| claim_event(&answer));
                return answer;
            }
        }
        #[cfg(not(feature = "tracing"))]
        let _ = (key, wait);
        call()
    }

    /// Runs a holder's `complete` of `token` in its span and reports its answer.
    #[inline]
    pub(crate) fn complete(
        &self,
        key: &[u8],
        token: u64,
        call: impl FnOnce() -> Result<(), LeaseError>,
    ) -> Result<(), LeaseError> {
        #[cfg(feature = "tracing")]
        {
            let span = tracing::debug_span!(target: TARGET, "complete", key_hash = %Hex(key_hash(key)), key = tracing::field::Empty, token);
            if !span.is_disabled() {
                self.record_key(&span, key);
                let answer = span.in_scope(call);
                let outcome = match &answer {
                    Ok(()) => Ok("completed"),
                    Err(e) => Err(e),
                };
                span.in_scope(|| lease_event("complete answered", token, outcome));
                return answer;
            }
        }
        #[cfg(not(feature = "tracing"))]
        let _ = (key, token);
        call()
    }

    /// Runs a holder's `release` of `token` in its span and reports its answer.
    #[inline]
    pub(crate) fn release(
        &self,
        key: &[u8],
        token: u64,
        call: impl FnOnce() -> Result<bool, LeaseError>,
    ) -> Result<bool, LeaseError> {
        #[cfg(feature = "tracing")]
        {
            let span = tracing::debug_span!(target: TARGET, "release", key_hash = %Hex(key_hash(key)), key = tracing::field::Empty, token);
            if !span.is_disabled() {
                self.record_key(&span, key);
                let answer = span.in_scope(call);
                let outcome = match &answer {
                    Ok(true) => Ok("released"),
                    Ok(false) => Ok("not_held"),
                    Err(e) => Err(e),
                };
                span.in_scope(|| lease_event("release answered", token, outcome));
                return answer;
            }
        }
        #[cfg(not(feature = "tracing"))]
        let _ = (key, token);
        call()
    }

    /// Runs a holder's `fail` of `token` in its span and reports its answer.
    #[inline]
    pub(crate) fn fail(
        &self,
        key: &[u8],
        token: u64,
        call: impl FnOnce() -> Result<bool, LeaseError>,
    ) -> Result<bool, LeaseError> {
        #[cfg(feature = "tracing")]
        {
            let span = tracing::debug_span!(target: TARGET, "fail", key_hash = %Hex(key_hash(key)), key = tracing::field::Empty, token);
            if !span.is_disabled() {
                self.record_key(&span, key);
                let answer = span.in_scope(call);
                let outcome = match &answer {
                    Ok(true) => Ok("failed"),
                    Ok(false) => Ok("not_held"),
                    Err(e) => Err(e),
                };
                span.in_scope(|| lease_event("fail answered", token, outcome));
                return answer;
            }
        }
        #[cfg(not(feature = "tracing"))]
        let _ = (key, token);
        call()
    }
}

/// The event of a claim's answer. The answers a caller must act on beyond retrying
/// (`OutcomeUnknown`, `Corrupted`) are warnings; every other answer is debug.
#[cfg(feature = "tracing")]
fn claim_event(answer: &Result<Claim, ClaimError>) {
    const MSG: &str = "claim answered";
    match answer {
        Ok(Claim::Acquired(lease)) => {
            // Only a takeover raises the attempt above one (docs/design.md).
            let outcome = if lease.attempt() > 1 {
                "takeover"
            } else {
                "acquired"
            };
            tracing::debug!(target: TARGET, outcome, token = lease.token(), attempt = lease.attempt(), MSG);
        }
        Ok(Claim::InProgress(busy)) => {
            let retry_after_ms = u64::try_from(busy.retry_after().as_millis()).unwrap_or(u64::MAX);
            tracing::debug!(target: TARGET, outcome = "in_progress", attempt = busy.attempt(), retry_after_ms, MSG);
        }
        Ok(Claim::Completed(stored)) => {
            tracing::debug!(target: TARGET, outcome = "replay", token = stored.token(), attempt = stored.attempt(), MSG);
        }
        Ok(Claim::Forgotten(forgotten)) => {
            tracing::debug!(target: TARGET, outcome = "forgotten", attempt = forgotten.attempt(), MSG);
        }
        Err(e @ (ClaimError::OutcomeUnknown(_) | ClaimError::Corrupted(_))) => {
            tracing::warn!(target: TARGET, outcome = claim_error_label(e), error = %e, MSG);
        }
        Err(e) => {
            tracing::debug!(target: TARGET, outcome = claim_error_label(e), error = %e, MSG);
        }
    }
}

/// The event of a holder's answer (`OutcomeUnknown` is a warning, as for claims).
#[cfg(feature = "tracing")]
fn lease_event(msg: &'static str, token: u64, outcome: Result<&'static str, &LeaseError>) {
    match outcome {
        Ok(outcome) => tracing::debug!(target: TARGET, outcome, token, "{msg}"),
        Err(e @ LeaseError::OutcomeUnknown(_)) => {
            tracing::warn!(target: TARGET, outcome = lease_error_label(e), token, error = %e, "{msg}")
        }
        Err(e) => {
            tracing::debug!(target: TARGET, outcome = lease_error_label(e), token, error = %e, "{msg}")
        }
    }
}

#[cfg(feature = "tracing")]
fn claim_error_label(e: &ClaimError) -> &'static str {
    match e {
        ClaimError::FingerprintMismatch => "fingerprint_mismatch",
        ClaimError::Overloaded(_) => "overloaded",
        ClaimError::KeyTooLong { .. } | ClaimError::KeyEmpty | ClaimError::ScopeTooLong { .. } => {
            "invalid_key"
        }
        ClaimError::TokensExhausted => "tokens_exhausted",
        ClaimError::Poisoned(_) => "poisoned",
        ClaimError::OutcomeUnknown(_) => "outcome_unknown",
        ClaimError::Corrupted(_) => "corrupted",
        ClaimError::Contended => "contended",
        ClaimError::Closed => "closed",
        ClaimError::RetentionTooLong { .. } => "invalid_retention",
        #[allow(unreachable_patterns)]
        _ => "error",
    }
}

#[cfg(feature = "tracing")]
fn lease_error_label(e: &LeaseError) -> &'static str {
    match e {
        LeaseError::LeaseLost => "lease_lost",
        LeaseError::ResponseTooLarge { .. } => "response_too_large",
        LeaseError::CheckpointTooLarge { .. } => "checkpoint_too_large",
        LeaseError::KeyTooLong { .. } | LeaseError::ScopeTooLong { .. } => "invalid_key",
        LeaseError::Overloaded(_) => "overloaded",
        LeaseError::Poisoned(_) => "poisoned",
        LeaseError::OutcomeUnknown(_) => "outcome_unknown",
        LeaseError::Closed => "closed",
        LeaseError::WriteSet(_) => "write_set_refused",
        LeaseError::Settled => "settled",
        LeaseError::RetentionTooLong { .. } => "invalid_retention",
        #[allow(unreachable_patterns)]
        _ => "error",
    }
}
