#!/usr/bin/env bash
# A throwaway Redis for the message-broker demonstration (examples/redis_streams):
#
#   scripts/broker.sh run [--pg] [example args]
#                         # start Redis, run the example in each mode (naive, idemkv, kill;
#                         # idemkv-pg when IDEMKV_PG_URL is set, or with --pg, which starts
#                         # scripts/pg.sh for it), print the reports, stop Redis
#   scripts/broker.sh test [cargo test args]
#                         # start Redis, run `cargo test --test broker` against it, stop
#   scripts/broker.sh install # install redis-server with apt-get if missing (fails if it cannot)
#   scripts/broker.sh start   # start it and print `export IDEMKV_REDIS_URL=...`
#   scripts/broker.sh stop    # stop it and remove its directory
#
# The server listens on 127.0.0.1:$REDIS_PORT (63799) only, keeps nothing on disk (no RDB
# snapshots, no AOF) and runs from $REDIS_DIR (/var/tmp/idemkv-redis). `redis-server` is
# installed with apt-get when missing; `test` is skipped (exit 0, with the reason) when it
# cannot be installed. A server already running is reused and left running.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REDIS_PORT=${REDIS_PORT:-63799}
REDIS_DIR=${REDIS_DIR:-/var/tmp/idemkv-redis}
ADDR="127.0.0.1:$REDIS_PORT"

log() { printf '[broker] %s\n' "$*" >&2; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# Installs redis-server if missing; fails (non-zero) when it cannot.
install_redis() {
    command -v redis-server >/dev/null 2>&1 && return 0
    log "installing redis-server with apt-get"
    as_root apt-get update -qq >/dev/null 2>&1 || true
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null 2>&1 || return 1
    # The package may start a system server on the default port; this script uses its own.
    as_root service redis-server stop >/dev/null 2>&1 || true
    command -v redis-server >/dev/null 2>&1
}

ping() { redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping >/dev/null 2>&1; }

STARTED=0

start() {
    install_redis || { log "redis-server is not installed and apt-get could not install it"; return 1; }
    if ping; then
        log "already running on $ADDR"
        return 0
    fi
    rm -rf "$REDIS_DIR"
    mkdir -p "$REDIS_DIR"
    redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save '' --appendonly no \
        --dir "$REDIS_DIR" --daemonize yes --pidfile "$REDIS_DIR/redis.pid" \
        --logfile "$REDIS_DIR/redis.log" >/dev/null
    for _ in $(seq 100); do ping && break; sleep 0.1; done
    ping || { log "redis-server did not start; see $REDIS_DIR/redis.log"; return 1; }
    STARTED=1
    log "$(redis-server --version | awk '{print $1, $2, $3}') on $ADDR ($REDIS_DIR)"
}

stop() {
    if [ -f "$REDIS_DIR/redis.pid" ]; then
        kill "$(cat "$REDIS_DIR/redis.pid")" 2>/dev/null || true
        for _ in $(seq 50); do ping || break; sleep 0.1; done
    fi
    rm -rf "$REDIS_DIR"
    log "stopped; $REDIS_DIR removed"
}

export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
export CARGO_PROFILE_DEV_DEBUG=${CARGO_PROFILE_DEV_DEBUG:-line-tables-only}
export CARGO_PROFILE_TEST_DEBUG=${CARGO_PROFILE_TEST_DEBUG:-line-tables-only}

case "${1:-}" in
    install) install_redis || { log "redis-server is not installed and apt-get could not install it"; exit 1; } ;;
    start) start; echo "export IDEMKV_REDIS_URL=$ADDR" ;;
    stop) stop ;;
    run)
        shift
        PG_STARTED=0
        if [ "${1:-}" = "--pg" ]; then
            shift
            if [ -z "${IDEMKV_PG_URL:-}" ]; then
                eval "$("$ROOT/scripts/pg.sh" start)"
                PG_STARTED=1
            fi
        fi
        start
        cleanup() {
            if [ "$STARTED" = 1 ]; then stop; fi
            if [ "$PG_STARTED" = 1 ]; then "$ROOT/scripts/pg.sh" stop; fi
        }
        trap cleanup EXIT
        cd "$ROOT"
        FEATURES=()
        if [ -n "${IDEMKV_PG_URL:-}" ]; then FEATURES=(--features postgres); fi
        cargo build -q --example redis_streams "${FEATURES[@]}"
        BIN="$ROOT/target/debug/examples/redis_streams"
        export IDEMKV_REDIS_URL=$ADDR
        status=0
        for mode in naive idemkv kill; do
            echo "\$ redis_streams $mode $*"
            "$BIN" "$mode" "$@" || status=1
            echo
        done
        if [ -n "${IDEMKV_PG_URL:-}" ]; then
            echo "\$ redis_streams idemkv-pg $*"
            "$BIN" idemkv-pg "$@" || status=1
        fi
        exit "$status"
        ;;
    test)
        shift
        if ! start; then
            echo "broker test skipped: redis-server could not be installed"
            exit 0
        fi
        if [ "$STARTED" = 1 ]; then trap stop EXIT; fi
        cd "$ROOT"
        IDEMKV_REDIS_URL=$ADDR cargo test -p idemkv --test broker "$@"
        ;;
    *)
        echo "usage: scripts/broker.sh run [--pg] [example args]|test [cargo test args]|install|start|stop" >&2
        exit 2
        ;;
esac
