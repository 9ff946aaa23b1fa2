#!/usr/bin/env bash
# Runs once, when the postgres container initialises its data directory, as
# the superuser (which no service uses). Four roles, passwords from the
# files OWNER_DB_PASSWORD_FILE and so on name (compose secrets; each
# *_PASSWORD variable instead where no file is named), quoted by psql: any
# characters but a newline work. They reach psql on its standard input
# (\prompt, with -f), never on a command line or in its environment,
# where any process of the host could read them:
#   mailroom_owner  owns the schema and runs `tailer migrate` (not a
#                   superuser: CREATE on the database, the public schema,
#                   and REPLICATION to create the slot);
#   mailroom_app    the application: reads and writes the mailroom tables;
#   tailer          the daemon: REPLICATION, SELECT on tokens and accounts
#                   and its resync bookkeeping (granted by the migrations);
#   postgres_exporter   reads the server's statistics and the slot's
#                   positions (pg_monitor), nothing of mailroom's tables.
set -euo pipefail
# secret NAME: the content of the file NAME_FILE names, or $NAME.
secret() {
  local file="${1}_FILE"
  if [ -n "${!file:-}" ]; then
    cat "${!file}"
  elif [ -n "${!1:-}" ]; then
    printf '%s' "${!1}"
  else
    echo "01-roles.sh: neither $file nor $1 is set" >&2
    return 1
  fi
}
OWNER_DB_PASSWORD=$(secret OWNER_DB_PASSWORD)
TAILER_DB_PASSWORD=$(secret TAILER_DB_PASSWORD)
APP_DB_PASSWORD=$(secret APP_DB_PASSWORD)
EXPORTER_DB_PASSWORD=$(secret EXPORTER_DB_PASSWORD)
sql=$(mktemp)
trap 'rm -f "$sql"' EXIT
cat > "$sql" <<'EOSQL'
\prompt owner_pw
\prompt tailer_pw
\prompt app_pw
\prompt exporter_pw
CREATE ROLE mailroom_owner WITH LOGIN REPLICATION PASSWORD :'owner_pw';
CREATE ROLE tailer WITH LOGIN REPLICATION PASSWORD :'tailer_pw';
CREATE ROLE mailroom_app WITH LOGIN PASSWORD :'app_pw';
CREATE ROLE postgres_exporter WITH LOGIN PASSWORD :'exporter_pw';
GRANT pg_monitor TO postgres_exporter;
GRANT CONNECT ON DATABASE mailroom TO postgres_exporter;
GRANT CONNECT, CREATE ON DATABASE mailroom TO mailroom_owner;
ALTER SCHEMA public OWNER TO mailroom_owner;
GRANT CONNECT ON DATABASE mailroom TO tailer, mailroom_app;
GRANT USAGE ON SCHEMA public TO tailer, mailroom_app;
-- The application reads and writes the mailroom tables the owner creates.
ALTER DEFAULT PRIVILEGES FOR ROLE mailroom_owner IN SCHEMA public
  GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO mailroom_app;
ALTER DEFAULT PRIVILEGES FOR ROLE mailroom_owner IN SCHEMA public
  GRANT USAGE ON SEQUENCES TO mailroom_app;
EOSQL
# printf is the shell's own: the passwords go from this shell to psql's
# standard input, a line each, in the order of the \prompt lines.
printf '%s\n' "$OWNER_DB_PASSWORD" "$TAILER_DB_PASSWORD" "$APP_DB_PASSWORD" "$EXPORTER_DB_PASSWORD" |
  psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" -f "$sql"
