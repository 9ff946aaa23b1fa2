// Package natsconn connects a command to NATS as its settings say: to
// MAILROOM_NATS_URL with its credentials and TLS, or to an embedded server
// it starts on MAILROOM_DATA_DIR when no URL is set.
//
// Wiring: tailer run and tailer resync connect through it.
package natsconn
