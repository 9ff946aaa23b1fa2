// Package embedded runs an in-process NATS server with JetStream, the
// tailer's default when no NATS URL is configured.
//
// Beside the data path: the NATS server tailer run can start in-process
// when no MAILROOM_NATS_URL is given.
package embedded
