package inbox

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
)

// ackedMsg is a delivered message that counts its acks.
type ackedMsg struct {
	jetstream.Msg
	acks atomic.Int32
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

// The units of a consume commit in the order they were cut, whatever
// order they finish storing in: a message stored while one before it is
// not would be where a lost consumer is made again, past the one not
// stored (Position). A unit that cannot store holds back those after it;
// each message is acknowledged once its unit committed.
func TestUnitsCommitInOrder(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := inboxPool(ctx, t)
	sink := &gatedSink{Sink: Inbox{}, seq: 1}
	c := &Consumer{Pool: pool, Sink: sink, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	p := newPipeline(c)
	var msgs []*ackedMsg
	for seq := uint64(1); seq <= 3; seq++ {
		m := &ackedMsg{}
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
	time.Sleep(time.Second)
	if n := stored(); n != 0 || msgs[1].acks.Load() != 0 || msgs[2].acks.Load() != 0 {
		t.Fatalf("with message 1 not stored: %d rows, acks %d and %d of messages 2 and 3; want none of either", n, msgs[1].acks.Load(), msgs[2].acks.Load())
	}
	sink.open.Store(true)
	p.wait()
	if n := stored(); n != 6 {
		t.Fatalf("%d rows, want 6", n)
	}
	for i, m := range msgs {
		if m.acks.Load() != 1 {
			t.Fatalf("message %d acknowledged %d times, want once", i+1, m.acks.Load())
		}
	}
}
