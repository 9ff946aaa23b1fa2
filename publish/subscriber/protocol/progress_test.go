package protocol

import (
	"errors"
	"strings"
	"testing"

	"github.com/mailroom/tailer/publish/wire"
)

// A stored record is read only when it can be a subscriber's: each thing
// that cannot be is refused, naming it; one of a later format that needs
// more than this release knows is ErrRecordAhead.
func TestParseProgress(t *testing.T) {
	for _, tc := range []struct {
		name, data, want string
	}{
		{"too large", `{"floor":1,"x":"` + strings.Repeat("a", maxRecordBytes) + `"}`, "bytes, more than"},
		{"not JSON", `{"floor":`, "progress record: "},
		{"a later format needed", `{"version":3,"needs":2,"floor":1}`, "needs a reader of format 2"},
		{"a null message", `{"floor":1,"messages":{"5":null}}`, "message 5: null"},
		{"a message at 0", `{"floor":0,"messages":{"0":{"batches":1}}}`, "message at sequence 0"},
		{"no batches", `{"floor":1,"messages":{"5":{"batches":0}}}`, "message 5: 0 batches"},
		{"too many batches", `{"floor":1,"messages":{"5":{"batches":1048577}}}`, "message 5: 1048577 batches"},
		{"done past its batches", `{"floor":1,"messages":{"5":{"batches":2,"done":"0-2"}}}`, "batches 0-2 done of 2"},
		{"attempts past its batches", `{"floor":1,"messages":{"5":{"batches":2,"attempts":{"2":1}}}}`, "1 attempts at batch 2 of 2"},
		{"negative attempts", `{"floor":1,"messages":{"5":{"batches":2,"attempts":{"1":-1}}}}`, "-1 attempts at batch 1 of 2"},
	} {
		_, err := ParseProgress([]byte(tc.data))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: ParseProgress = %v, want an error saying %q", tc.name, err, tc.want)
		}
		if tc.name == "a later format needed" && !errors.Is(err, ErrRecordAhead) {
			t.Errorf("%s: %v, want ErrRecordAhead", tc.name, err)
		}
	}
	// At the bounds, accepted: a record of exactly maxRecordBytes, one
	// that needs this reader's format, no attempts yet at a batch.
	exact := `{"floor":1}`
	exact += strings.Repeat(" ", maxRecordBytes-len(exact))
	for _, ok := range []string{exact, `{"needs":1,"floor":1}`, `{"floor":1,"messages":{"5":{"batches":2,"attempts":{"1":0}}}}`} {
		if _, err := ParseProgress([]byte(ok)); err != nil {
			t.Errorf("ParseProgress(%.40q) = %v, want it read", ok, err)
		}
	}
	p, err := ParseProgress([]byte(`{"floor":4,"last":{"seq":6,"mark":"m6"},"messages":{"5":{"mark":"m5","batches":3,"done":"0,2","attempts":{"1":2}}}}`))
	if err != nil {
		t.Fatal(err)
	}
	m := p.Messages[5]
	if p.Floor != 4 || p.Last != (wire.Anchor{Seq: 6, Mark: "m6"}) || !m.Done.Has(0) || m.Done.Has(1) || !m.Done.Has(2) || m.Done.Has(3) || m.Attempts[1] != 2 {
		t.Fatalf("ParseProgress = %+v, message 5 %+v", p, m)
	}
}

// A message's record: the same content and batch count is the same
// message; another is started over, not taken on the old one's word. A
// failure counts against a batch until it is finished. The newest message
// given only moves forward; a floor prunes what is at or below it.
func TestMessageRecord(t *testing.T) {
	var p Progress
	m := p.MessageAt(5, "m5", 3)
	m.Finished(0)
	m.Failed(1)
	m.Failed(1)
	if again := p.MessageAt(5, "m5", 3); again != m || !again.Done.Has(0) || again.Attempts[1] != 2 {
		t.Fatalf("the same message again: %+v", again)
	}
	m.Finished(1)
	if _, ok := m.Attempts[1]; ok || !m.Done.Has(1) {
		t.Fatalf("a batch finished keeps its failures: %+v", m)
	}
	for _, other := range []struct {
		mark string
		n    int
	}{{"other", 3}, {"m5", 4}} {
		if o := p.MessageAt(5, other.mark, other.n); o.Done.Len() != 0 || o.Mark != other.mark || o.Batches != other.n {
			t.Fatalf("another message at 5 (%s, %d batches) took the old one's record: %+v", other.mark, other.n, o)
		}
	}
	unmarked := &Progress{Messages: map[uint64]*MessageProgress{7: {Batches: 2, Done: Batches{{0, 0}}}}}
	if u := unmarked.MessageAt(7, "m7", 2); !u.Done.Has(0) || u.Mark != "m7" {
		t.Fatalf("a record written before marks is the message's: %+v", u)
	}
	if !p.Saw(6, "m6") || p.Saw(4, "m4") || p.Last != (wire.Anchor{Seq: 6, Mark: "m6"}) {
		t.Fatalf("Saw: last %+v", p.Last)
	}
	p.MessageAt(6, "m6", 1)
	p.Prune(5)
	if _, ok := p.Messages[5]; ok || p.Messages[6] == nil || p.Floor != 5 {
		t.Fatalf("Prune(5): %+v", p)
	}
	p.Prune(3)
	if p.Floor != 5 {
		t.Fatalf("a lower floor moved it back: %d", p.Floor)
	}
	c := p.Clone()
	c.Messages[6].Finished(0)
	if p.Messages[6].Done.Has(0) {
		t.Fatal("a clone shares its messages with the original")
	}
}
