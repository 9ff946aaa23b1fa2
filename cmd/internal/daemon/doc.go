// Package daemon is tailer run: it wires replication → decoder → batch →
// join → publish into the running service, with the embedded NATS
// server, the HTTP endpoints and metrics, the slot's sampler and the
// continuous audit. It decides nothing of a session's protocol: it
// carries out the commands of publish/relay's Relay (open, claim,
// check the stream, publish, stop, wait, retry) and tells it, as events,
// what the IO found.
//
// Wiring: cmd/tailer's run command builds a Daemon; nothing below cmd
// imports it.
package daemon
