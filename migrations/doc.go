// Package migrations holds the mailroom schema and the tailer's publication
// as golang-migrate migrations embedded in the binary.
//
// Before the data path: the schema, triggers and slot records every other
// package relies on.
package migrations
