// Package inbox takes the tailer's batches from the stream into a
// PostgreSQL database of the consumer's, exactly once: DB is the
// subscriber.Sink that stores the batches at hand in one transaction (a
// large message's in parts), as rows of an inbox table keyed by token key
// (Inbox) or as River jobs unique by token key (Jobs), or through a Table
// of one's own; up to four such transactions run side by side and commit
// in the order they were cut, and a batch is done once its transaction
// committed (its message acknowledged, a double ack, once all its batches
// are). A crash before the ack, or an ack lost on its way, delivers the
// message again, and storing it again adds only what is not there.
//
// A service that consumes the stream itself does the same inside its own
// transaction: decode with subscriber.Decode, Store in the transaction, commit,
// then DoubleAck.
//
// After the data path: a sink of publish/subscriber's subscriber that
// stores in the consumer's PostgreSQL.
package inbox
