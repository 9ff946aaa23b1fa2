#!/bin/sh
# Starts postgres_exporter (or any command given) with its password in a
# password file rather than its connection string: postgres_exporter
# 0.17.1 splits the string it builds on spaces, so a password holding a
# space stops its pg_up and pg_settings metrics, and the error it logs
# then shows the password. lib/pq reads the file (PGPASSFILE) when the
# connection string has no password.
# The password comes from the file EXPORTER_DB_PASSWORD_FILE names
# (compose secrets), or the variable EXPORTER_DB_PASSWORD.
set -eu
if [ -n "${EXPORTER_DB_PASSWORD_FILE:-}" ]; then
  EXPORTER_DB_PASSWORD=$(cat "$EXPORTER_DB_PASSWORD_FILE")
fi
if [ -z "${EXPORTER_DB_PASSWORD:-}" ]; then
  echo "postgres_exporter: neither EXPORTER_DB_PASSWORD_FILE nor EXPORTER_DB_PASSWORD is set" >&2
  exit 1
fi
umask 077
PGPASSFILE=$(mktemp)
# The password's field of the file, with '\' and ':' escaped.
printf '*:*:*:*:%s\n' "$(printf '%s' "$EXPORTER_DB_PASSWORD" | sed -e 's/\\/\\\\/g' -e 's/:/\\:/g')" >"$PGPASSFILE"
export PGPASSFILE
unset EXPORTER_DB_PASSWORD
exec "$@"
