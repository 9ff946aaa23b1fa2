// Package tailertest holds what the tailer's integration tests share: a
// migrated mailroom database with the questions tests ask it (WAL and slot
// positions), the stream's messages read back, and a buffer for a tailer's
// output that tests read while it writes.
//
// The servers themselves come from pgtest (PostgreSQL) and the tests'
// embedded NATS servers. It does not import the packages under test, so
// that their own tests can use it.
//
// Test support: helpers shared by the integration tests.
package tailertest
