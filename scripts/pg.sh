#!/usr/bin/env bash
# A throwaway PostgreSQL for the shared backend (feature `postgres`, docs/shared.md):
#
#   scripts/pg.sh start   # install it with apt-get if missing, initdb, start on 127.0.0.1
#   scripts/pg.sh env     # print `export IDEMKV_PG_URL=...` (eval "$(scripts/pg.sh env)")
#   scripts/pg.sh test    # start, run `cargo test --features postgres --test shared` and
#                         # `--test shared_processes`, stop
#                         # (a server already running is reused and left running)
#   scripts/pg.sh stop    # stop it and remove its directory
#   scripts/pg.sh restart # restart the running server (pg_ctl restart -m fast)
#
# The server listens on 127.0.0.1:$PG_PORT (54339) only, trusts local connections, runs as
# the `postgres` user when started by root, and keeps its data under $PG_DIR
# (/var/tmp/idemkv-pg). Extra arguments of `test` go to cargo test (e.g. a test name).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PG_PORT=${PG_PORT:-54339}
PG_DIR=${PG_DIR:-/var/tmp/idemkv-pg}
URL="postgres://postgres@127.0.0.1:$PG_PORT/postgres"

log() { printf '[pg] %s\n' "$*" >&2; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# The newest installed server's bin directory (as scripts/peers.sh finds it).
pg_bindir() {
    local d
    d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
    if [ -n "$d" ] && [ -x "$d/initdb" ]; then echo "$d"; fi
}

as_pg() {
    if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

install_pg() {
    if [ -z "$(pg_bindir)" ]; then
        log "installing postgresql with apt-get"
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    fi
    PG_BIN=$(pg_bindir)
    [ -n "$PG_BIN" ] || { log "no PostgreSQL binaries under /usr/lib/postgresql"; exit 1; }
}

STARTED=0

running() {
    [ -f "$PG_DIR/data/postmaster.pid" ] && as_pg "$PG_BIN/pg_ctl" -D "$PG_DIR/data" status >/dev/null 2>&1
}

start() {
    install_pg
    if running; then
        log "already running on 127.0.0.1:$PG_PORT ($PG_DIR)"
        return
    fi
    rm -rf "$PG_DIR"
    mkdir -p "$PG_DIR/data" "$PG_DIR/sock"
    chmod 755 "$PG_DIR"
    if [ "$(id -u)" -eq 0 ]; then chown -R postgres: "$PG_DIR/data" "$PG_DIR/sock"; fi
    as_pg "$PG_BIN/initdb" -D "$PG_DIR/data" -U postgres -A trust -E UTF8 --no-locale >/dev/null
    cat >>"$PG_DIR/data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$PG_DIR/sock'
max_connections = 300
shared_buffers = 128MB
fsync = on
synchronous_commit = on
CONF
    as_pg "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/sock/postgres.log" -w start >/dev/null
    STARTED=1
    log "PostgreSQL $("$PG_BIN/postgres" --version | awk '{print $3}') on 127.0.0.1:$PG_PORT ($PG_DIR)"
}

stop() {
    PG_BIN=$(pg_bindir)
    if [ -n "$PG_BIN" ] && [ -d "$PG_DIR/data" ]; then
        as_pg "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m fast -w stop >/dev/null 2>&1 || true
    fi
    rm -rf "$PG_DIR"
    log "stopped; $PG_DIR removed"
}

case "${1:-}" in
    start) start; echo "export IDEMKV_PG_URL=$URL" ;;
    env) echo "export IDEMKV_PG_URL=$URL" ;;
    stop) stop ;;
    restart)
        install_pg
        as_pg "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m fast -w restart >/dev/null
        ;;
    test)
        shift
        start
        # A server that was already running is left running.
        if [ "$STARTED" = 1 ]; then trap stop EXIT; fi
        cd "$ROOT"
        # The statement texts that docs/shared.md reproduces, then the suite.
        cargo test -q -p idemkv --features postgres --lib shared::
        IDEMKV_PG_URL=$URL cargo test -p idemkv --features postgres --test shared "$@"
        # Across processes; its restart test runs `scripts/pg.sh restart` on this server.
        export PG_PORT PG_DIR
        IDEMKV_PG_URL=$URL cargo test -p idemkv --features postgres --test shared_processes "$@"
        ;;
    *)
        echo "usage: scripts/pg.sh start|stop|env|restart|test [cargo test args]" >&2
        exit 2
        ;;
esac
