package subscriber

import (
	"sync/atomic"
	"time"
)

// counts are a subscriber's Stats as they are counted: each on its own,
// from whichever goroutine counts it; none guards a decision, and none
// waits on the machine's lock.
type counts struct {
	messages, redelivered, acked, batches, skipped  atomic.Int64
	deadLetters, readerFailures, recreated, stoodBy atomic.Int64
	// lastDelivery and lastDone are Unix nanoseconds (0: never).
	lastDelivery, lastDone atomic.Int64
	noRoom                 atomic.Pointer[string]
}

// stats are the counts as Stats.
func (c *counts) stats() Stats {
	st := Stats{
		Messages: int(c.messages.Load()), Redelivered: int(c.redelivered.Load()), Acked: int(c.acked.Load()),
		Batches: int(c.batches.Load()), Skipped: int(c.skipped.Load()), DeadLetters: int(c.deadLetters.Load()),
		ReaderFailures: int(c.readerFailures.Load()), Recreated: int(c.recreated.Load()), StoodBy: int(c.stoodBy.Load()),
		LastDelivery: unixTime(c.lastDelivery.Load()), LastDone: unixTime(c.lastDone.Load()),
	}
	if why := c.noRoom.Load(); why != nil {
		st.NoRoom = *why
	}
	return st
}

// setNoRoom keeps why a save found no room ("": it found room), and
// returns what was kept before.
func (c *counts) setNoRoom(why string) (was string) {
	if old := c.noRoom.Swap(&why); old != nil {
		return *old
	}
	return ""
}

// unixTime is Unix nanoseconds n as a time (the zero time for 0).
func unixTime(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}
