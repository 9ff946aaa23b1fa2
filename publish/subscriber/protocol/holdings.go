package protocol

import (
	"slices"
	"time"
)

// Held is a message delivered and not acknowledged yet: its record, how
// many of its batches are not done, and whether its ack is on its way.
type Held struct {
	Seq     uint64
	Rec     *MessageProgress
	Pending int
	Acking  bool
	// Msg is the driver's handle of the delivery (a jetstream.Msg; the
	// simulation's message): the core never looks into it.
	Msg any
}

// Holdings is what a subscriber holds and the record of it: the messages
// delivered and not acknowledged, the durable's record (Progress) at the
// revision the subscriber last read or wrote, whether it changed since,
// the batches finished since it was saved, and the pin of the last
// delivery. The subscriber (publish/subscriber) and its simulation
// (publish/subscriber/sim) both keep theirs here: every change of it is
// one of these methods, made once. It does no IO and reads no clock; its
// owner guards it.
type Holdings struct {
	// Record is the durable's record as this subscriber knows it, Rev the
	// revision it read or wrote last.
	Record Progress
	Rev    uint64
	// Dirty: Record changed since it was saved.
	Dirty bool
	// TakenOver: a save was refused while messages were held; nothing
	// more of this subscriber's is written.
	TakenOver bool
	// DoneUnsaved counts the batches finished since Record was saved.
	DoneUnsaved int
	// Pin is the pin of the last message delivered ("": none).
	Pin  string
	held []*Held
	// missed counts the looks in a row that found the pin another's.
	missed int
}

// Holding reports whether any message is held.
func (h *Holdings) Holding() bool { return len(h.held) > 0 }

// Held returns the messages held, in delivery order.
func (h *Holdings) Held() []*Held { return slices.Clone(h.held) }

// Acking reports whether the ack of a message held is on its way.
func (h *Holdings) Acking() bool {
	return slices.ContainsFunc(h.held, func(x *Held) bool { return x.Acking })
}

// Reread notes a delivery of pin, idle after the last one: whether the
// record must be read again before it is taken (MustReread).
func (h *Holdings) Reread(pin string, idle time.Duration) bool {
	stale := MustReread(pin != h.Pin, h.Holding(), idle)
	h.Pin = pin
	return stale
}

// WatchesPin reports whether the pin is to be looked at now: while
// messages are held under a pin. Not, the watch starts over.
func (h *Holdings) WatchesPin() bool {
	if !h.Holding() || h.Pin == "" {
		h.missed = 0
		return false
	}
	return true
}

// PinSeen notes the pin the server gives the durable's group now ("":
// none), looked at a second after the last: whether this subscriber lost
// its pin, seen another's, or none, twice in a row (a consumer's new
// leader may not know its pin at once). Held messages kept alive by
// in-progress acks meanwhile would leave nothing for the server to
// deliver, and so nobody to pin: the pair stuck, both standing by.
func (h *Holdings) PinSeen(pinned string) (lost bool) {
	if pinned == h.Pin {
		h.missed = 0
		return false
	}
	if h.missed++; h.missed < 2 {
		return false
	}
	h.missed = 0
	return true
}

// PinnedHere reports whether the server pinning pinned ("": none) pins
// this subscriber: the one pinned is the one that saves over a late write
// of another's (the other writes nothing more once refused), and may let
// the server pin another at once as it stops.
func (h *Holdings) PinnedHere(pinned string) bool { return h.Pin != "" && pinned == h.Pin }

// Read decides on the record read again (cur at rev, held against the
// stream when it is another's): what to claim, and the decision and
// whether messages were held, for Claimed.
func (h *Holdings) Read(cur Progress, rev uint64) (claim Progress, decided Reread, holding bool) {
	holding = h.Holding()
	decided = AfterReread(holding, rev == h.Rev)
	switch decided {
	case KeepOwn:
		// A record of another stream dropped since stays dropped: read
		// back, that one would skip this stream's messages at its
		// sequences.
		claim = h.Record.Clone()
	case Merge:
		// What this subscriber finished and had not saved yet stays
		// known.
		claim = cur
		claim.Absorb(&h.Record)
	}
	return claim, decided, holding
}

// Claimed notes claim written at rev (Read's decision and holding). The
// record at rev is this subscriber's: a save refused before no longer
// holds it back (a save refused while it held a message it acknowledged
// all the same, then pinned again and claimed, it saved nothing more,
// and the next to deliver found its chain short of what it handed: a
// gap said of messages written; make sim, seed 1058058775, resends).
func (h *Holdings) Claimed(claim Progress, rev uint64, decided Reread, holding bool) {
	h.Rev, h.TakenOver = rev, false
	if decided == Merge {
		// The record written is this subscriber's from now on; with
		// KeepOwn it already was.
		h.Record = claim
	}
	if !holding {
		h.Dirty, h.DoneUnsaved = false, 0
	}
}

// Saw notes a message delivered at seq, of mark.
func (h *Holdings) Saw(seq uint64, mark string) {
	if h.Record.Saw(seq, mark) {
		h.Dirty = true
	}
}

// Taken is what becomes of a delivered message (Take).
type Taken struct {
	// Held is the message now held (nil: none); Fates its batches'.
	Held  *Held
	Fates []Fate
	// Ack: acknowledge it now, nothing for the sink.
	Ack bool
	// Skipped counts its batches done before, not handed again.
	Skipped int
	// Attempts counts, batch by batch, the readers that failed with it
	// taken (a dead letter's reason).
	Attempts []int
}

// Take takes a message delivered at seq, of mark, whose batches carry
// tokens (of the subscriber's action), under rules (Plan): a message to
// acknowledge, one the delivery in hand finishes, or one held, each of
// its batches to hand, to set aside, or done as it is.
func (h *Holdings) Take(seq uint64, mark string, tokens []int, rules Rules, msg any) Taken {
	rec := h.Record.MessageAt(seq, mark, len(tokens))
	batches := make([]PlanBatch, len(tokens))
	for i, n := range tokens {
		batches[i] = PlanBatch{Done: rec.Done.Has(i), Attempts: rec.Attempts[i], Tokens: n}
	}
	inHand := slices.ContainsFunc(h.held, func(x *Held) bool { return x.Rec == rec && !x.Acking })
	fates, ack := Plan(Delivery{Seq: seq, Floor: h.Record.Floor, Acked: rec.Acked, Held: inHand, Batches: batches}, rules)
	if ack {
		return Taken{Ack: true, Skipped: rec.Batches}
	}
	if fates == nil {
		return Taken{}
	}
	held := &Held{Seq: seq, Rec: rec, Msg: msg}
	h.held = append(h.held, held)
	h.Dirty = true
	t := Taken{Held: held, Fates: fates, Attempts: make([]int, len(tokens))}
	for i, f := range fates {
		t.Attempts[i] = rec.Attempts[i]
		switch f {
		case DoneBefore:
			t.Skipped++
		case SetAside, Hand:
			held.Pending++
		case NothingForSink:
			rec.Done.Add(i)
		}
	}
	return t
}

// Finished notes batch line of m done: whether all of m's are.
func (h *Holdings) Finished(m *Held, line int) (complete bool) {
	m.Rec.Finished(line)
	h.Dirty = true
	h.DoneUnsaved++
	m.Pending--
	return m.Pending == 0
}

// ToAck are those of ms all of whose batches are done and whose ack is
// not on its way yet: their acks are on their way from now.
func (h *Holdings) ToAck(ms ...*Held) []*Held {
	var ready []*Held
	for _, m := range ms {
		if !m.Acking && m.Pending == 0 {
			m.Acking = true
			ready = append(ready, m)
		}
	}
	return ready
}

// Unsent notes the acks of ms not sent after all (the record not saved).
func (h *Holdings) Unsent(ms []*Held) {
	for _, m := range ms {
		m.Acking = false
	}
}

// Acked notes m's ack answered: confirmed (ok), the record says so.
func (h *Holdings) Acked(m *Held, ok bool) {
	h.held = slices.DeleteFunc(h.held, func(x *Held) bool { return x == m })
	if ok {
		m.Rec.Acked = true
		h.Dirty = true
	}
}

// Blame counts a failed attempt against batch line of m (a reader that
// failed with it taken and not finished).
func (h *Holdings) Blame(m *Held, line int) {
	m.Rec.Failed(line)
	h.Dirty = true
}

// LetGo returns the messages held but those being acknowledged, and holds
// them no more: they are to be delivered again.
func (h *Holdings) LetGo() []*Held {
	var out []*Held
	h.held = slices.DeleteFunc(h.held, func(m *Held) bool {
		if !m.Acking {
			out = append(out, m)
		}
		return !m.Acking
	})
	return out
}

// Forget holds nothing more: the consumer the messages came from is gone,
// and what they held comes again from the one made anew.
func (h *Holdings) Forget() { h.held = nil }

// Prune forgets what the consumer's ack floor says will not come again.
func (h *Holdings) Prune(floor uint64) {
	if floor > h.Record.Floor {
		h.Record.Prune(floor)
		h.Dirty = true
	}
}

// Save is what a save of the record is to do (ToSave).
type Save uint8

const (
	// NothingToSave: the record did not change since it was saved.
	NothingToSave Save = iota
	// SaveIt: write the record returned at the revision returned.
	SaveIt
	// Refused: this subscriber was taken over; it writes nothing more.
	Refused
)

// ToSave is the save to make now: the record and its revision, and the
// batches done it saves (for Saved).
func (h *Holdings) ToSave() (Save, Progress, uint64, int) {
	switch {
	case h.TakenOver:
		return Refused, Progress{}, 0, 0
	case !h.Dirty:
		return NothingToSave, Progress{}, 0, 0
	}
	h.Dirty = false
	return SaveIt, h.Record.Clone(), h.Rev, h.DoneUnsaved
}

// Saved notes a save landed at rev, of saving batches done.
func (h *Holdings) Saved(rev uint64, saving int) {
	h.Rev = rev
	h.DoneUnsaved -= saving
}

// NotSaved notes a save that did not land: refused because another
// subscriber wrote (taken), this one writes nothing more while it holds
// messages (each write would refuse the other's next save); failed, the
// record is still to be saved.
func (h *Holdings) NotSaved(taken bool) {
	if !taken {
		h.Dirty = true
		return
	}
	if h.Holding() {
		h.TakenOver = true
	}
}

// Absorb takes another's record, read over a late write of its, beside
// this one's: the batches it says are done are done.
func (h *Holdings) Absorb(cur *Progress) { h.Record.Absorb(cur) }

// StandingBy notes the subscriber letting go of what it held (its reader
// ended, the messages handed back): taken over, it saves nothing of it.
func (h *Holdings) StandingBy() {
	if h.TakenOver {
		h.Dirty = false
	}
}

// StoodBy lets go of the pin and of a refusal to save, once what was held
// is let go, and returns what this subscriber finished, to be kept over
// the record read next (Reloaded).
func (h *Holdings) StoodBy() (kept Progress) {
	kept = h.Record.Clone()
	h.TakenOver, h.Pin = false, ""
	return kept
}

// Reloaded holds the record read at rev, with kept over it: pinned again,
// a subscriber does not write again the batches it finished.
func (h *Holdings) Reloaded(p Progress, rev uint64, kept *Progress) {
	h.Record, h.Rev = p, rev
	if kept != nil {
		h.Record.Absorb(kept)
	}
}
