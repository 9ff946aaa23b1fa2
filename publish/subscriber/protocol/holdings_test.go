package protocol

import (
	"testing"
	"time"

	"github.com/mailroom/tailer/publish/wire"
)

var rules = Rules{MaxDeliveries: 2, DeadLetters: true}

// A message taken: held with its batches to hand counted pending, a batch
// without tokens done as it is, one done before skipped; taken again while
// held, nothing more; acknowledged, taken again, acknowledged at once.
func TestHoldingsTake(t *testing.T) {
	var h Holdings
	tk := h.Take(5, "m5", []int{2, 0, 3}, rules, "msg5")
	if tk.Held == nil || tk.Ack || tk.Held.Pending != 2 || tk.Held.Seq != 5 || tk.Held.Msg != "msg5" || !h.Dirty || !h.Holding() {
		t.Fatalf("took %+v (held %+v), dirty %v", tk, tk.Held, h.Dirty)
	}
	if want := []Fate{Hand, NothingForSink, Hand}; !equalFates(tk.Fates, want) || !tk.Held.Rec.Done.Has(1) {
		t.Fatalf("fates %v, want %v, batch 1 done", tk.Fates, want)
	}
	if early := h.ToAck(tk.Held); len(early) != 0 || h.Acking() {
		t.Fatalf("acknowledged with %d batches pending", tk.Held.Pending)
	}
	if again := h.Take(5, "m5", []int{2, 0, 3}, rules, "again"); again.Held != nil || again.Ack || len(h.Held()) != 1 {
		t.Fatalf("taken again while held: %+v, %d held", again, len(h.Held()))
	}
	if h.Finished(tk.Held, 0) || !h.Finished(tk.Held, 2) || h.DoneUnsaved != 2 {
		t.Fatalf("finished: pending %d, done unsaved %d", tk.Held.Pending, h.DoneUnsaved)
	}
	ready := h.ToAck(tk.Held)
	if len(ready) != 1 || !h.Acking() || len(h.ToAck(tk.Held)) != 0 {
		t.Fatalf("to ack %v, acking %v", ready, h.Acking())
	}
	h.Acked(tk.Held, true)
	if h.Holding() || !tk.Held.Rec.Acked {
		t.Fatal("acked, still held or not recorded")
	}
	if done := h.Take(5, "m5", []int{2, 0, 3}, rules, "late"); !done.Ack || done.Skipped != 3 {
		t.Fatalf("an acknowledged message delivered again: %+v, want acknowledged, 3 skipped", done)
	}
	part := h.Take(6, "m6", []int{1, 1}, rules, "m6")
	h.Finished(part.Held, 0)
	h.Acked(part.Held, false)
	if again := h.Take(6, "m6", []int{1, 1}, rules, "m6 again"); again.Skipped != 1 || again.Held == nil || again.Held.Pending != 1 {
		t.Fatalf("a message with a batch done, delivered again: %+v", again)
	}
}

func equalFates(a, b []Fate) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A save: nothing while clean, the record and revision while dirty (and
// clean after), refused once taken over while holding; a failure leaves it
// dirty, a landing moves the revision and keeps batches done since.
func TestHoldingsSave(t *testing.T) {
	var h Holdings
	if what, _, _, _ := h.ToSave(); what != NothingToSave {
		t.Fatalf("clean: %v", what)
	}
	tk := h.Take(1, "m1", []int{1, 1}, rules, nil)
	h.Finished(tk.Held, 0)
	what, p, rev, saving := h.ToSave()
	if what != SaveIt || rev != 0 || saving != 1 || !p.Messages[1].Done.Has(0) || h.Dirty {
		t.Fatalf("dirty: %v at %d saving %d, dirty after %v", what, rev, saving, h.Dirty)
	}
	h.Finished(tk.Held, 1)
	h.Saved(7, saving)
	if h.Rev != 7 || h.DoneUnsaved != 1 {
		t.Fatalf("saved: revision %d, done unsaved %d; want 7, 1 (the batch done since)", h.Rev, h.DoneUnsaved)
	}
	h.NotSaved(false)
	if !h.Dirty || h.TakenOver {
		t.Fatal("a save that failed leaves the record to save, not taken over")
	}
	h.NotSaved(true)
	if what, _, _, _ := h.ToSave(); !h.TakenOver || what != Refused {
		t.Fatalf("refused while holding: taken over %v, next save %v", h.TakenOver, what)
	}
	h.StandingBy()
	if h.Dirty {
		t.Fatal("taken over and standing by, the record is still to save")
	}
	var idle Holdings
	idle.NotSaved(true)
	if idle.TakenOver {
		t.Fatal("refused while holding nothing: taken over")
	}
}

// The record read again: one's own (same revision) kept, another's merged
// with what this one finished when it holds nothing, and taken over when
// it holds messages; a claim moves the revision, and one holding nothing
// has nothing unsaved after.
func TestHoldingsRead(t *testing.T) {
	var h Holdings
	h.Rev = 3
	h.Record.MessageAt(4, "m4", 2).Done.Add(1)
	h.DoneUnsaved, h.Dirty = 1, true
	theirs := Progress{Floor: 2}
	claim, decided, holding := h.Read(theirs, 3)
	if decided != KeepOwn || holding || claim.Messages[4] == nil {
		t.Fatalf("own revision: %v, claim %+v", decided, claim)
	}
	claim, decided, _ = h.Read(Progress{Floor: 2}, 5)
	if decided != Merge || claim.Floor != 2 || claim.Messages[4] == nil || !claim.Messages[4].Done.Has(1) {
		t.Fatalf("another's record, holding nothing: %v, claim %+v", decided, claim)
	}
	h.Claimed(claim, 6, decided, false)
	if h.Rev != 6 || h.Record.Floor != 2 || h.Dirty || h.DoneUnsaved != 0 {
		t.Fatalf("claimed: %+v", h)
	}
	h.Take(9, "m9", []int{1}, rules, nil)
	if _, decided, holding := h.Read(Progress{}, 8); decided != TakenOver || !holding {
		t.Fatalf("another's record while holding: %v", decided)
	}
	kept := h.Record.Clone()
	kept.MessageAt(9, "m9", 1).Done.Add(0)
	h.Claimed(Progress{}, 9, KeepOwn, true)
	if h.Rev != 9 || !h.Dirty {
		t.Fatal("a claim while holding keeps the record dirty and moves the revision")
	}
}

// A delivery of a new pin, or after a long idle, or with nothing held, is
// read again; the pin is kept. Letting go returns what is not being
// acknowledged; standing by lets go of the pin and keeps what was done.
func TestHoldingsPinAndLetGo(t *testing.T) {
	var h Holdings
	if !h.Reread("p1", 0) || h.Pin != "p1" {
		t.Fatal("a first pin is read again and kept")
	}
	a := h.Take(1, "m1", []int{1}, rules, nil)
	b := h.Take(2, "m2", []int{1}, rules, nil)
	if h.Reread("p1", time.Millisecond) {
		t.Fatal("the same pin while holding: read again")
	}
	h.Finished(b.Held, 0)
	h.ToAck(b.Held)
	h.Blame(a.Held, 0)
	if a.Held.Rec.Attempts[0] != 1 {
		t.Fatal("blamed, no attempt counted")
	}
	let := h.LetGo()
	if len(let) != 1 || let[0] != a.Held || len(h.Held()) != 1 {
		t.Fatalf("let go of %v, holding %v", let, h.Held())
	}
	h.Prune(1)
	if h.Record.Floor != 1 || h.Record.Messages[1] != nil {
		t.Fatalf("pruned to 1: %+v", h.Record)
	}
	h.Dirty = false
	h.Prune(1)
	h.Prune(0)
	if h.Record.Floor != 1 || h.Dirty {
		t.Fatal("the same floor, or a lower one, changed the record")
	}
	h.TakenOver = true
	kept := h.StoodBy()
	if h.Pin != "" || h.TakenOver || kept.Messages[2] == nil {
		t.Fatalf("stood by: pin %q, taken over %v, kept %+v", h.Pin, h.TakenOver, kept)
	}
	h.Reloaded(Progress{Floor: 1, Last: wire.Anchor{Seq: 2, Mark: "m2"}}, 11, &kept)
	if h.Rev != 11 || h.Record.Messages[2] == nil || h.Record.Last.Seq != 2 {
		t.Fatalf("reloaded: %+v", h)
	}
	h.Forget()
	if h.Holding() {
		t.Fatal("forgot, still holding")
	}
	h.Saw(12, "m12")
	if h.Record.Last.Seq != 12 || !h.Dirty {
		t.Fatalf("saw 12: %+v", h.Record.Last)
	}
}

// The pin is watched while messages are held under it; seen another's, or
// none, twice in a row, it is lost, and the watch starts over; its own
// pin seen between resets the count.
func TestHoldingsPinWatch(t *testing.T) {
	var h Holdings
	if h.WatchesPin() {
		t.Fatal("nothing held: the pin watched")
	}
	h.Reread("p1", 0)
	h.Take(1, "m1", []int{1}, rules, nil)
	if !h.WatchesPin() {
		t.Fatal("holding under a pin: not watched")
	}
	for i, c := range []struct {
		pinned string
		lost   bool
	}{{"p2", false}, {"p1", false}, {"p2", false}, {"", true}, {"p2", false}, {"p2", true}} {
		if got := h.PinSeen(c.pinned); got != c.lost {
			t.Fatalf("look %d, %q pinned: lost %v, want %v", i, c.pinned, got, c.lost)
		}
	}
	h.PinSeen("p2")
	h.Forget()
	h.WatchesPin()
	if h.PinSeen("p2") {
		t.Fatal("a miss before the watch started over counted after it")
	}
}

// Only the subscriber the server pins, under the pin it was given, is
// pinned here; none without a pin.
func TestHoldingsPinnedHere(t *testing.T) {
	var h Holdings
	if h.PinnedHere("") || h.PinnedHere("p1") {
		t.Fatal("without a pin: pinned here")
	}
	h.Reread("p1", 0)
	if !h.PinnedHere("p1") || h.PinnedHere("p2") || h.PinnedHere("") {
		t.Fatal("pinned here wrongly judged under pin p1")
	}
}
