package subscriber_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/mailroom/tailer/publish/subscriber"
)

// A unit with nothing left for the reader (its tokens in the dedup
// window, or unsafe on a line) is done at once, nothing written; one with
// lines is done once they are written, and its tokens join the window.
func TestLinesDoneWithNothingToWrite(t *testing.T) {
	var out bytes.Buffer
	window := subscriber.NewDedup[string](8)
	window.Seen("k1")
	l := &subscriber.Lines{Out: &out, Dedup: window}
	seen := &subscriber.Unit{Seq: 1, Tokens: []subscriber.SignedToken{{Action: "activation", Email: "a@x", Login: "a", Token: "t", Key: "k1"}}}
	unsafe := &subscriber.Unit{Seq: 2, Tokens: []subscriber.SignedToken{{Action: "activation", Email: "b,@x", Login: "b", Token: "t", Key: "k2"}}}
	fresh := &subscriber.Unit{Seq: 3, Tokens: []subscriber.SignedToken{{Action: "activation", Email: "c@x", Login: "c", Token: "t", Key: "k3"}}}
	var done []uint64
	if err := l.Hand(context.Background(), []*subscriber.Unit{seen, unsafe, fresh}, func(us ...*subscriber.Unit) {
		for _, u := range us {
			done = append(done, u.Seq)
		}
	}); err != nil {
		t.Fatal(err)
	}
	if len(done) != 3 || done[0] != 1 || done[1] != 2 || done[2] != 3 {
		t.Fatalf("done %v, want 1 and 2 at once, then 3", done)
	}
	if bytes.Contains(out.Bytes(), []byte("a@x")) || !bytes.Contains(out.Bytes(), []byte("c@x")) {
		t.Fatalf("wrote %q, want the fresh token's line alone", out.String())
	}
	if !window.Contains("k3") || window.Contains("k2") {
		t.Fatal("the dedup window does not hold what was written, or holds what was not")
	}
}
