#!/usr/bin/env bash
# Checks the compose stack, alone and with the cluster or the TLS file added
# (or both, with the cluster-TLS file), with
# Docker Compose v2 (`docker compose config`; no Docker engine needed): it
# resolves with nothing in the environment; no service has a password in
# its environment or command (each reads its own from a compose secret,
# a file under infra/secrets); every service drops every capability it is
# not given back, sets no-new-privileges, rotates its logs and has a memory
# and CPU limit; none runs as root but the two that must start so.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/compose-lib.sh
if ! command -v python3 >/dev/null; then
  echo "skip: the checks read compose's JSON with python3, which is missing"
  exit 0
fi

resolved=$(mktemp)
trap 'rm -f "$resolved"' EXIT
single=(-f infra/docker-compose.yml)
cluster=(-f infra/docker-compose.yml -f infra/docker-compose.cluster.yml)
tls=(-f infra/docker-compose.yml -f infra/docker-compose.tls.yml)
clustertls=("${cluster[@]}" -f infra/docker-compose.tls.yml -f infra/docker-compose.cluster-tls.yml)
for files in "${single[*]}" "${cluster[*]}" "${tls[*]}" "${clustertls[*]}"; do
  read -ra f <<<"$files"
  env -i PATH="$PATH" HOME="$HOME" "${compose[@]}" "${f[@]}" --profile "*" config --format json >"$resolved"
  python3 - "$resolved" <<'PY'
import json, re, sys
c = json.load(open(sys.argv[1]))
bad = []
# Root at the start, by design: PostgreSQL prepares its volume then runs
# as postgres; nats-volume gives NATS its volume.
root_ok = {"postgres", "nats-volume"}
images_user = {"migrate", "tailer", "subscriber", "nats-exporter"}  # the image says nonroot
for name, s in c["services"].items():
    for k, v in (s.get("environment") or {}).items():
        if re.search(r"PASSWORD|SECRET|TOKEN", k) and not k.endswith("_FILE") and k != "GF_SECURITY_ADMIN_PASSWORD__FILE":
            bad.append(f"{name}: {k} in the environment")
    for arg in (s.get("command") or []) + (s.get("entrypoint") or []):
        if "PASSWORD" in arg:
            bad.append(f"{name}: a password on the command line: {arg}")
    if s.get("cap_drop") != ["ALL"]:
        bad.append(f"{name}: cap_drop {s.get('cap_drop')}, want [ALL]")
    if "no-new-privileges:true" not in (s.get("security_opt") or []):
        bad.append(f"{name}: no no-new-privileges")
    log = s.get("logging") or {}
    if log.get("driver") != "json-file" or "max-size" not in (log.get("options") or {}):
        bad.append(f"{name}: logs not rotated: {log}")
    long_running = s.get("restart") != "no"
    if long_running and not s.get("mem_limit"):
        bad.append(f"{name}: no memory limit")
    if long_running and not s.get("cpus"):
        bad.append(f"{name}: no CPU limit")
    user = s.get("user")
    if name not in root_ok and name not in images_user and (not user or user.split(":")[0] in ("root", "0")):
        bad.append(f"{name}: runs as {user or 'the image default'}")
    if name not in root_ok and s.get("cap_add"):
        bad.append(f"{name}: capabilities added back: {s['cap_add']}")
for name, sec in (c.get("secrets") or {}).items():
    if "/infra/secrets/" not in sec.get("file", ""):
        bad.append(f"secret {name}: not a file under infra/secrets: {sec}")
# With TLS, every client of PostgreSQL checks its certificate and name.
for name, s in c["services"].items():
    for k, v in (s.get("environment") or {}).items():
        if "tls_ca" in str(c.get("secrets")) and re.match(r"postgres(ql)?://", str(v)) and "sslmode=verify-full" not in v:
            bad.append(f"{name}: {k} does not verify PostgreSQL's certificate (sslmode=verify-full)")
# A cluster's nodes route with the route password, and with TLS, over TLS
# with clients over TLS too.
tls = "tls_ca" in str(c.get("secrets"))
nodes = [n for n in ("nats", "nats-2", "nats-3") if n in c["services"]]
if len(nodes) == 3:
    for name in nodes:
        s = c["services"][name]
        env, cmd = s.get("environment") or {}, " ".join(s.get("command") or [])
        conf = "/etc/nats/cluster-tls.conf" if tls else "/etc/nats/cluster.conf"
        if f"--config {conf}" not in cmd:
            bad.append(f"{name}: runs {cmd!r}, want --config {conf}")
        if not env.get("NATS_ROUTE_PASSWORD_FILE") or not env.get("NATS_ROUTE_HOSTS"):
            bad.append(f"{name}: routes without the route password")
        if tls and not env.get("NATS_TLS_CERT_FILE"):
            bad.append(f"{name}: clients in the clear")
pg = c["services"]["postgres"]
if pg.get("stop_signal") != "SIGINT" or not pg.get("stop_grace_period"):
    bad.append("postgres: stop_signal SIGINT and a grace period, for a clean shutdown")
if bad:
    print("FAIL:\n  " + "\n  ".join(bad))
    sys.exit(1)
PY
  echo "ok: $files"
done
