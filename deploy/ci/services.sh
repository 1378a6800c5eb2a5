#!/usr/bin/env bash
# The servers the database tests need, on 127.0.0.1: a throwaway PostgreSQL cluster and a Redis, each in its own
# folder under $RAG_CI_SERVICES_DIR (default /var/tmp/rag-ci-services-<user>) and on its own port, so a cluster the
# machine already runs (Debian's 15/main on 5432) is never touched. `make test` runs it and evals what it prints:
#   export RAG_TEST_POSTGRES_URL=postgresql+psycopg://...   (the feedback store and deployment tests)
#   export RAG_TEST_REDIS_URL=redis://127.0.0.1:.../        (the Celery executor test)
# Idempotent: a server already answering from its folder is reused; a stopped one is started again. Where a server
# cannot be had (its Debian package is missing, no root to install it, it fails to start) it says so on stderr and
# prints no variable, so the tests that need it are skipped with their reason. A variable already set in the
# environment is kept as it is (a developer's own server).
# Stops nothing; `deploy/ci/services.sh stop` stops the two servers this script started.
set -uo pipefail

DIR=${RAG_CI_SERVICES_DIR:-/var/tmp/rag-ci-services-$(id -un)}
PG_PORT=${RAG_CI_POSTGRES_PORT:-55432}
REDIS_PORT=${RAG_CI_REDIS_PORT:-56379}
PG_PASSWORD=rag-ci  # a loopback-only throwaway cluster; the password only makes the tests connect as a deployment does
PG_DATA=$DIR/postgres
REDIS_DIR=$DIR/redis

note() { echo "services: $*" >&2; }

# PostgreSQL refuses to run as root: as root the cluster belongs to Debian's `postgres` user.
if [ "$(id -u)" = 0 ]; then PG_USER=postgres; else PG_USER=$(id -un); fi
as_pg() {
  if [ "$(id -un)" = "$PG_USER" ]; then "$@"; else runuser -u "$PG_USER" -- "$@"; fi
}

pg_bin() {  # the newest installed server's bin folder
  local dir
  dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  [ -n "$dir" ] && [ -x "$dir/pg_ctl" ] && echo "$dir"
}

start_postgres() {
  # A cluster left broken (a stale lock file whose PID was reused, a half-written folder) is made anew, once.
  # Status 2: PostgreSQL cannot be had here at all.
  start_postgres_cluster
  if [ $? = 1 ]; then
    note "making the throwaway cluster anew"
    rm -rf "$PG_DATA"
    start_postgres_cluster || note "no PostgreSQL: the Postgres tests will be skipped"
  fi
}

start_postgres_cluster() {
  local bin
  if ! bin=$(pg_bin); then
    note "PostgreSQL is not installed (Debian package postgresql): the Postgres tests will be skipped"
    return 2
  fi
  if [ "$PG_USER" = postgres ] && ! id postgres >/dev/null 2>&1; then
    note "there is no 'postgres' user to run PostgreSQL as: the Postgres tests will be skipped"
    return 2
  fi
  mkdir -p "$DIR"
  chmod 755 "$DIR"
  if [ ! -s "$PG_DATA/PG_VERSION" ]; then
    rm -rf "$PG_DATA"
    mkdir -p "$PG_DATA"
    chown "$PG_USER" "$PG_DATA"
    local pwfile
    pwfile=$(mktemp)
    echo "$PG_PASSWORD" >"$pwfile"
    chown "$PG_USER" "$pwfile"
    if ! as_pg "$bin/initdb" -D "$PG_DATA" -U postgres --pwfile="$pwfile" --auth-local=trust \
      --auth-host=scram-sha-256 --encoding=UTF8 --locale=C.UTF-8 >"$DIR/initdb.log" 2>&1; then
      rm -f "$pwfile"
      note "initdb failed ($DIR/initdb.log)"
      return 1
    fi
    rm -f "$pwfile"
  fi
  if ! as_pg "$bin/pg_ctl" -D "$PG_DATA" status >/dev/null 2>&1; then
    # Loopback only; the socket stays inside the cluster's folder; fsync off: nothing here outlives the tests.
    if ! as_pg "$bin/pg_ctl" -D "$PG_DATA" -l "$PG_DATA/server.log" -w -t 60 start \
      -o "-c listen_addresses=127.0.0.1 -p $PG_PORT -k $PG_DATA -c fsync=off -c synchronous_commit=off \
          -c full_page_writes=off -c max_connections=200" >/dev/null 2>&1; then
      note "PostgreSQL did not start on 127.0.0.1:$PG_PORT ($PG_DATA/server.log)"
      return 1
    fi
  fi
  echo "export RAG_TEST_POSTGRES_URL=postgresql+psycopg://postgres:$PG_PASSWORD@127.0.0.1:$PG_PORT/postgres"
  note "PostgreSQL on 127.0.0.1:$PG_PORT ($PG_DATA)"
}

redis_answers() {
  command -v redis-cli >/dev/null && [ "$(redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null)" = PONG ]
}

start_redis() {
  if ! command -v redis-server >/dev/null; then
    note "Redis is not installed (Debian package redis-server): the Celery executor test will be skipped"
    return 1
  fi
  if ! redis_answers; then
    mkdir -p "$REDIS_DIR"
    # No snapshots: the broker's queues are the tests' own and end with them.
    redis-server --daemonize yes --bind 127.0.0.1 --port "$REDIS_PORT" --dir "$REDIS_DIR" \
      --pidfile "$REDIS_DIR/redis.pid" --logfile "$REDIS_DIR/redis.log" --save "" --appendonly no >/dev/null
    for _ in $(seq 50); do redis_answers && break; sleep 0.1; done
    if ! redis_answers; then
      note "Redis did not start on 127.0.0.1:$REDIS_PORT ($REDIS_DIR/redis.log): the Celery executor test will be skipped"
      return 1
    fi
  fi
  echo "export RAG_TEST_REDIS_URL=redis://127.0.0.1:$REDIS_PORT"
  note "Redis on 127.0.0.1:$REDIS_PORT ($REDIS_DIR)"
}

stop() {
  local bin
  if bin=$(pg_bin) && [ -s "$PG_DATA/PG_VERSION" ]; then as_pg "$bin/pg_ctl" -D "$PG_DATA" -m fast stop; fi
  if [ -s "$REDIS_DIR/redis.pid" ]; then kill "$(cat "$REDIS_DIR/redis.pid")"; fi
}

if [ "${1:-}" = stop ]; then stop; exit 0; fi
if [ -z "${RAG_TEST_POSTGRES_URL:-}" ]; then start_postgres; fi
if [ -z "${RAG_TEST_REDIS_URL:-}" ]; then start_redis; fi
exit 0
