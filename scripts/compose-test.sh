#!/usr/bin/env bash
# The compose stack run for real, as an operator runs it: up with random
# passwords that hold every URL-special character, tokens inserted by the
# application's role and taken by the subscriber service exactly once, the
# tailer stopped under writes until the PostgreSQL-side lag alerts
# (PostgresSlotLagHigh in bytes and PostgresSlotLagSecondsHigh in time, from
# postgres_exporter) reach Alertmanager, then
# started again and every token still delivered exactly once.
#
# CLUSTER=1 adds infra/docker-compose.cluster.yml (three NATS nodes) and
# checks that the tailer made its stream there with three replicas and
# that the nodes routed (with the route password; with TLS=1 as well, the
# cluster-TLS file, and routes over TLS).
# Otherwise the single-node stack is then moved to the cluster by the steps
# of docs/deploy.md ("Moving a running stack to the cluster"), with 500
# tokens on the stream that the subscriber has not read and a writer on:
# every token delivered once, the subscriber's consumer kept (MOVE=0 skips
# it). TLS=1 adds infra/docker-compose.tls.yml (infra/tls.sh makes the
# CA and certificates) and checks that every connection of the tailer and
# postgres_exporter to PostgreSQL and every NATS client is encrypted, and
# that PostgreSQL refuses a plain login over the network.
#
# Grafana has no stand-in: scripts/dashboard-check.py loads every panel's
# query of its dashboard from the stack's Prometheus instead, and every
# panel must show data.
#
# Needs a Docker engine; without one it says so and exits 0. Where no
# registry is reachable, scripts/standins/build.sh builds local stand-ins
# for the images (Grafana has none: it is not started here). The stack runs
# from a copy of infra/ under its own project name, on other host ports
# (COMPOSE_TEST_PORT_BASE), and is removed at the end (KEEP=1 keeps it).
#
# Two things differ from the shipped files, to fit in minutes: Prometheus
# scrapes and evaluates every 2 s instead of 15 s, and PostgresSlotLagHigh
# fires past 1 MiB after 10 s instead of 256 MiB after 5 minutes
# (promtool test rules covers the real thresholds).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! out=$(docker info 2>&1); then
  echo "skip: no Docker engine here (docker info: $(printf '%s' "$out" | tail -1))"
  exit 0
fi
. scripts/compose-lib.sh

start=$(date +%s)
say() { printf '[%4ds] %s\n' "$(($(date +%s) - start))" "$*"; }
fail() { say "FAIL: $*"; exit 1; }

# Images: pulled where a registry answers, stand-ins where it does not; the
# tailer's own built from infra/Dockerfile.
bash scripts/standins/build.sh
say "building the tailer's images from infra/Dockerfile"
docker build -q --network host -f infra/Dockerfile -t mailroom/tailer:local . >/dev/null
docker build -q --network host -f infra/Dockerfile --target subscriber -t mailroom/tailer-subscriber:local . >/dev/null
docker build -q --network host -t mailroom/nats-cli:local infra/nats-cli >/dev/null

work=$(mktemp -d)
project="mailroom-test-$$"
cp -r infra "$work/infra"
rm -f "$work/infra/.env" "$work/infra/secrets/"*
base=${COMPOSE_TEST_PORT_BASE:-25000}
# Other host ports, so that a stack already running here is left alone.
sed -i -e "s/\"127.0.0.1:5432:/\"127.0.0.1:$((base + 1)):/" -e "s/\"127.0.0.1:4222:/\"127.0.0.1:$((base + 2)):/" \
  -e "s/\"127.0.0.1:8222:/\"127.0.0.1:$((base + 3)):/" -e "s/\"127.0.0.1:9187:/\"127.0.0.1:$((base + 4)):/" \
  -e "s/\"127.0.0.1:9090:/\"127.0.0.1:$((base + 5)):/" -e "s/\"127.0.0.1:9093:/\"127.0.0.1:$((base + 6)):/" \
  -e "s/\"127.0.0.1:3000:/\"127.0.0.1:$((base + 7)):/" "$work/infra/docker-compose.yml"
sed -i -e "s/\"127.0.0.1:4223:/\"127.0.0.1:$((base + 8)):/" -e "s/\"127.0.0.1:4224:/\"127.0.0.1:$((base + 9)):/" \
  -e "s/\"127.0.0.1:8223:/\"127.0.0.1:$((base + 10)):/" -e "s/\"127.0.0.1:8224:/\"127.0.0.1:$((base + 11)):/" "$work/infra/docker-compose.cluster.yml"
files=(-f "$work/infra/docker-compose.yml")
[ "${CLUSTER:-}" = 1 ] && files+=(-f "$work/infra/docker-compose.cluster.yml")
[ "${TLS:-}" = 1 ] && files+=(-f "$work/infra/docker-compose.tls.yml")
[ "${CLUSTER:-}" = 1 ] && [ "${TLS:-}" = 1 ] && files+=(-f "$work/infra/docker-compose.cluster-tls.yml")
sed -i 's/^\(  \(scrape\|evaluation\)_interval:\) 15s/\1 2s/' "$work/infra/prometheus/prometheus.yml"
python3 - "$work/infra/prometheus/rules.yml" <<'EOF'
import re, sys
p = sys.argv[1]
s = open(p).read()
i = s.index("- alert: PostgresSlotLagHigh")
j = s.index("- alert:", i + 1)
rule = s[i:j].replace("> 256 * 1024 * 1024", "> 1024 * 1024").replace("for: 5m", "for: 10s")
open(p, "w").write(s[:i] + rule + s[j:])
EOF

dc() { "${compose[@]}" -p "$project" "${files[@]}" --profile subscriber "$@"; }
cleanup() {
  code=$?
  if [ "$code" != 0 ]; then
    dc logs --no-color --tail 40 >"$work/logs" 2>&1 || true
    echo "---- last log lines of each service ($work/logs) ----"
    cat "$work/logs"
  fi
  if [ "${KEEP:-}" = 1 ]; then
    echo "kept: ${compose[*]} -p $project ${files[*]} --profile subscriber ..."
  else
    dc down -v --remove-orphans >/dev/null 2>&1 || true
    rm -rf "$work"
  fi
  exit "$code"
}
trap cleanup EXIT

# Random passwords, each holding every character that breaks a URL, a
# shell word, a .env line or a NATS configuration value.
password() {
  local special='/?#@:%+&=[]!$'"'"'()*,; "\`{}<>|^~' random
  random=$(head -c 18 /dev/urandom | base64 | tr -d '\n')
  printf '%s%s%s' "${random:0:12}" "$special" "${random:12}"
}
# They go into the secrets' files, as an operator's own would; the rest
# (the keyring) infra/secrets.sh makes.
secrets=(postgres_password owner_db_password tailer_db_password app_db_password exporter_db_password
         nats_tailer_password nats_subscriber_password nats_admin_password nats_system_password nats_route_password grafana_admin_password)
for name in "${secrets[@]}"; do
  password >"$work/infra/secrets/$name"
  chmod 0444 "$work/infra/secrets/$name"
done
sh "$work/infra/secrets.sh" >/dev/null
[ "${TLS:-}" = 1 ] && sh "$work/infra/tls.sh" >/dev/null
APP_DB_PASSWORD=$(cat "$work/infra/secrets/app_db_password")

services=(postgres nats migrate tailer postgres-exporter nats-exporter prometheus alertmanager subscriber)
[ "${CLUSTER:-}" = 1 ] && services+=(nats-2 nats-3)
# The whole stack but Grafana, as docs/deploy.md brings it up where
# Grafana's image cannot be had.
#
# Sampled all through this first up, PostgreSQL's first setup
# (01-roles.sh) included: no password on the command line or in the
# environment of any process, the host's or a container's (theirs are
# the host's too). The random part of each password stands for it.
for name in "${secrets[@]}"; do pw=$(cat "$work/infra/secrets/$name"); printf '%s\n' "${pw:0:12}"; done >"$work/patterns"
(
  n=0
  until [ -e "$work/up-done" ]; do
    for f in $(grep -lF -f "$work/patterns" /proc/[0-9]*/cmdline /proc/[0-9]*/environ 2>/dev/null); do
      echo "$f: $(tr '\0' ' ' <"${f%/*}/cmdline" 2>/dev/null | cut -c1-120)"
    done
    n=$((n + 1))
  done
  echo "sweeps $n"
) >"$work/sampled" &
sampler=$!
say "up -d --wait --pull never --scale grafana=0"
dc up -d --no-build --wait --wait-timeout 300 --pull never --scale grafana=0 >/dev/null
touch "$work/up-done"
wait "$sampler"
grep -v '^sweeps ' "$work/sampled" && fail "a password on a command line or in an environment during the first up (above)"
say "healthy: $(dc ps --format '{{.Service}}={{.Health}}' | tr '\n' ' ')"
say "no password on any process's command line or in its environment during the first up ($(tail -1 "$work/sampled") of /proc)"

# Every published port on loopback only.
if dc ps --format '{{.Publishers}}' | grep -o 'URL:[^ ]*' | grep -v 'URL:127.0.0.1'; then
  fail "a port is published beyond 127.0.0.1"
fi
pid=$(docker inspect -f '{{.State.Pid}}' "$(dc ps -q tailer)")
uid=$(awk '/^Uid:/ { print $2 }' "/proc/$pid/status")
[ "$uid" = 65532 ] || fail "the tailer runs as uid $uid, not 65532"

# No password in any container's configuration (docker inspect: its
# environment, command, labels) or on any of its processes' command
# lines; every process of every container runs as a user other than
# root, with no capability, no-new-privileges, its logs rotated, a memory
# limit. The random part of each password stands for it (inspect's JSON
# escapes some of the special characters).
for c in $(dc ps -q); do
  svc=$(docker inspect -f '{{index .Config.Labels "com.docker.compose.service"}}' "$c")
  inspect=$(docker inspect "$c")
  for name in "${secrets[@]}"; do
    pw=$(cat "$work/infra/secrets/$name")
    case "$inspect" in *"${pw:0:12}"*) fail "$svc: docker inspect shows $name" ;; esac
    for p in $(docker top "$c" -eo pid | tail -n +2); do
      if tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline" | grep -qF -- "${pw:0:12}"; then
        fail "$svc: process $p has $name on its command line"
      fi
    done
  done
  for p in $(docker top "$c" -eo pid | tail -n +2); do
    puid=$(awk '/^Uid:/ { print $2 }' "/proc/$p/status" 2>/dev/null || echo gone)
    [ "$puid" != 0 ] || fail "$svc: process $p ($(tr '\0' ' ' <"/proc/$p/cmdline")) runs as root"
    caps=$(awk '/^CapEff:/ { print $2 }' "/proc/$p/status" 2>/dev/null || echo 0)
    [ "$caps" = gone ] || [ "$((16#$caps))" = 0 ] || fail "$svc: process $p has capabilities $caps"
  done
  hc=$(docker inspect -f '{{.HostConfig.CapDrop}} {{.HostConfig.SecurityOpt}} {{.HostConfig.LogConfig.Config}} {{.HostConfig.Memory}}' "$c")
  case "$hc" in
    *ALL*no-new-privileges:true*max-size:10m*) ;;
    *) fail "$svc: not hardened: $hc" ;;
  esac
  [ "${hc##* }" -gt 0 ] || fail "$svc: no memory limit"
  # Its healthcheck and any exec run as the container's user.
  user=$(docker inspect -f '{{.Config.User}}' "$c")
  case "$user" in "" | 0 | 0:* | root | root:*) fail "$svc: runs as root (user '$user'): its healthcheck and execs too" ;; esac
  for p in $(docker top "$c" -eo pid | tail -n +2); do
    for name in "${secrets[@]}"; do
      pw=$(cat "$work/infra/secrets/$name")
      if tr '\0' '\n' 2>/dev/null <"/proc/$p/environ" | grep -qF -- "${pw:0:12}"; then
        fail "$svc: process $p has $name in its environment"
      fi
    done
  done
done
say "no password in docker inspect, a command line or a process's environment; every container's user and process non-root, without capabilities; limits and log rotation set"

if [ "${TLS:-}" = 1 ]; then
  # Every connection of the tailer (replication and queries) and of
  # postgres_exporter is encrypted; a plain login over the network is
  # refused.
  tls=$(dc exec -T postgres psql -qAt -U postgres -d mailroom -c "SELECT count(*) FILTER (WHERE s.ssl), count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) WHERE a.usename IN ('tailer', 'postgres_exporter')")
  [ "${tls%|*}" = "${tls#*|}" ] && [ "${tls#*|}" -ge 2 ] || fail "PostgreSQL: ${tls%|*} of ${tls#*|} connections of the tailer and postgres_exporter use TLS"
  if out=$(dc exec -T -e PGPASSWORD="$(cat "$work/infra/secrets/app_db_password")" postgres \
      psql "host=postgres sslmode=disable user=mailroom_app dbname=mailroom" -c "SELECT 1" 2>&1); then
    fail "PostgreSQL took a plain login over the network"
  fi
  case "$out" in *"no encryption"*) ;; *) fail "a plain login over the network: $out" ;; esac
  # NATS: TLS required, and every client on it, on every node (a
  # cluster's clients connect to any of the three).
  nodes=($((base + 3)))
  [ "${CLUSTER:-}" = 1 ] && nodes+=($((base + 10)) $((base + 11)))
  tlsc=0 allc=0
  for port in "${nodes[@]}"; do
    curl -fsS "http://127.0.0.1:$port/varz" | grep -q '"tls_required": *true' || fail "NATS on :$port does not require TLS"
    c=$(curl -fsS "http://127.0.0.1:$port/connz?auth=true" | python3 -c 'import json,sys; c=json.load(sys.stdin)["connections"]; print(sum(1 for x in c if x.get("tls_version")), len(c))')
    tlsc=$((tlsc + ${c% *})) allc=$((allc + ${c#* }))
  done
  conns="$tlsc $allc"
  [ "${conns% *}" = "${conns#* }" ] && [ "${conns#* }" -ge 2 ] || fail "NATS: ${conns% *} of ${conns#* } clients use TLS"
  say "TLS: ${tls%|*} of ${tls#*|} connections to PostgreSQL encrypted, ${conns% *} of ${conns#* } NATS clients; a plain login refused: ${out##*FATAL:  }"
fi

psql_app() { dc exec -T -e PGPASSWORD="$APP_DB_PASSWORD" postgres psql -qAt -h 127.0.0.1 -U mailroom_app -d mailroom -v ON_ERROR_STOP=1 "$@"; }
inserted=0
insert() { # n, prefix
  psql_app -c "INSERT INTO accounts (email, login) SELECT '$2' || g || '@example.com', '$2' || g FROM generate_series(1, $1) g" >/dev/null
  inserted=$((inserted + $1))
}
# start_writer PREFIX ROWS PAUSE: the application inserts ROWS accounts
# every PAUSE seconds, in the background, until stop_writer, which counts
# them in.
writer_stop="$work/writer.stop"
start_writer() {
  rm -f "$writer_stop" "$work/written"
  (
    i=0
    while [ ! -e "$writer_stop" ]; do
      i=$((i + 1))
      psql_app -c "INSERT INTO accounts (email, login) SELECT '$1${i}x' || g || '@example.com', '$1${i}x' || g FROM generate_series(1, $2) g" >/dev/null
      echo "$2" >>"$work/written"
      sleep "$3"
    done
  ) &
  writer=$!
}
stop_writer() {
  touch "$writer_stop"
  wait "$writer"
  inserted=$((inserted + $(awk '{ s += $1 } END { print s + 0 }' "$work/written")))
}
# The signed tokens in the subscriber's collector lines (five fields a
# token: action,email,login,token,code).
delivered() {
  # No file yet is no token yet.
  { dc exec -T subscriber cat /out/lines 2>/dev/null || true; } | awk -F, '{ for (i = 4; i <= NF; i += 5) print $i }' | sort
}
await_delivery() { # what
  local deadline=$(($(date +%s) + 180)) tokens
  while :; do
    tokens=$(delivered | wc -l)
    [ "$tokens" -ge "$inserted" ] && break
    [ "$(date +%s)" -lt "$deadline" ] || fail "$1: $tokens of $inserted tokens delivered"
    sleep 2
  done
  local dupes
  dupes=$(delivered | uniq -d | wc -l)
  [ "$tokens" = "$inserted" ] && [ "$dupes" = 0 ] || fail "$1: $tokens tokens for $inserted inserted, $dupes repeated"
  say "$1: $tokens of $inserted tokens delivered, none twice"
}

# await_all WHAT MAX: every token inserted delivered, at most MAX of them
# more than once.
await_all() {
  local deadline=$(($(date +%s) + 180)) unique
  while :; do
    unique=$(delivered | uniq | wc -l)
    [ "$unique" -ge "$inserted" ] && break
    [ "$(date +%s)" -lt "$deadline" ] || fail "$1: $unique of $inserted tokens delivered"
    sleep 2
  done
  local repeats=$(($(delivered | wc -l) - unique))
  [ "$unique" = "$inserted" ] && [ "$repeats" -le "$2" ] || fail "$1: $unique distinct tokens for $inserted inserted, $repeats written again (at most $2)"
  say "$1: $unique of $inserted tokens delivered, $repeats written again"
}

insert 50 first
await_delivery "before the fault"

# The tailer's NATS user may not touch a subscriber's consumer: asked, as
# that user, to delete, edit, pull from or acknowledge on the
# subscriber's, the server refuses (a permissions violation, or no
# answer), and the consumer is as it was.
net=$(docker inspect -f '{{range $k, $v := .NetworkSettings.Networks}}{{$k}}{{end}}' "$(dc ps -q nats)")
tlsca=()
[ "${TLS:-}" = 1 ] && tlsca=(-v "$work/infra/secrets/tls/ca.crt:/ca.crt:ro")
as_tailer() { # the NATS CLI as the tailer's user (its password from the secret's file), then the CLI's arguments
  docker run --rm --network "$net" -v "$work/infra/secrets/nats_tailer_password:/pw:ro" "${tlsca[@]}" -e TLS="${TLS:-}" -e HOME=/tmp \
    --entrypoint /busybox/sh mailroom/nats-cli:local -c \
    'NATS_USER=tailer NATS_PASSWORD=$(cat /pw) exec nats -s nats://nats:4222 ${TLS:+--tlsca /ca.crt} --timeout 3s "$@"' as-tailer "$@"
}
sender_state() { "${compose[@]}" -p "$project" "${files[@]}" run --rm -T nats-cli consumer info MAILROOM sender --json 2>/dev/null |
  python3 -c 'import json,sys; c=json.load(sys.stdin); print(c["config"].get("max_deliver"), c["delivered"]["stream_seq"], c["ack_floor"]["stream_seq"])'; }
state=$(sender_state) || fail "no consumer sender before the tailer's user tries it"
# Each as the CLI's command (which looks the consumer up first, and is
# refused there), and as the API request itself.
for try in "consumer rm MAILROOM sender -f" "consumer edit MAILROOM sender --max-deliver 1 -f" "consumer next MAILROOM sender --count 1" \
    'req $JS.API.CONSUMER.DURABLE.CREATE.MAILROOM.sender {"stream_name":"MAILROOM","config":{"durable_name":"sender","max_deliver":1,"ack_policy":"explicit"}}' \
    'req $JS.API.CONSUMER.MSG.NEXT.MAILROOM.sender {"batch":1,"group":"mailroom"}' \
    'pub $JS.ACK.MAILROOM.sender.1.1.1.0.0 +ACK'; do
  # shellcheck disable=SC2086 # each try is the CLI's words
  out=$(as_tailer $try 2>&1) && case "$out" in *"Permissions Violation"*) ;; *) fail "the tailer's NATS user was not refused '$try': $out" ;; esac
  case "$out" in
    *"Permissions Violation"* | *timeout* | *"context deadline exceeded"* | *"unknown consumer"*) ;;
    *) fail "the tailer's NATS user, '$try': not a refusal: $out" ;;
  esac
  [ "$(sender_state)" = "$state" ] || fail "the subscriber's consumer changed after the tailer's user tried '$try': $(sender_state), was $state"
  say "the tailer's NATS user is refused '$try': $(printf '%s' "$out" | tail -1)"
done
say "memory in use: $(docker stats --no-stream --format '{{.Name}}={{.MemUsage}}' $(dc ps -q) | sed "s/$project-//" | tr '\n' ' ')"

# A restart of PostgreSQL is a clean shutdown (SIGINT: fast), not a
# SIGKILL into crash recovery.
clean=$(dc logs --no-color postgres | grep -c "database system was shut down at" || true)
dc restart postgres >/dev/null
# Healthy again, so that the new server has said how it found its data.
dc up -d --wait --no-build postgres >/dev/null
if [ "$(dc logs --no-color postgres | grep -c "database system was shut down at" || true)" != $((clean + 1)) ]; then
  fail "PostgreSQL's restart: no clean shutdown in its log"
fi
if dc logs --no-color postgres | grep -qE "not properly shut down|automatic recovery in progress"; then
  fail "PostgreSQL's restart ended in crash recovery"
fi
say "PostgreSQL restarted cleanly (shut down, no recovery)"
insert 10 afterpg
await_delivery "after PostgreSQL's restart"
if [ "${CLUSTER:-}" = 1 ]; then
  replicas=$(curl -fsS "http://127.0.0.1:$((base + 3))/jsz?acc=MAILROOM&streams=true&config=true" | grep -o '"num_replicas": *[0-9]*' | head -1 | grep -o '[0-9]*$')
  [ "$replicas" = 3 ] || fail "the tailer's stream has ${replicas:-no} replicas on the cluster, want 3"
  # Every node routed to the two others with the route password (and,
  # with TLS, routes over TLS and clients on TLS only).
  for port in $((base + 3)) $((base + 10)) $((base + 11)); do
    peers=$(curl -fsS "http://127.0.0.1:$port/routez" | python3 -c 'import json,sys; print(len({r["remote_name"] for r in json.load(sys.stdin)["routes"]}))')
    [ "$peers" = 2 ] || fail "the node on :$port is routed to $peers others, want 2"
    if [ "${TLS:-}" = 1 ]; then
      curl -fsS "http://127.0.0.1:$port/varz" | python3 -c 'import json,sys; v=json.load(sys.stdin); sys.exit(0 if v.get("tls_required") and v["cluster"].get("tls_required") else 1)' ||
        fail "the node on :$port takes clients or routes in the clear"
    fi
  done
  say "the stream MAILROOM has 3 replicas; every node routed to the two others$([ "${TLS:-}" = 1 ] && echo ", routes and clients over TLS")"
fi

say "stopping the tailer while the application writes"
dc stop tailer >/dev/null
stopped=$(date +%s)
# About 64 tokens a second, as the lag issue measured it.
start_writer w 20 0.3
# More WAL for the lag alert to see, in a table outside the publication
# (so that the mail stays few), made by the operator.
dc exec -T postgres psql -qAt -U postgres -d mailroom -c "CREATE TABLE filler AS SELECT g, md5(g::text) AS m FROM generate_series(1, 60000) g" >/dev/null

deadline=$(($(date +%s) + 240))
alertmanager="http://127.0.0.1:$((base + 6))/api/v2/alerts"
until curl -fsS "$alertmanager" 2>/dev/null | grep -q '"alertname":"PostgresSlotLagHigh"'; do
  [ "$(date +%s)" -lt "$deadline" ] || fail "PostgresSlotLagHigh never reached Alertmanager"
  sleep 2
done
say "Alertmanager has PostgresSlotLagHigh: $(curl -fsS "$alertmanager" | grep -o '"summary":"[^"]*"' | head -3 | tr '\n' ' ')"
if curl -fsS "$alertmanager" | grep -q '"alertname":"TailerDown"'; then
  say "Alertmanager has TailerDown too"
fi
# The lag in seconds from PostgreSQL's side, at its real thresholds (over
# 45 s for a minute): within two minutes of the stop.
until curl -fsS "$alertmanager" 2>/dev/null | grep -q '"alertname":"PostgresSlotLagSecondsHigh"'; do
  [ "$(date +%s)" -lt $((stopped + 180)) ] || fail "PostgresSlotLagSecondsHigh never reached Alertmanager"
  sleep 2
done
took=$(($(date +%s) - stopped))
say "Alertmanager has PostgresSlotLagSecondsHigh ${took}s after the tailer stopped: $(curl -fsS "$alertmanager" | grep -o '"summary":"slot mailroom: tokens[^"]*"' | head -1)"
[ "$took" -le 120 ] || fail "PostgresSlotLagSecondsHigh took ${took}s, more than two minutes"

stop_writer
say "starting the tailer again"
dc start tailer >/dev/null
await_delivery "after the tailer's stop"
say "ok: the stack with URL-hostile passwords kept every token exactly once, and the PostgreSQL-side lag alert reached Alertmanager"

# Grafana's dashboard, every panel's query from the stack's Prometheus;
# a rate over [1m] needs two samples of the tailer started again, so the
# check is asked again for up to 90 s.
deadline=$(($(date +%s) + 90))
until python3 scripts/dashboard-check.py "http://127.0.0.1:$((base + 5))" "$work/infra/grafana/dashboards/tailer.json" >"$work/dashboard.log" 2>&1; do
  [ "$(date +%s)" -lt "$deadline" ] || { cat "$work/dashboard.log"; fail "the dashboard"; }
  sleep 5
done
cat "$work/dashboard.log"


if [ "${CLUSTER:-}" != 1 ] && [ "${TLS:-}" != 1 ] && [ "${MOVE:-1}" = 1 ]; then
  # The move, as docs/deploy.md gives it. First 500 tokens on the
  # stream that the subscriber has not read.
  dc stop subscriber >/dev/null
  insert 500 unread
  lsn=$(dc exec -T postgres psql -qAt -U postgres -d mailroom -c "SELECT pg_current_wal_lsn()")
  deadline=$(($(date +%s) + 60))
  until [ "$(dc exec -T postgres psql -qAt -U postgres -d mailroom -c "SELECT bool_and(confirmed_flush_lsn >= '$lsn') FROM pg_replication_slots WHERE slot_name = 'mailroom'")" = t ]; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "the tailer did not publish the 500 tokens"
    sleep 1
  done
  cli() { "${compose[@]}" -p "$project" "${files[@]}" run --rm -T nats-cli "$@"; }
  consumer() { cli consumer info MAILROOM sender --json 2>/dev/null | python3 -c 'import json,sys; c=json.load(sys.stdin); print(c["config"]["durable_name"], c["ack_floor"]["stream_seq"], c["num_pending"] + c["num_ack_pending"])'; }
  before=$(consumer)
  say "500 tokens on the stream unread by the subscriber: consumer (durable, ack floor, messages not acknowledged) $before"
  start_writer m 5 0.2
  # 1. Stop the tailer (cleanly: it records the stream's last message)
  #    and the subscribers.
  dc stop tailer subscriber >/dev/null
  # 2. Back up every stream of the account, with its consumers.
  #    Twice, as the step says: a directory of its own each time.
  for _ in 1 2; do
    b=/backup/$(date -u +%Y%m%dT%H%M%SZ)
    cli backup account "$b" --consumers -f >"$work/backup.log" 2>&1 || { cat "$work/backup.log"; fail "nats backup account"; }
    sleep 1
  done
  streams=$("${compose[@]}" -p "$project" "${files[@]}" run --rm -T --entrypoint /busybox/ls nats-cli "$b" | tr -d '\r')
  say "backed up: $(echo $streams)"
  # 3. The cluster on its own volumes.
  files+=(-f "$work/infra/docker-compose.cluster.yml")
  dc up -d --no-build --wait --wait-timeout 300 nats nats-2 nats-3 >/dev/null
  # 4. Each stream restored with three replicas.
  for s in $streams; do
    cli backup restore stream "$b/$s" --replicas 3 --no-progress >"$work/restore.log" 2>&1 || { cat "$work/restore.log"; fail "nats backup restore stream $s"; }
  done
  # 5. Everything up again.
  dc up -d --no-build --wait --wait-timeout 300 --pull never --scale grafana=0 >/dev/null
  say "moved: $(dc ps --format '{{.Service}}={{.Health}}' | tr '\n' ' ')"
  after=$(consumer)
  read -r durable floor _ <<<"$before"
  read -r durable2 floor2 _ <<<"$after"
  [ "$durable2" = "$durable" ] && [ "$floor2" -ge "$floor" ] || fail "the subscriber's consumer after the move: $after, before: $before"
  replicas=$(cli stream info MAILROOM --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["config"]["num_replicas"])')
  [ "$replicas" = 3 ] || fail "the stream has $replicas replicas after the move, want 3"
  stop_writer
  await_delivery "after the move to three nodes"
  say "ok: moved to three nodes (stream R3, consumer $durable kept at ack floor $floor2), every token once"

  # Any one node can fail without stopping the tailer: the stream's
  # leader SIGKILLed 5 times under a writer, each time started again once
  # another leads. The replicas of a restored stream each report their own
  # creation time; a leader change is never a refusal (issue 45).
  leader() { cli stream info MAILROOM --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["cluster"].get("leader",""))' || true; }
  service_of() { case "$1" in nats-1) echo nats ;; *) echo "$1" ;; esac; }
  refusals() { dc logs --no-color tailer 2>&1 | grep -cE "cannot be streamed from|deleted and made again" || true; }
  refused=$(refusals)
  # The stream's part, read back from it: the batches published from now
  # on hold every token once.
  batches_on_stream() { cli stream subjects MAILROOM --json | python3 -c 'import json,sys; print(json.load(sys.stdin).get("mailroom.batches", 0))'; }
  from_seq=$(cli stream info MAILROOM --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"]["last_seq"] + 1)')
  from_batches=$(batches_on_stream)
  from_inserted=$inserted
  start_writer k 5 0.2
  for i in 1 2 3 4 5; do
    l=$(leader)
    [ -n "$l" ] || fail "kill $i: the stream has no leader"
    docker kill -s KILL "$(dc ps -q "$(service_of "$l")")" >/dev/null
    deadline=$(($(date +%s) + 60))
    until n=$(leader) && [ -n "$n" ] && [ "$n" != "$l" ]; do
      [ "$(date +%s)" -lt "$deadline" ] || fail "kill $i: no new leader a minute after $l was killed"
      sleep 1
    done
    dc up -d --no-build --wait --wait-timeout 120 "$(service_of "$l")" >/dev/null
    say "kill $i: the stream's leader $l SIGKILLed; $n leads; $l back"
  done
  stop_writer
  # The stream holds every token once (the tailer's part); the subscriber
  # delivers every token, and may write again the batches its sender had
  # in doubt when the consumer's leader died with the node (a pipe
  # sender's at-least-once: at most two batches of 10 a kill).
  await_all "after 5 SIGKILLs of the stream's leader" 100
  on_stream=$(cli stream info MAILROOM --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"]["messages"])')
  published=$(($(batches_on_stream) - from_batches))
  ids=$(timeout 120 "${compose[@]}" -p "$project" "${files[@]}" run --rm -T nats-cli sub mailroom.batches --stream MAILROOM \
    --start-sequence "$from_seq" --count "$published" --headers-only 2>/dev/null | tr -d '\r' | sed -n 's/^ *Mailroom-Token-Ids: //p' | tr ',' '\n' | grep . || true)
  on_stream_tokens=$(printf '%s\n' "$ids" | grep -c . || true)
  on_stream_unique=$(printf '%s\n' "$ids" | sort -u | grep -c . || true)
  [ "$on_stream_tokens" = "$on_stream_unique" ] && [ "$on_stream_unique" = $((inserted - from_inserted)) ] ||
    fail "the stream after the kills: $on_stream_tokens tokens in $published batch messages, $on_stream_unique distinct, $((inserted - from_inserted)) inserted"
  say "the stream after the kills: $on_stream_unique tokens in $published batch messages, each once"
  [ "$(refusals)" = "$refused" ] || fail "the tailer refused the stream after a leader's kill: $(dc logs --no-color tailer 2>&1 | grep -E "cannot be streamed from|deleted and made again" | tail -2)"
  say "ok: the stream's leader SIGKILLed 5 times under a writer: no refusal, every token delivered ($on_stream messages on the stream)"
fi

# The teardown as documented (every file and profile the stack ran with)
# leaves nothing of the stack: no container, volume or network.
"${compose[@]}" -p "$project" "${files[@]}" --profile '*' down -v --remove-orphans >/dev/null 2>&1
left=$( { docker ps -aq --filter "label=com.docker.compose.project=$project"
          docker volume ls -q --filter "label=com.docker.compose.project=$project"
          docker network ls -q --filter "label=com.docker.compose.project=$project"; } | wc -l)
[ "$left" = 0 ] || fail "down -v left $left containers, volumes or networks of the stack"
say "down -v --profile '*' left no container, volume or network"
