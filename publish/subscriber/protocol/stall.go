package protocol

import "time"

// Stall follows a reader from look to look, to tell a slow one from one
// that stalled: it has had lines waiting (in its pipe, or taken and not
// finished) for longer than the stall timeout without taking a byte of
// them or finishing a batch. A reader idle with nothing waiting is not
// stalled, however long; a slow one finishes a batch within the timeout.
// The zero Stall has not looked yet.
type Stall struct {
	lastMove               time.Time
	lastUnread, lastFinish int
	waiting                bool
}

// Moved notes that the reader moved at now (a sender started again).
func (s *Stall) Moved(now time.Time) { s.lastMove = now }

// Look notes what a look at now found (unread: bytes waiting in its pipe;
// handed: batches it took and did not finish; finished: batches finished
// so far) and reports whether the reader stalled for longer than d.
//
// Lines found waiting where the look before found none count from this
// look, not from that one: they came in between, maybe just now, and
// counted from before they came a stall was said up to a look early
// (the simulation: said of a sender that had taken its line 9.2 s
// before, with a timeout of 10 s).
func (s *Stall) Look(now time.Time, unread, handed, finished int, d time.Duration) bool {
	waiting := unread > 0 || handed > 0
	if !waiting || !s.waiting || unread < s.lastUnread || finished != s.lastFinish || s.lastMove.IsZero() {
		s.lastMove = now
	}
	s.lastUnread, s.lastFinish, s.waiting = unread, finished, waiting
	return waiting && now.Sub(s.lastMove) > d
}

// StallLookEvery is how often a stall is looked for, so that it is said
// within the stall timeout d and a few seconds: half of d, at most 5 s.
func StallLookEvery(d time.Duration) time.Duration {
	return min(5*time.Second, d/2+time.Millisecond)
}
