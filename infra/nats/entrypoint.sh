#!/bin/sh
# Starts nats-server (or any command given) with each password, read from
# the file NATS_TAILER_PASSWORD_FILE (and so on) names (compose secrets;
# the NATS_TAILER_PASSWORD variable itself where no file is named), quoted
# for nats.conf. The server parses a variable's value as configuration, so a
# bare password such as 12345, true, a{b} or one holding '#', ',' or a space
# would become a number, a map or a parse error; nats.conf reads the
# *_QUOTED forms, which are always strings. With NATS_TLS_CERT_FILE, the
# server takes clients over TLS only. With NATS_ROUTE_HOSTS (the cluster
# file's nodes), the route password too, and NATS_ROUTES: the route URL of
# each host, its password percent-encoded, for cluster.conf.
set -eu
quote() {
  printf '"%s"' "$(printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g')"
}
for v in NATS_TAILER_PASSWORD NATS_SUBSCRIBER_PASSWORD NATS_ADMIN_PASSWORD NATS_SYSTEM_PASSWORD; do
  eval "file=\${${v}_FILE:-}"
  if [ -n "$file" ]; then
    val=$(cat "$file")
  else
    eval "val=\${$v:-}"
  fi
  if [ -z "$val" ]; then
    echo "nats: neither ${v}_FILE nor $v is set" >&2
    exit 1
  fi
  export "${v}_QUOTED=$(quote "$val")"
done
if [ -n "${NATS_ROUTE_HOSTS:-}" ]; then
  if [ -n "${NATS_ROUTE_PASSWORD_FILE:-}" ]; then
    pw=$(cat "$NATS_ROUTE_PASSWORD_FILE")
  else
    pw=${NATS_ROUTE_PASSWORD:-}
  fi
  if [ -z "$pw" ]; then
    echo "nats: NATS_ROUTE_HOSTS is set, but neither NATS_ROUTE_PASSWORD_FILE nor NATS_ROUTE_PASSWORD" >&2
    exit 1
  fi
  export NATS_ROUTE_PASSWORD_QUOTED="$(quote "$pw")"
  # Every byte percent-encoded: the URL holds any password as it is.
  enc=$(printf '%s' "$pw" | od -An -tx1 -v | tr -d ' \n' | sed 's/../%&/g')
  routes=
  for h in $NATS_ROUTE_HOSTS; do
    routes="$routes${routes:+, }\"nats://route:$enc@$h:6222\""
  done
  export NATS_ROUTES="[$routes]"
fi
# TLS for clients (infra/docker-compose.tls.yml): the server's certificate
# and key, files the override mounts as secrets.
if [ -n "${NATS_TLS_CERT_FILE:-}" ]; then
  set -- "$@" --tls --tlscert "$NATS_TLS_CERT_FILE" --tlskey "${NATS_TLS_KEY_FILE:?NATS_TLS_KEY_FILE must be set with NATS_TLS_CERT_FILE}"
fi
exec "$@"
