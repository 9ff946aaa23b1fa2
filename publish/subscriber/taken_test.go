package subscriber_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/publish/subscriber"
	"github.com/mailroom/tailer/publish/wire"
)

// doneSink finishes every unit at once, noting each message it was given.
type doneSink struct {
	mu   sync.Mutex
	seqs map[uint64]int
}

func (s *doneSink) Hand(_ context.Context, us []*subscriber.Unit, done func(...*subscriber.Unit)) error {
	s.mu.Lock()
	for _, u := range us {
		s.seqs[u.Seq]++
	}
	s.mu.Unlock()
	done(us...)
	return nil
}

func (s *doneSink) given(seq uint64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seqs[seq]
}

// lockedBuffer is a log a subscriber writes while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// chained publishes the next message of threeMessages' format on S,
// naming its predecessor (HeaderPrev, HeaderPrevSeq) as the tailer does.
func chained(ctx context.Context, t *testing.T, js jetstream.JetStream, seq uint64) {
	t.Helper()
	h, body, _, _ := encoded(t, wire.FormatLine)
	hi := nats.Header{}
	for k, v := range h {
		hi[k] = v
	}
	hi.Set(wire.HeaderMsgID, fmt.Sprintf("c-%d", seq))
	if seq > 1 {
		hi.Set(wire.HeaderPrev, wire.IDMark(fmt.Sprintf("c-%d", seq-1)))
		hi.Set(wire.HeaderPrevSeq, strconv.FormatUint(seq-1, 10))
	}
	ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: "b", Header: hi, Data: body})
	if err != nil || ack.Sequence != seq {
		t.Fatalf("publish message %d: %v (at %v)", seq, err, ack)
	}
}

// runUntil runs sub until the consumer d's ack floor reaches floor.
func runUntil(ctx context.Context, t *testing.T, js jetstream.JetStream, sub *subscriber.Subscriber, floor uint64) {
	t.Helper()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sub.Run(runCtx, js) }()
	defer func() { stop(); <-done }()
	waitFor(t, 20*time.Second, func() bool {
		c, err := js.Consumer(ctx, "S", "d")
		if err != nil {
			return false
		}
		info, err := c.Info(ctx)
		return err == nil && info.AckFloor.Stream >= floor
	})
}

// A message of a durable that does not pin one subscriber (made before
// tailer subscribe pinned, or by hand), taken and acknowledged by another
// client (nats consumer next), is said by the subscriber as the chain
// shows it missing: an error naming the message, counted. Tokens the
// subscriber never wrote are otherwise lost without a word.
func TestMessageTakenByAnotherClientIsSaid(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js := progressServer(t, ctx, nil)
	chained(ctx, t, js, 1)
	if _, err := (subscriber.Durable{Stream: "S", Subject: "b", Name: "d", FromStart: true}).Ensure(ctx, js); err != nil {
		t.Fatal(err)
	}
	store, err := subscriber.OpenProgress(ctx, js, "S", "d")
	if err != nil {
		t.Fatal(err)
	}
	var log lockedBuffer
	sink := &doneSink{seqs: map[uint64]int{}}
	cfg := subscriber.Config{Stream: "S", Subject: "b", Durable: "d", Sink: sink, Progress: store, Pinned: true,
		Log: slog.New(slog.NewTextHandler(&log, nil))}
	runUntil(ctx, t, js, newSubscriber(t, cfg), 1)

	// Another client takes the next message and acknowledges it.
	chained(ctx, t, js, 2)
	cons, err := js.Consumer(ctx, "S", "d")
	if err != nil {
		t.Fatal(err)
	}
	msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := msg.DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	chained(ctx, t, js, 3)
	sub := newSubscriber(t, cfg)
	runUntil(ctx, t, js, sub, 3)
	if sink.given(2) != 0 || sink.given(3) != 2 {
		t.Fatalf("the sink was given message 2 %d times, 3 %d times; want 0 and 2 batches", sink.given(2), sink.given(3))
	}
	if n := sub.Stats().TakenElsewhere; n != 1 {
		t.Errorf("TakenElsewhere = %d, want 1\n%s", n, log.String())
	}
	said := ""
	for _, line := range strings.Split(log.String(), "\n") {
		if strings.Contains(line, "level=ERROR") && strings.Contains(line, "given to another client") {
			said = line
		}
	}
	if !strings.Contains(said, "taken_stream_seq=2") || !strings.Contains(said, "taken_mark=id:c-2") {
		t.Fatalf("no error naming message 2:\n%s", log.String())
	}
	t.Logf("said: %s", said)
}

// On a durable that pins one subscriber, as tailer subscribe makes it,
// another client's pull under a running subscriber takes nothing: the
// server refuses it without the priority group, and keeps it waiting
// with the group and no pin; the subscriber is given every message.
func TestPinnedDurableRefusesAnotherClient(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js := progressServer(t, ctx, nil)
	chained(ctx, t, js, 1)
	store, err := subscriber.OpenProgress(ctx, js, "S", "d")
	if err != nil {
		t.Fatal(err)
	}
	sink := &doneSink{seqs: map[uint64]int{}}
	sub := newSubscriber(t, subscriber.Config{Stream: "S", Subject: "b", Durable: "d", FromStart: true, Sink: sink, Progress: store,
		Pinned: true, PinnedTTL: 10 * time.Second})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sub.Run(runCtx, js) }()
	defer func() { stop(); <-done }()
	waitFor(t, 20*time.Second, func() bool { return sink.given(1) == 2 })

	cons, err := js.Consumer(ctx, "S", "d")
	if err != nil {
		t.Fatal(err)
	}
	for i, try := range []struct {
		name string
		opts []jetstream.FetchOpt
	}{
		{"without the group (nats consumer next)", nil},
		{"in the group, without the pin", []jetstream.FetchOpt{jetstream.FetchPriorityGroup(subscriber.PriorityGroup)}},
	} {
		chained(ctx, t, js, uint64(2+i))
		batch, err := cons.Fetch(1, append(try.opts, jetstream.FetchMaxWait(2*time.Second))...)
		if err == nil {
			for m := range batch.Messages() {
				t.Fatalf("%s: given message %s", try.name, m.Headers().Get(wire.HeaderMsgID))
			}
			err = batch.Error()
		}
		// Without the group: 400; in it without the pin, the pull waits
		// as a standby's does until the pin is let go, given nothing.
		t.Logf("%s: given nothing (%v)", try.name, err)
	}
	waitFor(t, 20*time.Second, func() bool { return sink.given(2) == 2 && sink.given(3) == 2 })
	if n := sub.Stats().TakenElsewhere; n != 0 {
		t.Fatalf("TakenElsewhere = %d on a pinned durable", n)
	}
}
