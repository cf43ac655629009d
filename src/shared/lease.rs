//! What a lease can do only on a shared engine: complete in a PostgreSQL transaction that
//! also runs the application's own statements. The capability is a type of its own, reached
//! through [`Lease::into_postgres`], so that no call of [`Lease`] works on one backend and
//! is refused on the other: a lease of an engine over a file is simply never one.

use crate::api::lease::Lease;
use crate::model::error::LeaseError;
use crate::model::write_set::merged;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// A lease of a shared (PostgreSQL) engine, with the completion only that backend has:
/// [`PostgresLease::complete_in_transaction`]. Get one from [`Lease::into_postgres`]; every
/// other decision is the [`Lease`]'s ([`PostgresLease::lease`], [`PostgresLease::into_lease`]).
///
/// Dropped unsettled, it keeps its key until the lease ends, as a [`Lease`] does.
#[must_use = "a lease dropped unsettled keeps its key until the lease ends; complete it"]
pub struct PostgresLease(Lease);

impl fmt::Debug for PostgresLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("PostgresLease").field(&self.0).finish()
    }
}

impl Lease {
    /// This lease as a [`PostgresLease`] when its engine is shared (opened with
    /// [`crate::EngineBuilder::postgres`]); the lease itself, unchanged, when the engine is
    /// over a file, which has no SQL transaction to join (complete it with
    /// [`Lease::complete_with`] and a [`crate::WriteSet`] there).
    ///
    /// # Errors
    ///
    /// `Err(self)` when the engine is not shared.
    #[expect(
        clippy::result_large_err,
        reason = "the lease comes back as it went in; boxing it would allocate for the refusal"
    )]
    pub fn into_postgres(self) -> Result<PostgresLease, Lease> {
        if self.engine.remote().is_some() {
            Ok(PostgresLease(self))
        } else {
            Err(self)
        }
    }
}

impl PostgresLease {
    /// The lease, for its token, key and every other decision.
    pub fn lease(&self) -> &Lease {
        &self.0
    }

    /// The lease back, to decide by any of its own calls.
    pub fn into_lease(self) -> Lease {
        self.0
    }

    /// Completes the lease in a PostgreSQL transaction that also runs the application's
    /// own statements: `hook` receives the transaction after the completing statement
    /// wrote the row, and everything commits together, or nothing does.
    ///
    /// The hook runs only when this call completes the key: not when the lease was lost
    /// (`LeaseLost`, nothing committed) and not for a repeat of a completion this token
    /// already made. An error of the hook rolls the transaction back and is returned as
    /// [`LeaseError::Database`] (the key stays InFlight under this token, as after any
    /// refused completion). Writes staged on the lease ([`Lease::stage`]) are applied in
    /// the same transaction. A failure of the commit itself is `OutcomeUnknown` when the
    /// database's answer was lost (both or neither committed).
    ///
    /// ```no_run
    /// # fn credit(lease: idemkv::Lease, account: &str, amount: i64) -> Result<(), idemkv::LeaseError> {
    /// let Ok(lease) = lease.into_postgres() else {
    ///     unreachable!("this service's engine is shared");
    /// };
    /// let account = account.to_owned();
    /// lease.complete_in_transaction(b"applied", move |tx| {
    ///     Box::pin(async move {
    ///         tx.execute(
    ///             "UPDATE balances SET amount = amount + $2 WHERE account = $1",
    ///             &[&account, &amount],
    ///         )
    ///         .await?;
    ///         Ok(())
    ///     })
    /// })?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn complete_in_transaction<F>(self, response: &[u8], hook: F) -> Result<(), LeaseError>
    where
        F: for<'t> FnOnce(
                &'t tokio_postgres::Transaction<'t>,
            ) -> Pin<
                Box<dyn Future<Output = Result<(), tokio_postgres::Error>> + Send + 't>,
            > + Send
            + 'static,
    {
        let mut lease = self.0;
        lease.settled = true;
        let writes = merged(lease.staged.settle(), None)?;
        let writes = Some(&writes).filter(|w| !w.is_empty());
        let Some(remote) = lease.engine.remote() else {
            // `into_postgres` made this value only for a shared engine, and an engine's
            // backend never changes.
            return Err(LeaseError::Closed);
        };
        lease.engine.check_response(&lease.key, response)?;
        remote
            .complete_in(
                &lease.key,
                lease.token,
                Arc::from(response),
                writes,
                Box::new(hook),
            )
            .map(|_| ())
    }
}
