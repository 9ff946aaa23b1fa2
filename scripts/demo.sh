#!/usr/bin/env bash
# End-to-end demo on one machine: a throwaway PostgreSQL with
# wal_level=logical, `tailer migrate`, `tailer run` with its embedded NATS
# JetStream server, sample accounts and a password recovery, and the signed
# batches as a subscriber sees them. Everything lives in a temporary
# directory that is removed on exit (KEEP=1 keeps it).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

pg_bin() {
  if command -v initdb >/dev/null 2>&1; then dirname "$(readlink -f "$(command -v initdb)")"; return; fi
  ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1
}
free_port() {
  local p=$1
  while (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; do p=$((p + 1)); done
  echo "$p"
}

PGBIN=$(pg_bin)
[ -x "$PGBIN/initdb" ] || { echo "PostgreSQL server programs not found: apt-get install postgresql" >&2; exit 1; }

WORK=$(mktemp -d /tmp/tailer-demo.XXXXXX)
AS=()
if [ "$(id -u)" = 0 ]; then
  # PostgreSQL refuses to run as root.
  chown postgres "$WORK"
  AS=(runuser -u postgres --)
fi
PGPORT=$(free_port 54329)
NATSPORT=$(free_port 42229)
HTTPPORT=$(free_port 19187)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  "${AS[@]}" "$PGBIN/pg_ctl" stop -D "$WORK/pg" -m fast >/dev/null 2>&1 || true
  if [ "${KEEP:-}" = 1 ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

say "work directory $WORK, removed at exit (KEEP=1 make demo keeps it); ports: PostgreSQL $PGPORT, NATS $NATSPORT, HTTP $HTTPPORT"
say "building tailer (on a cold build cache this compiles every dependency: a minute or more)"
go build -o "$WORK/tailer" ./cmd/tailer
chmod 755 "$WORK"

say "starting PostgreSQL on 127.0.0.1:$PGPORT (wal_level=logical)"
"${AS[@]}" "$PGBIN/initdb" -D "$WORK/pg" -U postgres --auth=trust -E UTF8 >/dev/null
"${AS[@]}" "$PGBIN/pg_ctl" start -w -D "$WORK/pg" -l "$WORK/pg/postgres.log" \
  -o "-c wal_level=logical -c port=$PGPORT -c listen_addresses=127.0.0.1 -c unix_socket_directories=$WORK" >/dev/null

export MAILROOM_DATABASE_URL="postgres://postgres@127.0.0.1:$PGPORT/postgres?sslmode=disable"
export MAILROOM_SECRET_KEY=cafebabecafebabecafebabecafebabecafebabecafebabecafebabecafebabe
export MAILROOM_BATCH_LIMIT=3
export MAILROOM_BATCH_TIMEOUT=2000
export MAILROOM_DATA_DIR="$WORK/nats"
export MAILROOM_NATS_LISTEN="127.0.0.1:$NATSPORT"
export MAILROOM_HTTP_ADDR="127.0.0.1:$HTTPPORT"
psql_() { psql "$MAILROOM_DATABASE_URL" -v ON_ERROR_STOP=1 -qAt "$@"; }

say "tailer migrate (schema, publication, slot)"
"$WORK/tailer" migrate

say "tailer run (embedded NATS on $MAILROOM_NATS_LISTEN, batch limit 3, timeout 2000 ms)"
"$WORK/tailer" run 2>"$WORK/tailer.log" &
PIDS+=($!)
for _ in $(seq 100); do grep -q '"streaming"\|msg=streaming' "$WORK/tailer.log" && break; sleep 0.1; done
grep -q 'msg=streaming' "$WORK/tailer.log" || { cat "$WORK/tailer.log"; exit 1; }
sed 's/^/  tailer: /' "$WORK/tailer.log"

MAILROOM_NATS_URL="nats://$MAILROOM_NATS_LISTEN" "$WORK/tailer" subscribe --durable demo --from-start >"$WORK/batches" 2>"$WORK/subscribe.log" &
PIDS+=($!)

say "inserting 5 accounts (each gets an activation token from the trigger)"
printf "%.0sINSERT INTO accounts (email, login) VALUES ('user' || md5(random()::text) || '@fake.mail', 'user' || substr(md5(random()::text), 1, 20));\n" {1..5} | psql_

say "activating one account and asking for its password recovery"
psql_ -c "UPDATE tokens SET consumed_at = extract(epoch FROM now()) WHERE id = (SELECT min(id) FROM tokens);"
psql_ -c "INSERT INTO tokens (account, action) SELECT id, 'password_recovery' FROM accounts WHERE status = 'active' LIMIT 1;"

say "signed batches on the stream (one line per batch: action,email,login,token,code,...)"
for _ in $(seq 60); do [ "$(wc -l <"$WORK/batches")" -ge 2 ] && break; sleep 0.1; done
sleep 2.5 # the last, partial batch is cut by the 2000 ms timeout
cat "$WORK/batches"

say "tailer verify on the password recovery token"
line=$(grep -m1 -o '2,[^,]*,[^,]*,[A-Za-z0-9_-]\{86\},[0-9]\{5\}' "$WORK/batches" || true)
if [ -n "$line" ]; then
  token=$(echo "$line" | cut -d, -f4); code=$(echo "$line" | cut -d, -f5)
  "$WORK/tailer" verify --code "$code" "$token"
else
  echo "no password recovery token seen" >&2; exit 1
fi

say "the same tokens into PostgreSQL, exactly once: inbox rows and River jobs (tailer subscribe --into)"
export MAILROOM_INBOX_URL="$MAILROOM_DATABASE_URL"
for into in inbox river; do
  MAILROOM_NATS_URL="nats://$MAILROOM_NATS_LISTEN" "$WORK/tailer" subscribe --durable "$into" --into "$into" --migrate --from-start 2>"$WORK/$into.log" &
  PIDS+=($!)
done
for _ in $(seq 100); do
  [ "$(psql_ -c "SELECT (SELECT count(*) FROM mailroom_inbox) + (SELECT count(*) FROM river_job)" 2>/dev/null || echo 0)" -ge 12 ] && break
  sleep 0.1
done
psql "$MAILROOM_DATABASE_URL" -c "SELECT token_key, token_id, action, email, stream_seq FROM mailroom_inbox ORDER BY token_id"
psql "$MAILROOM_DATABASE_URL" -c "SELECT id, kind, state, args->>'token_key' AS token_key, args->>'email' AS email FROM river_job ORDER BY id"

say "tailer status"
"$WORK/tailer" status --nats-url "nats://$MAILROOM_NATS_LISTEN" || true

say "metrics (published and skipped)"
curl -fsS "http://$MAILROOM_HTTP_ADDR/metrics" 2>/dev/null | grep -E '^tailer_tokens_(published|skipped)_total' || true
