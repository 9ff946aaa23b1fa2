// Package resync recreates the tailer's slot from a snapshot and publishes,
// once, the tokens the stream lacks: after the server invalidated the slot
// (or it was dropped, or the database is a copy whose slot is not the
// stream's), or when adopting a database that ran mailroom's collector.
//
// The slot is created with an exported snapshot: every token committed
// before the slot's consistent point is visible in the snapshot, every later
// one is decoded from the slot by tailer run. In the snapshot the resync
// selects the tokens still to be mailed (join.Eligible, less what the
// collector sent before a cutover), reads the keys of the tokens the stream
// already holds (a short window: tokens live minutes), and publishes the
// rest through the same pipeline as tailer run: batches of the batch limit,
// joined, signed, published with their PubAcks awaited in order.
//
// The caller holds the slot's lease for all of it. The new incarnation is
// recorded as pending before the slot is created and marked done once its
// snapshot is on the stream; tailer run does not stream from a pending
// incarnation, and a resync that died half way is finished by running it
// again (the slot is made once more and the stream read again, so nothing
// is published twice).
//
// Beside the data path: an orchestrator above publish that re-publishes
// tokens from the database when the slot cannot be trusted.
package resync
