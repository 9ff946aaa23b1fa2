// Package sim is the relay's deterministic simulation: models of the
// mailroom database (the WAL's token transactions, the slot, its record,
// the publication) and of a JetStream stream (ids, expected last
// sequence, purges, deletions, replicas, backups, limits), tailer run
// processes that carry a real relay.Relay's commands out against them,
// and the schedules rapid draws over them (Schedule). It holds no
// production code: publish/relay's TestSimulation runs it, and its
// own tests hold each model to the real server (nats-server, PostgreSQL).
//
// Where it sits: inside the relay's room (publish/relay), beside its
// core; nothing but tests imports it.
package sim
