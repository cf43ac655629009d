#!/usr/bin/env bash
# The side-by-side peers benchmark, in one command:
#
#   scripts/peers.sh
#   scripts/peers.sh shared   # the shared backend (PostgreSQL) at 1 and 4 processes next to
#                             # the naive INSERT … ON CONFLICT DO NOTHING baseline, D = 8,
#                             # with database round trips per delivery; PostgreSQL only;
#                             # rewrites the peers-shared block of docs/benchmarks.md
#
# Installs PostgreSQL and Redis with apt-get if they are missing, starts them on 127.0.0.1
# (unusual ports, temporary data directories on disk, PostgreSQL as the `postgres` user),
# builds peers/ in release, runs the one workload against idemkv and every peer, stops the
# servers, removes the temporary files, and rewrites the Peers section of
# docs/benchmarks.md (between its peers:begin / peers:end markers) and docs/peers.svg.
#
# Each durable idemkv mode runs twice (idemkv-immediate and idemkv-immediate-async,
# idemkv-buffered and idemkv-buffered-async): once with C OS threads calling the blocking
# API, once with C tasks on a tokio runtime of 2 worker threads awaiting the async API
# (claim_async, Lease::complete_async); same keys, deliveries, checks and time limit. Every
# idemkv row runs the engine's defaults but for the durability (Immediate: the commit log).
#
# Knobs (environment): N (keys, 100000), D (deliveries per key, 2), C (workers: threads, or
# tasks in the -async rows, 64),
# TIME_LIMIT (seconds per system and round, 4), ROUNDS (5), SYSTEMS (comma-separated ids, or all),
# PG_PORT (54329), REDIS_PORT (63799), PEERS_TMP (parent of the temp dir, /var/tmp).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
began=$(date +%s)
SECTION=${1:-main}
case "$SECTION" in
    main | shared) ;;
    *) echo "usage: scripts/peers.sh [shared]" >&2; exit 2 ;;
esac

# The exact command, with any knob that was set, for the report.
command_line="scripts/peers.sh"
[ "$SECTION" = main ] || command_line="scripts/peers.sh $SECTION"
for v in N D C TIME_LIMIT ROUNDS SYSTEMS; do
    if [ -n "${!v+x}" ]; then command_line="$v=${!v} $command_line"; fi
done

N=${N:-100000}
C=${C:-64}
TIME_LIMIT=${TIME_LIMIT:-4}
ROUNDS=${ROUNDS:-5}
if [ "$SECTION" = shared ]; then
    D=${D:-8}
    SYSTEMS=${SYSTEMS:-pg-sync-on,idemkv-shared,idemkv-shared-4p,idemkv-shared-async,idemkv-shared-4p-async}
else
    D=${D:-2}
    SYSTEMS=${SYSTEMS:-all}
fi
PG_PORT=${PG_PORT:-54329}
REDIS_PORT=${REDIS_PORT:-63799}
PEERS_TMP=${PEERS_TMP:-/var/tmp}

log() { printf '[peers] %s\n' "$*" >&2; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

pg_bindir() {
    local d
    d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
    if [ -n "$d" ] && [ -x "$d/initdb" ]; then echo "$d"; fi
}

# --- 1. servers installed? ---------------------------------------------------------------
missing=()
if [ "$SECTION" = main ]; then
    command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
    command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
fi
[ -n "$(pg_bindir)" ] || missing+=(postgresql)
if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]} with apt-get"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
PG_BIN=$(pg_bindir)
[ -n "$PG_BIN" ] || { log "no PostgreSQL binaries under /usr/lib/postgresql"; exit 1; }

# --- 2. temporary data directories, cleaned up on any exit --------------------------------
WORK=$(mktemp -d "$PEERS_TMP/idemkv-peers.XXXXXX")
chmod 755 "$WORK"
mkdir -p "$WORK/redis" "$WORK/pgsock" "$WORK/data"

if [ "$(id -u)" -eq 0 ]; then
    chown postgres: "$WORK/pgsock"
    as_pg() { runuser -u postgres -- "$@"; }
else
    as_pg() { "$@"; }
fi

redis_started=0
pg_started=0
cleanup() {
    local rc=$?
    if [ "$redis_started" = 1 ]; then
        redis-cli -h 127.0.0.1 -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
    fi
    if [ "$pg_started" = 1 ]; then
        as_pg "$PG_BIN/pg_ctl" -D "$WORK/pg" -m fast -w stop >/dev/null 2>&1 || true
    fi
    rm -rf "$WORK"
    log "servers stopped, $WORK removed; total $(($(date +%s) - began)) s"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- 3. build (before the servers start, so they do not sit idle) -------------------------
log "building peers/ in release"
cargo build --release --quiet --manifest-path "$ROOT/peers/Cargo.toml"
BIN=$(cargo metadata --format-version 1 --no-deps --manifest-path "$ROOT/peers/Cargo.toml" |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')/release/idemkv-peers
[ -x "$BIN" ] || { log "cannot find the built binary at $BIN"; exit 1; }

# --- 4. start Redis and PostgreSQL on loopback --------------------------------------------
if [ "$SECTION" = main ]; then
    log "starting Redis on 127.0.0.1:$REDIS_PORT"
    redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --protected-mode yes \
        --dir "$WORK/redis" --save "" --appendonly no --daemonize yes \
        --pidfile "$WORK/redis/redis.pid" --logfile "$WORK/redis/redis.log"
    redis_started=1
    for _ in $(seq 1 100); do
        redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping >/dev/null 2>&1 && break
        sleep 0.1
    done
fi

log "initdb and start PostgreSQL on 127.0.0.1:$PG_PORT"
mkdir -p "$WORK/pg"
[ "$(id -u)" -ne 0 ] || chown postgres: "$WORK/pg"
as_pg "$PG_BIN/initdb" -D "$WORK/pg" -U postgres -A trust -E UTF8 --no-locale >/dev/null
cat >>"$WORK/pg/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$WORK/pgsock'
max_connections = $((C + 20))
shared_buffers = 256MB
fsync = on
synchronous_commit = on
EOF
as_pg "$PG_BIN/pg_ctl" -D "$WORK/pg" -l "$WORK/pgsock/postgres.log" -w start >/dev/null
pg_started=1

# --- 5. run -------------------------------------------------------------------------------
dev=$(findmnt -no SOURCE -T "$WORK" 2>/dev/null || echo '?')
fstype=$(findmnt -no FSTYPE -T "$WORK" 2>/dev/null || echo '?')
base=$(basename "$dev")
kind=""
case "$base" in
    vd*) kind="virtio block device" ;;
    nvme*) kind="NVMe" ;;
    *) if [ -e "/sys/block/$base/queue/rotational" ]; then
           if [ "$(cat "/sys/block/$base/queue/rotational")" = 1 ]; then kind="rotational"; else kind="SSD"; fi
       fi ;;
esac
disk="$dev ($fstype${kind:+, $kind}) under $PEERS_TMP"

log "running N=$N D=$D C=$C, $ROUNDS rounds, at most $TIME_LIMIT s per system and round"
if [ "$SECTION" = shared ]; then
    outputs=(--section shared)
else
    outputs=(--redis "redis://127.0.0.1:$REDIS_PORT/" --svg "$ROOT/docs/peers.svg")
fi
"$BIN" --data-dir "$WORK/data" --n "$N" --d "$D" --c "$C" --time-limit "$TIME_LIMIT" --rounds "$ROUNDS" \
    --systems "$SYSTEMS" \
    --pg "host=127.0.0.1 port=$PG_PORT user=postgres dbname=postgres" \
    "${outputs[@]}" \
    --doc "$ROOT/docs/benchmarks.md" \
    --stamp "$(date -u '+%Y-%m-%d %H:%M UTC')" --disk "$disk" --command "$command_line"
