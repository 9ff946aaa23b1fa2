// Package replication owns the logical replication connection: it creates
// the pgoutput slot, starts streaming from the slot's confirmed position,
// answers keepalives and reports the position the caller may confirm. One
// goroutine (the one running Receiver.Run) reads and writes the connection.
//
// Data path, first step: the slot connection. It feeds the decoder's
// handler and confirms what batch says may be confirmed.
package replication
