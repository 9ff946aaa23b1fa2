package consume_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mailroom/tailer/publish/consume"
	"github.com/mailroom/tailer/publish/wire"
)

// A gap whose predecessor the stream still holds where the next message
// names it is none (a subscriber took over from one that died before its
// record said it had that message); one whose predecessor was removed is
// counted and open until a resync's message comes.
func TestGapsCheckTheStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js := progressServer(t, ctx, nil)
	var marks []string
	for i, id := range []string{"m1", "m2", "m3"} {
		ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: "b", Header: nats.Header{wire.HeaderMsgID: {id}}, Data: []byte{byte(i)}})
		if err != nil || ack.Sequence != uint64(i+1) {
			t.Fatalf("publish %s: %v at %d", id, err, ack.Sequence)
		}
		marks = append(marks, wire.IDMark(id))
	}
	var gaps consume.Gaps
	// The record said m1; m2 went to a subscriber that died; m3 comes.
	given := wire.Anchor{Seq: 1, Mark: marks[0]}
	gap := &wire.Gap{Subject: "b", Seq: 3, Prev: wire.Anchor{Seq: 2, Mark: marks[1]}, Given: given}
	gaps.Note(ctx, js, "S", "d", nil, nats.Header{}, gap)
	if n, open := gaps.State(); n != 0 || open != "" {
		t.Fatalf("the predecessor is on the stream: %d gaps, open %q", n, open)
	}
	s, err := js.Stream(ctx, "S")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteMsg(ctx, 2); err != nil {
		t.Fatal(err)
	}
	gaps.Note(ctx, js, "S", "d", nil, nats.Header{}, gap)
	if n, open := gaps.State(); n != 1 || open == "" {
		t.Fatalf("the predecessor was removed: %d gaps, open %q", n, open)
	}
	// Another at the predecessor's place is no predecessor either.
	other := &wire.Gap{Subject: "b", Seq: 4, Prev: wire.Anchor{Seq: 3, Mark: "id:other"}, Given: given}
	gaps.Note(ctx, js, "S", "d", nil, nats.Header{}, other)
	if n, _ := gaps.State(); n != 2 {
		t.Fatalf("another message at the predecessor's place: %d gaps, want 2", n)
	}
	gaps.Note(ctx, js, "S", "d", nil, nats.Header{wire.HeaderResync: {"0/1"}}, nil)
	if n, open := gaps.State(); n != 2 || open != "" {
		t.Fatalf("after a resync's message: %d gaps, open %q", n, open)
	}
}
