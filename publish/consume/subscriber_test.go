package consume_test

import (
	"bufio"
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/publish/consume"
	"github.com/mailroom/tailer/publish/embedded"
	"github.com/mailroom/tailer/publish/wire"
)

// Into a pipe, a message is acknowledged only once the reader has taken
// the next one; the one it took last is in doubt, and handed back for
// redelivery when the reader goes. The test is the reader, a line at a
// time, on a real JetStream server.
func TestSubscriberPipe(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := embedded.Start(t.TempDir(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"b", "b.>"}}); err != nil {
		t.Fatal(err)
	}
	h, body, _, _ := encoded(t, wire.FormatLine)
	for i := 0; i < 3; i++ {
		hi := nats.Header{}
		for k, v := range h {
			hi[k] = v
		}
		hi.Set(wire.HeaderMsgID, "batch-"+string(rune('a'+i)))
		m := &nats.Msg{Subject: "b", Header: hi, Data: body}
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	pipe, ok := consume.OpenPipe(w)
	if !ok {
		t.Fatal("an os.Pipe is not taken for a pipe")
	}
	sub := &consume.Subscriber{Stream: "S", Subject: "b", Durable: "d", FromStart: true, Out: w, Pipe: pipe, AckWait: time.Second}
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
		if !errors.Is(err, consume.ErrReaderGone) {
			t.Fatalf("Run = %v, want the reader gone", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the subscriber did not notice its reader go")
	}
	if sub.Redelivered != 0 {
		t.Fatalf("%d messages delivered again while the reader held them", sub.Redelivered)
	}
	if n := sub.Settle(ctx, false); n != 1 {
		t.Fatalf("%d messages handed back, want 1", n)
	}
	r2, w2, _ := os.Pipe()
	defer r2.Close()
	pipe2, _ := consume.OpenPipe(w2)
	sub2 := &consume.Subscriber{Stream: "S", Subject: "b", Durable: "d", Out: w2, Pipe: pipe2}
	ctx2, stop2 := context.WithCancel(ctx)
	done2 := make(chan error, 1)
	go func() { done2 <- sub2.Run(ctx2, js) }()
	if _, err := bufio.NewReader(r2).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	stop2()
	<-done2
	if sub2.Redelivered != 1 {
		t.Fatalf("redelivered %d, want the one in doubt", sub2.Redelivered)
	}
}
