// Package sim is the subscriber's deterministic simulation: models of a
// JetStream stream and of a durable pull consumer with a pinned priority
// group (pinned TTL, ack wait, redelivery, in-progress, naks), of the
// durable's record in a KV bucket (revisions, compare-and-swap, a bucket
// that does not answer or loses its answers; read and written through the
// shipping subscriber.KVProgress), of sinks (a sender reporting each
// line, slow, stalling, failing or killed, ending each way the docs name;
// an inbox table that keeps each token once), and tailer subscribe
// processes that step protocol.Machine and carry out what it is to do as
// publish/subscriber does, killed, frozen and started again; in the
// profile resends, tailer dead-letters resend runs, each ending once
// drained. Schedule draws schedules over them. It holds no production
// code: publish/subscriber/protocol's TestSimulation runs it.
//
// Where it sits: inside the subscriber's room (publish/subscriber), beside
// its core; nothing but tests imports it.
package sim
