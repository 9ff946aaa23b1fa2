package subscriber_test

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/decoder"
	"github.com/mailroom/tailer/decoder/action"
	"github.com/mailroom/tailer/internal/embedded"
	"github.com/mailroom/tailer/publish"
	"github.com/mailroom/tailer/publish/join"
	"github.com/mailroom/tailer/publish/subscriber"
	"github.com/mailroom/tailer/publish/wire"
)

// BenchmarkSubscriberPipeBacklog drains a backlog of group-committed
// messages (50 of 100 batches, a token each) into a pipe whose reader
// takes each line at once, with the durable's record kept in the bucket
// on one embedded server (syncing every write, as tailer run's): what the
// record's save before each next batch costs a fast reader. An iteration
// is a new durable reading the whole stream.
func BenchmarkSubscriberPipeBacklog(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	srv, err := embedded.Start(b.TempDir(), "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Shutdown()
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"b", "b.>"}}); err != nil {
		b.Fatal(err)
	}
	const msgs, per = 50, 100
	for m := range msgs {
		if _, err := js.PublishMsg(ctx, backlogMessage(m, per)); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		r, w, pipe := readerPipe(b)
		durable := fmt.Sprintf("d%d", i)
		store, err := subscriber.OpenProgress(ctx, js, "S", durable)
		if err != nil {
			b.Fatal(err)
		}
		sub := newSubscriber(b, subscriber.Config{Stream: "S", Subject: "b", Durable: durable, FromStart: true, Sink: &subscriber.Lines{Out: w, Pipe: pipe}, AckWait: 30 * time.Second, Progress: store})
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- sub.Run(runCtx, js) }()
		lines := bufio.NewReader(r)
		for range msgs * per {
			if _, err := lines.ReadString('\n'); err != nil {
				b.Fatal(err)
			}
		}
		stop()
		<-done
		r.Close()
		w.Close()
	}
	b.ReportMetric(float64(b.N*msgs*per)/time.Since(start).Seconds(), "batches/s")
}

// backlogMessage is message m of a backlog: per batches of a token each.
func backlogMessage(m, per int) *nats.Msg {
	e := publish.NewEncoder(testSigner(), wire.FormatLine)
	e.Begin(nil, 0)
	for i := range per {
		id := m*per + i + 1
		tok := []decoder.Token{{ID: int64(id), Action: action.Activation, CodeNull: true}}
		tok[0].Secret[0], tok[0].Secret[1] = byte(id), byte(id>>8)
		e.Add(tok, []join.TokenState{{Email: []byte(fmt.Sprintf("u%d@example.com", id)), Login: []byte("l"), ExpiresAt: 100}})
	}
	id := fmt.Sprintf("m%d", m)
	enc := e.Finish(id)
	h := nats.Header{}
	h.Set(wire.HeaderBatchSizes, enc.Sizes)
	h.Set(wire.HeaderMsgID, id)
	h.Set(wire.HeaderTokenIDs, enc.IDs)
	h.Set(wire.HeaderTokenKeys, enc.Keys)
	h.Set(wire.HeaderCount, strconv.Itoa(enc.N))
	h.Set(wire.HeaderFormat, wire.FormatLine.String())
	h.Set(wire.HeaderKeyID, enc.KeyID)
	return &nats.Msg{Subject: "b", Header: h, Data: enc.Body}
}
