// Package protocol holds the decisions of tailer subscribe as pure
// functions, and the durable's record (Progress) with its merge: what
// becomes of each batch of a delivered message, when the record must be
// read again and what to make of it, when a serial reader's record must
// be saved before it gets more, what a gap in a chain means, and how
// often the messages in hand and the pin are kept. No goroutines, no
// network, no clock: durations and what the record and the server said
// come in as arguments.
//
// Where it sits: the subscriber's core, beneath publish/subscriber, which
// carries the IO (JetStream, the records' bucket, the sinks), and beside
// publish/relay, the tailer's own (the relay's) core. Its simulation,
// publish/subscriber/sim, runs these decisions and this record
// against models of the servers.
package protocol
