package protocol

import (
	"testing"

	"github.com/mailroom/tailer/publish/wire"
)

// Two subscribers' records of one durable merge without either losing
// what it finished: batches done, acks, failures, the newest message given
// and the chain; a message recorded with other content is not taken for
// the same (issue 49's fault runs: a subscriber that took over rewrote
// what the other had finished and not yet saved, up to 350 lines at one
// fault).
func TestProgressAbsorb(t *testing.T) {
	done := func(is ...int) Batches {
		var b Batches
		for _, i := range is {
			b.Add(i)
		}
		return b
	}
	p := Progress{Floor: 10, Last: wire.Anchor{Seq: 12, Mark: "id:12"},
		Chain: wire.Chain{Subjects: map[string]wire.Anchor{"a": {Seq: 12, Mark: "id:12"}}},
		Messages: map[uint64]*MessageProgress{
			11: {Mark: "id:11", Batches: 3, Done: done(0)},
			12: {Mark: "id:12", Batches: 2, Attempts: map[int]int{1: 1}},
		}}
	q := Progress{Floor: 11, Last: wire.Anchor{Seq: 14, Mark: "id:14"},
		Chain: wire.Chain{Subjects: map[string]wire.Anchor{"a": {Seq: 14, Mark: "id:14"}, "b": {Seq: 13, Mark: "id:13"}}},
		Messages: map[uint64]*MessageProgress{
			12: {Mark: "id:12", Batches: 2, Done: done(0), Attempts: map[int]int{1: 2}},
			13: {Mark: "id:13", Batches: 1, Done: done(0), Acked: true},
			14: {Mark: "id:other", Batches: 5},
		}}
	p.Messages[14] = &MessageProgress{Mark: "id:14", Batches: 5, Done: done(4)}
	if !p.Absorb(&q) {
		t.Fatal("absorb said nothing changed")
	}
	switch {
	case p.Floor != 11 || p.Messages[11] != nil:
		t.Fatalf("floor %d, message 11 %v: want the higher floor, and what is below it forgotten", p.Floor, p.Messages[11])
	case p.Last.Seq != 14 || p.Chain.Subjects["a"].Seq != 14 || p.Chain.Subjects["b"].Seq != 13:
		t.Fatalf("last %v, chain %v: want the newest of each", p.Last, p.Chain)
	case !p.Messages[12].Done.Has(0) || p.Messages[12].Attempts[1] != 2:
		t.Fatalf("message 12: %+v", p.Messages[12])
	case p.Messages[13] == nil || !p.Messages[13].Acked:
		t.Fatalf("message 13: %+v", p.Messages[13])
	case p.Messages[14].Done.Len() != 1 || !p.Messages[14].Done.Has(4):
		t.Fatalf("message 14 of other content merged: %+v", p.Messages[14])
	}
	if p.Absorb(&q) {
		t.Fatal("absorbing the same record twice changed it")
	}
	// A record that names no content for a message (written before marks
	// were kept) is of the same message: its batches done count.
	unmarked := Progress{Messages: map[uint64]*MessageProgress{12: {Batches: 2, Done: done(1)}}}
	if !p.Absorb(&unmarked) || !p.Messages[12].Done.Has(1) {
		t.Fatalf("message 12 after an unmarked record of it: %+v", p.Messages[12])
	}
	// The other way round, and a failure counted where none was.
	p.Messages[15] = &MessageProgress{Batches: 2}
	marked := Progress{Messages: map[uint64]*MessageProgress{15: {Mark: "id:15", Batches: 2, Done: done(0), Attempts: map[int]int{1: 1}}}}
	if !p.Absorb(&marked) || !p.Messages[15].Done.Has(0) || p.Messages[15].Attempts[1] != 1 {
		t.Fatalf("unmarked message 15 after a marked record of it: %+v", p.Messages[15])
	}
}

// The newest message given is the one seen last at the highest sequence:
// another at the same sequence (a stream made again) takes its place, an
// older one does not.
func TestProgressSaw(t *testing.T) {
	var p Progress
	if !p.Saw(5, "id:a") || !p.Saw(5, "id:b") || p.Last != (wire.Anchor{Seq: 5, Mark: "id:b"}) {
		t.Fatalf("last %v, want 5 id:b", p.Last)
	}
	if p.Saw(4, "id:c") || p.Last.Seq != 5 {
		t.Fatalf("an older message moved the last to %v", p.Last)
	}
}
