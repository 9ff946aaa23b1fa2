// Package protocol holds decisions of tailer subscribe as pure functions:
// what becomes of each batch of a delivered message, when the durable's
// record must be read again and what to make of it, when a serial
// reader's record must be saved before it gets more, and how often the
// messages in hand and the pin are kept. No goroutines, no network, no
// clock: durations and what the record and the server said come in as
// arguments. publish/consume carries the IO.
package protocol
