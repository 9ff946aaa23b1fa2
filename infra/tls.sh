#!/bin/sh
# Makes what infra/docker-compose.tls.yml needs that infra/secrets/tls/
# lacks: a CA of the stack's own (ten years), and certificates it signs
# for PostgreSQL (DNS name postgres) and NATS (nats, nats-2, nats-3, for
# the nodes' routes too), each also valid for localhost and 127.0.0.1
# (one year; delete a pair and run
# this again to renew it, then restart its service). Certificates are
# mode 0444; each private key 0400, owned by the uid of the service that
# reads it when run as root (NATS 1000; PostgreSQL's entrypoint copies its
# own as root), else 0444 in the directory of mode 0700, as
# infra/secrets.sh does. The CA's key never leaves the host.
set -eu
command -v openssl >/dev/null || { echo "infra/tls.sh: openssl is missing" >&2; exit 1; }
mkdir -p "$(dirname "$0")/secrets/tls"
cd "$(dirname "$0")/secrets/tls"
umask 077
if [ ! -s ca.crt ]; then
  openssl req -x509 -newkey rsa:3072 -nodes -days 3650 -subj "/CN=mailroom stack CA" \
    -keyout ca.key -out ca.crt 2>/dev/null
  chmod 0400 ca.key
  chmod 0444 ca.crt
  echo "made infra/secrets/tls/ca.crt"
fi
cert() { # name, uid that reads the key, subjectAltName, extendedKeyUsage
  [ -s "$1.crt" ] && return 0
  openssl req -newkey rsa:3072 -nodes -subj "/CN=$1" -keyout "$1.key" -out "$1.csr" 2>/dev/null
  printf 'subjectAltName=%s\nextendedKeyUsage=%s\n' "$3" "$4" >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 365 -extfile "$1.ext" -out "$1.crt" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
  chmod 0444 "$1.crt"
  if [ "$2" != - ] && chown "$2" "$1.key" 2>/dev/null; then
    chmod 0400 "$1.key"
  else
    chmod 0444 "$1.key"
  fi
  echo "made infra/secrets/tls/$1.crt"
}
cert postgres - "DNS:postgres,DNS:localhost,IP:127.0.0.1" serverAuth
# A cluster node dials the other nodes' routes with its certificate, and
# they require one (cluster-tls.conf): clientAuth too. One made before
# it was is made again; restart the NATS services to load it.
if [ -s nats.crt ] && ! openssl x509 -in nats.crt -noout -text | grep -q 'TLS Web Client Authentication'; then
  rm -f nats.crt nats.key
  echo "infra/tls.sh: nats.crt lacked clientAuth, which the cluster's routes need: making it again" >&2
fi
cert nats 1000 "DNS:nats,DNS:nats-2,DNS:nats-3,DNS:localhost,IP:127.0.0.1" serverAuth,clientAuth
chmod 0700 .
