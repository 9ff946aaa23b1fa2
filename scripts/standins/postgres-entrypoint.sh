#!/bin/sh
# Stand-in for the postgres image's entrypoint, as far as the stack uses it:
# on an empty volume, initdb with POSTGRES_USER and POSTGRES_PASSWORD (or
# the file POSTGRES_PASSWORD_FILE names, as the image reads it), a server
# on the Unix socket only that creates POSTGRES_DB and runs
# /docker-entrypoint-initdb.d/*.sh, then the real server as postgres.
# Started as postgres (the compose file's user), it needs no privilege:
# the image's data directory, and so a new volume on it, is postgres's.
set -eu
export PGDATA=/var/lib/postgresql/data PATH=/usr/lib/postgresql/15/bin:$PATH
mkdir -p "$PGDATA" /var/run/postgresql
as=
if [ "$(id -u)" = 0 ]; then
  chown postgres:postgres "$PGDATA" /var/run/postgresql
  as="setpriv --reuid=postgres --regid=postgres --init-groups"
fi
as_postgres() { $as "$@"; }
chmod 0700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pwfile=$(mktemp)
  if [ -n "${POSTGRES_PASSWORD_FILE:-}" ]; then
    cat "$POSTGRES_PASSWORD_FILE" >"$pwfile"
    echo >>"$pwfile"
  else
    printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
  fi
  [ -z "$as" ] || chown postgres "$pwfile"
  as_postgres initdb -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  as_postgres pg_ctl -D "$PGDATA" -w -o "-c listen_addresses='' -c unix_socket_directories=/var/run/postgresql" start >/dev/null
  as_postgres psql -v ON_ERROR_STOP=1 -h /var/run/postgresql -U "$POSTGRES_USER" -d postgres -c "CREATE DATABASE \"$POSTGRES_DB\"" >/dev/null
  for f in /docker-entrypoint-initdb.d/*.sh; do
    [ -e "$f" ] || continue
    echo "running $f"
    as_postgres env PGHOST=/var/run/postgresql bash "$f"
  done
  as_postgres pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
fi
[ "${1:-}" = postgres ] && shift
exec $as postgres -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories=/var/run/postgresql "$@"
