package protocol

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/mailroom/tailer/publish/wire"
)

// step is one step of a talk: the event, and the commands wanted back
// (compared as show prints them).
type step struct {
	e    Found
	want string
}

// talkThrough steps m through steps, failing at the first command that
// is not the one wanted.
func talkThrough(t *testing.T, m *Machine, steps []step) {
	t.Helper()
	for i, s := range steps {
		got := show(m.Step(s.e))
		if got != s.want {
			t.Fatalf("step %d (%T%+v): got %v, want %s", i, s.e, s.e, got, s.want)
		}
	}
}

// show prints cmds, the records they carry as they are saved.
func show(cmds []ToDo) string {
	out := ""
	for _, c := range cmds {
		switch c := c.(type) {
		case Write:
			b, _ := json.Marshal(c.Record)
			out += fmt.Sprintf("write %s at %d;", b, c.Rev)
		case Check:
			b, _ := json.Marshal(c.Record)
			out += fmt.Sprintf("check %s;", b)
		default:
			out += fmt.Sprintf("%T%v;", c, c)
		}
	}
	return out
}

// mine is a record with message 9's batch 0 done; theirs one with
// message 7's batch 1 done, at a later anchor.
func records() (mine, theirs Progress) {
	var d0, d1 Batches
	d0.Add(0)
	d1.Add(1)
	mine = Progress{Last: wire.Anchor{Seq: 9, Mark: "m9"}, Messages: map[uint64]*MessageProgress{9: {Mark: "m9", Done: d0}}}
	theirs = Progress{Last: wire.Anchor{Seq: 10, Mark: "m10"}, Messages: map[uint64]*MessageProgress{7: {Mark: "m7", Done: d1}}}
	return mine, theirs
}

// A claim: the record read at the revision this subscriber knows is
// written back as it is, no check; read at another, it is checked
// against the stream first and, nothing held, the claim is the record
// read with this one's over it; written since the read, read again.
func TestMachineClaim(t *testing.T) {
	mine, theirs := records()
	m := Machine{Holdings: Holdings{Record: mine.Clone(), Rev: 4, Dirty: true, DoneUnsaved: 1}}
	talkThrough(t, &m, []step{
		{ClaimRecord{}, show([]ToDo{Load{}})},
		{Loaded{Record: mine.Clone(), Rev: 4}, show([]ToDo{Write{mine, 4}})},
		{WriteRefused{}, show([]ToDo{Load{}})},
	})
	claimOver(t, &m, mine, theirs)
	if m.Rev != 7 || !m.Record.Messages[7].Done.Has(1) || !m.Record.Messages[9].Done.Has(0) || m.Dirty || m.DoneUnsaved != 0 {
		t.Fatalf("claimed: rev %d, record %+v, dirty %v, done unsaved %d", m.Rev, m.Record, m.Dirty, m.DoneUnsaved)
	}
	if got := m.Step(Wrote{Rev: 8}); got != nil {
		t.Fatalf("a write answered after the talk ended: %v", got)
	}
}

// claimOver steps m's claim, its read asked, through theirs read at
// revision 6, checked, and mine over it written there, landing at 7.
func claimOver(t *testing.T, m *Machine, mine, theirs Progress) {
	t.Helper()
	merged := theirs.Clone()
	merged.Absorb(&mine)
	talkThrough(t, m, []step{
		{Loaded{Record: theirs.Clone(), Rev: 6}, show([]ToDo{Check{theirs}})},
		{Checked{theirs.Clone()}, show([]ToDo{Write{merged, 6}})},
		{Wrote{Rev: 7}, show([]ToDo{TalkEnded{Outcome: Take}})},
	})
}

// A claim read at another revision while messages are held: another
// delivers now; the delivery goes back. One unanswered waits on the
// record, and starts over as a claim of its own.
func TestMachineClaimGivesBackAndWaits(t *testing.T) {
	mine, theirs := records()
	m := Machine{Holdings: Holdings{Record: mine.Clone(), Rev: 4}}
	m.Take(11, "m11", []int{1, 1}, rules, "msg11")
	talkThrough(t, &m, []step{
		{ClaimRecord{}, show([]ToDo{Load{}})},
		{Loaded{Record: theirs.Clone(), Rev: 5}, show([]ToDo{Check{theirs}})},
		{Checked{theirs.Clone()}, show([]ToDo{TalkEnded{Outcome: GiveBack}})},
		{ClaimRecord{}, show([]ToDo{Load{}})},
		{Unanswered{}, show([]ToDo{TalkEnded{Outcome: Waits}})},
		{ClaimRecord{}, show([]ToDo{Load{}})},
		{Loaded{Record: mine.Clone(), Rev: 4}, show([]ToDo{Write{m.Record, 4}})},
		{Unanswered{}, show([]ToDo{TalkEnded{Outcome: Waits}})},
	})
	if m.Rev != 4 {
		t.Fatalf("an unanswered claim moved the revision to %d", m.Rev)
	}
}

// A claim that lands makes the record this subscriber's again: a save
// refused before (a message acknowledged all the same, the pin then
// another's) holds back no save after it (make sim seed 1058058775,
// resends: the next resend's chain short of what this one handed).
func TestMachineClaimEndsARefusal(t *testing.T) {
	mine, theirs := records()
	m := Machine{Holdings: Holdings{Record: mine.Clone(), Rev: 4, TakenOver: true}}
	talkThrough(t, &m, []step{{ClaimRecord{}, show([]ToDo{Load{}})}})
	claimOver(t, &m, mine, theirs)
	m.Step(Arrived{Seq: 11, Mark: "m11", Subject: "S", Header: header{}})
	if got := show(m.Step(SaveDue{})); got == show([]ToDo{TalkEnded{Outcome: SaveRefused}}) {
		t.Fatalf("a save after the claim landed: %s, want the record written at 7", got)
	}
}

// A save: nothing changed, nothing written; changed, written at the
// revision known, and the batches it saves no longer unsaved;
// unanswered, still to save; refused once taken over, nothing written.
func TestMachineSave(t *testing.T) {
	mine, _ := records()
	m := Machine{Holdings: Holdings{Record: mine.Clone(), Rev: 4}}
	talkThrough(t, &m, []step{{SaveDue{}, show([]ToDo{TalkEnded{Outcome: Unchanged}})}})
	m.Dirty, m.DoneUnsaved = true, 3
	talkThrough(t, &m, []step{
		{SaveDue{}, show([]ToDo{Write{mine, 4}})},
		{Unanswered{}, show([]ToDo{TalkEnded{Outcome: SaveFailed}})},
	})
	if !m.Dirty || m.DoneUnsaved != 3 {
		t.Fatalf("an unanswered save: dirty %v, done unsaved %d", m.Dirty, m.DoneUnsaved)
	}
	talkThrough(t, &m, []step{
		{SaveDue{}, show([]ToDo{Write{mine, 4}})},
		{Wrote{Rev: 5}, show([]ToDo{TalkEnded{Outcome: Saved}})},
	})
	if m.Dirty || m.DoneUnsaved != 0 || m.Rev != 5 {
		t.Fatalf("saved: dirty %v, done unsaved %d, rev %d", m.Dirty, m.DoneUnsaved, m.Rev)
	}
	// The ack floor read: what it says will not come again is forgotten.
	m.Take(12, "m12", []int{1}, rules, "msg12")
	m.Acked(m.Held()[0], true)
	if m.Step(SaveDue{Floor: 12}); m.Record.Messages[12] != nil || m.Record.Messages[9] != nil || m.Record.Floor != 12 {
		t.Fatalf("saved after the floor 12 read: record %+v", m.Record)
	}
	m.Step(Wrote{Rev: 6})
	m.TakenOver = true
	talkThrough(t, &m, []step{{SaveDue{}, show([]ToDo{TalkEnded{Outcome: SaveRefused}})}})
}

// A save refused: with no pin, or the server pinning another, this one
// writes nothing more while it holds messages; pinned here, it takes the
// late write's record (checked against the stream) beside its own and
// writes over it, once: refused again, it stops.
func TestMachineSaveOver(t *testing.T) {
	mine, theirs := records()
	for _, pin := range []string{"", "p1"} {
		m := Machine{Holdings: Holdings{Record: mine.Clone(), Rev: 4, Pin: pin}}
		m.Take(9, "m9", []int{1}, rules, "msg9")
		// Refused while holding: another delivers now; this one stands by.
		refused := show([]ToDo{TalkEnded{Outcome: SaveRefused, StandBy: true}})
		want := []step{{SaveDue{}, show([]ToDo{Write{m.Record, 4}})}, {WriteRefused{}, show([]ToDo{AskPin{}})}, {PinIs{"p2"}, refused}}
		if pin == "" {
			want = []step{want[0], {WriteRefused{}, refused}}
		}
		talkThrough(t, &m, want)
		if !m.TakenOver {
			t.Fatalf("pin %q: refused while holding, not taken over", pin)
		}
	}
	m := Machine{Holdings: Holdings{Record: mine.Clone(), Rev: 4, Pin: "p1"}}
	m.Take(9, "m9", []int{1}, rules, "msg9")
	merged := m.Record.Clone()
	merged.Absorb(&theirs)
	talkThrough(t, &m, []step{
		{SaveDue{}, show([]ToDo{Write{m.Record, 4}})},
		{WriteRefused{}, show([]ToDo{AskPin{}})},
		{PinIs{"p1"}, show([]ToDo{Load{}})},
		{Loaded{Record: theirs.Clone(), Rev: 6}, show([]ToDo{Check{theirs}})},
		{Checked{theirs.Clone()}, show([]ToDo{Write{merged, 6}})},
		{WriteRefused{}, show([]ToDo{TalkEnded{Outcome: SaveRefused, StandBy: true}})},
	})
	if !m.TakenOver {
		t.Fatal("refused over a late write, not taken over")
	}
	// The late write dropped by the check: this one's record, written.
	m = Machine{Holdings: Holdings{Record: mine.Clone(), Rev: 4, Pin: "p1", Dirty: true}}
	talkThrough(t, &m, []step{
		{SaveDue{}, show([]ToDo{Write{mine, 4}})},
		{WriteRefused{}, show([]ToDo{AskPin{}})},
		{PinIs{"p1"}, show([]ToDo{Load{}})},
		{Loaded{Record: theirs.Clone(), Rev: 6}, show([]ToDo{Check{theirs}})},
		{Checked{}, show([]ToDo{Write{mine, 6}})},
		{Wrote{Rev: 7}, show([]ToDo{TalkEnded{Outcome: Saved}})},
	})
	if m.Rev != 7 || m.Record.Messages[7] != nil {
		t.Fatalf("saved over a dropped late write: rev %d, record %+v", m.Rev, m.Record)
	}
}

// Batches done: a message is complete once its last batch is, and
// acknowledged once the record saying so is saved; a save that failed
// keeps its ack waiting, and one refused (another wrote) acknowledges it
// all the same: every batch of it is done.
func TestMachineFinish(t *testing.T) {
	var m Machine
	h := m.Take(3, "m3", []int{1, 1}, rules, "msg3").Held
	if cmds := m.Step(Done{[]HeldBatch{{h, 0}}}); cmds != nil {
		t.Fatalf("one batch of two done: %v", cmds)
	}
	cmds := m.Step(Done{[]HeldBatch{{h, 1}}})
	if len(cmds) != 1 || len(cmds[0].(Finish).Msgs) != 1 || cmds[0].(Finish).Msgs[0] != h {
		t.Fatalf("both batches done: %v", cmds)
	}
	record := m.Record.Clone()
	talkThrough(t, &m, []step{
		{Complete{[]*Held{h}}, show([]ToDo{Write{record, 0}})},
		{Unanswered{}, show([]ToDo{TalkEnded{Outcome: SaveFailed, Acks: []*Held{h}}})},
	})
	if h.Acking || !m.Dirty {
		t.Fatalf("a save failed: acking %v, dirty %v", h.Acking, m.Dirty)
	}
	talkThrough(t, &m, []step{
		{Complete{[]*Held{h}}, show([]ToDo{Write{record, 0}})},
		{Wrote{Rev: 1}, show([]ToDo{TalkEnded{Outcome: Acking, Acks: []*Held{h}}})},
		{Complete{[]*Held{h}}, show([]ToDo{TalkEnded{Outcome: NoAck}})},
		{Acked{h, true}, ""},
	})
	if m.Holding() || !h.Rec.Acked {
		t.Fatalf("acked: holding %v, recorded %v", m.Holding(), h.Rec.Acked)
	}
	h = m.Take(4, "m4", []int{1}, rules, "msg4").Held
	m.Step(Done{[]HeldBatch{{h, 0}}})
	record = m.Record.Clone()
	talkThrough(t, &m, []step{
		{Complete{[]*Held{h}}, show([]ToDo{Write{record, 1}})},
		{WriteRefused{}, show([]ToDo{TalkEnded{Outcome: Acking, Acks: []*Held{h}}})},
	})
	if !m.TakenOver {
		t.Fatal("refused while holding, not taken over")
	}
}

// Handed back: the failure counted against the batch blamed, every
// message held but one being acknowledged let go, and handed back once
// the record is saved, or not to be: taken over, this one writes nothing
// more, and hands them back all the same.
func TestMachineHandBack(t *testing.T) {
	var m Machine
	h1 := m.Take(1, "m1", []int{1, 1}, rules, "msg1").Held
	h2 := m.Take(2, "m2", []int{1}, rules, "msg2").Held
	m.Step(Done{[]HeldBatch{{h2, 0}}})
	m.Step(Complete{[]*Held{h2}})
	m.Step(Wrote{Rev: 1})
	m.Dirty = true
	record := m.Record.Clone()
	record.Messages[1].Failed(0)
	talkThrough(t, &m, []step{
		{HandBack{Blame: &HeldBatch{h1, 0}}, show([]ToDo{Write{record, 1}})},
		{Wrote{Rev: 2}, show([]ToDo{TalkEnded{Outcome: Saved, Naks: []*Held{h1}}})},
	})
	if held := m.Held(); len(held) != 1 || held[0] != h2 || h1.Rec.Attempts[0] != 1 {
		t.Fatalf("held %v after handing back, attempts %v", held, h1.Rec.Attempts)
	}
	h3 := m.Take(3, "m3", []int{1}, rules, "msg3").Held
	m.TakenOver = true
	// Still holding h2, whose ack is on its way: it stands by.
	talkThrough(t, &m, []step{{HandBack{}, show([]ToDo{TalkEnded{Outcome: SaveRefused, Naks: []*Held{h3}, StandBy: true}})}})
}

// Standing by: taken over, nothing of what is let go is saved; the pin
// and the refusal are let go, and what the subscriber finished is kept
// over the record it reads next, however many reads go unanswered.
func TestMachineStandBy(t *testing.T) {
	mine, theirs := records()
	m := Machine{Holdings: Holdings{Record: mine.Clone(), Rev: 4, Pin: "p1", TakenOver: true}}
	h := m.Take(11, "m11", []int{1}, rules, "msg11").Held
	talkThrough(t, &m, []step{
		{HandBack{StandBy: true}, show([]ToDo{TalkEnded{Outcome: SaveRefused, Naks: []*Held{h}}})},
		{Reload{}, show([]ToDo{Load{}})},
		{Unanswered{}, show([]ToDo{TalkEnded{Outcome: Waits}})},
	})
	if m.TakenOver || m.Pin != "" || m.Holding() {
		t.Fatalf("stood by: taken over %v, pin %q, holding %v", m.TakenOver, m.Pin, m.Holding())
	}
	talkThrough(t, &m, []step{
		{Reload{}, show([]ToDo{Load{}})},
		{Loaded{Record: theirs.Clone(), Rev: 9}, show([]ToDo{TalkEnded{Outcome: RecordRead}})},
	})
	if m.Rev != 9 || !m.Record.Messages[7].Done.Has(1) || !m.Record.Messages[9].Done.Has(0) {
		t.Fatalf("reloaded: rev %d, record %+v", m.Rev, m.Record)
	}
	// Read again later (a stand-by after this one), nothing is kept twice.
	talkThrough(t, &m, []step{
		{Reload{}, show([]ToDo{Load{}})},
		{Loaded{Record: Progress{}, Rev: 12}, show([]ToDo{TalkEnded{Outcome: RecordRead}})},
	})
	if len(m.Record.Messages) != 0 {
		t.Fatalf("a second reload kept the first stand-by's record: %+v", m.Record)
	}
}
