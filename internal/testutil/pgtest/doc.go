// Package pgtest runs a throwaway PostgreSQL server with wal_level=logical
// for tests and benchmarks: initdb into a temporary directory, pg_ctl on a
// free loopback port. PostgreSQL refuses to run as root, so when the caller
// is root the server runs as the "postgres" user (or $TAILER_PG_USER).
//
// Test support: real PostgreSQL servers for the tests.
package pgtest
