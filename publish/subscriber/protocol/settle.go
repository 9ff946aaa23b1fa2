package protocol

// ReaderEnd is how a reader ended, as settling the batches it held needs
// it.
type ReaderEnd struct {
	// Done: it read to the end of its input and said it finished
	// everything; Failed: it failed with batches in hand; Took: it ended
	// on its own saying it finished what it took (exit 0), which a
	// pipe's reader took whole.
	Done, Failed, Took bool
	// Reports: it reports each line it finished, and only those are done.
	Reports bool
	// Pipe: it read from a pipe, of which it took Taken bytes; Ends are
	// where each batch handed to it ends in the pipe, oldest first.
	Pipe  bool
	Taken int64
	Ends  []int64
}

// AfterReaderEnd decides the batches a reader held as it ended: how many of
// them, oldest first, are done (all when it said it finished everything,
// those it took whole when it said it finished what it took; none from
// a reader that reports line by line), and the one its failure counts
// against (-1: none), the oldest it took whole: a reader that keeps
// failing on one batch fails there first. A reader not fed through a
// pipe took each batch handed to it.
func AfterReaderEnd(e ReaderEnd) (done int, blamed int) {
	switch {
	case e.Reports:
	case e.Done:
		return len(e.Ends), -1
	case e.Took:
		for done < len(e.Ends) && (!e.Pipe || e.Ends[done] <= e.Taken) {
			done++
		}
		return done, -1
	}
	if !e.Failed {
		return 0, -1
	}
	for i, end := range e.Ends {
		if end <= e.Taken || !e.Pipe {
			return 0, i
		}
	}
	return 0, -1
}

// Drain is what a subscriber that runs until drained (tailer dead-letters
// resend) sees of itself and of its consumer.
type Drain struct {
	// Handling: a delivery is being taken or handed on; InDoubt: a pipe's
	// reader has batches it has not settled by waiting for more; Acking:
	// a message's ack is on its way, unanswered.
	Handling, InDoubt, Acking bool
	// Pending: messages the consumer has not delivered; AckPending: those
	// delivered and not acknowledged; Holding: those this subscriber
	// holds.
	Pending, AckPending, Holding int
}

// Drained reports whether a subscriber that runs until drained may stop:
// nothing left to deliver, every message delivered held here, none being
// handled or acknowledged, nothing in doubt. Stopped while an ack was on
// its way, the ack was cut short, the message came again to a subscriber
// whose record said it was done, and the dead letter, delivered, was
// never removed (issue 45: two resends at once).
func Drained(d Drain) bool {
	return !d.Handling && !d.InDoubt && !d.Acking && d.Pending == 0 && d.AckPending == d.Holding
}
