package protocol

import (
	"slices"
	"time"
)

// ReaderBook is what a subscriber's reader (a sender, a file) was handed
// and has not finished, in the order it was written, and what each word
// of the reader's finishes: a file's reader has what was written; a
// pipe's took a batch once it took the next; one that reports finished
// each line it reported; one that ended settles what it held
// (AfterReaderEnd). It follows the reader's stall too (Stall). Step
// takes what the driver (publish/subscriber's Lines) found and returns
// what it must do; like Machine, it does no IO and reads no clock, and
// its owner guards it.
type ReaderBook struct {
	handed []*Handout
	// lines are the lines handed and not yet reported, by content.
	lines map[string][]*Handout
	// written counts the bytes written since the last settle.
	written int64
	// finished counts the batches done, stall follows the reader.
	finished int
	stall    Stall
	// waited: the last look found the reader waiting for more with
	// batches in doubt (IdleLook).
	waited bool
}

// Handout is a batch as lines handed to a reader: Unit is the driver's
// handle of it, Lines its lines as written (without newlines), Size its
// bytes.
type Handout struct {
	Unit  any
	Lines []string
	Size  int
	// end is where it ends in what was written; reported counts its
	// lines reported.
	end      int64
	reported int
	done     bool
}

// ReaderFound is what the driver found of its reader, for Step.
type ReaderFound interface{ readerFound() }

// ReaderToDo is what the driver must do, from Step.
type ReaderToDo interface{ readerToDo() }

// Handing: Outs are being written, in this order. Reports: the reader
// reports each line it finished (ReportedLine).
type Handing struct {
	Outs    []*Handout
	Reports bool
}

// WriteCut: the last write stopped Unwritten bytes short (a pipe's
// reader gone): those were not written.
type WriteCut struct{ Unwritten int }

// TookThrough: a pipe's reader took Out (it had read all before it):
// those handed before it are done.
type TookThrough struct{ Out *Handout }

// Through: Outs are done (written to a file; a pipe's reader waits for
// more after them).
type Through struct{ Outs []*Handout }

// ReportedLine: the reader reported it finished Line.
type ReportedLine struct{ Line string }

// NewReader: a reader was started at At (a sender started again): it
// has not stalled yet.
type NewReader struct{ At time.Time }

// StallLook: a look for a stall at Now, Unread bytes waiting in the
// reader's pipe; answered with StallIs.
type StallLook struct {
	Now     time.Time
	Unread  int
	Timeout time.Duration
}

// IdleLook: no message is being handed over (Busy: one is). Answered with
// AskWaits when a pipe's reader (not one that reports) holds batches in
// doubt.
type IdleLook struct{ Busy, Reports bool }

// ReaderWaiting: whether the reader waits for more (AskWaits), Outs
// those AskWaits named.
type ReaderWaiting struct {
	Outs  []*Handout
	Waits bool
}

// ReaderEnds: the reader ended as End says (its Ends and Taken are the
// book's), Unread bytes left in its pipe. Answered with Settled; what
// was handed is forgotten.
type ReaderEnds struct {
	End    ReaderEnd
	Unread int64
}

// DoubtLook asks what is in doubt; answered with Doubt. Serial: the
// reader is a pipe's that does not report.
type DoubtLook struct{ Serial bool }

// ForgetHanded drops what was handed (a consumer gone).
type ForgetHanded struct{}

// OutsDone: Outs are done, newly: the driver tells the subscriber.
type OutsDone struct{ Outs []*Handout }

// UnknownLine: a report named a line not handed (or reported twice).
type UnknownLine struct{}

// StallIs: whether the reader stalled (StallLook).
type StallIs struct{ Stalled bool }

// AskWaits: ask whether the reader waits for more; answered with
// ReaderWaiting. Outs are the batches in doubt now.
type AskWaits struct{ Outs []*Handout }

// Settled: what a reader's end settled: Done, newly done; Blamed the
// batch its failure counts against (nil: none); Held: it had batches it
// did not finish.
type Settled struct {
	Done   []*Handout
	Blamed *Handout
	Held   bool
}

// Doubt: N batches are handed and not done; Unsettled: some wait for the
// reader to say it finished them by waiting for more.
type Doubt struct {
	N         int
	Unsettled bool
}

func (Handing) readerFound()       {}
func (WriteCut) readerFound()      {}
func (TookThrough) readerFound()   {}
func (Through) readerFound()       {}
func (ReportedLine) readerFound()  {}
func (NewReader) readerFound()     {}
func (StallLook) readerFound()     {}
func (IdleLook) readerFound()      {}
func (ReaderWaiting) readerFound() {}
func (ReaderEnds) readerFound()    {}
func (DoubtLook) readerFound()     {}
func (ForgetHanded) readerFound()  {}

func (OutsDone) readerToDo()    {}
func (UnknownLine) readerToDo() {}
func (StallIs) readerToDo()     {}
func (AskWaits) readerToDo()    {}
func (Settled) readerToDo()     {}
func (Doubt) readerToDo()       {}

// Step takes what the driver found and returns what it must do.
func (b *ReaderBook) Step(e ReaderFound) []ReaderToDo {
	switch e := e.(type) {
	case Handing:
		b.handing(e)
	case WriteCut:
		b.written -= int64(e.Unwritten)
	case TookThrough:
		if i := slices.Index(b.handed, e.Out); i > 0 {
			return b.through(slices.Clone(b.handed[:i]))
		}
	case Through:
		return b.through(e.Outs)
	case ReportedLine:
		return b.reported(e.Line)
	case NewReader:
		b.stall.Moved(e.At)
	case StallLook:
		return []ReaderToDo{StallIs{b.stall.Look(e.Now, e.Unread, len(b.handed), b.finished, e.Timeout)}}
	case IdleLook:
		if e.Reports || e.Busy || len(b.handed) == 0 {
			b.waited = false
			return nil
		}
		return []ReaderToDo{AskWaits{slices.Clone(b.handed)}}
	case ReaderWaiting:
		return b.waiting(e)
	case ReaderEnds:
		return []ReaderToDo{b.ended(e)}
	case DoubtLook:
		n := len(b.handed)
		return []ReaderToDo{Doubt{N: n, Unsettled: e.Serial && n > 0}}
	case ForgetHanded:
		b.forget()
	}
	return nil
}

// handing notes Outs written after what was written before.
func (b *ReaderBook) handing(e Handing) {
	if e.Reports && b.lines == nil {
		b.lines = make(map[string][]*Handout)
	}
	for _, x := range e.Outs {
		b.written += int64(x.Size)
		x.end = b.written
		b.handed = append(b.handed, x)
		if e.Reports {
			for _, line := range x.Lines {
				b.lines[line] = append(b.lines[line], x)
			}
		}
	}
}

// through marks outs done: those not done before are the driver's to
// tell.
func (b *ReaderBook) through(outs []*Handout) []ReaderToDo {
	var done []*Handout
	for _, x := range outs {
		if x.done {
			continue
		}
		x.done = true
		if i := slices.Index(b.handed, x); i >= 0 {
			b.handed = slices.Delete(b.handed, i, i+1)
		}
		b.finished++
		done = append(done, x)
	}
	if len(done) == 0 {
		return nil
	}
	return []ReaderToDo{OutsDone{done}}
}

// reported notes a line reported: the oldest batch handed with it, done
// once each of its lines is.
func (b *ReaderBook) reported(line string) []ReaderToDo {
	q := b.lines[line]
	if len(q) == 0 {
		return []ReaderToDo{UnknownLine{}}
	}
	x := q[0]
	if len(q) == 1 {
		delete(b.lines, line)
	} else {
		b.lines[line] = q[1:]
	}
	if x.reported++; x.reported == len(x.Lines) {
		return b.through([]*Handout{x})
	}
	return nil
}

// waiting settles the batches in doubt on a pipe once the reader waited
// for more at two looks in a row (a reader between two reads is not one
// that waits).
func (b *ReaderBook) waiting(e ReaderWaiting) []ReaderToDo {
	switch {
	case !e.Waits:
		b.waited = false
		return nil
	case !b.waited:
		b.waited = true
		return nil
	}
	b.waited = false
	return b.through(e.Outs)
}

// ended settles what the reader held as it ended, and forgets it.
func (b *ReaderBook) ended(e ReaderEnds) Settled {
	handed := slices.Clone(b.handed)
	end := e.End
	end.Taken, end.Ends = b.written-e.Unread, nil
	for _, x := range handed {
		end.Ends = append(end.Ends, x.end)
	}
	done, blamed := AfterReaderEnd(end)
	var s Settled
	if cmds := b.through(slices.Clone(handed[:done])); len(cmds) > 0 {
		s.Done = cmds[0].(OutsDone).Outs
	}
	if blamed >= 0 {
		s.Blamed = handed[blamed]
	}
	s.Held = len(handed) > done
	b.forget()
	return s
}

func (b *ReaderBook) forget() {
	b.handed, b.lines, b.written = nil, nil, 0
}
