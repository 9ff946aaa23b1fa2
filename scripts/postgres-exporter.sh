#!/usr/bin/env bash
# Builds prometheus-community/postgres_exporter from the Go module proxy at
# the version infra/docker-compose.yml runs, once, and prints its path. The
# infra tests run it against their PostgreSQL (POSTGRES_EXPORTER=path).
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n 's/^\s*image: quay.io\/prometheuscommunity\/postgres-exporter:\(v[0-9.]*\)$/\1/p' infra/docker-compose.yml)
[ -n "$version" ] || { echo "no postgres-exporter image in infra/docker-compose.yml" >&2; exit 1; }
bin="${TAILER_CACHE:-$HOME/.cache/tailer}/postgres_exporter-$version"
if [ ! -x "$bin" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  # go install refuses this module (the proxy lists no versions of it);
  # building its downloaded source works.
  dir=$(cd "$tmp" && go mod init tools >/dev/null 2>&1 &&
    go mod download -json "github.com/prometheus-community/postgres_exporter@$version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  mkdir -p "$(dirname "$bin")"
  (cd "$dir" && CGO_ENABLED=0 go build -trimpath -o "$bin" ./cmd/postgres_exporter) >&2
fi
echo "$bin"
