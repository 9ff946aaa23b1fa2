#!/bin/sh
# nats (the NATS CLI) as the operator's users of infra/nats/nats.conf:
# `nats server ...` (reports of the servers and the cluster) as system,
# in the system account; everything else (streams, consumers, backups) as
# admin, in the MAILROOM account. Each password is read from its compose
# secret into the CLI's environment: never on a command line, never in
# the container's configuration.
set -eu
case "${1:-}" in
  server) user=system secret=/run/secrets/nats_system_password ;;
  *) user=admin secret=/run/secrets/nats_admin_password ;;
esac
NATS_USER=$user NATS_PASSWORD=$(cat "$secret")
export NATS_USER NATS_PASSWORD
exec nats "$@"
