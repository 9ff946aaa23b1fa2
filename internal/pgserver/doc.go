// Package pgserver runs a throwaway PostgreSQL server with
// wal_level=logical: initdb into a temporary directory (or a copy of one,
// see CopyInitdb), pg_ctl on a free loopback port, standbys and copies of
// a data directory for the fault tests. PostgreSQL refuses to run as root,
// so when the caller is root the server runs as the "postgres" user (or
// $TAILER_PG_USER).
//
// It imports no testing: cmd/bench runs its servers with it, and the
// tests through internal/testutil/pgtest, which adds a pool of servers
// shared by a test binary and helpers that fail a test.
//
// Support: not on the data path.
package pgserver
