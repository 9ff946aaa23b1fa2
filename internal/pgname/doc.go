// Package pgname names PostgreSQL objects by their schema, never by a
// connection's search_path.
//
// PostgreSQL's default search_path puts a schema named after the session's
// role ("$user") before public, and a database or role can set its own: a
// table called tokens or accounts in such a schema would be read in place
// of the real one, and the tailer would sign tokens for the addresses it
// holds. So every query of the tailer and of tailer subscribe names its
// tables through a Schema, and every connection they open sets its
// search_path to SearchPath (Isolate), whatever its URL, role or database
// asks.
//
// Wiring: used by every package that opens a connection or writes SQL
// (replication, publish/join, the inbox, the commands).
package pgname
