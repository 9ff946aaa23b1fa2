package protocol

// Machine is a subscriber's Holdings and its talks with the durable's
// record, stepped: the record read again and claimed before a delivery
// is taken (Reread says when), the record saved (over a late write of
// another's while the server pins this subscriber), the batches done and
// their messages acknowledged once the record saved says so, and what it
// held handed back. Step takes what IO found (a Found) and returns what
// IO must do next (ToDo); a talk ends with a TalkEnded. The subscriber
// (publish/subscriber) and its simulation (publish/subscriber/sim) are
// its drivers: each carries out what it is to do, against the servers or
// their models, and neither decides a step of a talk. One talk at a
// time: the driver keeps them from overlapping. Like Holdings, it does
// no IO and reads no clock; its owner guards it.
type Machine struct {
	Holdings
	talk talk
	// rev is the revision of the record read, while it is checked.
	rev uint64
	// claim is the record a claim writes, with Read's decision.
	claim   Progress
	decided Reread
	holding bool
	// saving is the batches done the save on its way saves.
	saving int
	// acks are the messages whose acks wait on the save under way, naks
	// those handed back once it ends.
	acks, naks []*Held
	// standing: the hand back under way is a stand-by's; kept is what
	// the subscriber finished before it stood by, kept over the record
	// it reads next (Reload).
	standing bool
	kept     *Progress
}

// talk is the talk with the record under way.
type talk uint8

const (
	noTalk talk = iota
	claiming
	saving
	savingOver
	reloading
)

// Found is what IO found, for Step.
type Found interface{ found() }

// ToDo is what IO must do, from Step.
type ToDo interface{ toDo() }

// ClaimRecord starts a claim, for a delivery that must wait on the
// record read again (Reread said so, or its claim was not answered:
// Waits).
type ClaimRecord struct{}

// SaveDue: the record is to be saved if it changed, after it forgets
// what the consumer's ack floor, Floor (0: not read), says will not come
// again.
type SaveDue struct{ Floor uint64 }

// Done: batches the sink finished (or set aside), outside any talk. The
// messages then complete come back in a Finish.
type Done struct{ Batches []HeldBatch }

// HeldBatch is batch Line of the message held as Held.
type HeldBatch struct {
	Held *Held
	Line int
}

// Complete: messages all of whose batches may be done (none was for the
// sink, or their acks waited on a save that failed, SaveFailed):
// acknowledged as Done's are.
type Complete struct{ Msgs []*Held }

// Acked: the ack of a message (TalkEnded's Acks) answered, confirmed
// (OK) or not. Outside any talk.
type Acked struct {
	Held *Held
	OK   bool
}

// HandBack: the subscriber lets go of what it holds (its reader ended,
// it stands by), Blame the batch a reader's failure counts against (nil:
// none). The messages held but those being acknowledged are handed back,
// once the record says which of their batches are done. StandBy: it no
// longer delivers (another took over, or its pin is lost): taken over,
// it saves nothing of what it lets go, and then lets go of its pin and
// of the refusal, keeping what it finished for the record it reads next
// (Reload).
type HandBack struct {
	Blame   *HeldBatch
	StandBy bool
}

// Reload reads the record (at the start, or after standing by), with
// what the subscriber finished before it stood by kept over it.
type Reload struct{}

// Loaded: the record read (Load), at Rev.
type Loaded struct {
	Record Progress
	Rev    uint64
}

// Checked: the record Check held against the stream, dropped if it is of
// another stream or names no message.
type Checked struct{ Record Progress }

// Wrote: a Write landed, at Rev.
type Wrote struct{ Rev uint64 }

// WriteRefused: a Write found the record written since its revision.
type WriteRefused struct{}

// Unanswered: a Load or Write got no answer, or failed (the bucket
// unreachable, no room, the subscriber stopping).
type Unanswered struct{}

// PinIs: the pin the server gives the durable's group (AskPin; "" when
// none, or when the server did not say).
type PinIs struct{ Pinned string }

// Load reads the durable's record, answered with Loaded or Unanswered.
type Load struct{}

// Check holds Record, read back, against the stream: answered with
// Checked.
type Check struct{ Record Progress }

// Write writes Record at Rev, answered with Wrote, WriteRefused or
// Unanswered.
type Write struct {
	Record Progress
	Rev    uint64
}

// AskPin asks the server whom it pins now, answered with PinIs.
type AskPin struct{}

// Finish has messages whose batches are all done acknowledged: step
// Complete{Msgs} when no talk is under way.
type Finish struct{ Msgs []*Held }

// TalkEnded ends a talk. Acks, with Acking, are the messages to
// acknowledge, side by side, each answered with Acked; with SaveFailed,
// of a Complete's save, those whose acks wait on the record (Complete,
// later). Naks, of a HandBack, are the messages to hand back to the
// server (a nak each, no answer), whatever the save's outcome. StandBy:
// a save was refused while the subscriber holds messages; another
// delivers now, and this one is to stand by.
type TalkEnded struct {
	Outcome TalkOutcome
	Acks    []*Held
	Naks    []*Held
	StandBy bool
}

// TalkOutcome is how a talk with the record ended.
type TalkOutcome uint8

const (
	// Take: the claim landed; the delivery is to be taken.
	Take TalkOutcome = iota
	// GiveBack: another subscriber delivers now; the delivery goes back
	// to the server, and this one stands by (ErrTakenOver).
	GiveBack
	// Waits: the claim or the reload got no answer; the delivery, or
	// the subscriber, waits on the record.
	Waits
	// RecordRead: the reload read the record.
	RecordRead
	// Saved: the save landed.
	Saved
	// Unchanged: the record did not change since it was saved.
	Unchanged
	// SaveRefused: another subscriber wrote the record, and the server
	// does not pin this one: it writes nothing more (ErrTakenOver).
	SaveRefused
	// SaveFailed: the save got no answer; the record is still to save.
	SaveFailed
	// NoAck: the batches done complete no message.
	NoAck
	// Acking: the record is saved (or this subscriber writes it no
	// more): the messages complete are to be acknowledged.
	Acking
)

func (ClaimRecord) found()  {}
func (SaveDue) found()      {}
func (Done) found()         {}
func (Complete) found()     {}
func (Acked) found()        {}
func (HandBack) found()     {}
func (Reload) found()       {}
func (Loaded) found()       {}
func (Checked) found()      {}
func (Wrote) found()        {}
func (WriteRefused) found() {}
func (Unanswered) found()   {}
func (PinIs) found()        {}

func (Load) toDo()      {}
func (Check) toDo()     {}
func (Write) toDo()     {}
func (AskPin) toDo()    {}
func (Finish) toDo()    {}
func (TalkEnded) toDo() {}

// Step takes what IO found and returns what IO must do next. An input
// that does not fit the talk under way (a Loaded with no talk) is a
// driver's slip, and ends nothing: Step returns no output.
func (m *Machine) Step(e Found) []ToDo {
	if cmds, ok := m.stepOutside(e); ok {
		return cmds
	}
	switch e := e.(type) {
	case ClaimRecord:
		return m.start(claiming, Load{})
	case SaveDue:
		// Messages in hand are above the floor: they are not
		// acknowledged.
		m.Prune(e.Floor)
		return m.saveDue()
	case Done:
		var complete []*Held
		for _, b := range e.Batches {
			if m.Finished(b.Held, b.Line) {
				complete = append(complete, b.Held)
			}
		}
		if len(complete) == 0 {
			return nil
		}
		return []ToDo{Finish{complete}}
	case Complete:
		return m.complete(e.Msgs)
	case Acked:
		m.Holdings.Acked(e.Held, e.OK)
		return nil
	case Reload:
		return m.start(reloading, Load{})
	case HandBack:
		if e.StandBy {
			m.StandingBy()
			m.standing = true
		}
		if b := e.Blame; b != nil {
			m.Blame(b.Held, b.Line)
		}
		// Every message held but those being acknowledged: some of their
		// batches may not even have been handed over.
		m.naks = m.LetGo()
		return m.saveDue()
	}
	switch m.talk {
	case claiming:
		return m.stepClaim(e)
	case saving, savingOver:
		return m.stepSave(e)
	case reloading:
		return m.stepReload(e)
	}
	return nil
}

// stepReload steps a reload: the record read, what the subscriber
// finished before it stood by kept over it (pinned again, it does not
// write those batches again).
func (m *Machine) stepReload(e Found) []ToDo {
	switch e := e.(type) {
	case Loaded:
		m.Reloaded(e.Record, e.Rev, m.kept)
		m.kept = nil
		return m.finish(RecordRead)
	case Unanswered:
		return m.finish(Waits)
	}
	return nil
}

// start begins talk t with its first thing to do.
func (m *Machine) start(t talk, first ToDo) []ToDo {
	m.talk = t
	return []ToDo{first}
}

// finish ends the talk under way with o. A save that messages complete
// waited on, landed or not to be made, has them acknowledged: every
// batch of theirs is done, acknowledged even when this subscriber is
// taken over; failed, their acks wait.
func (m *Machine) finish(o TalkOutcome) []ToDo {
	m.talk = noTalk
	if m.standing {
		kept := m.StoodBy()
		m.kept, m.standing = &kept, false
	}
	acks, naks := m.acks, m.naks
	m.acks, m.naks = nil, nil
	switch {
	case acks == nil:
		return []ToDo{TalkEnded{Outcome: o, Naks: naks, StandBy: o == SaveRefused && m.Holding()}}
	case o == SaveFailed:
		m.Unsent(acks)
		return []ToDo{TalkEnded{Outcome: o, Acks: acks}}
	}
	return []ToDo{TalkEnded{Outcome: Acking, Acks: acks}}
}

// complete acknowledges those of ms all of whose batches are done and
// whose acks are not on their way, once the record is saved.
func (m *Machine) complete(ms []*Held) []ToDo {
	ready := m.ToAck(ms...)
	if len(ready) == 0 {
		return end(NoAck)
	}
	m.acks = ready
	return m.saveDue()
}

func end(o TalkOutcome) []ToDo { return []ToDo{TalkEnded{Outcome: o}} }

// stepClaim steps the claim: the record read, held against the stream
// when another wrote it since, decided on (Read), and written back before
// anything is handed on; written since the read, it is read again.
func (m *Machine) stepClaim(e Found) []ToDo {
	switch e := e.(type) {
	case Loaded:
		if e.Rev != m.Rev {
			m.rev = e.Rev
			return []ToDo{Check{e.Record}}
		}
		return m.decide(e.Record, e.Rev)
	case Checked:
		return m.decide(e.Record, m.rev)
	case Wrote:
		m.Claimed(m.claim, e.Rev, m.decided, m.holding)
		return m.finish(Take)
	case WriteRefused:
		return []ToDo{Load{}}
	case Unanswered:
		return m.finish(Waits)
	}
	return nil
}

// decide decides on the record cur read at rev: taken over, or the claim
// to write.
func (m *Machine) decide(cur Progress, rev uint64) []ToDo {
	m.claim, m.decided, m.holding = m.Read(cur, rev)
	if m.decided == TakenOver {
		return m.finish(GiveBack)
	}
	return []ToDo{Write{m.claim, rev}}
}

// saveDue starts a save of the record, if it changed and this subscriber
// still writes it.
func (m *Machine) saveDue() []ToDo {
	what, p, rev, n := m.ToSave()
	switch what {
	case Refused:
		return m.finish(SaveRefused)
	case NothingToSave:
		return m.finish(Unchanged)
	}
	m.saving = n
	return m.start(saving, Write{p, rev})
}

// stepSave steps a save. Refused, the record was written by another: if
// the server still pins this subscriber, that write was the other's,
// landed late (a save it never heard back from, before it lost the pin),
// and this one takes the batches it says are done beside its own and
// writes over it (the one pinned merges; the other writes nothing more
// once refused), instead of standing by and having the batches it held
// written again (issue 49).
func (m *Machine) stepSave(e Found) []ToDo {
	switch e := e.(type) {
	case Wrote:
		m.Saved(e.Rev, m.saving)
		return m.finish(Saved)
	case WriteRefused:
		if m.talk == savingOver || m.Pin == "" {
			m.NotSaved(true)
			return m.finish(SaveRefused)
		}
		return []ToDo{AskPin{}}
	case PinIs:
		if !m.PinnedHere(e.Pinned) {
			m.NotSaved(true)
			return m.finish(SaveRefused)
		}
		m.talk = savingOver
		return []ToDo{Load{}}
	case Loaded:
		// Late, and maybe of a stream since made again (the other,
		// frozen as the stream went, saved the old record as it woke):
		// dropped then, not absorbed.
		m.rev = e.Rev
		return []ToDo{Check{e.Record}}
	case Checked:
		// In place: the messages in hand keep their records.
		m.Absorb(&e.Record)
		return []ToDo{Write{m.Record.Clone(), m.rev}}
	case Unanswered:
		m.NotSaved(false)
		return m.finish(SaveFailed)
	}
	return nil
}
