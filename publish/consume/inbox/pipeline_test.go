package inbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/publish/wire"
)

// ackedMsg is a delivered message, its id and first token key in its
// headers, that counts its acks.
type ackedMsg struct {
	jetstream.Msg
	id, key string
	acks    atomic.Int32
}

func (m *ackedMsg) Headers() nats.Header {
	return nats.Header{nats.MsgIdHdr: {m.id}, wire.HeaderTokenKeys: {m.key + ",other"}}
}

func (m *ackedMsg) DoubleAck(context.Context) error { m.acks.Add(1); return nil }
func (m *ackedMsg) Ack() error                      { m.acks.Add(1); return nil }
func (m *ackedMsg) InProgress() error               { return nil }

// gatedSink fails to store the message at seq until open.
type gatedSink struct {
	Sink
	seq  uint64
	open atomic.Bool
}

func (g *gatedSink) StoreAll(ctx context.Context, tx pgx.Tx, ms []Received) ([]int, error) {
	for _, m := range ms {
		if m.Seq == g.seq && !g.open.Load() {
			return nil, errors.New("the database cannot take it now")
		}
	}
	return g.Sink.StoreAll(ctx, tx, ms)
}

// The units of a consume commit in whatever order they finish storing, and
// each message is acknowledged once its unit committed; where the
// durable's messages are stored through never passes one not stored: a
// lost consumer made again there, after a kill, would skip it.
func TestStoredThroughHasNoHole(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := inboxPool(ctx, t)
	sink := &gatedSink{Sink: Inbox{}, seq: 1}
	c := &Consumer{Pool: pool, Sink: sink, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	p := newPipeline(c)
	var msgs []*ackedMsg
	for seq := uint64(1); seq <= 3; seq++ {
		m := &ackedMsg{id: fmt.Sprintf("batch-%d", seq), key: fmt.Sprintf("key%d", seq*10)}
		msgs = append(msgs, m)
		p.add(ctx, []*received{{msg: m, meta: &jetstream.MsgMetadata{}, m: Meta{Stream: "S", Seq: seq, Durable: "d"}, b: testBatch(int(seq)*10, 2)}})
	}
	stored := func() (n int) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM mailroom_inbox`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	through := func() Stored {
		t.Helper()
		at, _, err := storedThrough(ctx, pool, "S", "d")
		if err != nil {
			t.Fatal(err)
		}
		return at
	}
	for deadline := time.Now().Add(10 * time.Second); msgs[1].acks.Load() == 0 || msgs[2].acks.Load() == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("messages 2 and 3 acknowledged %d and %d times while message 1 could not be stored; want each once", msgs[1].acks.Load(), msgs[2].acks.Load())
		}
	}
	if n, at := stored(), through(); n != 4 || at.Seq != 0 || msgs[0].acks.Load() != 0 {
		t.Fatalf("with message 1 not stored: %d rows, stored through %+v, message 1 acknowledged %d times; want 4 rows, through nothing, no ack", n, at, msgs[0].acks.Load())
	}
	sink.open.Store(true)
	p.wait()
	if n, at := stored(), through(); n != 6 || at != (Stored{Seq: 3, BatchID: "batch-3", Key: "key30"}) {
		t.Fatalf("%d rows, stored through %+v; want 6, through message 3 (batch-3, key30)", n, at)
	}
	for i, m := range msgs {
		if m.acks.Load() != 1 {
			t.Fatalf("message %d acknowledged %d times, want once", i+1, m.acks.Load())
		}
	}
}

// A database written before StoredThroughTable (commits in order) starts
// the durable's row at its newest message stored; one without a message
// at sequence 0, so that the sink's newest message, which the loop's
// commits out of order may leave a message unstored behind, is never
// taken for where the durable got to.
func TestAdoptPosition(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := inboxPool(ctx, t)
	legacy := func(durable string) func() (Stored, bool, error) {
		return func() (Stored, bool, error) { return Inbox{}.Position(ctx, pool, "S", durable) }
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := Inbox{}.StoreAll(ctx, tx, []Received{{Meta{Stream: "S", Seq: 5, Durable: "old"}, testBatch(50, 2)}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for _, durable := range []string{"old", "new"} {
		if err := adoptPosition(ctx, pool, "S", durable, legacy(durable)); err != nil {
			t.Fatal(err)
		}
	}
	// The new durable's sink holds nothing yet; then a token of it is
	// stored (out of order, say): adopting again changes nothing.
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := Inbox{}.StoreAll(ctx, tx, []Received{{Meta{Stream: "S", Seq: 9, Durable: "new"}, testBatch(90, 2)}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := adoptPosition(ctx, pool, "S", "new", legacy("new")); err != nil {
		t.Fatal(err)
	}
	for durable, want := range map[string]uint64{"old": 5, "new": 0} {
		at, found, err := storedThrough(ctx, pool, "S", durable)
		if err != nil || !found || at.Seq != want {
			t.Fatalf("%s: stored through %+v (found %v, err %v), want sequence %d", durable, at, found, err, want)
		}
	}
}
