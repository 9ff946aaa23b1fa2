package protocol

// PlanBatch is one batch of a delivered message as the plan sees it.
type PlanBatch struct {
	// Done: the durable's record says a reader finished it.
	Done bool
	// Attempts counts the readers that failed with it taken.
	Attempts int
	// Tokens counts its tokens of the subscriber's action (all of them
	// without one).
	Tokens int
}

// Rules are the settings a plan follows: a batch on which MaxDeliveries
// readers failed (0: no bound) is set aside, when there is somewhere to
// set it (DeadLetters).
type Rules struct {
	MaxDeliveries int
	DeadLetters   bool
}

// Delivery is a delivered message as the plan sees it: its stream
// sequence, the record's floor (every message up to it is done), whether
// the record says it was acknowledged, whether this subscriber holds it
// already, and its batches.
type Delivery struct {
	Seq, Floor uint64
	Acked      bool
	// Held: this subscriber was given the message before and holds it,
	// its batches with the sink or waiting for it. The server delivers
	// it again when another subscriber's nak lands after the message
	// went to this one: the server takes a nak by stream sequence, of
	// whichever delivery.
	Held    bool
	Batches []PlanBatch
}

// Fate is what becomes of one batch.
type Fate uint8

const (
	// DoneBefore: skipped, a reader finished it before.
	DoneBefore Fate = iota
	// Hand: handed to the sink.
	Hand
	// SetAside: set aside as a dead letter.
	SetAside
	// NothingForSink: none of its tokens is of the subscriber's action;
	// done as it is.
	NothingForSink
)

// Plan decides every batch of m. Acknowledge says the message was done
// before (its ack was lost, or the consumer was made again below it): it
// is acknowledged again and nothing of it handed on; fates is nil then.
// Fates is nil too, and nothing acknowledged, for a message held: what
// is in hand finishes it (handed again, its batches were written twice:
// the simulation's frozen subscriber, woken after its message went to
// the other, naked it under that one).
func Plan(m Delivery, r Rules) (fates []Fate, acknowledge bool) {
	if m.Seq <= m.Floor || m.Acked || allDone(m.Batches) {
		return nil, true
	}
	if m.Held {
		return nil, false
	}
	fates = make([]Fate, len(m.Batches))
	for i, b := range m.Batches {
		fates[i] = fate(b, r)
	}
	return fates, false
}

// fate is what becomes of b, of a message not done before.
func fate(b PlanBatch, r Rules) Fate {
	if b.Done {
		return DoneBefore
	}
	if r.MaxDeliveries > 0 && r.DeadLetters && b.Attempts >= r.MaxDeliveries {
		return SetAside
	}
	if b.Tokens == 0 {
		return NothingForSink
	}
	return Hand
}

// allDone reports whether the record says every batch is done.
func allDone(bs []PlanBatch) bool {
	for _, b := range bs {
		if !b.Done {
			return false
		}
	}
	return true
}
