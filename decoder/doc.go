// Package decoder turns pgoutput logical replication messages into typed
// token inserts, each carrying its WAL position.
//
// The decoder parses the pgoutput wire format itself rather than through a
// generic message tree: it is on the hot path of every token, so it copies
// only the columns the tailer needs into fixed-size fields and allocates
// nothing per row. It understands protocol versions 1 and 2, text and binary
// tuple formats, and buffers streamed (protocol v2) transactions until their
// Stream Commit.
//
// Data path, second step: between replication (raw pgoutput bytes) and
// batch (typed token events).
package decoder
