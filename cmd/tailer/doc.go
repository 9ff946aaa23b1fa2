// Command tailer publishes mailroom tokens from PostgreSQL's WAL to NATS
// JetStream. See the README for the commands and docs/configuration.md for
// the settings.
//
// Wiring only: the commands hand their work to the packages of the data
// path and to cmd/internal (see docs/architecture.md).
package main
