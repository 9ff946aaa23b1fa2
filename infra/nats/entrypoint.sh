#!/bin/sh
# Starts nats-server (or any command given) on a copy of its configuration
# completed with the secrets, which never enter a process's environment:
#
#   - each user's password, read from the file NATS_TAILER_PASSWORD_FILE
#     (and so on) names (the NATS_TAILER_PASSWORD variable itself where no
#     file is named): a bcrypt hash, as nats-auth.sh makes them for the
#     compose stack, or the password itself;
#   - with NATS_ROUTE_HOSTS (the cluster file's nodes), the route password
#     (NATS_ROUTE_PASSWORD_FILE) and the route URL of each host, the
#     password percent-encoded.
#
# They go into secrets.conf, quoted (the server parses a bare value as
# configuration: 12345, true, a{b} or a '#' would become a number, a map or
# a parse error), beside a copy of the --config file's directory in
# NATS_CONFIG_COPY (default /tmp/nats, a tmpfs), which nats.conf includes;
# the --config argument is pointed at the copy. With NATS_TLS_CERT_FILE,
# the server takes clients over TLS only.
set -eu
quote() {
  printf '"%s"' "$(printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g')"
}
# secret VAR: the content of the file ${VAR}_FILE names, or $VAR.
secret() {
  eval "file=\${${1}_FILE:-}"
  if [ -n "$file" ]; then
    cat "$file"
  else
    eval "printf '%s' \"\${$1:-}\""
  fi
}
copy=${NATS_CONFIG_COPY:-/tmp/nats}
umask 077
mkdir -p "$copy"
secrets=$copy/secrets.conf
: >"$secrets"
for v in NATS_TAILER_PASSWORD NATS_SUBSCRIBER_PASSWORD NATS_ADMIN_PASSWORD NATS_SYSTEM_PASSWORD; do
  val=$(secret "$v")
  if [ -z "$val" ]; then
    echo "nats: neither ${v}_FILE nor $v is set" >&2
    exit 1
  fi
  printf '%s_QUOTED: %s\n' "$v" "$(quote "$val")" >>"$secrets"
done
if [ -n "${NATS_ROUTE_HOSTS:-}" ]; then
  pw=$(secret NATS_ROUTE_PASSWORD)
  if [ -z "$pw" ]; then
    echo "nats: NATS_ROUTE_HOSTS is set, but neither NATS_ROUTE_PASSWORD_FILE nor NATS_ROUTE_PASSWORD" >&2
    exit 1
  fi
  # Every byte percent-encoded: the URL holds any password as it is.
  enc=$(printf '%s' "$pw" | od -An -tx1 -v | tr -d ' \n' | sed 's/../%&/g')
  routes=
  for h in $NATS_ROUTE_HOSTS; do
    routes="$routes${routes:+, }\"nats://route:$enc@$h:6222\""
  done
  printf 'NATS_ROUTE_PASSWORD_QUOTED: %s\nNATS_ROUTES: [%s]\n' "$(quote "$pw")" "$routes" >>"$secrets"
fi
# The configuration's directory copied beside secrets.conf, and --config
# pointed at the copy.
conf=
for a in "$@"; do
  [ "$conf" = next ] && conf=$a && break
  [ "$a" = --config ] && conf=next
done
if [ -n "$conf" ] && [ "$conf" != next ]; then
  cp "$(dirname "$conf")"/*.conf "$copy"/
  n=$#
  while [ "$n" -gt 0 ]; do
    a=$1
    shift
    [ "$a" = "$conf" ] && a=$copy/$(basename "$conf")
    set -- "$@" "$a"
    n=$((n - 1))
  done
fi
# TLS for clients (infra/docker-compose.tls.yml): the server's certificate
# and key, files the override mounts as secrets.
if [ -n "${NATS_TLS_CERT_FILE:-}" ]; then
  set -- "$@" --tls --tlscert "$NATS_TLS_CERT_FILE" --tlskey "${NATS_TLS_KEY_FILE:?NATS_TLS_KEY_FILE must be set with NATS_TLS_CERT_FILE}"
fi
exec "$@"
