// Package inbox takes the tailer's batches from the stream into a
// PostgreSQL database of the consumer's, exactly once: each message's
// tokens are stored in one transaction (a large message's in parts, each
// in its own), as rows of an inbox table keyed by token key (Inbox) or as
// River jobs unique by token key (Jobs), and the message is acknowledged
// to JetStream (a double ack) only after every commit. A crash before the
// ack, or an ack lost on its way, delivers the message again, and storing
// it again adds only what is not there.
//
// A service that consumes the stream itself does the same inside its own
// transaction: decode with consume.Decode, Store in the transaction, commit,
// then DoubleAck.
//
// After the data path: a consumer of publish/consume's batches that
// stores them in the consumer's PostgreSQL.
package inbox
