package publish

import (
	"context"
	"errors"
	"github.com/mailroom/tailer/decoder/wal"
	"testing"
	"time"

	"github.com/mailroom/tailer/batch"
	"github.com/mailroom/tailer/decoder"
	"github.com/mailroom/tailer/decoder/action"
	"github.com/mailroom/tailer/publish/join"
	"github.com/mailroom/tailer/publish/token"
	"github.com/mailroom/tailer/publish/wire"
)

// publishAll is a Joiner for which every token is still to be mailed.
type publishAll struct{}

func (publishAll) JoinMany(_ context.Context, _ [][]decoder.Token, rows [][]join.TokenState) error {
	for b := range rows {
		for i := range rows[b] {
			if rows[b][i].Skip == join.Publish {
				rows[b][i].Email, rows[b][i].Login = []byte("a@example.com"), []byte("a")
			}
		}
	}
	return nil
}

// A PubAck that says "duplicate" for a message the stream does not hold
// (seen on a NATS 2.10 cluster after a full restart; here the message is
// deleted while its id stays in the duplicate window) must not count the
// batch as published: the pipeline fails and the batch is not done, so its
// tokens stay in the slot.
func TestDuplicateAckForAMissingMessage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, js := testJetStream(t)
	signer, err := token.NewSigner("k", make([]byte, token.KeySize))
	if err != nil {
		t.Fatal(err)
	}
	tok := decoder.Token{Pos: wal.Position{Commit: 0x2000}, ID: 1, Action: action.Activation}
	session := func() (done int, err error) {
		pub, err := NewPublisher(ctx, nc, Destination{Name: "DUPACK", Subject: "mailroom.batches"})
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close()
		p := &Pipeline{Publisher: pub, Joiner: publishAll{}, Encoder: NewEncoder(signer, wire.FormatLine), Done: func(*batch.Batch) { done++ }}
		in := make(chan *batch.Batch, 1)
		in <- &batch.Batch{Tokens: []decoder.Token{tok}}
		close(in)
		return done, p.Run(ctx, in)
	}
	if done, err := session(); done != 1 || err != nil {
		t.Fatalf("first publish: done %d, %v", done, err)
	}
	stream, err := js.Stream(ctx, "DUPACK")
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.DeleteMsg(ctx, 1); err != nil {
		t.Fatal(err)
	}
	done, err := session()
	if done != 0 || !errors.Is(err, ErrDuplicateGone) {
		t.Fatalf("republished batch whose message is gone: done %d, %v", done, err)
	}
}

// A message refused because the stream is gone (no responders) is not
// taken for another writer's doing: only the chain's refusal is
// ErrStreamMoved (TestGroupRefusedHalfWay has that one).
func TestRefusalOtherThanTheChainIsNotStreamMoved(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, js := testJetStream(t)
	signer, err := token.NewSigner("k", make([]byte, token.KeySize))
	if err != nil {
		t.Fatal(err)
	}
	pub, err := NewPublisher(ctx, nc, Destination{Name: "GONE", Subject: "mailroom.batches"})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if err := js.DeleteStream(ctx, "GONE"); err != nil {
		t.Fatal(err)
	}
	p := &Pipeline{Publisher: pub, Joiner: publishAll{}, Encoder: NewEncoder(signer, wire.FormatLine), Done: func(*batch.Batch) { t.Error("a batch done without a stream") }}
	in := make(chan *batch.Batch, 1)
	in <- &batch.Batch{Tokens: []decoder.Token{{Pos: wal.Position{Commit: 0x2000}, ID: 1, Action: action.Activation}}}
	close(in)
	err = p.Run(ctx, in)
	if err == nil || errors.Is(err, ErrStreamMoved) {
		t.Fatalf("Run into a deleted stream = %v, want a failure that is not ErrStreamMoved", err)
	}
}
