// Package audit proves by content what the tailer's bookkeeping only
// says: every token of the database that was eligible when the slot
// confirmed past it is on the stream once, and, for a durable, in what
// that durable delivered. It reads the database from one snapshot and
// the stream from the window's start by time (package subscriber's read-back,
// the one way the stream is read back), and changes nothing; healing
// publishes through package resync's path.
//
// Where it sits: beside the data path, after publish (it reads what
// publish wrote); tailer audit and tailer run's continuous audit
// (cmd/internal/daemon) call it.
package audit
