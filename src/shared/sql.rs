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
    /// Claims of several keys, sorted, in one statement (`batch.rs`).
    pub(crate) claim_batch: String,
    /// The same two statements committed without waiting for the WAL flush, for a
    /// database that can force the flush afterwards ([`Sql::flush`]): a claim's row and
    /// its lock are given up to other callers as soon as it commits, and only an
    /// acquiring caller waits for the flush (docs/shared.md, "Claims commit early").
    pub(crate) claim_early: String,
    pub(crate) claim_batch_early: String,
    /// A transaction that writes a WAL record (a transactional logical-decoding message)
    /// and commits with the session's `synchronous_commit`: its commit is durable only
    /// once every record before it is, the early claims' commits included. It reads the
    /// server's lifetime token ([`Sql::life`]) and writes nothing when the row is gone.
    pub(crate) flush: String,
    /// Whether this session can commit claims early: it may execute the function
    /// [`Sql::flush`] calls, and read and write the lifetime table, which is unlogged.
    pub(crate) can_flush: String,
    /// Reads the lifetime token, and writes a random one first where the row is missing:
    /// the row lives in an unlogged table, which crash recovery empties (and a standby
    /// never has), so a token still found proves no crash or failover since it was read
    /// (docs/shared.md, "Claims commit early").
    pub(crate) life: String,
    pub(crate) complete: String,
    /// A completion with writes to the application's tables and messages for the outbox,
    /// all in the completing statement.
    pub(crate) complete_with: String,
    /// Completions without writes of several keys in one statement and one commit
    /// (`batch.rs`), each fenced by its own token.
    pub(crate) complete_batch: String,
    /// The same, reading the lifetime token too, for a batch that carries acquisitions
    /// waiting for their flush: its commit stands for their flush where it read their
    /// claims' token.
    pub(crate) complete_batch_life: String,
    pub(crate) release: String,
    /// Wakes other processes' waiters: one autocommit statement after the settling one.
    pub(crate) notify: String,
    /// Run by a listening connection after its `LISTEN`, and before its `UNLISTEN`: the
    /// shared advisory locks that tell completions someone listens (`listen.rs`).
    pub(crate) hear: String,
    pub(crate) unhear: String,
    pub(crate) extend: String,
    pub(crate) checkpoint: String,
    /// A checkpoint with writes, in one statement.
    pub(crate) checkpoint_with: String,
    pub(crate) fail: String,
    /// The application's tables: one row; a range of rows.
    pub(crate) table_get: String,
    pub(crate) table_scan: String,
    /// The outbox relay: take pending messages for a while; remove sent ones.
    pub(crate) outbox_take: String,
    pub(crate) outbox_sent: String,
    pub(crate) get: String,
    pub(crate) sweep: String,
    pub(crate) version: String,
    /// `CREATE SCHEMA`, when a schema is configured.
    pub(crate) create_schema: Option<String>,
    /// The schema's DDL, run under the advisory lock by the first open of a database.
    pub(crate) create: Vec<String>,
    /// From schema version 1 to 7 to the current one (8), run under the same lock; each
    /// statement is idempotent and the last writes the version row.
    pub(crate) upgrade_from_1: Vec<String>,
    pub(crate) upgrade_from_2: Vec<String>,
    pub(crate) upgrade_from_3: Vec<String>,
    pub(crate) upgrade_from_4: Vec<String>,
    pub(crate) upgrade_from_5: Vec<String>,
    pub(crate) upgrade_from_6: Vec<String>,
    pub(crate) upgrade_from_7: Vec<String>,
}

/// The class of the wake-up stripes' advisory locks (the two-key form, a space of its own),
/// from the keys table's qualified name, so backends on different tables never meet: the
/// low 32 bits of its FNV-1a hash.
fn wake_class(keys: &str) -> i32 {
    let low = crate::model::codec::fnv1a64(keys.as_bytes()) as u32;
    i32::from_ne_bytes(low.to_ne_bytes())
}

/// The class of the claims' advisory locks (the two-key form, a space of its own), apart
/// from the wake-up stripes' class and from other tables': the low 32 bits of the FNV-1a
/// hash of the keys table's qualified name followed by `#claim`.
fn claim_class(keys: &str) -> i32 {
    wake_class(&format!("{keys}#claim"))
}

/// `n` microseconds as an interval.
const US: &str = "* interval '1 microsecond'";
/// The qualified names of one backend's objects, as the statements quote them.
struct Names {
    keys: String,
    meta: String,
    tables: String,
    outbox: String,
    outbox_seq: String,
    /// nextval takes a sequence's name as text: its quoting is inside the literal.
    outbox_seq_lit: String,
    seq: String,
    seq_lit: String,
    claim_fn: String,
    complete_fn: String,
    /// The unlogged table of the server's lifetime token.
    life: String,
    channel: String,
    idx: String,
    wake_class: i32,
    claim_class: i32,
}

impl Names {
    fn new(schema: Option<&str>, prefix: &str) -> Names {
        let q = |name: &str| match schema {
            Some(s) => format!("\"{s}\".\"{prefix}{name}\""),
            None => format!("\"{prefix}{name}\""),
        };
        let keys = q("keys");
        let (outbox_seq, seq) = (q("outbox_ids"), q("tokens"));
        Names {
            meta: q("meta"),
            tables: q("tables"),
            outbox: q("outbox"),
            outbox_seq_lit: outbox_seq.replace('\'', "''"),
            outbox_seq,
            seq_lit: seq.replace('\'', "''"),
            seq,
            claim_fn: q("claim"),
            complete_fn: q("complete"),
            life: q("life"),
            channel: match schema {
                Some(s) => format!("{s}_{prefix}wake"),
                None => format!("{prefix}wake"),
            },
            idx: format!("\"{prefix}keys_reap_at\""),
            wake_class: wake_class(&keys),
            claim_class: claim_class(&keys),
            keys,
        }
    }
}

impl Sql {
    pub(crate) fn new(schema: Option<&str>, prefix: &str) -> Sql {
        let n = Names::new(schema, prefix);
        let (claim, claim_batch) = claims(&n);
        let (claim_early, claim_batch_early) =
            (commits_early(&n, &claim), commits_early(&n, &claim_batch));
        let (complete, complete_with) = completes(&n);
        let (release, notify, hear, unhear) = settles(&n);
        let (extend, checkpoint, checkpoint_with, fail) = lease_updates(&n);
        let (table_get, table_scan, outbox_take, outbox_sent) = app_reads(&n);
        let (get, sweep, version) = key_reads(&n);
        let [upgrade_from_1, upgrade_from_2, upgrade_from_3, upgrade_from_4, upgrade_from_5, upgrade_from_6, upgrade_from_7] =
            upgrades(&n);
        Sql {
            create_schema: schema.map(|s| format!("CREATE SCHEMA IF NOT EXISTS \"{s}\"")),
            create: create(&n),
            can_flush: can_flush(&n),
            complete_batch: complete_batch(&n, false),
            complete_batch_life: complete_batch(&n, true),
            flush: flush(&n),
            life: life(&n),
            keys: n.keys,
            meta: n.meta,
            channel: n.channel,
            claim,
            claim_batch,
            claim_early,
            claim_batch_early,
            complete,
            complete_with,
            release,
            notify,
            hear,
            unhear,
            extend,
            checkpoint,
            checkpoint_with,
            fail,
            table_get,
            table_scan,
            outbox_take,
            outbox_sent,
            get,
            sweep,
            version,
            upgrade_from_1,
            upgrade_from_2,
            upgrade_from_3,
            upgrade_from_4,
            upgrade_from_5,
            upgrade_from_6,
            upgrade_from_7,
        }
    }

    /// The statements that bring a database of schema version `from` to the current one.
    pub(crate) fn upgrade(&self, from: i64) -> Option<&[String]> {
        match from {
            1 => Some(&self.upgrade_from_1),
            2 => Some(&self.upgrade_from_2),
            3 => Some(&self.upgrade_from_3),
            4 => Some(&self.upgrade_from_4),
            5 => Some(&self.upgrade_from_5),
            6 => Some(&self.upgrade_from_6),
            7 => Some(&self.upgrade_from_7),
            _ => None,
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

/// The schema's DDL for a database without it: the keys table, its index and token
/// sequence, the application's tables, the claim function and, last, the version row.
fn create(n: &Names) -> Vec<String> {
    let Names {
        keys,
        seq,
        idx,
        meta,
        ..
    } = n;
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
    retention_us     bigint,
    claim_id         bytea,
    marker_until     timestamptz
)"
    ));
    create.push(format!(
        "CREATE INDEX IF NOT EXISTS {idx} ON {keys} (reap_at)"
    ));
    create.push(format!(
        "CREATE SEQUENCE IF NOT EXISTS {seq} AS bigint MINVALUE 1 NO CYCLE"
    ));
    create.extend(app_tables(n));
    create.push(life_ddl(n));
    // The claim function comes after the table (its row type is the table's); the
    // version row is written last.
    create.push(claim_fn_ddl(n));
    create.push(complete_fn_ddl(n));
    create.push(format!(
        "INSERT INTO {meta} (name, value) VALUES ('schema_version', $1) \
             ON CONFLICT (name) DO NOTHING"
    ));
    create
}

// The application's tables (a row's key is its table's name, length-prefixed,
// then its key, as in a file) and the outbox, with the instant until which a relay
// took a message (NULL: nobody).
fn app_tables(n: &Names) -> Vec<String> {
    let Names {
        tables,
        outbox,
        outbox_seq,
        ..
    } = n;
    vec![
        format!(
            "CREATE TABLE IF NOT EXISTS {tables} (key bytea PRIMARY KEY, value bytea NOT NULL)"
        ),
        format!("CREATE SEQUENCE IF NOT EXISTS {outbox_seq} AS bigint MINVALUE 1 NO CYCLE"),
        format!(
            "CREATE TABLE IF NOT EXISTS {outbox} (
    id          bigint      PRIMARY KEY,
    payload     bytea       NOT NULL,
    taken_until timestamptz
)"
        ),
    ]
}

/// The lifetime token's table (see [`Sql::life`]): unlogged, so that crash recovery
/// empties it; one row, `id = 1`.
fn life_ddl(n: &Names) -> String {
    let life = &n.life;
    format!("CREATE UNLOGGED TABLE IF NOT EXISTS {life} (id integer PRIMARY KEY, token bigint NOT NULL)")
}

/// Whether a claim may take over the row `r` (see `claim_fn_ddl`).
fn take_over(r: &str) -> String {
    format!(
        "({r}.state = 'c' AND {r}.expires_at <= clock_timestamp()
               AND (NOT p_markers OR {r}.marker_until IS NULL
                    OR {r}.marker_until <= clock_timestamp()
                    OR (p_rerun AND (p_fp IS NULL OR {r}.fingerprint IS NULL
                                     OR {r}.fingerprint = p_fp
                                     OR {r}.fingerprint = p_fp_legacy))))
           OR ({r}.state = 'i' AND {r}.lease_until <= clock_timestamp()
               AND (p_fp IS NULL OR {r}.fingerprint IS NULL
                    OR {r}.fingerprint = p_fp OR {r}.fingerprint = p_fp_legacy))"
    )
}

/// Whether a claim resumes the lease of the row `r` (see `claim_fn_ddl`).
fn resume(r: &str) -> String {
    format!(
        "p_claim_id IS NOT NULL AND {r}.state = 'i' AND {r}.claim_id = p_claim_id
               AND NOT {r}.failed
               AND (p_fp IS NULL OR {r}.fingerprint IS NULL
                    OR {r}.fingerprint = p_fp OR {r}.fingerprint = p_fp_legacy)"
    )
}

/// The claim function's answer for a key it does not write, assigned from the row it read
/// (`seen`): no second statement, and one reading of the clock.
const CLAIM_ANSWER: &str = "            now_at := clock_timestamp();
            kind := CASE WHEN p_markers AND seen.state = 'c' AND seen.expires_at <= now_at
                         THEN 'm' ELSE seen.state END;
            token := seen.token;
            attempt := seen.attempt;
            response := CASE WHEN seen.state = 'c' AND seen.expires_at > now_at
                             THEN seen.response END;
            fingerprint := seen.fingerprint;
            remaining_us := (extract(epoch FROM CASE WHEN seen.state = 'i' THEN seen.lease_until
                                                     WHEN seen.expires_at > now_at
                                                     THEN seen.expires_at
                                                     WHEN p_markers THEN seen.marker_until
                                                     ELSE seen.expires_at END
                                                - now_at) * 1000000)::bigint;
            completed_ms := (extract(epoch FROM seen.completed_at) * 1000)::bigint;
            RETURN NEXT;
            RETURN;";

// Claim: one call of a function the backend installs (`claim_fn`). Inside, each
// pass reads the key's row with a fresh snapshot (READ COMMITTED gives every
// statement of a volatile function its own) and then does at most one conditional
// write: with no row, the key's claim lock (a transaction advisory lock, taken only
// if free) and an insert that does nothing on a conflict; with a row the
// claim may take over (a completion past its retention: a fresh claim; an InFlight
// row whose lease is over and whose fingerprint matches: attempt + 1, checkpoint
// kept), an update whose condition is re-checked on the row's newest version once
// locked. A write that did nothing (another caller inserted or took over first)
// starts the next pass, whose snapshot shows that caller's commit; otherwise the
// row read is the answer. So a claim answered by a live row is one read, writes
// nothing and commits without a WAL flush. A claim that finds no row while another
// claim holds the key's lock (its insert not yet committed, in a batch that may
// wait for others) answers at once as a holder with this claim's lease ('i'), and
// never waits for that commit: batches of different processes never queue behind
// each other's inserts, each holding its own. A claim that meets an insert made
// without the lock waits for it and answers from it in the same call. A token is drawn from
// the sequence only by a writing statement, after the snapshot that showed the row
// it replaces (or none), so a key's tokens only increase. After `PG_CLAIM_ASKS_MAX`
// passes that each lost a race it returns no row, and the caller asks again.
// Parameters: the key, the fingerprint, the same request's 64-bit legacy
// fingerprint, the lease µs, the engine's retention µs, the claim's own retention
// µs or NULL, the claim identity or NULL. The key's own retention is kept in the
// row through a takeover of an InFlight row unless the taking claim brings its own;
// a fresh claim replaces it. A claim presenting the identity its InFlight row holds
// (not failed, the fingerprint matching) resumes that lease, live or over and not
// taken over: the same token and attempt, the lease renewed from now.
fn claim_fn_ddl(n: &Names) -> String {
    let Names {
        keys,
        seq_lit,
        claim_fn,
        claim_class,
        ..
    } = n;
    let asks = crate::shared::constants::PG_CLAIM_ASKS_MAX;
    let (take_over_seen, take_over_locked) = (take_over("seen"), take_over("k"));
    let (resume_seen, resume_locked) = (resume("seen"), resume("k"));
    let acquired = "RETURNING 'a'::text, k.token, k.attempt, k.checkpoint_phase, k.checkpoint,
                      NULL::bytea, NULL::bytea, NULL::bigint, NULL::bigint";
    // A resumed lease answers as an acquired one, of kind 'r'.
    let resumed = acquired.replacen("'a'", "'r'", 1);
    format!(
        "CREATE OR REPLACE FUNCTION {claim_fn}(p_key bytea, p_fp bytea, p_fp_legacy bytea,
    p_lease_us bigint, p_retention_us bigint, p_own_us bigint, p_claim_id bytea,
    p_markers boolean, p_rerun boolean)
RETURNS TABLE (kind text, token bigint, attempt integer, checkpoint_phase bigint,
               checkpoint bytea, response bytea, fingerprint bytea, remaining_us bigint,
               completed_ms bigint)
LANGUAGE plpgsql VOLATILE AS $claim$
#variable_conflict use_column
DECLARE
    seen {keys}%ROWTYPE;
    now_at timestamptz;
BEGIN
    FOR pass IN 1..{asks} LOOP
        SELECT * INTO seen FROM {keys} r WHERE r.key = p_key;
        IF NOT FOUND AND NOT pg_try_advisory_xact_lock({claim_class},
                                                       hashtext(encode(p_key, 'hex'))) THEN
            kind := 'i';
            token := 0;
            attempt := 1;
            remaining_us := p_lease_us;
            RETURN NEXT;
            RETURN;
        ELSIF NOT FOUND THEN
            RETURN QUERY
            INSERT INTO {keys} AS k (key, state, token, attempt, fingerprint, lease_until,
                                     reap_at, first_claimed_at, attempt_started_at,
                                     retention_us, claim_id)
            VALUES (p_key, 'i', nextval('{seq_lit}'), 1, p_fp,
                    clock_timestamp() + p_lease_us {US},
                    clock_timestamp() + (p_lease_us + coalesce(p_own_us, p_retention_us)) {US},
                    clock_timestamp(), clock_timestamp(), p_own_us, p_claim_id)
            ON CONFLICT (key) DO NOTHING
            {acquired};
        ELSIF {resume_seen} THEN
            RETURN QUERY
            UPDATE {keys} k SET
                lease_until = clock_timestamp() + p_lease_us {US},
                reap_at = clock_timestamp() + (p_lease_us + coalesce(k.retention_us,
                              p_retention_us)) {US}
            WHERE k.key = p_key AND k.token = seen.token AND ({resume_locked})
            {resumed};
        ELSIF {take_over_seen} THEN
            RETURN QUERY
            UPDATE {keys} k SET
                token = nextval('{seq_lit}'),
                attempt = CASE WHEN k.state = 'c' THEN 1 ELSE k.attempt + 1 END,
                fingerprint = CASE WHEN k.state = 'c' THEN p_fp
                                   ELSE coalesce(p_fp, k.fingerprint) END,
                checkpoint_phase = CASE WHEN k.state = 'c' THEN NULL ELSE k.checkpoint_phase END,
                checkpoint = CASE WHEN k.state = 'c' THEN NULL ELSE k.checkpoint END,
                first_claimed_at = CASE WHEN k.state = 'c' THEN clock_timestamp()
                                        ELSE k.first_claimed_at END,
                state = 'i', response = NULL, expires_at = NULL, completed_at = NULL,
                failed = false, attempt_started_at = clock_timestamp(), claim_id = p_claim_id,
                marker_until = NULL,
                lease_until = clock_timestamp() + p_lease_us {US},
                retention_us = CASE WHEN k.state = 'c' THEN p_own_us
                                    ELSE coalesce(p_own_us, k.retention_us) END,
                reap_at = clock_timestamp() + (p_lease_us + coalesce(p_own_us,
                              CASE WHEN k.state = 'i' THEN k.retention_us END,
                              p_retention_us)) {US}
            WHERE k.key = p_key AND ({take_over_locked})
            {acquired};
        ELSE
{CLAIM_ANSWER}
        END IF;
        IF FOUND THEN
            RETURN;
        END IF;
    END LOOP;
END
$claim$"
    )
}

/// A lone claim, and the claims of a batch.
fn claims(n: &Names) -> (String, String) {
    let claim_fn = &n.claim_fn;
    let claim = format!("SELECT c.* FROM {claim_fn}($1, $2, $3, $4, $5, $6, $7, $8, $9) c");
    // The same function for each key of a batch, in the arrays' order (the keys come
    // sorted), in one transaction; `n` numbers the keys from 1. $1 keys, $2
    // fingerprints, $3 legacy fingerprints, $4 leases µs, $5 own retentions µs (NULL:
    // none), $6 the engine's retention µs, $7 claim identities (NULL: none), $8 whether
    // the engine keeps markers, $9 whether each claim reruns a forgotten key.
    //
    // The keys are numbered by `generate_subscripts`, not taken by `unnest`: the planner
    // knows how many rows `unnest` of a known array gives, so every plan made with the
    // batch's values came out cheaper than the plan made without them, and the server
    // planned the statement again for every batch. `generate_subscripts` gives the same
    // estimate either way, so the prepared statement keeps one plan.
    let claim_batch = format!(
        "SELECT i::bigint AS n, c.*
FROM generate_subscripts($1::bytea[], 1) AS i,
     LATERAL {claim_fn}(($1::bytea[])[i], ($2::bytea[])[i], ($3::bytea[])[i],
                        ($4::bigint[])[i], $6, ($5::bigint[])[i], ($7::bytea[])[i], $8,
                        ($9::boolean[])[i]) c"
    );
    (claim, claim_batch)
}

/// `claim` (a lone claim or a batch, each `SELECT … FROM …`) with its transaction's
/// `synchronous_commit` set to `off`: the setting is local to the statement's own
/// transaction and read at its commit. The one-row subquery is evaluated once, whichever
/// side of the join the planner puts it on. Each row also carries the server's lifetime
/// token as the statement's snapshot read it, before the commit: the claim's flush must
/// find the same token on the server it reaches.
fn commits_early(n: &Names, claim: &str) -> String {
    let (select, from) = claim.split_once("FROM ").unwrap_or((claim, ""));
    let life = life_read(n);
    format!(
        "{select}, {life} AS life\nFROM (SELECT set_config('synchronous_commit', 'off', true)) AS early,\n     {from}",
        select = select.trim_end()
    )
}

/// Forces the WAL flush of the early claims before it (see [`Sql::flush`]), and answers
/// the lifetime token it found; no row: the token is gone, and nothing is written. The
/// message is empty; a logical decoding consumer sees it under the prefix `idemkv`.
fn flush(n: &Names) -> String {
    let life = &n.life;
    format!("SELECT token, pg_logical_emit_message(true, 'idemkv', '') FROM {life} WHERE id = 1")
}

/// See [`Sql::life`]. An insert that meets another session's row waits for it and writes
/// nothing; the outer read's snapshot may then predate that row, and no row comes back
/// (the caller asks again). `random()` gives 52 random bits (48 before PostgreSQL 15): a
/// new token repeats a given old one with a chance of 2^-52.
fn life(n: &Names) -> String {
    let life = &n.life;
    format!(
        "WITH made AS (
    INSERT INTO {life} (id, token) VALUES (1, floor(random() * 4.5e15)::bigint + 1)
    ON CONFLICT (id) DO NOTHING
    RETURNING token
)
SELECT token FROM made
UNION ALL
SELECT token FROM {life} WHERE id = 1"
    )
}

/// See [`Sql::can_flush`]: any `pg_logical_emit_message` of `pg_catalog` that takes text
/// as its third argument (PostgreSQL 17 added a fourth, with a default), executable by
/// this role; none: `false`. The lifetime table must be unlogged (a table of that name
/// made otherwise survives a crash, and proves nothing) and readable and writable by it.
fn can_flush(n: &Names) -> String {
    let life = n.life.replace('\'', "''");
    format!(
        "SELECT coalesce(bool_or(has_function_privilege(p.oid, 'EXECUTE')), false)
       AND coalesce((SELECT relpersistence = 'u' FROM pg_class WHERE oid = to_regclass('{life}')), false)
       AND has_table_privilege('{life}', 'SELECT, INSERT')
FROM pg_proc p
WHERE p.proname = 'pg_logical_emit_message'
  AND p.pronamespace = 'pg_catalog'::regnamespace
  AND p.proargtypes[2] = 'text'::regtype"
    )
}

/// The scalar subquery that reads the lifetime token (NULL: none).
fn life_read(n: &Names) -> String {
    format!("(SELECT token FROM {} WHERE id = 1)", n.life)
}

// The writes of a set, applied only when its statement wrote the row (`done`; a
// repeat applies nothing again): its final value of each row ($8 keys, $9 values),
// the rows it deletes ($10) and its messages in emission order ($11), their ids
// drawn from the outbox's sequence.
fn writes(n: &Names) -> String {
    let Names {
        tables,
        outbox,
        outbox_seq_lit,
        ..
    } = n;
    format!(
        "puts AS (
    INSERT INTO {tables} (key, value)
    SELECT w.key, w.value FROM unnest($8::bytea[], $9::bytea[]) AS w(key, value)
    WHERE EXISTS (SELECT 1 FROM done)
    ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value
),
dels AS (
    DELETE FROM {tables} WHERE key = ANY($10::bytea[]) AND EXISTS (SELECT 1 FROM done)
),
msgs AS (
    INSERT INTO {outbox} (id, payload)
    SELECT nextval('{outbox_seq_lit}'), m.payload
    FROM unnest($11::bytea[]) WITH ORDINALITY AS m(payload, n)
    WHERE EXISTS (SELECT 1 FROM done)
    ORDER BY m.n
)"
    )
}

/// A lone completion, without and with writes.
fn completes(n: &Names) -> (String, String) {
    let Names {
        keys, wake_class, ..
    } = n;
    // Complete, as the completing part of a completion with writes (without writes,
    // the completion function makes the same update): fenced by the token and the
    // InFlight state. It does not notify: a notifying transaction holds the
    // database-wide notify lock through its commit, which serializes such commits;
    // `notify` follows once it answered, when `heard`:
    // the key's wake-up stripe is locked, shared, by a listening connection (a waiting
    // claim's). The try-lock is held to the commit, so a listener that starts to listen
    // meanwhile waits for the commit and then reads it. When nothing was written, a
    // completion already stored under the same token is a repeat ($1 key, $2 token, $3
    // response, $4 the engine's retention µs, $5 the completion's own or NULL; the
    // key's own, kept with the claim, comes between them; $6 the key's wake-up stripe).
    let done = format!(
        "done AS (
    UPDATE {keys} SET state = 'c', response = $3, completed_at = clock_timestamp(),
        expires_at = clock_timestamp() + coalesce($5::bigint, retention_us, $4::bigint) {US},
        reap_at = clock_timestamp() + coalesce($5::bigint, retention_us, $4::bigint) {US},
        marker_until = clock_timestamp()
            + (coalesce($5::bigint, retention_us, $4::bigint) + $7::bigint) {US},
        lease_until = NULL, checkpoint_phase = NULL, checkpoint = NULL
    WHERE key = $1 AND token = $2 AND state = 'i'
    RETURNING attempt, fingerprint, expires_at
)"
    );
    let writes = writes(n);
    let complete_tail = format!(
        "SELECT 'done'::text AS kind, d.attempt, d.fingerprint,
       (extract(epoch FROM d.expires_at - clock_timestamp()) * 1000000)::bigint AS remaining_us,
       NOT pg_try_advisory_xact_lock({wake_class}, $6::integer) AS heard
FROM done d
UNION ALL
SELECT 'repeat', k.attempt, k.fingerprint,
       (extract(epoch FROM k.expires_at - clock_timestamp()) * 1000000)::bigint, true
FROM {keys} k
WHERE k.key = $1 AND k.token = $2 AND k.state = 'c' AND k.expires_at > clock_timestamp()
  AND NOT EXISTS (SELECT 1 FROM done)"
    );
    // Without writes: one call of the completion function, as in a batch.
    let complete = format!(
        "SELECT * FROM {}($1, $2, $3, $5, $6, $4, $7)",
        n.complete_fn
    );
    let complete_with = format!("WITH {done},\n{writes}\n{complete_tail}");
    (complete, complete_with)
}

// Complete, without writes, as one call of a function the backend installs
// (`complete_fn`), so that its plan (an update by the primary key) is made once per
// connection. A lone completion calls it once; the batch's statement calls it for each
// ask, in the arrays' order (the keys come sorted), and keeps one plan too (see `claims`
// on `generate_subscripts`). Its repeat check reads with a snapshot of its own: a
// completion under the same token committed while the update waited for the row is a
// repeat. A join of
// the asks with the table, the earlier form, was planned for each batch: a plan kept from
// when the table was nearly empty scans the whole table. The function updates the row
// under the lone completion's conditions and answers `done`, or reads a repeat; no row:
// the token no longer holds the key.
fn complete_fn_ddl(n: &Names) -> String {
    let Names {
        keys,
        complete_fn,
        wake_class,
        ..
    } = n;
    format!(
        "CREATE OR REPLACE FUNCTION {complete_fn}(p_key bytea, p_token bigint, p_response bytea,
    p_own_us bigint, p_stripe integer, p_retention_us bigint, p_marker_us bigint)
RETURNS TABLE (kind text, attempt integer, fingerprint bytea, remaining_us bigint,
               heard boolean)
LANGUAGE plpgsql VOLATILE AS $complete$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    UPDATE {keys} k SET state = 'c', response = p_response, completed_at = clock_timestamp(),
        expires_at = clock_timestamp() + coalesce(p_own_us, k.retention_us, p_retention_us) {US},
        reap_at = clock_timestamp() + coalesce(p_own_us, k.retention_us, p_retention_us) {US},
        marker_until = clock_timestamp()
            + (coalesce(p_own_us, k.retention_us, p_retention_us) + p_marker_us) {US},
        lease_until = NULL, checkpoint_phase = NULL, checkpoint = NULL
    WHERE k.key = p_key AND k.token = p_token AND k.state = 'i'
    RETURNING 'done'::text, k.attempt, k.fingerprint,
              (extract(epoch FROM k.expires_at - clock_timestamp()) * 1000000)::bigint,
              NOT pg_try_advisory_xact_lock({wake_class}, p_stripe);
    IF FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT 'repeat'::text, k.attempt, k.fingerprint,
           (extract(epoch FROM k.expires_at - clock_timestamp()) * 1000000)::bigint, true
    FROM {keys} k
    WHERE k.key = p_key AND k.token = p_token AND k.state = 'c'
      AND k.expires_at > clock_timestamp();
END
$complete$"
    )
}

// Complete, batched ($1 keys, $2 tokens, $3 responses, $4 own retention µs or NULL, $5
// wake-up stripes; $6 and $7 as the lone completion's $4 and $7): a row per ask that wrote
// or repeats, named by its ordinal `n`; with `life`, also the lifetime token its snapshot
// read (NULL: none), so that the batch's commit can stand for the flush of early claims.
fn complete_batch(n: &Names, life: bool) -> String {
    let complete_fn = &n.complete_fn;
    let life = match life {
        true => format!(", {} AS life", life_read(n)),
        false => String::new(),
    };
    format!(
        "SELECT i::bigint AS n, c.*{life}
FROM generate_subscripts($1::bytea[], 1) AS i,
     LATERAL {complete_fn}(($1::bytea[])[i], ($2::bigint[])[i], ($3::bytea[])[i],
                           ($4::bigint[])[i], ($5::integer[])[i], $6::bigint, $7::bigint) c"
    )
}

/// Release, notify, and the listeners' hear and unhear.
fn settles(n: &Names) -> (String, String, String, String) {
    let Names {
        keys,
        channel,
        wake_class,
        ..
    } = n;
    let wake_stripes = crate::shared::constants::PG_WAKE_STRIPES;
    // Hear: every wake-up stripe locked, shared, for the session; Unhear: released.
    let every_stripe = |lock_fn: &str| {
        format!(
            "SELECT count({lock_fn}({wake_class}, s))
FROM generate_series(0, {last}) s",
            last = wake_stripes - 1
        )
    };
    let hear = every_stripe("pg_advisory_lock_shared");
    let unhear = every_stripe("pg_advisory_unlock_shared");

    // Release: fenced delete; `notify` follows once it answered.
    let release =
        format!("DELETE FROM {keys} WHERE key = $1 AND token = $2 AND state = 'i' RETURNING 1");

    // Notify: its own transaction, sent after the settling statement answered, so a
    // waiter it wakes reads the commit ($1: key hashes in hex, comma-separated). The
    // notification is not durable anyway, so its commit does not wait for the WAL
    // flush, and holds the notify lock only as long as the commit itself.
    let notify =
        format!("SELECT set_config('synchronous_commit', 'off', true), pg_notify('{channel}', $1)");
    (release, notify, hear, unhear)
}

/// The holder's updates: extend, checkpoint (without and with writes), fail.
fn lease_updates(n: &Names) -> (String, String, String, String) {
    let keys = &n.keys;
    let writes = writes(n);
    // Extend: the lease ends `$3` µs from the database's now; the abandoned row's
    // reaping moves with it ($4 retention µs). A failed attempt is over for good: a
    // renewal racing the fail finds no row (`LeaseLost`), so the next claim still
    // takes the key over at once.
    let extend = format!(
        "UPDATE {keys} SET lease_until = clock_timestamp() + $3::bigint {US},
    reap_at = clock_timestamp() + ($3::bigint + coalesce(retention_us, $4::bigint)) {US}
WHERE key = $1 AND token = $2 AND state = 'i' AND NOT failed
RETURNING 1"
    );

    let checkpoint = format!(
        "UPDATE {keys} SET checkpoint_phase = $3::bigint, checkpoint = $4
WHERE key = $1 AND token = $2 AND state = 'i'
RETURNING 1"
    );
    // A checkpoint with writes: the same update, its writes applied only when it wrote
    // the row ($5..$8 as the completion's $8..$11).
    let checkpoint_with = format!(
        "WITH done AS (
    UPDATE {keys} SET checkpoint_phase = $3::bigint, checkpoint = $4
    WHERE key = $1 AND token = $2 AND state = 'i'
    RETURNING 1
),
{writes}
SELECT 1 FROM done"
    )
    .replace("$8::", "$5::")
    .replace("$9::", "$6::")
    .replace("$10::", "$7::")
    .replace("$11::", "$8::");
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
    (extend, checkpoint, checkpoint_with, fail)
}

/// The application's tables and the outbox relay.
fn app_reads(n: &Names) -> (String, String, String, String) {
    let Names { tables, outbox, .. } = n;
    // Tables: one row; the rows from $1 (inclusive) to $2 (exclusive), at most $3.
    let table_get = format!("SELECT value FROM {tables} WHERE key = $1");
    let table_scan = format!(
        "SELECT key, value FROM {tables} WHERE key >= $1 AND key < $2 ORDER BY key LIMIT $3"
    );
    // The relay takes up to $1 messages nobody has taken (or whose taker's time, $2 µs,
    // ran out), in id order, skipping rows another relay is taking right now: two
    // relays never get the same message while one's time runs. Sent: removed.
    let outbox_take = format!(
        "UPDATE {outbox} SET taken_until = clock_timestamp() + $2::bigint {US}
WHERE id IN (SELECT id FROM {outbox}
             WHERE taken_until IS NULL OR taken_until <= clock_timestamp()
             ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED)
RETURNING id, payload"
    );
    let outbox_sent = format!("DELETE FROM {outbox} WHERE id = ANY($1::bigint[])");
    (table_get, table_scan, outbox_take, outbox_sent)
}

/// Get, sweep, and the schema version.
fn key_reads(n: &Names) -> (String, String, String) {
    let Names { keys, meta, .. } = n;
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
    // A completion whose marker outlives it (`marker_until`, set by a completion of an
    // engine with markers) loses its response and is reaped at the marker's end; every
    // other row is deleted. Returns how many keys it removed: a marker's end is not
    // counted (the key went when its response did), as on a file. The instant it compares
    // `reap_at` with is read once, by a subquery, so that the index on `reap_at` stops at
    // it (a volatile function in the condition would be a filter: the scan would read
    // every row of the index whenever fewer than `$1` are due); the keys it chose are
    // also given as an array, which keeps the update and the delete on the key's index
    // in a plan made while the table was empty.
    let sweep = format!(
        "WITH due AS (
    SELECT key FROM {keys} WHERE reap_at <= (SELECT clock_timestamp())
    ORDER BY reap_at LIMIT $1 FOR UPDATE SKIP LOCKED
),
forgot AS (
    UPDATE {keys} k SET response = NULL, reap_at = k.marker_until
    FROM due WHERE k.key = ANY(ARRAY(SELECT key FROM due)) AND k.key = due.key
      AND k.reap_at <= clock_timestamp()
      AND k.state = 'c' AND k.marker_until > clock_timestamp()
    RETURNING 1
),
gone AS (
    DELETE FROM {keys} k USING due
    WHERE k.key = ANY(ARRAY(SELECT key FROM due)) AND k.key = due.key
      AND k.reap_at <= clock_timestamp()
      AND NOT (k.state = 'c' AND coalesce(k.marker_until > clock_timestamp(), false))
    RETURNING k.state = 'c' AND k.marker_until IS NOT NULL AS marker
)
SELECT (SELECT count(*) FROM forgot) + (SELECT count(*) FROM gone WHERE NOT marker)"
    );

    let version = format!("SELECT value FROM {meta} WHERE name = 'schema_version'");
    (get, sweep, version)
}

// Version 1 to 2: the failed flag, the attempt's start (unknown, so NULL, for rows
// claimed before) and the key's own retention. Version 2 to 3: the claim function.
// Version 3 to 4: the claim identity (NULL for rows claimed before, which no claim
// resumes), and the claim function that takes it in place of the one that did not
// (a function is named by its arguments: the old one is dropped). Version 4 to 5 and
// 5 to 6 below. Then the version row. Each statement is idempotent.
fn upgrades(n: &Names) -> [Vec<String>; 7] {
    let Names {
        keys,
        meta,
        claim_fn,
        ..
    } = n;
    let (app_tables, claim_fn_ddl) = (app_tables(n), claim_fn_ddl(n));
    let columns_v2 = vec![
        format!(
            "ALTER TABLE {keys} ADD COLUMN IF NOT EXISTS failed boolean NOT NULL DEFAULT false"
        ),
        format!("ALTER TABLE {keys} ADD COLUMN IF NOT EXISTS attempt_started_at timestamptz"),
        format!("ALTER TABLE {keys} ADD COLUMN IF NOT EXISTS retention_us bigint"),
    ];
    let version_row =
        format!("UPDATE {meta} SET value = $1 WHERE name = 'schema_version' AND value < $1");
    let to_v4 = vec![
        format!("ALTER TABLE {keys} ADD COLUMN IF NOT EXISTS claim_id bytea"),
        format!("DROP FUNCTION IF EXISTS {claim_fn}(bytea, bytea, bytea, bigint, bigint, bigint)"),
    ];
    // Version 4 to 5: the application's tables, the outbox, and the claim function
    // that knows markers (nine arguments) in place of version 4's (seven).
    let to_v5 = [
            vec![format!(
                "ALTER TABLE {keys} ADD COLUMN IF NOT EXISTS marker_until timestamptz"
            )],
            app_tables,
            vec![
                format!(
                    "DROP FUNCTION IF EXISTS {claim_fn}(bytea, bytea, bytea, bigint, bigint, bigint, bytea)"
                ),
                claim_fn_ddl.clone(),
                version_row.clone(),
            ],
        ]
        .concat();
    let upgrade_from_1 = [columns_v2, to_v4.clone(), to_v5.clone()].concat();
    let upgrade_from_2 = [to_v4.clone(), to_v5.clone()].concat();
    let upgrade_from_3 = [to_v4, to_v5.clone()].concat();
    let upgrade_from_4 = to_v5;
    // Version 5 to 6: the claim function that takes the key's claim lock before it
    // inserts (same arguments, so replaced in place; the upgrades above install it too).
    let upgrade_from_5 = vec![claim_fn_ddl.clone(), version_row.clone()];
    // Version 6 to 7: the completion function (the batch of completions calls it), and
    // the claim function that answers from the row it read without another statement
    // (same arguments, replaced in place). Every upgrade installs the completion function
    // before its version row.
    let complete_fn_ddl = complete_fn_ddl(n);
    let upgrade_from_6 = vec![claim_fn_ddl, complete_fn_ddl.clone(), version_row.clone()];
    // Version 7 to 8: the lifetime token's unlogged table (claims commit early).
    let life_ddl = life_ddl(n);
    let upgrade_from_7 = vec![life_ddl.clone(), version_row];
    let mut all = [
        upgrade_from_1,
        upgrade_from_2,
        upgrade_from_3,
        upgrade_from_4,
        upgrade_from_5,
        upgrade_from_6,
        upgrade_from_7,
    ];
    for steps in &mut all[..5] {
        steps.insert(steps.len() - 1, complete_fn_ddl.clone());
    }
    for steps in &mut all[..6] {
        steps.insert(steps.len() - 1, life_ddl.clone());
    }
    all
}

/// Whether a prepared statement run `executions` times kept one plan: PostgreSQL makes
/// custom plans for the first five executions, then keeps the generic plan unless those
/// looked cheaper; a statement planned for every execution counts only custom plans.
#[cfg(test)]
pub(crate) fn kept_one_plan(generic: i64, custom: i64, executions: usize) -> bool {
    custom <= 5 && generic + custom == executions as i64
}

#[cfg(test)]
mod tests {
    use super::{kept_one_plan, Sql};

    /// docs/shared.md shows every statement as sent with the default names; a change here
    /// must change the page too.
    #[test]
    fn the_documentation_shows_every_statement() {
        let doc = include_str!("../../docs/shared.md");
        let sql = Sql::new(None, "idemkv_");
        let mut all = vec![
            sql.claim.clone(),
            sql.claim_batch.clone(),
            sql.complete.clone(),
            sql.claim_early.clone(),
            sql.claim_batch_early.clone(),
            sql.flush.clone(),
            sql.can_flush.clone(),
            sql.life.clone(),
            sql.complete_with.clone(),
            sql.complete_batch.clone(),
            sql.complete_batch_life.clone(),
            sql.release.clone(),
            sql.notify.clone(),
            sql.hear.clone(),
            sql.unhear.clone(),
            sql.extend.clone(),
            sql.checkpoint.clone(),
            sql.checkpoint_with.clone(),
            sql.fail.clone(),
            sql.table_get.clone(),
            sql.table_scan.clone(),
            sql.outbox_take.clone(),
            sql.outbox_sent.clone(),
            sql.get.clone(),
            sql.sweep.clone(),
            sql.version.clone(),
            sql.create_meta(),
        ];
        all.extend(sql.create.iter().cloned());
        all.extend(sql.upgrade_from_1.iter().cloned());
        // The page writes the lock class as `WAKE_CLASS`, and gives its value once.
        let class = super::wake_class(&sql.keys).to_string();
        assert!(doc.contains(&format!("`WAKE_CLASS` is {class}")));
        let claims = super::claim_class(&sql.keys).to_string();
        assert!(doc.contains(&format!("`CLAIM_CLASS` is {claims}")));
        let named = |s: &String| {
            s.replace(&class, "WAKE_CLASS")
                .replace(&claims, "CLAIM_CLASS")
        };
        for stmt in all.iter().map(named) {
            assert!(doc.contains(&stmt), "docs/shared.md lacks:\n{stmt}");
        }
        assert!(doc.contains(&format!("LISTEN \"{}\"", sql.channel)));
    }

    /// Every statement reads the time as an unqualified `clock_timestamp()`, the one
    /// reading a test database shadows through `search_path` to move the clock
    /// (docs/testing.md, "The differential suite"): no other time function, no
    /// schema-qualified one.
    #[test]
    fn every_statement_reads_the_time_through_clock_timestamp() {
        let sql = Sql::new(Some("s"), "p_");
        let mut all = vec![
            sql.claim.clone(),
            sql.claim_batch.clone(),
            sql.complete.clone(),
            sql.complete_batch.clone(),
            sql.release.clone(),
            sql.extend.clone(),
            sql.checkpoint.clone(),
            sql.checkpoint_with.clone(),
            sql.fail.clone(),
            sql.outbox_take.clone(),
            sql.get.clone(),
            sql.sweep.clone(),
        ];
        all.extend(sql.create.iter().cloned());
        all.extend(sql.upgrade_from_1.iter().cloned());
        let mut reads = 0;
        for stmt in &all {
            let lower = stmt.to_lowercase();
            for other in [
                "now()",
                "current_timestamp",
                "current_time",
                "localtime",
                "statement_timestamp",
                "transaction_timestamp",
                "timeofday",
                "pg_catalog.clock_timestamp",
            ] {
                assert!(!lower.contains(other), "{other} in:\n{stmt}");
            }
            reads += lower.matches("clock_timestamp()").count();
        }
        assert!(reads > 0);
    }

    /// The batches of claims and of completions each keep one plan on a connection. A
    /// statement whose plans made with its values look cheaper than the plan made without
    /// them is planned again at every execution, as the claims' batch was when it took its
    /// keys with `unnest`; the completions' batch was sent unprepared, planned every time.
    /// The completions answer `done`, then `repeat` for the same tokens, and nothing for a
    /// token that does not hold its key. Needs the server of `scripts/pg.sh test`
    /// (PostgreSQL 14 or later counts the plans).
    #[test]
    fn the_batches_keep_one_plan_on_a_connection() {
        let url = std::env::var("IDEMKV_PG_URL").unwrap_or_else(|_| {
            panic!("IDEMKV_PG_URL is not set: this test needs the server of `scripts/pg.sh test`")
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .expect("connect");
            let io = tokio::spawn(conn);
            // A schema of its own, dropped with everything in it at the end.
            let schema = format!("t{:08x}_plans", fastrand::u32(..));
            let sql = Sql::new(Some(&schema), "p_");
            let create = sql
                .create_schema
                .as_deref()
                .expect("a schema is configured");
            client.batch_execute(create).await.expect("schema");
            client
                .batch_execute(&sql.create_meta())
                .await
                .expect("meta");
            // The last statement writes the version row; the batches need the rest.
            for ddl in &sql.create[..sql.create.len() - 1] {
                client.batch_execute(ddl).await.expect("schema");
            }
            const EXECUTIONS: usize = 12;
            let answered = |kind: &str| vec![(1, kind.to_string()), (2, kind.to_string())];
            // As sent by claims that commit with the flush, then by early ones.
            let pairs = [
                (&sql.claim_batch, &sql.complete_batch),
                (&sql.claim_batch_early, &sql.complete_batch_life),
            ];
            // Kept to the count: a statement dropped is deallocated.
            let mut prepared = Vec::new();
            for (variant, (claims, completions)) in pairs.iter().enumerate() {
                let batches = Batches {
                    client: &client,
                    claims: client.prepare(claims).await.expect("prepare"),
                    completions: client.prepare(completions).await.expect("prepare"),
                };
                for round in 0..EXECUTIONS {
                    let keys: Vec<Vec<u8>> = (0..2)
                        .map(|k| format!("k{variant}-{round}-{k}").into_bytes())
                        .collect();
                    let tokens = batches.claim(&keys).await;
                    assert_eq!(batches.complete(&keys, &tokens).await, answered("done"));
                    if round == 0 {
                        assert_eq!(batches.complete(&keys, &tokens).await, answered("repeat"));
                        let others: Vec<i64> = tokens.iter().map(|t| t + 1000).collect();
                        assert_eq!(batches.complete(&keys, &others).await, vec![]);
                    }
                }
                prepared.push(batches);
            }
            // The completions' batches ran twice more in the first round.
            let counted = pairs
                .iter()
                .flat_map(|(c, d)| [(*c, EXECUTIONS), (*d, EXECUTIONS + 2)]);
            for (statement, executions) in counted {
                let plans = client
                    .query_one(
                        "SELECT generic_plans, custom_plans FROM pg_prepared_statements \
                         WHERE statement = $1",
                        &[statement],
                    )
                    .await
                    .expect("pg_prepared_statements");
                let (generic, custom): (i64, i64) = (plans.get(0), plans.get(1));
                assert!(
                    kept_one_plan(generic, custom, executions),
                    "{custom} custom and {generic} generic plans for {executions} executions \
                     of:\n{statement}"
                );
            }
            client
                .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
                .await
                .expect("drop");
            drop(prepared);
            drop(client);
            let _ = io.await;
        });
    }

    /// The two batch statements prepared on one connection, sent as the engine sends them.
    struct Batches<'a> {
        client: &'a tokio_postgres::Client,
        claims: tokio_postgres::Statement,
        completions: tokio_postgres::Statement,
    }

    impl Batches<'_> {
        /// Claims fresh `keys` (each must be acquired, in order); returns their tokens.
        async fn claim(&self, keys: &[Vec<u8>]) -> Vec<i64> {
            let none_bytes: Vec<Option<&[u8]>> = vec![None; keys.len()];
            let none_us: Vec<Option<i64>> = vec![None; keys.len()];
            let leases: Vec<i64> = vec![60_000_000; keys.len()];
            let reruns: Vec<bool> = vec![false; keys.len()];
            let rows = self
                .client
                .query(
                    &self.claims,
                    &[
                        &keys,
                        &none_bytes,
                        &none_bytes,
                        &leases,
                        &none_us,
                        &86_400_000_000i64,
                        &none_bytes,
                        &false,
                        &reruns,
                    ],
                )
                .await
                .expect("claims");
            let kinds: Vec<(i64, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
            let expected: Vec<(i64, String)> =
                (1..=keys.len() as i64).map(|n| (n, "a".into())).collect();
            assert_eq!(kinds, expected);
            rows.iter().map(|r| r.get::<_, i64>(2)).collect()
        }

        /// Completes `keys` under `tokens`; returns each row's position and kind.
        async fn complete(&self, keys: &[Vec<u8>], tokens: &[i64]) -> Vec<(i64, String)> {
            let responses: Vec<&[u8]> = vec![b"ok"; keys.len()];
            let none_us: Vec<Option<i64>> = vec![None; keys.len()];
            let stripes: Vec<i32> = vec![0; keys.len()];
            let rows = self
                .client
                .query(
                    &self.completions,
                    &[
                        &keys,
                        &tokens,
                        &responses,
                        &none_us,
                        &stripes,
                        &86_400_000_000i64,
                        &None::<i64>,
                    ],
                )
                .await
                .expect("completions");
            rows.iter().map(|r| (r.get(0), r.get(1))).collect()
        }
    }
}
