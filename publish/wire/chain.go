package wire

import (
	"fmt"
	"strconv"
)

// ChainStart is HeaderPrev on the first batch message of a subject.
const ChainStart = "none"

// IDMark is the Mark of a message published with Nats-Msg-Id id.
func IDMark(id string) string { return "id:" + id }

// Chain is what a reader was given of the tailer's chains (HeaderPrev):
// the newest batch message on each subject, which the next one there
// must follow.
type Chain struct {
	Subjects map[string]Anchor `json:"subjects,omitempty"`
	// Seed is the newest message a reader handled, of a subject it does
	// not know (the inbox keeps the last message it stored, not its
	// subject). Until a subject's newest is known, a message there that
	// names a predecessor past the seed, or another at its sequence,
	// follows one the reader never had. A seed without a Mark names a
	// place only (a consumer's ack floor: every message up to it was
	// handled, whatever stands there now).
	Seed Anchor `json:"seed,omitzero"`
}

// Gap is a batch message whose predecessor on its subject is not the
// newest one its reader was given there: the messages between were
// removed from the stream before they were read (the subject purged,
// messages deleted, a limit), or the stream is not the one the reader read
// before. Their tokens reach no reader until tailer resync publishes them
// again.
type Gap struct {
	Subject string
	// Seq is the stream sequence of the message after the gap, and Prev
	// what it names as its predecessor.
	Seq  uint64
	Prev Anchor
	// Given is the newest message given on Subject before it (or the
	// Seed).
	Given Anchor
	// Resynced: the message after the gap is a resync's (HeaderResync),
	// which publishes every token still eligible again, those removed
	// too.
	Resynced bool
}

func (g *Gap) Error() string {
	return fmt.Sprintf("the stream lacks messages on %s before sequence %d: that message follows %s at sequence %d, and the last one this reader had was %s at sequence %d",
		g.Subject, g.Seq, g.Prev.Mark, g.Prev.Seq, g.Given.Mark, g.Given.Seq)
}

// Follow notes the batch message of mark at seq on subject, with headers
// h (its predecessor in HeaderPrev and HeaderPrevSeq; none from a tailer
// before the chain), as given to the reader; again: it was delivered
// before. It returns the gap before the message, if it is newer than the
// newest given on subject and does not follow it. A message delivered
// again says nothing: a reader that does not remember what was given
// before it cannot tell.
func (c *Chain) Follow(subject string, seq uint64, h Header, mark string, again bool) *Gap {
	if c.Subjects == nil {
		c.Subjects = map[string]Anchor{}
	}
	given, known := c.Subjects[subject]
	if known && seq <= given.Seq {
		return nil
	}
	c.Subjects[subject] = Anchor{Seq: seq, Mark: mark}
	prev := Anchor{Mark: h.Get(HeaderPrev)}
	prev.Seq, _ = strconv.ParseUint(h.Get(HeaderPrevSeq), 10, 64)
	if again || prev.Mark == "" {
		return nil
	}
	switch {
	case known && prev.Mark == given.Mark:
		return nil
	case !known:
		seed := c.Seed
		if seed.Seq == 0 || seq <= seed.Seq || prev.Seq < seed.Seq || prev == seed || prev.Seq == seed.Seq && seed.Mark == "" {
			return nil
		}
		given = seed
	}
	return &Gap{Subject: subject, Seq: seq, Prev: prev, Given: given, Resynced: h.Get(HeaderResync) != ""}
}

// Absorb takes, subject by subject and for the seed, the newer of c's and
// o's anchors; it reports whether c changed.
func (c *Chain) Absorb(o Chain) bool {
	changed := false
	for subject, a := range o.Subjects {
		if a.Seq > c.Subjects[subject].Seq {
			if c.Subjects == nil {
				c.Subjects = map[string]Anchor{}
			}
			c.Subjects[subject], changed = a, true
		}
	}
	if o.Seed.Seq > c.Seed.Seq {
		c.Seed, changed = o.Seed, true
	}
	return changed
}
