# Sourced by the compose scripts: sets compose=(...) to Docker Compose v2,
# built from the Go module proxy when `docker compose` is not installed
# (Debian's docker-compose v1 rejects the top-level `name`).
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
