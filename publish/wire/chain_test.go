package wire

import (
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"
)

// header is a batch message's headers naming prev at prevSeq.
func header(prev string, prevSeq uint64) nats.Header {
	h := nats.Header{}
	if prev != "" {
		h.Set(HeaderPrev, prev)
		h.Set(HeaderPrevSeq, strconv.FormatUint(prevSeq, 10))
	}
	return h
}

func TestChainFollow(t *testing.T) {
	var c Chain
	steps := []struct {
		subject string
		seq     uint64
		prev    string
		prevSeq uint64
		mark    string
		again   bool
		gap     bool
	}{
		{"b", 5, "id:x", 4, "id:a", false, false}, // nothing known: no judgement
		{"b", 6, "id:a", 5, "id:b", false, false}, // follows
		{"b.activation", 7, ChainStart, 0, "id:c", false, false},
		{"b", 9, "id:b", 6, "id:d", false, false},                // another subject between
		{"b", 12, "id:x", 10, "id:e", false, true},               // its predecessor was removed
		{"b", 11, "id:x", 10, "id:y", false, false},              // older than the newest given
		{"b", 14, "id:q", 13, "id:f", true, false},               // delivered again: says nothing
		{"b", 15, "", 0, "id:g", false, false},                   // an older tailer's message
		{"b.activation", 20, ChainStart, 0, "id:h", false, true}, // the chain starts again
		{"b.activation", 21, "id:h", 20, "id:i", false, false},
	}
	for i, s := range steps {
		gap := c.Follow(s.subject, s.seq, header(s.prev, s.prevSeq), s.mark, s.again)
		if (gap != nil) != s.gap {
			t.Fatalf("step %d: gap %v, want one: %v", i, gap, s.gap)
		}
		if gap != nil && (gap.Seq != s.seq || gap.Prev != (Anchor{s.prevSeq, s.prev}) || gap.Subject != s.subject) {
			t.Fatalf("step %d: %+v", i, gap)
		}
	}
	if got := c.Subjects["b"]; got != (Anchor{Seq: 15, Mark: "id:g"}) {
		t.Fatalf("newest on b: %+v", got)
	}
	// A resync's message after a gap: its tokens are being published
	// again.
	h := header(ChainStart, 0)
	h.Set(HeaderResync, "0/5000000")
	if gap := c.Follow("b", 40, h, "id:r", false); gap == nil || !gap.Resynced {
		t.Fatalf("a resync's message after a gap: %+v", gap)
	}
}

// A reader that knows only the last message it handled, not its subject
// (the inbox): a message on a subject not seen since is judged by where
// its predecessor is.
func TestChainSeed(t *testing.T) {
	seed := Anchor{Seq: 10, Mark: "id:s"}
	for _, tc := range []struct {
		name    string
		seq     uint64
		prev    string
		prevSeq uint64
		gap     bool
	}{
		{"follows the seed", 11, "id:s", 10, false},
		{"follows an older message of another subject's reader", 12, "id:o", 7, false},
		{"the first of its subject", 12, ChainStart, 0, false},
		{"follows a message after the seed, never had", 14, "id:n", 12, true},
		{"follows another message at the seed's place", 11, "id:z", 10, true},
		{"at or before the seed", 10, "id:n", 12, false},
	} {
		c := Chain{Seed: seed}
		gap := c.Follow("b", tc.seq, header(tc.prev, tc.prevSeq), "id:m", false)
		if (gap != nil) != tc.gap {
			t.Errorf("%s: gap %v, want one: %v", tc.name, gap, tc.gap)
		}
		if gap != nil && gap.Given != seed {
			t.Errorf("%s: given %+v, want the seed", tc.name, gap.Given)
		}
	}
}

// A seed of a place only (a consumer's ack floor) knows no mark: whatever
// stands at it was handled; only a predecessor past it was never had.
func TestChainSeedPlaceOnly(t *testing.T) {
	for _, tc := range []struct {
		name    string
		seq     uint64
		prevSeq uint64
		gap     bool
	}{
		{"follows the message at the floor", 11, 10, false},
		{"follows one before the floor", 12, 7, false},
		{"follows a message after the floor, never had", 14, 12, true},
	} {
		c := Chain{Seed: Anchor{Seq: 10}}
		if gap := c.Follow("b", tc.seq, header("id:p", tc.prevSeq), "id:m", false); (gap != nil) != tc.gap {
			t.Errorf("%s: gap %v, want one: %v", tc.name, gap, tc.gap)
		}
	}
}
