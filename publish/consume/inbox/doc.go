// Package inbox takes the tailer's batches from the stream into a
// PostgreSQL database of the consumer's, exactly once: the tokens of the
// messages at hand are stored in one transaction (a large message's in
// parts), as rows of an inbox table keyed by token key (Inbox) or as River
// jobs unique by token key (Jobs); up to four such transactions run side
// by side and commit in the order the messages came, and each message is
// acknowledged to JetStream (a double ack) only after its commit. A crash
// before the ack, or an ack lost on its way, delivers the message again,
// and storing it again adds only what is not there.
//
// A service that consumes the stream itself does the same inside its own
// transaction: decode with consume.Decode, Store in the transaction, commit,
// then DoubleAck.
//
// After the data path: a consumer of publish/consume's batches that
// stores them in the consumer's PostgreSQL.
package inbox
