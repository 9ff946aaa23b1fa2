// Package wal names a place in the WAL: an LSN, and a token's Position (its
// transaction's commit and its index among the transaction's tokens).
//
// Data path, beneath the decoder that reads positions from pgoutput and
// beside it: the batcher, the relay's core (publish/relay), the publisher
// and the subscriber's side all hold positions as this one type. Standard
// library only, so that the relay's core stays pure.
package wal
