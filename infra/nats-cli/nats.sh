#!/bin/sh
# nats (the NATS CLI) as the operator's users of infra/nats/nats.conf:
# `nats server ...` (reports of the servers and the cluster) as system,
# in the system account; everything else (streams, consumers, backups) as
# admin, in the MAILROOM account. Each password is read from its compose
# secret into a context file of the CLI's on the tmpfs (HOME=/tmp), mode
# 0600: never on a command line, in a process's environment or in the
# container's configuration.
set -eu
case "${1:-}" in
  server) user=system secret=/run/secrets/nats_system_password ;;
  *) user=admin secret=/run/secrets/nats_admin_password ;;
esac
# The CLI finds contexts under XDG_CONFIG_HOME only, not under HOME.
XDG_CONFIG_HOME=${XDG_CONFIG_HOME:-$HOME/.config}
export XDG_CONFIG_HOME
dir=$XDG_CONFIG_HOME/nats/context
umask 077
mkdir -p "$dir"
# JSON strings: backslash and quote escaped (the stack's passwords hold no
# control character).
json() { printf '"%s"' "$(printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g')"; }
printf '{"user": %s, "password": %s}\n' "$(json "$user")" "$(json "$(cat "$secret")")" >"$dir/operator.json"
exec nats --context operator "$@"
