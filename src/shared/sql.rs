//! Every statement the shared backend sends, built once at open from the configured names.
//! docs/shared.md reproduces them; keep the two in step.
//!
//! Each state transition is ONE statement, decided by the database under the row's lock:
//! no call reads a row and then writes it in a second round trip. Deadlines are computed
//! from the database's clock (`clock_timestamp()`), never from the caller's. Durations are
//! passed as microseconds (`bigint`), capped at `PG_INTERVAL_MAX`.

/// The qualified names of one backend's objects and the statements over them.
#[derive(Debug, Clone)]
pub(crate) struct Sql {
    pub(crate) keys: String,
    pub(crate) meta: String,
    /// The unqualified channel name (`LISTEN` and `pg_notify` take the same text).
    pub(crate) channel: String,
    pub(crate) claim: String,
    pub(crate) complete: String,
    pub(crate) release: String,
    /// Wakes other processes' waiters: one autocommit statement after the settling one.
    pub(crate) notify: String,
    pub(crate) extend: String,
    pub(crate) checkpoint: String,
    pub(crate) fail: String,
    pub(crate) get: String,
    pub(crate) sweep: String,
    pub(crate) version: String,
    /// `CREATE SCHEMA`, when a schema is configured.
    pub(crate) create_schema: Option<String>,
    /// The schema's DDL, run under the advisory lock by the first open of a database.
    pub(crate) create: Vec<String>,
    /// From schema version 1 to 2, run under the same lock; each statement is idempotent.
    pub(crate) upgrade: Vec<String>,
}

/// `n` microseconds as an interval.
const US: &str = "* interval '1 microsecond'";

impl Sql {
    pub(crate) fn new(schema: Option<&str>, prefix: &str) -> Sql {
        let q = |name: &str| match schema {
            Some(s) => format!("\"{s}\".\"{prefix}{name}\""),
            None => format!("\"{prefix}{name}\""),
        };
        let keys = q("keys");
        let meta = q("meta");
        // nextval takes the sequence's name as text: its quoting is inside the literal.
        let seq = q("tokens");
        let seq_lit = seq.replace('\'', "''");
        let channel = match schema {
            Some(s) => format!("{s}_{prefix}wake"),
            None => format!("{prefix}wake"),
        };
        let idx = format!("\"{prefix}keys_reap_at\"");
        let create_schema = schema.map(|s| format!("CREATE SCHEMA IF NOT EXISTS \"{s}\""));
        let mut create = Vec::new();
        create.push(format!(
            "CREATE TABLE IF NOT EXISTS {keys} (
    key              bytea       PRIMARY KEY,
    state            text        NOT NULL CHECK (state IN ('i', 'c')),
    token            bigint      NOT NULL,
    attempt          integer     NOT NULL,
    fingerprint      bytea,
    checkpoint_phase bigint,
    checkpoint       bytea,
    response         bytea,
    lease_until      timestamptz,
    expires_at       timestamptz,
    reap_at          timestamptz NOT NULL,
    first_claimed_at timestamptz NOT NULL,
    completed_at     timestamptz,
    failed           boolean     NOT NULL DEFAULT false,
    attempt_started_at timestamptz,
    retention_us     bigint
)"
        ));
        create.push(format!(
            "CREATE INDEX IF NOT EXISTS {idx} ON {keys} (reap_at)"
        ));
        create.push(format!(
            "CREATE SEQUENCE IF NOT EXISTS {seq} AS bigint MINVALUE 1 NO CYCLE"
        ));
        create.push(format!(
            "INSERT INTO {meta} (name, value) VALUES ('schema_version', $1) \
             ON CONFLICT (name) DO NOTHING"
        ));

        // Claim: insert the key, or take it over when the existing row allows it (a
        // completion past its retention: a fresh claim; an InFlight row whose lease is over
        // and whose fingerprint matches: attempt + 1, checkpoint kept). Only those two
        // branches write or lock: the insert runs only when the snapshot shows no row and
        // does nothing on a conflict, and the update's condition is checked before the row
        // is locked (and re-checked on its newest version once locked), so a claim answered
        // by a live row is read-only and commits without a WAL flush. A token is drawn from
        // the sequence only by a branch that may write, after the snapshot that showed the
        // row it replaces, so a key's tokens only increase. When nothing was written, the
        // last branch reports the row as the statement's snapshot shows it ($1 key, $2
        // fingerprint, $3 the same request's 64-bit legacy fingerprint, $4 lease µs, $5 the
        // engine's retention µs, $6 the claim's own retention µs or NULL). The key's own
        // retention is kept in the row through a takeover of an InFlight row unless the
        // taking claim brings its own; a fresh claim replaces it.
        let claim = format!(
            "WITH ins AS (
    INSERT INTO {keys} (key, state, token, attempt, fingerprint, lease_until, reap_at,
                        first_claimed_at, attempt_started_at, retention_us)
    SELECT $1, 'i', nextval('{seq_lit}'), 1, $2, clock_timestamp() + $4::bigint {US},
           clock_timestamp() + ($4::bigint + coalesce($6::bigint, $5::bigint)) {US},
           clock_timestamp(), clock_timestamp(), $6::bigint
    WHERE NOT EXISTS (SELECT 1 FROM {keys} WHERE key = $1)
    ON CONFLICT (key) DO NOTHING
    RETURNING token, attempt, checkpoint_phase, checkpoint
), upd AS (
    UPDATE {keys} k SET
        token = nextval('{seq_lit}'),
        attempt = CASE WHEN k.state = 'c' THEN 1 ELSE k.attempt + 1 END,
        fingerprint = CASE WHEN k.state = 'c' THEN $2
                           ELSE coalesce($2, k.fingerprint) END,
        checkpoint_phase = CASE WHEN k.state = 'c' THEN NULL ELSE k.checkpoint_phase END,
        checkpoint = CASE WHEN k.state = 'c' THEN NULL ELSE k.checkpoint END,
        first_claimed_at = CASE WHEN k.state = 'c' THEN clock_timestamp() ELSE k.first_claimed_at END,
        state = 'i', response = NULL, expires_at = NULL, completed_at = NULL, failed = false,
        attempt_started_at = clock_timestamp(), lease_until = clock_timestamp() + $4::bigint {US},
        retention_us = CASE WHEN k.state = 'c' THEN $6 ELSE coalesce($6, k.retention_us) END,
        reap_at = clock_timestamp() + ($4::bigint + coalesce($6, CASE WHEN k.state = 'i'
                                       THEN k.retention_us END, $5::bigint)) {US}
    WHERE k.key = $1 AND NOT EXISTS (SELECT 1 FROM ins)
      AND ((k.state = 'c' AND k.expires_at <= clock_timestamp())
           OR (k.state = 'i' AND k.lease_until <= clock_timestamp()
               AND ($2::bytea IS NULL OR k.fingerprint IS NULL
                    OR k.fingerprint = $2 OR k.fingerprint = $3)))
    RETURNING k.token, k.attempt, k.checkpoint_phase, k.checkpoint
)
SELECT 'a'::text AS kind, token, attempt, checkpoint_phase, checkpoint,
       NULL::bytea AS response, NULL::bytea AS fingerprint, NULL::bigint AS remaining_us
FROM ins
UNION ALL
SELECT 'a', token, attempt, checkpoint_phase, checkpoint, NULL, NULL, NULL
FROM upd
UNION ALL
SELECT k.state, k.token, k.attempt, NULL, NULL,
       CASE WHEN k.state = 'c' THEN k.response END, k.fingerprint,
       (extract(epoch FROM CASE WHEN k.state = 'c' THEN k.expires_at ELSE k.lease_until END
                           - clock_timestamp()) * 1000000)::bigint
FROM {keys} k
WHERE k.key = $1 AND NOT EXISTS (SELECT 1 FROM ins) AND NOT EXISTS (SELECT 1 FROM upd)"
        );

        // Complete: fenced by the token and the InFlight state. It does not notify: a
        // notifying transaction holds the database-wide notify lock through its commit,
        // which serializes such commits; `notify` follows once it answered. When nothing
        // was written, a completion already stored under the same token is a repeat ($1 key,
        // $2 token, $3 response, $4 the engine's retention µs, $5 the completion's own or
        // NULL; the key's own, kept with the claim, comes between them).
        let complete = format!(
            "WITH done AS (
    UPDATE {keys} SET state = 'c', response = $3, completed_at = clock_timestamp(),
        expires_at = clock_timestamp() + coalesce($5::bigint, retention_us, $4::bigint) {US},
        reap_at = clock_timestamp() + coalesce($5::bigint, retention_us, $4::bigint) {US},
        lease_until = NULL, checkpoint_phase = NULL, checkpoint = NULL
    WHERE key = $1 AND token = $2 AND state = 'i'
    RETURNING attempt, fingerprint, expires_at
)
SELECT 'done'::text AS kind, d.attempt, d.fingerprint,
       (extract(epoch FROM d.expires_at - clock_timestamp()) * 1000000)::bigint AS remaining_us
FROM done d
UNION ALL
SELECT 'repeat', k.attempt, k.fingerprint,
       (extract(epoch FROM k.expires_at - clock_timestamp()) * 1000000)::bigint
FROM {keys} k
WHERE k.key = $1 AND k.token = $2 AND k.state = 'c' AND k.expires_at > clock_timestamp()
  AND NOT EXISTS (SELECT 1 FROM done)"
        );

        // Release: fenced delete; `notify` follows once it answered.
        let release =
            format!("DELETE FROM {keys} WHERE key = $1 AND token = $2 AND state = 'i' RETURNING 1");

        // Notify: its own transaction, sent after the settling statement answered, so a
        // waiter it wakes reads the commit ($1: key hashes in hex, comma-separated). The
        // notification is not durable anyway, so its commit does not wait for the WAL
        // flush, and holds the notify lock only as long as the commit itself.
        let notify = format!(
            "SELECT set_config('synchronous_commit', 'off', true), pg_notify('{channel}', $1)"
        );

        // Extend: the lease ends `$3` µs from the database's now; the abandoned row's
        // reaping moves with it ($4 retention µs).
        let extend = format!(
            "UPDATE {keys} SET lease_until = clock_timestamp() + $3::bigint {US},
    reap_at = clock_timestamp() + ($3::bigint + coalesce(retention_us, $4::bigint)) {US}
WHERE key = $1 AND token = $2 AND state = 'i'
RETURNING 1"
        );

        let checkpoint = format!(
            "UPDATE {keys} SET checkpoint_phase = $3::bigint, checkpoint = $4
WHERE key = $1 AND token = $2 AND state = 'i'
RETURNING 1"
        );

        // Fail: the lease ends now (or keeps an end already past) and the row stays,
        // marked failed, with its checkpoint and fingerprint, for the next claim to take
        // over at once; its reaping moves with the lease's end ($3 retention µs).
        let fail = format!(
            "UPDATE {keys} SET failed = true,
    lease_until = least(lease_until, clock_timestamp()),
    reap_at = least(lease_until, clock_timestamp()) + coalesce(retention_us, $3::bigint) {US}
WHERE key = $1 AND token = $2 AND state = 'i'
RETURNING 1"
        );

        // Get: the row unless it is a completion past its retention.
        let get = format!(
            "SELECT state, token, attempt, checkpoint_phase, checkpoint, response,
       (extract(epoch FROM lease_until - clock_timestamp()) * 1000000)::bigint,
       (extract(epoch FROM expires_at) * 1000)::bigint, failed,
       (extract(epoch FROM first_claimed_at) * 1000)::bigint,
       (extract(epoch FROM attempt_started_at) * 1000)::bigint
FROM {keys}
WHERE key = $1 AND (state = 'i' OR expires_at > clock_timestamp())"
        );

        // Sweep: a bounded batch of rows past their reaping instant (completions past
        // retention, InFlight rows past their lease end plus retention). Rows another
        // transaction has locked are skipped, and the outer condition re-checks each row.
        let sweep = format!(
            "DELETE FROM {keys}
WHERE key IN (SELECT key FROM {keys} WHERE reap_at <= clock_timestamp()
              ORDER BY reap_at LIMIT $1 FOR UPDATE SKIP LOCKED)
  AND reap_at <= clock_timestamp()"
        );

        let version = format!("SELECT value FROM {meta} WHERE name = 'schema_version'");

        // Version 1 to 2: the failed flag, the attempt's start (unknown, so NULL, for rows
        // claimed before) and the key's own retention, then the version row.
        let upgrade = vec![
            format!(
                "ALTER TABLE {keys} ADD COLUMN IF NOT EXISTS failed boolean NOT NULL DEFAULT false"
            ),
            format!("ALTER TABLE {keys} ADD COLUMN IF NOT EXISTS attempt_started_at timestamptz"),
            format!("ALTER TABLE {keys} ADD COLUMN IF NOT EXISTS retention_us bigint"),
            format!("UPDATE {meta} SET value = $1 WHERE name = 'schema_version' AND value < $1"),
        ];

        Sql {
            keys,
            meta,
            channel,
            claim,
            complete,
            release,
            notify,
            extend,
            checkpoint,
            fail,
            get,
            sweep,
            version,
            create_schema,
            create,
            upgrade,
        }
    }

    /// The meta table, created before the version row is read under the lock.
    pub(crate) fn create_meta(&self) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (name text PRIMARY KEY, value bigint NOT NULL)",
            self.meta
        )
    }
}

#[cfg(test)]
mod tests {
    use super::Sql;

    /// docs/shared.md shows every statement as sent with the default names; a change here
    /// must change the page too.
    #[test]
    fn the_documentation_shows_every_statement() {
        let doc = include_str!("../../docs/shared.md");
        let sql = Sql::new(None, "idemkv_");
        let mut all = vec![
            sql.claim.clone(),
            sql.complete.clone(),
            sql.release.clone(),
            sql.notify.clone(),
            sql.extend.clone(),
            sql.checkpoint.clone(),
            sql.fail.clone(),
            sql.get.clone(),
            sql.sweep.clone(),
            sql.version.clone(),
            sql.create_meta(),
        ];
        all.extend(sql.create.iter().cloned());
        all.extend(sql.upgrade.iter().cloned());
        for stmt in all {
            assert!(doc.contains(&stmt), "docs/shared.md lacks:\n{stmt}");
        }
        assert!(doc.contains(&format!("LISTEN \"{}\"", sql.channel)));
    }
}
