package subscriber_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/internal/embedded"
	"github.com/mailroom/tailer/publish/subscriber"
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
	var gaps subscriber.Gaps
	// The record said m1; m2 went to a subscriber that died; m3 comes.
	given := wire.Anchor{Seq: 1, Mark: marks[0]}
	gap := &wire.Gap{Subject: "b", Seq: 3, Prev: wire.Anchor{Seq: 2, Mark: marks[1]}, Given: given}
	gaps.Note(ctx, subscriber.GapCheck{JS: js, Stream: "S", Durable: "d", Pinned: true}, nats.Header{}, gap, nil)
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
	gaps.Note(ctx, subscriber.GapCheck{JS: js, Stream: "S", Durable: "d", Pinned: true}, nats.Header{}, gap, nil)
	if n, open := gaps.State(); n != 1 || open == "" {
		t.Fatalf("the predecessor was removed: %d gaps, open %q", n, open)
	}
	// Another at the predecessor's place is no predecessor either.
	other := &wire.Gap{Subject: "b", Seq: 4, Prev: wire.Anchor{Seq: 3, Mark: "id:other"}, Given: given}
	gaps.Note(ctx, subscriber.GapCheck{JS: js, Stream: "S", Durable: "d", Pinned: true}, nats.Header{}, other, nil)
	if n, _ := gaps.State(); n != 2 {
		t.Fatalf("another message at the predecessor's place: %d gaps, want 2", n)
	}
	gaps.Note(ctx, subscriber.GapCheck{JS: js, Stream: "S", Durable: "d", Pinned: true}, nats.Header{wire.HeaderResync: {"0/1"}}, nil, nil)
	if n, open := gaps.State(); n != 2 || open != "" {
		t.Fatalf("after a resync's message: %d gaps, open %q", n, open)
	}
	// Asked to stop, it asks the stream once more, and a stream that
	// answers judges the gap all the same.
	stopped, stop := context.WithCancel(ctx)
	stop()
	gaps.Note(stopped, subscriber.GapCheck{JS: js, Stream: "S", Durable: "d", Pinned: true}, nats.Header{}, gap, nil)
	if n, open := gaps.State(); n != 3 || open == "" {
		t.Fatalf("stopping, the stream answering: %d gaps, open %q; want the gap said", n, open)
	}
}

// A stream that cannot answer for longer than a client's usual wait (its
// leader being elected, a node partitioned) is asked again, the message
// kept, until it does: a gap is not said on a slow answer (issue 49's
// fault runs: one said during a node's SIGSTOP, sending the operator to
// resync for nothing). Here the server holding the stream is down for
// its first 6 s.
func TestGapsWaitForTheStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	srv, err := embedded.Start(dir, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "LATE", Subjects: []string{"late"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"m1", "m2"} {
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: "late", Header: nats.Header{wire.HeaderMsgID: {id}}}); err != nil {
			t.Fatal(err)
		}
	}
	nc.Close()
	srv.Shutdown()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	nc, err = nats.Connect("nats://"+addr, nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ = jetstream.New(nc)
	go func() {
		time.Sleep(6 * time.Second)
		srv, err := embedded.Start(dir, addr)
		if err != nil {
			t.Error(err)
			return
		}
		t.Cleanup(srv.Shutdown)
	}()
	gap := &wire.Gap{Subject: "late", Seq: 3, Prev: wire.Anchor{Seq: 2, Mark: wire.IDMark("m2")}, Given: wire.Anchor{Seq: 1, Mark: wire.IDMark("m1")}}
	var gaps subscriber.Gaps
	var kept atomic.Int32
	gaps.Note(ctx, subscriber.GapCheck{JS: js, Stream: "LATE", Durable: "d", Pinned: true}, nats.Header{}, gap, func() { kept.Add(1) })
	if n, open := gaps.State(); n != 0 || open != "" {
		t.Fatalf("the stream answered late, holding the predecessor: %d gaps, open %q", n, open)
	}
	if kept.Load() == 0 {
		t.Fatal("the message was not kept while the stream was asked again")
	}
}

// A subscriber asked to stop while the stream does not answer judges no
// gap: the predecessor is not known missing (issue 71: subscribers
// stopped during their check said "messages missing" of messages the
// stream held, sending the operator to resync for nothing).
func TestGapsNotJudgedWhenStopped(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	nc, err := nats.Connect("nats://"+addr, nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	gap := &wire.Gap{Subject: "s", Seq: 3, Prev: wire.Anchor{Seq: 2, Mark: wire.IDMark("m2")}, Given: wire.Anchor{Seq: 1, Mark: wire.IDMark("m1")}}
	var gaps subscriber.Gaps
	gaps.Note(ctx, subscriber.GapCheck{JS: js, Stream: "S", Durable: "d", Pinned: true}, nats.Header{}, gap, nil)
	if n, open := gaps.State(); n != 0 || open != "" {
		t.Fatalf("stopped while the stream did not answer: %d gaps, open %q, want none judged", n, open)
	}
}

// sinkRecord is a Positioner answering Holds from what it stored, after
// failing its first fails asks (a database restarting).
type sinkRecord struct {
	stored map[string]bool
	fails  atomic.Int32
	asked  atomic.Int32
}

func (r *sinkRecord) Position(context.Context, string, string) (subscriber.Stored, bool, error) {
	return subscriber.Stored{}, false, nil
}

func (r *sinkRecord) Holds(_ context.Context, stream, durable string, seq uint64, id string) (bool, error) {
	r.asked.Add(1)
	if r.fails.Add(-1) >= 0 {
		return false, errors.New("the database is restarting")
	}
	return r.stored[fmt.Sprint(stream, durable, seq, id)], nil
}

// A gap whose predecessor the stream lost is none when the sink's own
// record says it stored it: its subscriber died after the commit, before
// its record of progress said so (make sim seed 3341109095, everything:
// a standby said messages missing whose tokens the inbox had). A sink
// that cannot answer yet is asked again, the message kept; one that does
// not hold it leaves the gap said.
func TestGapsAskTheSink(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js := progressServer(t, ctx, nil)
	for _, id := range []string{"m1", "m2", "m3"} {
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: "b", Header: nats.Header{wire.HeaderMsgID: {id}}}); err != nil {
			t.Fatal(err)
		}
	}
	s, err := js.Stream(ctx, "S")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteMsg(ctx, 2); err != nil {
		t.Fatal(err)
	}
	sink := &sinkRecord{stored: map[string]bool{fmt.Sprint("S", "d", uint64(2), "m2"): true}}
	sink.fails.Store(2)
	check := subscriber.GapCheck{JS: js, Stream: "S", Durable: "d", Pinned: true, Sink: sink}
	gap := &wire.Gap{Subject: "b", Seq: 3, Prev: wire.Anchor{Seq: 2, Mark: wire.IDMark("m2")}, Given: wire.Anchor{Seq: 1, Mark: wire.IDMark("m1")}}
	var gaps subscriber.Gaps
	var kept atomic.Int32
	gaps.Note(ctx, check, nats.Header{}, gap, func() { kept.Add(1) })
	if n, open := gaps.State(); n != 0 || open != "" {
		t.Fatalf("the sink stored the predecessor the stream lost: %d gaps, open %q", n, open)
	}
	if sink.asked.Load() != 3 || kept.Load() != 2 {
		t.Fatalf("the sink asked %d times, the message kept %d times; want 3 and 2", sink.asked.Load(), kept.Load())
	}
	other := &wire.Gap{Subject: "b", Seq: 3, Prev: wire.Anchor{Seq: 2, Mark: wire.IDMark("other")}, Given: gap.Given}
	gaps.Note(ctx, check, nats.Header{}, other, nil)
	if n, open := gaps.State(); n != 1 || open == "" {
		t.Fatalf("the sink stored another message at the predecessor's place: %d gaps, open %q; want the gap said", n, open)
	}
	check.Sink = nil
	gaps.Note(ctx, check, nats.Header{}, gap, nil)
	if n, _ := gaps.State(); n != 2 {
		t.Fatalf("no sink of its own to ask: %d gaps, want 2", n)
	}
}
