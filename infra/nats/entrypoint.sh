#!/bin/sh
# Starts nats-server (or any command given) with each password, read from
# the file NATS_TAILER_PASSWORD_FILE (and so on) names (compose secrets;
# the NATS_TAILER_PASSWORD variable itself where no file is named), quoted
# for nats.conf. The server parses a variable's value as configuration, so a
# bare password such as 12345, true, a{b} or one holding '#', ',' or a space
# would become a number, a map or a parse error; nats.conf reads the
# *_QUOTED forms, which are always strings. With NATS_TLS_CERT_FILE, the
# server takes clients over TLS only.
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
# TLS for clients (infra/docker-compose.tls.yml): the server's certificate
# and key, files the override mounts as secrets.
if [ -n "${NATS_TLS_CERT_FILE:-}" ]; then
  set -- "$@" --tls --tlscert "$NATS_TLS_CERT_FILE" --tlskey "${NATS_TLS_KEY_FILE:?NATS_TLS_KEY_FILE must be set with NATS_TLS_CERT_FILE}"
fi
exec "$@"
