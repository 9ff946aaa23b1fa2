package protocol

import (
	"testing"
	"time"
)

// outs are n handouts of one line each, "l0", "l1", ..., of size 3.
func outs(n int) []*Handout {
	hs := make([]*Handout, n)
	for i := range hs {
		hs[i] = &Handout{Unit: i, Lines: []string{"l" + string(rune('0'+i))}, Size: 3}
	}
	return hs
}

// units are the Units of the handouts an answer says are done.
func units(cmds []ReaderToDo) []any {
	var us []any
	for _, c := range cmds {
		switch c := c.(type) {
		case OutsDone:
			for _, h := range c.Outs {
				us = append(us, h.Unit)
			}
		case Settled:
			for _, h := range c.Done {
				us = append(us, h.Unit)
			}
		}
	}
	return us
}

func wantUnits(t *testing.T, what string, cmds []ReaderToDo, want ...any) {
	t.Helper()
	got := units(cmds)
	if len(got) != len(want) {
		t.Fatalf("%s: done %v, want %v", what, got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s: done %v, want %v", what, got, want)
		}
	}
}

// A pipe's reader that took a batch is done with those before it, once.
func TestReaderBookPipe(t *testing.T) {
	var b ReaderBook
	hs := outs(3)
	for _, h := range hs {
		b.Step(Handing{Outs: []*Handout{h}})
	}
	wantUnits(t, "took the first", b.Step(TookThrough{Out: hs[0]}))
	wantUnits(t, "took the third", b.Step(TookThrough{Out: hs[2]}), 0, 1)
	wantUnits(t, "the first again", b.Step(Through{Outs: hs[:1]}))
	if d := b.Step(DoubtLook{Serial: true})[0].(Doubt); d.N != 1 || !d.Unsettled {
		t.Fatalf("doubt %+v, want the third, unsettled", d)
	}
	if d := b.Step(DoubtLook{})[0].(Doubt); d.Unsettled {
		t.Fatalf("doubt %+v of a reader that is not serial", d)
	}
}

// A reader that ends settles what it held by where it stopped reading:
// a failure blames the oldest batch it took whole; a cut write counts as
// unwritten.
func TestReaderBookEnds(t *testing.T) {
	var b ReaderBook
	hs := outs(3)
	b.Step(Handing{Outs: hs[:2]})
	b.Step(Handing{Outs: hs[2:]})
	b.Step(WriteCut{Unwritten: 2})
	// Written 7 bytes (3, 3, 1); unread 4: it took the first whole.
	s := b.Step(ReaderEnds{End: ReaderEnd{Failed: true, Pipe: true}, Unread: 4})[0].(Settled)
	if s.Blamed != hs[0] || len(s.Done) != 0 || !s.Held {
		t.Fatalf("failed: %+v, want the first blamed, nothing done, held", s)
	}
	if d := b.Step(DoubtLook{Serial: true})[0].(Doubt); d.N != 0 || d.Unsettled {
		t.Fatalf("doubt %+v after the end: not forgotten", d)
	}
	hs = outs(3)
	b.Step(Handing{Outs: hs})
	s = b.Step(ReaderEnds{End: ReaderEnd{Took: true, Pipe: true}, Unread: 3})[0].(Settled)
	wantUnits(t, "took, 6 of 9 bytes read", []ReaderToDo{s}, 0, 1)
	if s.Blamed != nil || !s.Held {
		t.Fatalf("took: %+v, want none blamed, the third held", s)
	}
	hs = outs(2)
	b.Step(Handing{Outs: hs})
	s = b.Step(ReaderEnds{End: ReaderEnd{Done: true}})[0].(Settled)
	wantUnits(t, "done", []ReaderToDo{s}, 0, 1)
	if s.Held {
		t.Fatalf("done: %+v holds", s)
	}
}

// A reader that reports finishes a batch once each of its lines is
// reported, the oldest batch of a line first; a line not handed is
// unknown.
func TestReaderBookReports(t *testing.T) {
	var b ReaderBook
	two := &Handout{Unit: "two", Lines: []string{"a", "b"}, Size: 4}
	again := &Handout{Unit: "again", Lines: []string{"a"}, Size: 2}
	b.Step(Handing{Outs: []*Handout{two, again}, Reports: true})
	wantUnits(t, "a", b.Step(ReportedLine{Line: "a"}))
	wantUnits(t, "a again", b.Step(ReportedLine{Line: "a"}), "again")
	if got := b.Step(ReportedLine{Line: "a"}); len(got) != 1 || got[0] != (UnknownLine{}) {
		t.Fatalf("a third time: %v, want UnknownLine", got)
	}
	wantUnits(t, "b", b.Step(ReportedLine{Line: "b"}), "two")
	b.Step(Handing{Outs: outs(1)})
	if got := b.Step(ReportedLine{Line: "l0"}); len(got) != 1 || got[0] != (UnknownLine{}) {
		t.Fatalf("a line of a reader that does not report: %v, want UnknownLine", got)
	}
	s := b.Step(ReaderEnds{End: ReaderEnd{Done: true, Reports: true}})[0].(Settled)
	if len(s.Done) != 0 || !s.Held {
		t.Fatalf("a reader that reports ended: %+v, want nothing done but what it reported", s)
	}
}

// A pipe's reader waiting for more at two looks in a row finished what
// it held; busy, reporting, or not waiting, it did not.
func TestReaderBookIdle(t *testing.T) {
	var b ReaderBook
	if got := b.Step(IdleLook{}); got != nil {
		t.Fatalf("nothing handed: %v", got)
	}
	hs := outs(2)
	b.Step(Handing{Outs: hs})
	for _, e := range []IdleLook{{Busy: true}, {Reports: true}} {
		if got := b.Step(e); got != nil {
			t.Fatalf("%+v: %v", e, got)
		}
	}
	ask := b.Step(IdleLook{})[0].(AskWaits)
	wantUnits(t, "first look", b.Step(ReaderWaiting{Outs: ask.Outs, Waits: true}))
	wantUnits(t, "not waiting", b.Step(ReaderWaiting{Outs: ask.Outs}))
	wantUnits(t, "waiting again", b.Step(ReaderWaiting{Outs: ask.Outs, Waits: true}))
	b.Step(IdleLook{Busy: true})
	wantUnits(t, "after a busy look", b.Step(ReaderWaiting{Outs: ask.Outs, Waits: true}))
	wantUnits(t, "second look", b.Step(ReaderWaiting{Outs: ask.Outs, Waits: true}), 0, 1)
}

// The stall is followed from look to look, and a new reader starts it
// over.
func TestReaderBookStall(t *testing.T) {
	var b ReaderBook
	at := time.Unix(1000, 0)
	b.Step(NewReader{At: at})
	b.Step(Handing{Outs: outs(1)})
	look := func(after time.Duration) bool {
		return b.Step(StallLook{Now: at.Add(after), Timeout: 10 * time.Second})[0].(StallIs).Stalled
	}
	if look(time.Second) || look(5*time.Second) {
		t.Fatal("stalled within the timeout")
	}
	if !look(12 * time.Second) {
		t.Fatal("not stalled 11 s after the lines came")
	}
	b.Step(NewReader{At: at.Add(13 * time.Second)})
	if look(14 * time.Second) {
		t.Fatal("stalled a second after a new reader started")
	}
	if !look(25 * time.Second) {
		t.Fatal("not stalled 12 s after a new reader started")
	}
	// A batch finished is a move, though another waits.
	hs := outs(2)
	b.Step(Handing{Outs: hs})
	b.Step(Through{Outs: hs[:1]})
	if look(26 * time.Second) {
		t.Fatal("stalled at the look after a batch was finished")
	}
}
