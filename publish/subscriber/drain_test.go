package subscriber_test

import (
	"bytes"
	"context"
	"github.com/mailroom/tailer/publish/subscriber/protocol"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/publish/subscriber"
	"github.com/mailroom/tailer/publish/wire"
)

// slowSaves is a record whose saves take a while: a bucket on a busy
// server.
type slowSaves struct {
	subscriber.ProgressStore
	delay time.Duration
}

func (s *slowSaves) Save(ctx context.Context, p *protocol.Progress, revision uint64) (uint64, error) {
	time.Sleep(s.delay)
	return s.ProgressStore.Save(ctx, p, revision)
}

// A subscriber that runs until drained ends only once the ack of its last
// message is answered. Into a pipe, the last batch is settled once the
// reader (a process of its own) waits for more, beside the consume loop;
// the record is saved before the ack, and a drain that ended meanwhile
// cut the ack short, so the message came again after the ack wait to a
// subscriber whose record said it was done (issue 45: two dead-letters
// resend at once ended with the dead letter delivered, acknowledged
// without a line by the second, and never removed).
func TestDrainWaitsForTheAck(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, r, sub := pipeSubscriber(ctx, t, 30*time.Second, func(c *subscriber.Config) {
		c.UntilDrained = true
		c.Progress = &slowSaves{ProgressStore: c.Progress, delay: 700 * time.Millisecond}
	})
	out := filepath.Join(t.TempDir(), "out")
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	reader := exec.Command("cat")
	reader.Stdin, reader.Stdout = r, f
	if err := reader.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reader.Process.Kill(); reader.Wait() })
	if err := sub.Run(ctx, js); err != nil {
		t.Fatal(err)
	}
	cons, err := js.Consumer(ctx, "S", "d")
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.AckFloor.Stream != 3 || info.NumAckPending != 0 {
		t.Fatalf("drained with ack floor %d and %d awaiting an ack; want every message of 3 acknowledged", info.AckFloor.Stream, info.NumAckPending)
	}
	if b, _ := os.ReadFile(out); bytes.Count(b, []byte("\n")) != 6 {
		t.Fatalf("the reader got %q, want 6 lines", b)
	}
}

// A resend removes the dead letters its consumer acknowledged, by the
// consumer's ack floor: those another resend delivered, or one killed
// before it removed them, too. A dead letter above the floor, and one that
// cannot be read (terminated, not finished), stay.
func TestRemoveResent(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js := threeMessages(ctx, t)
	dl, err := subscriber.OpenDeadLetters(ctx, js, "S", "d")
	if err != nil {
		t.Fatal(err)
	}
	h, body, _, _ := encoded(t, wire.FormatLine)
	for i, batch := range []int{0, -1, 1, 0} {
		if err := dl.Put(ctx, subscriber.DeadLetter{Stream: "S", Seq: uint64(i + 1), Batch: batch, Durable: "d", Reason: "test", Deliveries: 3, Header: h, Body: body}); err != nil {
			t.Fatal(err)
		}
	}
	resend, err := subscriber.Durable{Stream: subscriber.DeadStream("S"), Subject: subscriber.DeadSubject("S", "d"), Name: "d-resend", FromStart: true}.Ensure(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	// The first three finished or terminated; the fourth not yet.
	batch, err := resend.Fetch(3, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for m := range batch.Messages() {
		if n++; n == 2 {
			err = m.Term()
		} else {
			err = m.DoubleAck(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if n != 3 {
		t.Fatalf("fetched %d dead letters, want 3", n)
	}
	removed, left, err := subscriber.RemoveResent(ctx, js, "S", "d", resend)
	if err != nil || removed != 2 || left != 2 {
		t.Fatalf("RemoveResent = %d removed, %d left, %v; want 2 and 2", removed, left, err)
	}
	list, err := subscriber.ListDeadLetters(ctx, js, "S", "d")
	if err != nil {
		t.Fatal(err)
	}
	var at []uint64
	for _, l := range list {
		at = append(at, l.At)
	}
	if len(at) != 2 || at[0] != 2 || at[1] != 4 {
		t.Fatalf("dead letters left at %v, want the unreadable one (2) and the one not delivered (4)", at)
	}
}
