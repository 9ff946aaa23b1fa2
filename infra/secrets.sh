#!/bin/sh
# Makes every secret of the compose stack that infra/secrets/ lacks: random
# passwords (files of mode 0444 in a directory of mode 0700, so that the
# containers, whatever user they run as, read their own through a bind
# mount and no other user of the host reaches them) and the signing
# keyring (mode 0400, owned by the tailer's uid 65532 when run as root).
# A secret already there is left as it is: replace a file's content to
# set your own value (any characters; one final newline is ignored).
#
# The services read them from /run/secrets (compose secrets): none is in
# a container's environment or configuration (docker inspect), nor on a
# command line.
set -eu
cd "$(dirname "$0")/secrets"
umask 077
for name in postgres_password owner_db_password tailer_db_password app_db_password exporter_db_password \
            nats_tailer_password nats_subscriber_password nats_admin_password nats_system_password nats_route_password \
            grafana_admin_password; do
  [ -s "$name" ] && continue
  head -c 24 /dev/urandom | base64 | tr -d '\n' >"$name"
  chmod 0444 "$name"
  echo "made infra/secrets/$name"
done
if [ ! -s mailroom_keyring ]; then
  printf 'k1 %s primary\n' "$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')" >mailroom_keyring
  if chown 65532:65532 mailroom_keyring 2>/dev/null; then
    chmod 0400 mailroom_keyring
  else
    # Not root: the tailer (uid 65532) could not read a 0400 file of
    # yours; the directory's 0700 still keeps the host's other users out.
    chmod 0444 mailroom_keyring
  fi
  echo "made infra/secrets/mailroom_keyring"
fi
chmod 0700 .
