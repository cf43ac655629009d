#!/usr/bin/env bash
# A throwaway PostgreSQL for the shared backend (feature `postgres`, docs/shared.md):
#
#   scripts/pg.sh start   # install it with apt-get if missing, initdb, start on 127.0.0.1
#   scripts/pg.sh env     # print `export IDEMKV_PG_URL=... IDEMKV_PG_TLS_DIR=...
#                         # IDEMKV_PG_SOCKET_DIR=...` (eval "$(scripts/pg.sh env)")
#   scripts/pg.sh test    # start, run `cargo test --features postgres --test shared`,
#                         # `--test shared_differential`, `--test shared_tls` and
#                         # `--test shared_processes`, stop
#                         # (a server already running is reused and left running)
#   scripts/pg.sh stop    # stop it and remove its directory
#   scripts/pg.sh restart # restart the running server (pg_ctl restart -m fast)
#   scripts/pg.sh crash   # crash and start it again (pg_ctl restart -m immediate: crash
#                         # recovery; commits not yet flushed are lost)
#
# The server listens on 127.0.0.1:$PG_PORT (54339) only, trusts local connections, runs as
# the `postgres` user when started by root, and keeps its data under $PG_DIR
# (/var/tmp/idemkv-pg). It also accepts TLS (ssl = on) with a certificate for 127.0.0.1 and
# localhost from a throwaway CA, all under $PG_DIR/tls: ca.crt (the CA), other-ca.crt (a CA
# that signed nothing here), client.crt and client.key (CN idemkv_tls_client, a role that
# may log in over TLS with that certificate only). Its Unix socket is in $PG_DIR/sock. Extra arguments of `test` go to cargo
# test (e.g. a test name).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PG_PORT=${PG_PORT:-54339}
PG_DIR=${PG_DIR:-/var/tmp/idemkv-pg}
URL="postgres://postgres@127.0.0.1:$PG_PORT/postgres"
TLS_DIR="$PG_DIR/tls"
ENV="export IDEMKV_PG_URL=$URL IDEMKV_PG_TLS_DIR=$TLS_DIR IDEMKV_PG_SOCKET_DIR=$PG_DIR/sock"

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

# A throwaway CA, the server's certificate signed by it, a client certificate for the role
# idemkv_tls_client, and an unrelated CA (for the test of a server nobody vouches for).
make_certs() {
    local d="$TLS_DIR"
    mkdir -p "$d"
    # The server (user postgres) reads its certificate here, whatever the caller's umask.
    chmod 755 "$d"
    local subj="/O=idemkv throwaway test CA"
    openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "$subj/CN=ca" \
        -keyout "$d/ca.key" -out "$d/ca.crt" 2>/dev/null
    openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "$subj/CN=other-ca" \
        -keyout "$d/other-ca.key" -out "$d/other-ca.crt" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" \
        -keyout "$d/server.key" -out "$d/server.csr" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >"$d/server.ext"
    openssl x509 -req -in "$d/server.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" \
        -CAcreateserial -days 30 -extfile "$d/server.ext" -out "$d/server.crt" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=idemkv_tls_client" \
        -keyout "$d/client.key" -out "$d/client.csr" 2>/dev/null
    # An extension makes it X.509 v3, which rustls requires (a bare `x509 -req` gives v1).
    printf 'extendedKeyUsage=clientAuth\n' >"$d/client.ext"
    openssl x509 -req -in "$d/client.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" \
        -CAcreateserial -days 30 -extfile "$d/client.ext" -out "$d/client.crt" 2>/dev/null
    chmod 600 "$d"/*.key
    chmod 644 "$d"/*.crt
    # The server reads its key as postgres; the tests read the client's key as the caller.
    if [ "$(id -u)" -eq 0 ]; then chown postgres: "$d/server.key"; fi
}

running() {
    [ -f "$PG_DIR/data/postmaster.pid" ] && as_pg "$PG_BIN/pg_ctl" -D "$PG_DIR/data" status >/dev/null 2>&1
}

start() {
    install_pg
    if running; then
        log "already running on 127.0.0.1:$PG_PORT ($PG_DIR)"
        [ -f "$TLS_DIR/ca.crt" ] ||
            log "warning: no $TLS_DIR/ca.crt (started by an older script?): the TLS suite needs a restart (stop, then start)"
        return
    fi
    rm -rf "$PG_DIR"
    mkdir -p "$PG_DIR/data" "$PG_DIR/sock"
    chmod 755 "$PG_DIR"
    if [ "$(id -u)" -eq 0 ]; then chown -R postgres: "$PG_DIR/data" "$PG_DIR/sock"; fi
    as_pg "$PG_BIN/initdb" -D "$PG_DIR/data" -U postgres -A trust -E UTF8 --no-locale >/dev/null
    make_certs
    # The certificate role may log in over TLS with its client certificate, and no other way;
    # the first matching line wins, so these go before initdb's `trust` lines.
    local hba="$PG_DIR/data/pg_hba.conf"
    { printf 'hostssl all idemkv_tls_client 127.0.0.1/32 cert\n'
      printf 'host all idemkv_tls_client all reject\n'
      printf 'local all idemkv_tls_client reject\n'
      cat "$hba"; } >"$hba.new"
    mv "$hba.new" "$hba"
    if [ "$(id -u)" -eq 0 ]; then chown postgres: "$hba"; fi
    cat >>"$PG_DIR/data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$PG_DIR/sock'
max_connections = 300
shared_buffers = 128MB
fsync = on
synchronous_commit = on
ssl = on
ssl_cert_file = '$TLS_DIR/server.crt'
ssl_key_file = '$TLS_DIR/server.key'
ssl_ca_file = '$TLS_DIR/ca.crt'
CONF
    as_pg "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/sock/postgres.log" -w start >/dev/null
    STARTED=1
    as_pg "$PG_BIN/psql" -X -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres \
        -c "CREATE ROLE idemkv_tls_client LOGIN SUPERUSER" >/dev/null
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
    start) start; echo "$ENV" ;;
    env) echo "$ENV" ;;
    stop) stop ;;
    restart)
        install_pg
        as_pg "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m fast -w restart >/dev/null
        ;;
    crash)
        # An immediate stop flushes nothing; the start that follows runs crash recovery.
        install_pg
        as_pg "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m immediate -w restart >/dev/null
        ;;
    test)
        shift
        start
        # A server that was already running is left running.
        if [ "$STARTED" = 1 ]; then trap stop EXIT; fi
        cd "$ROOT"
        # The statement texts that docs/shared.md reproduces and the plans the server keeps
        # for them, then the suite.
        IDEMKV_PG_URL=$URL cargo test -q -p idemkv --features postgres --lib -- shared::
        IDEMKV_PG_URL=$URL cargo test -p idemkv --features postgres --test shared "$@"
        # The same seeded histories on the file engine and on this server, compared.
        IDEMKV_PG_URL=$URL cargo test -p idemkv --features postgres --test shared_differential "$@"
        IDEMKV_PG_URL=$URL IDEMKV_PG_TLS_DIR=$TLS_DIR IDEMKV_PG_SOCKET_DIR=$PG_DIR/sock \
            cargo test -p idemkv --features postgres --test shared_tls "$@"
        # Across processes; its restart test runs `scripts/pg.sh restart` on this server.
        export PG_PORT PG_DIR
        IDEMKV_PG_URL=$URL cargo test -p idemkv --features postgres --test shared_processes "$@"
        ;;
    *)
        echo "usage: scripts/pg.sh start|stop|env|restart|crash|test [cargo test args]" >&2
        exit 2
        ;;
esac
