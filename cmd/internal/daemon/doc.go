// Package daemon wires the tailer's packages into the running service:
// replication -> decoder -> batch -> join -> publish, with the embedded NATS
// server, metrics and the retry loop around it.
//
// Wiring: runs the data path (replication → decoder → batch → publish)
// for tailer run.
package daemon
