package subscriber

import (
	"context"
	"errors"
	"github.com/mailroom/tailer/publish/subscriber/protocol"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/internal/testutil/natstest"
	"github.com/mailroom/tailer/publish/wire"
)

// keptRecord is a record store that keeps what was saved last.
type keptRecord struct {
	p   protocol.Progress
	rev uint64
}

func (k *keptRecord) Load(context.Context) (protocol.Progress, uint64, error) {
	return k.p.Clone(), k.rev, nil
}

func (k *keptRecord) Save(_ context.Context, p *protocol.Progress, rev uint64) (uint64, error) {
	if rev != k.rev {
		return 0, ErrTakenOver
	}
	k.p, k.rev = p.Clone(), k.rev+1
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
	old := protocol.Progress{Floor: 50, Last: wire.Anchor{Seq: 50, Mark: "id:old-50"}}
	store := &keptRecord{p: old, rev: 3}
	s := kept(t, &Subscriber{cfg: Config{Progress: store, Durable: "d"}}, protocol.Machine{Holdings: protocol.Holdings{Rev: 3, Pin: "p1"}})
	s.loaded.Store(true)
	if err := s.refresh(context.Background(), pinnedMsg{pin: "p2"}); err != nil {
		t.Fatal(err)
	}
	if store.p.Floor != 0 || store.p.Last.Seq != 0 {
		t.Fatalf("claimed the record read back (floor %d, last %d), not this subscriber's (empty)", store.p.Floor, store.p.Last.Seq)
	}
	if h := s.keep.stop(); h.Record.Floor != 0 {
		t.Fatalf("the subscriber took floor %d of the old stream", h.Record.Floor)
	}
}

// oneMessage starts a JetStream server for t with the stream S holding
// one message, at sequence 1.
func oneMessage(ctx context.Context, t *testing.T) jetstream.JetStream {
	t.Helper()
	_, js := natstest.JetStream(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"b"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: "b", Header: nats.Header{wire.HeaderMsgID: {"new-1"}}, Data: []byte{1}}); err != nil {
		t.Fatal(err)
	}
	return js
}

// A standby pinned on a stream made again reads back the record its
// predecessor left, of the old stream (killed before it saved that it
// dropped it): it is held against the stream and dropped, not merged
// (the simulation, "rebuilt under standbys": the old floor had the new
// stream's first message acknowledged unwritten).
func TestRecordReadBackOfAnotherStreamIsDropped(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js := oneMessage(ctx, t)
	old := protocol.Progress{Floor: 5, Last: wire.Anchor{Seq: 5, Mark: "id:old-5"}}
	store := &keptRecord{p: old, rev: 3}
	s := kept(t, &Subscriber{cfg: Config{Progress: store, Durable: "d", Stream: "S"}, js: js}, protocol.Machine{Holdings: protocol.Holdings{Rev: 2, Pin: "p1"}})
	s.loaded.Store(true)
	if err := s.refresh(ctx, pinnedMsg{pin: "p2"}); err != nil {
		t.Fatal(err)
	}
	if h := s.keep.stop(); store.p.Floor != 0 || h.Record.Floor != 0 {
		t.Fatalf("the old stream's floor merged: %d claimed, %d in hand", store.p.Floor, h.Record.Floor)
	}
}

// A standby's record that names no message, only the ack floor it read
// of a consumer since gone, is dropped when the consumer is seen again
// (a floor names a place in no stream in particular).
func TestFloorAloneIsDropped(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js := oneMessage(ctx, t)
	s := kept(t, &Subscriber{cfg: Config{Durable: "d", Stream: "S"}, js: js}, protocol.Machine{Holdings: protocol.Holdings{Record: protocol.Progress{Floor: 7}}})
	if err := s.checkRecord(ctx, js, false); err != nil {
		t.Fatal(err)
	}
	if h := s.keep.stop(); h.Record.Floor != 0 {
		t.Fatalf("kept floor %d of a consumer since gone", h.Record.Floor)
	}
}

// A save refused by a late write, while the server still pins this
// subscriber, merges that write only if it is of this stream: the
// other's, frozen as the stream was made again, saved the old record as
// it woke (the simulation's TestLateWriteOfTheOldStream).
func TestSaveOverDropsALateWriteOfAnotherStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js := oneMessage(ctx, t)
	store := &keptRecord{p: protocol.Progress{Floor: 5, Last: wire.Anchor{Seq: 5, Mark: "id:old-5"}}, rev: 3}
	own := protocol.Progress{Last: wire.Anchor{Seq: 1, Mark: wire.IDMark("new-1")}}
	s := kept(t, &Subscriber{cfg: Config{Progress: store, Durable: "d", Stream: "S"}, js: js}, protocol.Machine{Holdings: protocol.Holdings{Rev: 2, Record: own, Pin: "p1", Dirty: true}})
	var cons jetstream.Consumer = pinningConsumer{pin: "p1"}
	s.cons.Store(&cons)
	if err := s.save(ctx); err != nil {
		t.Fatal(err)
	}
	if h := s.keep.stop(); store.p.Floor != 0 || h.Record.Floor != 0 || h.Record.Last != own.Last || store.rev != 4 {
		t.Fatalf("the late write of the old stream merged: floor %d saved at revision %d, %d in hand, last %+v", store.p.Floor, store.rev, h.Record.Floor, h.Record.Last)
	}
}

// pinningConsumer is a consumer whose info says the server pins pin.
type pinningConsumer struct {
	jetstream.Consumer
	pin string
}

func (c pinningConsumer) Info(context.Context) (*jetstream.ConsumerInfo, error) {
	return &jetstream.ConsumerInfo{PriorityGroups: []jetstream.PriorityGroupState{{Group: PriorityGroup, PinnedClientID: c.pin}}}, nil
}

// slowBucket refuses its first saves as a bucket without a leader does,
// then takes them; taken: refused as another's write instead.
type slowBucket struct {
	fails, saves int
	taken        bool
}

func (b *slowBucket) Load(context.Context) (protocol.Progress, uint64, error) {
	return protocol.Progress{}, 1, nil
}

func (b *slowBucket) Save(context.Context, *protocol.Progress, uint64) (uint64, error) {
	switch b.saves++; {
	case b.taken:
		return 0, ErrTakenOver
	case b.saves <= b.fails:
		return 0, nats.ErrTimeout
	}
	return 2, nil
}

// countedMsg counts the in-progress acks that keep it from redelivery.
type countedMsg struct {
	jetstream.Msg
	inProgress int
}

func (m *countedMsg) InProgress() error { m.inProgress++; return nil }

// The save before an ack waits out a bucket that cannot take it, the
// message kept from redelivery meanwhile, and ends at once when the
// save is refused as another's (saveNow; issue 49).
func TestSaveNowWaitsOutTheBucket(t *testing.T) {
	dirty := protocol.Machine{Holdings: protocol.Holdings{Rev: 1, Dirty: true}}
	b := &slowBucket{fails: 2}
	s := kept(t, &Subscriber{cfg: Config{Progress: b, Durable: "d"}}, dirty)
	msg := &countedMsg{}
	if err := s.saveNow(context.Background(), msg); err != nil || b.saves != 3 || msg.inProgress != 2 {
		t.Fatalf("saveNow = %v after %d saves and %d in-progress acks; want it saved at the third, kept twice", err, b.saves, msg.inProgress)
	}
	b = &slowBucket{taken: true}
	s = kept(t, &Subscriber{cfg: Config{Progress: b, Durable: "d"}}, dirty)
	if err := s.saveNow(context.Background(), msg); !errors.Is(err, ErrTakenOver) || b.saves != 1 {
		t.Fatalf("saveNow refused = %v after %d saves; want ErrTakenOver after one", err, b.saves)
	}
}

// acklessMsg is a delivery whose ack the server never confirms (a
// consumer leader frozen or cut off).
type acklessMsg struct{ jetstream.Msg }

func (acklessMsg) DoubleAck(context.Context) error { return nats.ErrTimeout }

// An ack the server did not confirm leaves the message in the record, its
// batches done and it not acknowledged: delivered again, it is acked
// without a line (finish, acked).
func TestUnconfirmedAckKeepsItsRecord(t *testing.T) {
	h := protocol.Machine{}
	taken, ok := answerOf[protocol.Taken](h.Step(protocol.Offer{Seq: 5, Mark: "m5", Tokens: []int{1}, Msg: acklessMsg{}}))
	if !ok || taken.Held == nil {
		t.Fatal("the offer was not taken")
	}
	h.Step(protocol.Done{Batches: []protocol.HeldBatch{{Held: taken.Held, Line: 0}}})
	s := kept(t, &Subscriber{cfg: Config{Durable: "d"}}, h)
	s.finish(context.Background(), taken.Held)
	rec := s.keep.stop().Record.Messages[5]
	if rec == nil || rec.Acked || !rec.Done.Has(0) {
		t.Fatalf("the record of a message whose ack was not confirmed: %+v, want its batch done and it not acknowledged", rec)
	}
}
