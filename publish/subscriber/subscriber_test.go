package subscriber_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"github.com/mailroom/tailer/publish/subscriber/protocol"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/internal/embedded"
	"github.com/mailroom/tailer/publish/subscriber"
	"github.com/mailroom/tailer/publish/wire"
)

// threeMessages starts a JetStream server for t with the stream S (subject
// b) holding three messages of two batches each (batch-a to batch-c).
func threeMessages(ctx context.Context, t *testing.T) jetstream.JetStream {
	t.Helper()
	srv, err := embedded.Start(t.TempDir(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"b", "b.>"}}); err != nil {
		t.Fatal(err)
	}
	h, body, _, _ := encoded(t, wire.FormatLine)
	for i := range 3 {
		hi := nats.Header{}
		for k, v := range h {
			hi[k] = v
		}
		hi.Set(wire.HeaderMsgID, "batch-"+string(rune('a'+i)))
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: "b", Header: hi, Data: body}); err != nil {
			t.Fatal(err)
		}
	}
	return js
}

// newSubscriber is a subscriber of c, which must hold.
func newSubscriber(tb testing.TB, c subscriber.Config) *subscriber.Subscriber {
	tb.Helper()
	s, err := subscriber.NewSubscriber(c)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Close)
	return s
}

// readerPipe is a pipe for a subscriber to write into and the test to read
// from, as a sender's stdin; the read end is closed when tb ends.
func readerPipe(tb testing.TB) (r, w *os.File, pipe *subscriber.Pipe) {
	tb.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { r.Close() })
	pipe, ok := subscriber.OpenPipe(w)
	if !ok {
		tb.Fatal("an os.Pipe is not taken for a pipe")
	}
	return r, w, pipe
}

// pipeSubscriber is a subscriber of the durable d, from the start of
// threeMessages' stream, into a pipe the test reads from r, its record in
// the stream's bucket; tune, if set, changes its settings first.
func pipeSubscriber(ctx context.Context, t *testing.T, ackWait time.Duration, tune func(*subscriber.Config)) (jetstream.JetStream, *os.File, *subscriber.Subscriber) {
	t.Helper()
	js := threeMessages(ctx, t)
	r, w, pipe := readerPipe(t)
	store, err := subscriber.OpenProgress(ctx, js, "S", "d")
	if err != nil {
		t.Fatal(err)
	}
	c := subscriber.Config{Stream: "S", Subject: "b", Durable: "d", FromStart: true, Sink: &subscriber.Lines{Out: w, Pipe: pipe}, AckWait: ackWait, Progress: store}
	if tune != nil {
		tune(&c)
	}
	return js, r, newSubscriber(t, c)
}

// Into a pipe, a batch is done only once the reader has taken the next
// one, and a message is acknowledged once all its batches are done; the
// batch it took last is in doubt, and its message handed back for
// redelivery when the reader goes, the batches done before it not written
// again. The test is the reader, a line at a time, on a real JetStream
// server.
func TestSubscriberPipe(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, r, sub := pipeSubscriber(ctx, t, time.Second, nil)
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx, js) }()
	cons, err := js.Consumer(ctx, "S", "d")
	for err != nil {
		time.Sleep(10 * time.Millisecond)
		cons, err = js.Consumer(ctx, "S", "d")
	}
	acked := func() uint64 {
		t.Helper()
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.AckFloor.Stream
	}
	lines := bufio.NewReader(r)
	for i := 1; i <= 3; i++ {
		// Each message holds two batches, of two tokens and one: a line
		// each, as the collector wrote them.
		for _, tokens := range []int{2, 1} {
			line, err := lines.ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			if fields := strings.Split(strings.TrimSuffix(line, "\n"), ","); len(fields) != 5*tokens {
				t.Fatalf("message %d: line %q has %d fields, want %d", i, line, len(fields), 5*tokens)
			}
		}
		// Taking line i acknowledges message i-1 and no more; more than
		// AckWait passes by without a redelivery (kept in progress).
		time.Sleep(1500 * time.Millisecond)
		if got := acked(); got != uint64(i-1) {
			t.Fatalf("after the reader took message %d: acknowledged up to %d, want %d", i, got, i-1)
		}
	}
	// The reader goes: the subscriber notices while idle, and the last
	// message taken is handed back at once.
	r.Close()
	select {
	case err := <-done:
		if !errors.Is(err, subscriber.ErrReaderGone) {
			t.Fatalf("Run = %v, want the reader gone", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the subscriber did not notice its reader go")
	}
	if n := sub.Stats().Redelivered; n != 0 {
		t.Fatalf("%d messages delivered again while the reader held them", n)
	}
	if n := sub.ReaderEnded(ctx, subscriber.ReaderFailed); n != 1 {
		t.Fatalf("%d messages handed back, want 1", n)
	}
	r2, w2, pipe2 := readerPipe(t)
	store2, err := subscriber.OpenProgress(ctx, js, "S", "d")
	if err != nil {
		t.Fatal(err)
	}
	sub2 := newSubscriber(t, subscriber.Config{Stream: "S", Subject: "b", Durable: "d", Sink: &subscriber.Lines{Out: w2, Pipe: pipe2}, Progress: store2})
	ctx2, stop2 := context.WithCancel(ctx)
	done2 := make(chan error, 1)
	go func() { done2 <- sub2.Run(ctx2, js) }()
	// Message 3 again: its first batch (two tokens) was done, and only the
	// second (one token), in doubt, is written again.
	line, err := bufio.NewReader(r2).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if fields := strings.Split(strings.TrimSuffix(line, "\n"), ","); len(fields) != 5 {
		t.Fatalf("the redelivered message's first line holds %d fields, want the batch in doubt's 5", len(fields))
	}
	stop2()
	<-done2
	if st := sub2.Stats(); st.Redelivered != 1 || st.Skipped != 1 {
		t.Fatalf("redelivered %d, batches skipped %d: want the message in doubt, less its batch done", st.Redelivered, st.Skipped)
	}
}

// A pinned subscriber whose save of the record is refused because the
// record moved on under it (the other subscriber's save, one it never
// heard back from, landed late): the server still pins this one, so it
// keeps what that write says beside its own and goes on delivering
// (issue 49: it stood by, and the batches it held were written again by
// the other).
func TestSaveOverALateWrite(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, r, sub := pipeSubscriber(ctx, t, 5*time.Second, func(c *subscriber.Config) { c.Pinned, c.PinnedTTL = true, 10*time.Second })
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sub.Run(runCtx, js) }()
	lines := bufio.NewReader(r)
	read := func(n int) {
		t.Helper()
		for range n {
			if _, err := lines.ReadString('\n'); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Message 1's two batches taken, the first done.
	read(2)
	// The other subscriber's late write: a batch of a message it had.
	other, err := subscriber.OpenProgress(ctx, js, "S", "d")
	if err != nil {
		t.Fatal(err)
	}
	for saved := false; !saved; {
		p, rev, err := other.Load(ctx)
		if err != nil {
			t.Fatal(err)
		}
		late := &protocol.MessageProgress{Batches: 2}
		late.Done.Add(1)
		if p.Messages == nil {
			p.Messages = map[uint64]*protocol.MessageProgress{}
		}
		p.Messages[99] = late
		// The subscriber may save between the read and the write.
		_, err = other.Save(ctx, &p, rev)
		if saved = err == nil; !saved && !errors.Is(err, subscriber.ErrTakenOver) {
			t.Fatal(err)
		}
	}
	read(4)
	deadline := time.Now().Add(10 * time.Second)
	// The last batch taken stays in doubt: this reader does not wait on
	// the pipe for more.
	for sub.Stats().Messages < 3 || sub.Stats().Batches < 5 {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v: want the 3 messages delivered, every batch done but the last", sub.Stats())
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	<-done
	if n := sub.Stats().StoodBy; n != 0 {
		t.Fatalf("the subscriber stood by %d times while the server pinned it", n)
	}
	got, _, err := other.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if m := got.Messages[99]; m == nil || !m.Done.Has(1) {
		t.Fatalf("the late write's batch is gone from the record: %+v", got.Messages)
	}
}

// stalledSaves is a record whose saves, once stalled, never answer: a
// bucket whose leader is gone.
type stalledSaves struct {
	subscriber.ProgressStore
	stalled atomic.Bool
}

func (s *stalledSaves) Save(ctx context.Context, p *protocol.Progress, revision uint64) (uint64, error) {
	if s.stalled.Load() {
		<-ctx.Done()
		return 0, ctx.Err()
	}
	return s.ProgressStore.Save(ctx, p, revision)
}

// A subscriber stopped (its pin lost, a signal) while the save of what its
// reader finished waits on the bucket writes nothing more into the pipe:
// the batch it would write is read unrecorded and written again by the
// next subscriber, a third beside the one the reader holds and the one
// done and unsaved (issue 49: three batches again at one fault).
func TestNoBatchWrittenPastAWaitingSave(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var store *stalledSaves
	js, r, sub := pipeSubscriber(ctx, t, 5*time.Second, func(c *subscriber.Config) {
		store = &stalledSaves{ProgressStore: c.Progress}
		c.Progress = store
	})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sub.Run(runCtx, js) }()
	lines := bufio.NewReader(r)
	if _, err := lines.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	// Taking message 1's second batch finishes its first; that is saved
	// before message 2's first batch is written, and the save waits.
	store.stalled.Store(true)
	if _, err := lines.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	stop()
	<-done
	r.SetReadDeadline(time.Now().Add(time.Second))
	if line, err := lines.ReadString('\n'); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the subscriber wrote %q past the save it waited on (err %v)", line, err)
	}
}

// lateSave is a record on which another subscriber's save lands right
// after the first read this subscriber makes while consuming: the save of
// the subscriber that delivered until now, on its way as this one is
// pinned.
type lateSave struct {
	subscriber.ProgressStore
	sub   *subscriber.Subscriber
	fired atomic.Bool
	save  func()
}

func (l *lateSave) Load(ctx context.Context) (protocol.Progress, uint64, error) {
	p, rev, err := l.ProgressStore.Load(ctx)
	if err == nil && l.sub.Consuming() && !l.fired.Swap(true) {
		l.save()
	}
	return p, rev, err
}

// A subscriber that takes over claims the record it read, by writing it
// back, before it hands anything on: a save of the subscriber before it
// that lands after the read fails that write, and the record is read
// again, so the batch that save says is done is not written again (issue
// 49's fault runs: 3 and 4 of one subscriber's batches written again at
// one fault, the other's saves landing after the read).
func TestTakeoverSeesALateSave(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var late *lateSave
	js, r, sub := pipeSubscriber(ctx, t, 5*time.Second, func(c *subscriber.Config) {
		late = &lateSave{ProgressStore: c.Progress}
		c.Progress = late
	})
	st, err := js.Stream(ctx, "S")
	if err != nil {
		t.Fatal(err)
	}
	first, err := st.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	mark := wire.Mark(first.Subject, first.Header, first.Data)
	// The other subscriber finished message 1's first batch, and (its
	// late save) its second.
	other, err := subscriber.OpenProgress(ctx, js, "S", "d")
	if err != nil {
		t.Fatal(err)
	}
	markDone := func(batch int) {
		p, rev, err := other.Load(ctx)
		if err != nil {
			t.Error(err)
			return
		}
		m := p.Messages[1]
		if m == nil {
			m = &protocol.MessageProgress{Mark: mark, Batches: 2}
			p.Messages = map[uint64]*protocol.MessageProgress{1: m}
		}
		m.Done.Add(batch)
		if _, err := other.Save(ctx, &p, rev); err != nil {
			t.Error(err)
		}
	}
	markDone(0)
	late.sub, late.save = sub, func() { markDone(1) }
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sub.Run(runCtx, js) }()
	lines := bufio.NewReader(r)
	n := 0
	for {
		r.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := lines.ReadString('\n'); err != nil {
			break
		}
		n++
	}
	stop()
	<-done
	// Messages 2 and 3, two batches each; message 1 was done.
	if n != 4 {
		t.Fatalf("the subscriber wrote %d lines, want 4: the batch the late save says is done was written again", n)
	}
}

// heldSink takes units and never finishes them: a sender at work.
type heldSink struct {
	mu    sync.Mutex
	given map[string]int
}

func (s *heldSink) Hand(_ context.Context, us []*subscriber.Unit, _ func(...*subscriber.Unit)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, u := range us {
		s.given[fmt.Sprintf("%d/%d", u.Seq, u.Line)]++
	}
	return nil
}

// times is how often the sink was given unit (seq/line).
func (s *heldSink) times(unit string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.given[unit]
}

// A message the subscriber holds, delivered to it again because another
// client's nak of an older delivery landed (the server takes a nak by
// stream sequence), is not handed to the sink again: the simulation's
// frozen subscriber, woken after its message went to the other, naked it
// under that one, which wrote its batches twice.
func TestRedeliveredWhileHeldIsNotHandedAgain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js := threeMessages(ctx, t)
	cons, err := js.CreateConsumer(ctx, "S", jetstream.ConsumerConfig{Durable: "d", AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: time.Second, DeliverPolicy: jetstream.DeliverAllPolicy, MaxAckPending: 1})
	if err != nil {
		t.Fatal(err)
	}
	// The other client: given the first message, it lets its ack wait run out.
	batch, err := cons.Fetch(1)
	if err != nil {
		t.Fatal(err)
	}
	first := <-batch.Messages()
	if first == nil {
		t.Fatal("nothing fetched")
	}
	sink := &heldSink{given: map[string]int{}}
	sub := newSubscriber(t, subscriber.Config{Stream: "S", Subject: "b", Durable: "d", Sink: sink, AckWait: time.Second})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sub.Run(runCtx, js) }()
	defer func() { stop(); <-done }()
	// Past the other's ack wait, the subscriber holds it too.
	waitFor(t, 10*time.Second, func() bool { return sink.times("1/0") == 1 })
	// The other's nak, of its delivery, lands under the subscriber.
	if err := first.Nak(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool { return sub.Stats().Redelivered >= 2 })
	time.Sleep(300 * time.Millisecond)
	if sink.times("1/0") != 1 || sink.times("1/1") != 1 {
		t.Fatalf("the sink was given %v: want each of the first message's 2 batches once", sink.given)
	}
}

// waitFor waits up to d for ok.
func waitFor(t *testing.T, d time.Duration, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !ok(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("not within", d)
		}
	}
}
