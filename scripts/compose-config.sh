#!/usr/bin/env bash
# Checks both compose files with Docker Compose v2 (`docker compose config`;
# no Docker engine needed): they parse, every password is required, and with
# the passwords set they resolve. Compose v2 is built from the Go module
# proxy when `docker compose` is not installed (Debian's docker-compose v1
# rejects the top-level `name`).
set -euo pipefail
cd "$(dirname "$0")/.."

compose=(docker compose)
if ! docker compose version >/dev/null 2>&1; then
  bin="${COMPOSE_BIN:-$HOME/.cache/tailer/docker-compose}"
  if [ ! -x "$bin" ]; then
    echo "building Docker Compose v2 from the Go module proxy (a few minutes) ..."
    tmp=$(mktemp -d)
    GOBIN="$tmp" go install github.com/docker/compose/v2/cmd@v2.29.7
    mkdir -p "$(dirname "$bin")"
    mv "$tmp/cmd" "$bin"
    rm -rf "$tmp"
  fi
  compose=("$bin")
fi

env=$(mktemp)
trap 'rm -f "$env"' EXIT
for v in POSTGRES_PASSWORD OWNER_DB_PASSWORD TAILER_DB_PASSWORD APP_DB_PASSWORD \
         NATS_TAILER_PASSWORD NATS_SUBSCRIBER_PASSWORD GRAFANA_ADMIN_PASSWORD; do
  echo "$v=check-$v" >>"$env"
done

for f in infra/docker-compose.yml infra/nats-cluster/docker-compose.yml; do
  # Without the passwords the file must not resolve.
  if out=$(env -i PATH="$PATH" HOME="$HOME" "${compose[@]}" -f "$f" --env-file /dev/null config -q 2>&1); then
    echo "FAIL: $f resolves without the passwords"
    exit 1
  fi
  case "$out" in
    *"required variable"*|*"set "*"PASSWORD"*) ;;
    *) echo "FAIL: $f: unexpected error without the passwords: $out"; exit 1 ;;
  esac
  env -i PATH="$PATH" HOME="$HOME" "${compose[@]}" -f "$f" --env-file "$env" config -q
  echo "ok: $f"
done
