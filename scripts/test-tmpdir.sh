#!/usr/bin/env bash
# Prints the directory the tests keep their files in: /dev/shm when it is a
# writable, executable memory file system with 4 GiB free, else $TMPDIR or
# /tmp. The tests start dozens of PostgreSQL and NATS servers whose files
# are thrown away; on a disk their writes, fsyncs and the discards of their
# deletion cost more CPU than the tests themselves.
set -euo pipefail
fallback=${TMPDIR:-/tmp}
dir=/dev/shm
if [ -d "$dir" ] && [ -w "$dir" ] &&
  ! findmnt -no OPTIONS --target "$dir" 2>/dev/null | tr , '\n' | grep -qx noexec &&
  [ "$(df -Pk "$dir" | awk 'NR==2 {print $4}')" -gt $((4 * 1024 * 1024)) ]; then
  echo "$dir"
else
  echo "$fallback"
fi
