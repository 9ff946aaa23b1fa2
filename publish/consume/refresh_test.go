package consume

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/publish/wire"
)

// keptRecord is a record store that keeps what was saved last.
type keptRecord struct {
	p   Progress
	rev uint64
}

func (k *keptRecord) Load(context.Context) (Progress, uint64, error) { return k.p.clone(), k.rev, nil }

func (k *keptRecord) Save(_ context.Context, p *Progress, rev uint64) (uint64, error) {
	if rev != k.rev {
		return 0, ErrTakenOver
	}
	k.p, k.rev = p.clone(), k.rev+1
	return k.rev, nil
}

// pinnedMsg is a delivery under pin; nothing else of it is asked.
type pinnedMsg struct {
	jetstream.Msg
	pin string
}

func (m pinnedMsg) Headers() nats.Header { return nats.Header{"Nats-Pin-Id": []string{m.pin}} }
func (m pinnedMsg) InProgress() error    { return nil }

// A subscriber that dropped its record (of a stream made again) and is
// then pinned anew, nobody having written the record since, claims its
// own record, not the one it read back: that one's floor, of the old
// stream, would skip this stream's messages below it (issue 64: a claim
// that wrote back the record it had read lost 10 of 60 tokens).
func TestClaimKeepsWhatThisSubscriberDropped(t *testing.T) {
	old := Progress{Floor: 50, Last: wire.Anchor{Seq: 50, Mark: "id:old-50"}}
	store := &keptRecord{p: old, rev: 3}
	s := &Subscriber{cfg: Config{Progress: store, Durable: "d"}, rev: 3, loaded: true, pinID: "p1"}
	if err := s.refresh(context.Background(), pinnedMsg{pin: "p2"}); err != nil {
		t.Fatal(err)
	}
	if store.p.Floor != 0 || store.p.Last.Seq != 0 {
		t.Fatalf("claimed the record read back (floor %d, last %d), not this subscriber's (empty)", store.p.Floor, store.p.Last.Seq)
	}
	if s.prog.Floor != 0 {
		t.Fatalf("the subscriber took floor %d of the old stream", s.prog.Floor)
	}
}
