#!/busybox/sh
# The compose file's nats-auth service, once before the NATS servers
# start: each NATS user's password (a compose secret) hashed with bcrypt
# into /auth/<user>.bcrypt, which the servers read (nats/entrypoint.sh)
# instead of the password. No server, and no environment of a running
# process, holds a password: nats server passwd takes it in its
# environment for the moment it hashes. Made again at every start, so
# that a password changed in infra/secrets takes effect with the next up.
# nats server passwd refuses a password shorter than 10 characters.
set -eu
umask 077
for u in tailer subscriber admin system; do
  PASSWORD=$(cat "/run/secrets/nats_${u}_password") nats server passwd >"/auth/$u.bcrypt.new" </dev/null
  mv "/auth/$u.bcrypt.new" "/auth/$u.bcrypt"
done
echo "nats-auth: bcrypt hashes of 4 NATS users' passwords in /auth"
