#!/usr/bin/env bash
# Builds local stand-ins for the images infra/docker-compose.yml names, for
# a Docker engine that reaches no image registry (as on the project's CI
# machines): a Debian rootfs from debootstrap, Debian's PostgreSQL 15,
# Prometheus and Alertmanager, nats-server from this module's dependency,
# and postgres_exporter from the Go module proxy at the version the compose
# file pins. Each is
# tagged with the name the compose file uses, so the stack runs unchanged;
# an image already present is left alone. Grafana has no stand-in.
#
# The stand-ins differ from the real images in what the tests do not look
# at: PostgreSQL 15 runs for postgres:16, Prometheus 2.42 for 2.53,
# Alertmanager 0.25 for 0.27. Not for production.
set -euo pipefail
cd "$(dirname "$0")/../.."
here=scripts/standins
cache="${STANDIN_CACHE:-$HOME/.cache/tailer/standins}"
mkdir -p "$cache"

have() { docker image inspect "$1" >/dev/null 2>&1; }
build() { # tag, then a Dockerfile on stdin, context $ctx
  echo "building stand-in $1"
  docker build -q --network host -t "$1" -f - "$ctx" >/dev/null
}

if ! have standin/debian:bookworm; then
  if [ ! -x "$cache/rootfs/bin/sh" ]; then
    command -v debootstrap >/dev/null || { echo "debootstrap is missing (apt-get install debootstrap)"; exit 1; }
    debootstrap --variant=minbase --include=ca-certificates,busybox-static bookworm "$cache/rootfs" http://deb.debian.org/debian >/dev/null
  fi
  tar -C "$cache/rootfs" -c . | docker import - standin/debian:bookworm >/dev/null
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Each image gets a build context of its own, holding only its files.
newctx() { ctx=$(mktemp -d -p "$tmp"); }

# Label 3: started as postgres, on a data directory the image gives
# postgres and a socket directory anyone may write (as the real image
# has them, so that a tmpfs over it takes that mode); an older stand-in
# is built again.
if [ "$(docker image inspect -f '{{index .Config.Labels "mailroom.standin"}}' postgres:16 2>/dev/null)" != 3 ]; then
  newctx
  cp "$here/postgres-entrypoint.sh" "$ctx/"
  build postgres:16 <<'DOCKERFILE'
FROM standin/debian:bookworm
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql-15 >/dev/null && rm -rf /var/lib/apt/lists/* /var/lib/postgresql/15 \
 && mkdir -p /var/lib/postgresql/data && chown postgres:postgres /var/lib/postgresql/data && chmod 0700 /var/lib/postgresql/data \
 && chmod 3777 /var/run/postgresql
LABEL mailroom.standin=3
COPY postgres-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
ENV PATH=/usr/lib/postgresql/15/bin:$PATH
ENTRYPOINT ["/bin/sh", "/usr/local/bin/docker-entrypoint.sh"]
CMD ["postgres"]
DOCKERFILE
fi

nats_version=$(sed -n 's/^\s*image: nats:\([0-9.]*\)-alpine$/\1/p' infra/docker-compose.yml | head -1)
if ! have "nats:$nats_version-alpine"; then
  # The server the tests embed: the module's own dependency, at the
  # version TestComposeFile holds the image to.
  newctx
  CGO_ENABLED=0 go build -trimpath -o "$ctx/nats-server" github.com/nats-io/nats-server/v2
  build "nats:$nats_version-alpine" <<'DOCKERFILE'
FROM standin/debian:bookworm
COPY nats-server /usr/local/bin/nats-server
RUN ln -s /bin/busybox /usr/local/bin/wget
ENTRYPOINT ["nats-server"]
DOCKERFILE
fi

exporter_image=$(sed -n 's/^\s*image: \(quay.io\/prometheuscommunity\/postgres-exporter:.*\)$/\1/p' infra/docker-compose.yml)
if ! have "$exporter_image"; then
  newctx
  cp "$(bash scripts/postgres-exporter.sh)" "$ctx/postgres_exporter"
  build "$exporter_image" <<'DOCKERFILE'
FROM standin/debian:bookworm
COPY postgres_exporter /bin/postgres_exporter
RUN ln -s /bin/busybox /usr/local/bin/wget
USER nobody
ENTRYPOINT ["/bin/postgres_exporter"]
DOCKERFILE
fi

prometheus_image=$(sed -n 's/^\s*image: \(prom\/prometheus:.*\)$/\1/p' infra/docker-compose.yml)
alertmanager_image=$(sed -n 's/^\s*image: \(prom\/alertmanager:.*\)$/\1/p' infra/docker-compose.yml)
if ! have "$prometheus_image"; then
  newctx
  build "$prometheus_image" <<'DOCKERFILE'
FROM standin/debian:bookworm
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null && rm -rf /var/lib/apt/lists/* && ln -s /bin/busybox /usr/local/bin/wget && mkdir -p /prometheus && chown nobody /prometheus
USER nobody
ENTRYPOINT ["/bin/prometheus"]
DOCKERFILE
fi
if ! have "$alertmanager_image"; then
  newctx
  build "$alertmanager_image" <<'DOCKERFILE'
FROM standin/debian:bookworm
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus-alertmanager >/dev/null && rm -rf /var/lib/apt/lists/* && ln -s /usr/bin/prometheus-alertmanager /bin/alertmanager && ln -s /bin/busybox /usr/local/bin/wget && mkdir -p /alertmanager && chown nobody /alertmanager
USER nobody
ENTRYPOINT ["/bin/alertmanager"]
DOCKERFILE
fi

# The tailer's Dockerfile, built for real, needs its bases: Go (this
# machine's), and distroless static (nonroot, and debug-nonroot with
# busybox for the subscriber's sender).
if ! have golang:1.26-bookworm; then
  newctx
  cp -a "$(go env GOROOT)" "$ctx/go"
  # This machine's CA bundle: the module proxy may be reached through a
  # TLS proxy whose CA Debian's bundle lacks.
  cp /etc/ssl/certs/ca-certificates.crt "$ctx/"
  build golang:1.26-bookworm <<DOCKERFILE
FROM standin/debian:bookworm
COPY go /usr/local/go
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
ENV PATH=/usr/local/go/bin:/root/go/bin:\$PATH GOPROXY=$(go env GOPROXY)
DOCKERFILE
fi
distroless() { # tag, with busybox (yes/no)
  newctx
  mkdir -p "$ctx/root/etc" "$ctx/root/tmp" "$ctx/root/home/nonroot" "$ctx/root/etc/ssl/certs"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$ctx/root/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n' >"$ctx/root/etc/group"
  cp "$cache/rootfs/etc/ssl/certs/ca-certificates.crt" "$ctx/root/etc/ssl/certs/"
  chmod 1777 "$ctx/root/tmp"
  if [ "$2" = yes ]; then
    mkdir -p "$ctx/root/busybox"
    cp "$cache/rootfs/bin/busybox" "$ctx/root/busybox/"
    for a in $("$cache/rootfs/bin/busybox" --list | grep -vx busybox); do ln -s busybox "$ctx/root/busybox/$a"; done
  fi
  build "$1" <<'DOCKERFILE'
FROM scratch
COPY root /
ENV PATH=/usr/local/bin:/usr/bin:/bin:/busybox
DOCKERFILE
}
have gcr.io/distroless/static-debian12:nonroot || distroless gcr.io/distroless/static-debian12:nonroot no
have gcr.io/distroless/static-debian12:debug-nonroot || distroless gcr.io/distroless/static-debian12:debug-nonroot yes
echo "stand-ins ready"
