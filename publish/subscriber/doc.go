// Package subscriber is for programs that read the tailer's stream: it decodes
// a published batch (line or json) into typed tokens with their ids, writes
// collector-compatible lines, and keeps a bounded window of token ids seen,
// so that a redelivered or re-published batch is processed once per token.
//
// Subscriber is the one loop that reads a durable consumer for every
// output: it hands the batches of each message to a Sink (Lines for
// lines, inbox.DB for a database, or one's own), keeps the durable's
// record of which are done, and acknowledges a message once all are.
//
// The header names and formats are package wire's, which the tailer writes
// with. It depends on nats.go for the header type and the stream reads; it
// does not pull in the tailer's PostgreSQL or server code.
//
// Where it sits: the last stage of the data path, the subscriber's room
// of publish, beside the relay (publish/relay), reading what the relay
// wrote to the stream; it imports nothing of the relay. Its core is
// publish/subscriber/protocol, its simulation publish/subscriber/sim,
// its database sinks publish/subscriber/inbox; the formats it reads are
// publish/token's and publish/wire's, beneath both rooms.
package subscriber
