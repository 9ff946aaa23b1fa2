// Package tailertest holds what the tailer's integration tests share that
// belongs to no stage of the data path: waiting for a condition, and a
// buffer for a tailer's output that tests read while it writes.
//
// A migrated database is migrations/migratetest's; a stream read back is
// publish/wire/wiretest's. Test support: it imports nothing of the tailer,
// so that every package's tests can use it.
package tailertest
