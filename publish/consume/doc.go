// Package consume is for programs that read the tailer's stream: it decodes
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
// After the data path: the consumers' side, reading what publish wrote
// to the stream; it imports nothing of the producer.
package consume
