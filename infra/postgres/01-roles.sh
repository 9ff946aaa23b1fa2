#!/usr/bin/env bash
# Runs once, when the postgres container initialises its data directory.
# Three roles: the schema's owner (POSTGRES_USER, runs `tailer migrate`), the
# application, and the tailer, which only needs REPLICATION and SELECT on
# tokens and accounts (granted by migration 000003 once the tables exist).
set -euo pipefail
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
  -v tailer_pw="$TAILER_DB_PASSWORD" -v app_pw="$APP_DB_PASSWORD" <<'EOSQL'
CREATE ROLE tailer WITH LOGIN REPLICATION PASSWORD :'tailer_pw';
CREATE ROLE mailroom_app WITH LOGIN PASSWORD :'app_pw';
GRANT CONNECT ON DATABASE mailroom TO tailer, mailroom_app;
GRANT USAGE ON SCHEMA public TO tailer, mailroom_app;
-- The application reads and writes the mailroom tables the owner creates.
ALTER DEFAULT PRIVILEGES FOR ROLE mailroom_owner IN SCHEMA public
  GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO mailroom_app;
ALTER DEFAULT PRIVILEGES FOR ROLE mailroom_owner IN SCHEMA public
  GRANT USAGE ON SEQUENCES TO mailroom_app;
EOSQL
