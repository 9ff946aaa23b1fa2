#!/busybox/sh
# The compose file's nats-auth service, once before the NATS servers
# start: each NATS user's password (a compose secret) hashed with bcrypt
# into /auth/<user>.bcrypt, which the servers read (nats/entrypoint.sh)
# instead of the password. No server, no command line and no
# environment holds a password: tailer nats-passwd reads it on stdin
# (nats server passwd took it in its environment, seen there by a
# sampler of /proc). Made again at every start, so that a password
# changed in infra/secrets takes effect with the next up. A password
# shorter than 10 characters is refused.
set -eu
umask 077
for u in tailer subscriber admin system; do
  tailer nats-passwd <"/run/secrets/nats_${u}_password" >"/auth/$u.bcrypt.new"
  mv "/auth/$u.bcrypt.new" "/auth/$u.bcrypt"
done
echo "nats-auth: bcrypt hashes of 4 NATS users' passwords in /auth"
