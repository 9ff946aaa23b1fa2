#!/usr/bin/env bash
# Checks the compose stack, alone and with the cluster file added, with
# Docker Compose v2 (`docker compose config`; no Docker engine needed): it
# parses, every password is required, with the passwords set it resolves,
# and a password written in .env as env.example says reaches the services
# as it is, whatever its characters.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/compose-lib.sh

env=$(mktemp)
trap 'rm -f "$env"' EXIT
for v in POSTGRES_PASSWORD OWNER_DB_PASSWORD TAILER_DB_PASSWORD APP_DB_PASSWORD EXPORTER_DB_PASSWORD \
         NATS_TAILER_PASSWORD NATS_SUBSCRIBER_PASSWORD GRAFANA_ADMIN_PASSWORD; do
  echo "$v=check-$v" >>"$env"
done

single=(-f infra/docker-compose.yml)
cluster=(-f infra/docker-compose.yml -f infra/docker-compose.cluster.yml)
for files in "${single[*]}" "${cluster[*]}"; do
  read -ra f <<<"$files"
  # Without the passwords the stack must not resolve.
  if out=$(env -i PATH="$PATH" HOME="$HOME" "${compose[@]}" "${f[@]}" --env-file /dev/null --profile subscriber config -q 2>&1); then
    echo "FAIL: $files resolves without the passwords"
    exit 1
  fi
  case "$out" in
    *"required variable"*|*"set "*"PASSWORD"*) ;;
    *) echo "FAIL: $files: unexpected error without the passwords: $out"; exit 1 ;;
  esac
  env -i PATH="$PATH" HOME="$HOME" "${compose[@]}" "${f[@]}" --env-file "$env" --profile subscriber config -q
  echo "ok: $files"
done

# env.example's advice: a value in single quotes is taken as written, but
# for a single quote, written \'. A value from the shell's environment is
# taken as it is, whatever it holds.
hostile='k/9+Qw#x $y=={a}?@:%25&[1],;!*()`~^|<>\z"'"'"'q'
grep -v -e '^TAILER_DB_PASSWORD=' "$env" >"$env.new"
printf "TAILER_DB_PASSWORD='%s'\n" "${hostile//\'/\\\'}" >>"$env.new"
mv "$env.new" "$env"
fromshell="$hostile\\"
if ! command -v python3 >/dev/null; then
  echo "skip: the check of passwords as written reads compose's JSON with python3, which is missing"
  exit 0
fi
resolved=$(env -i PATH="$PATH" HOME="$HOME" NATS_TAILER_PASSWORD="$fromshell" "${compose[@]}" "${single[@]}" --env-file "$env" config --format json)
for pair in "MAILROOM_DATABASE_PASSWORD:$hostile" "MAILROOM_NATS_PASSWORD:$fromshell"; do
  key=${pair%%:*} want=${pair#*:}
  # config prints a literal $ as $$ (compose syntax for it).
  got=$(printf '%s' "$resolved" | python3 -c 'import json,sys; print(json.load(sys.stdin)["services"]["tailer"]["environment"][sys.argv[1]].replace("$$", "$"), end="")' "$key")
  if [ "$got" != "$want" ]; then
    echo "FAIL: $key is [$got], want [$want]"
    exit 1
  fi
done
echo "ok: passwords with URL and shell characters reach the services as written"
