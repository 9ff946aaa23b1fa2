// Package pgtest gives tests real PostgreSQL servers (internal/pgserver):
// Shared hands each test a server of its own from a pool that Main stops
// after the run, and Exec and WalLSN fail the test on error.
//
// Test support: real PostgreSQL servers for the tests.
package pgtest
