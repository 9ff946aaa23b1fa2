package protocol

// GapVerdict is what became of a message a subject's chain says came
// before the one delivered, and that this subscriber was never given.
type GapVerdict uint8

const (
	// NotMissing: the sink stored it; or the stream holds it, and the
	// durable pins one subscriber at a time: a subscriber of the durable
	// had it before this one took over (and died before its record said
	// so); or the durable is shared by its subscribers, one of which had
	// it.
	NotMissing GapVerdict = iota
	// RemovedFirst: the stream no longer holds it: removed (a limit, a
	// purge, a delete) before this durable read it; its tokens reach no
	// reader until tailer resync publishes them again.
	RemovedFirst
	// TakenElsewhere: the stream holds it, and the durable does not pin
	// one subscriber: another client of the durable was given it (a
	// second subscriber, nats consumer next), and this subscriber never
	// wrote its tokens.
	TakenElsewhere
)

// OnGap decides what a gap in the chain is, by whether the stream holds
// the message it names where it names it (there), whether the sink's own
// record says it stored a token of that message (stored: a subscriber of
// the durable had it, whatever the stream and the record of progress
// say since; an inbox stores a message in the transaction its subscriber
// may die after, before its record of progress says so), whether the durable
// pins one subscriber (pinned), and whether it is shared by design
// (shared: its sink keeps each token once by key and a record of its
// own, the inbox or River, so that several subscribers pull from one
// durable, each given a share of every chain). On a pinned durable a
// client that is not the pinned subscriber is refused by the server, so
// a message the stream holds went to a subscriber of the durable; on a
// shared one it went to another of its subscribers, and what reached the
// sink is proved by content (tailer audit --durable).
func OnGap(there, stored, pinned, shared bool) GapVerdict {
	switch {
	case stored:
		return NotMissing
	case !there:
		return RemovedFirst
	case pinned, shared:
		return NotMissing
	}
	return TakenElsewhere
}
