package audit

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/internal/pgname"
	"github.com/mailroom/tailer/publish/subscriber"
	"github.com/mailroom/tailer/publish/token"
)

// Floor is where a durable consumer stands: the stream sequences from
// which it delivers (From; 0: not known, then from the first message its
// output holds) and through which it acknowledged every message.
type Floor struct {
	JS              jetstream.JetStream
	Stream, Durable string
}

// Through reads the durable's ack floor and where it starts.
func (f Floor) Through(ctx context.Context) (from, through uint64, err error) {
	c, err := f.JS.Consumer(ctx, f.Stream, f.Durable)
	if err != nil {
		return 0, 0, fmt.Errorf("consumer %s: %w", f.Durable, err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("consumer %s: %w", f.Durable, err)
	}
	switch info.Config.DeliverPolicy {
	case jetstream.DeliverAllPolicy:
		from = 1
	case jetstream.DeliverByStartSequencePolicy:
		from = info.Config.OptStartSeq
	}
	return from, info.AckFloor.Stream, nil
}

// Inbox is a durable storing into the consumer's PostgreSQL (tailer
// subscribe --into inbox or river): its rows, by token key.
type Inbox struct {
	Floor
	Pool   *pgxpool.Pool
	Schema pgname.Schema
	// River: the rows are River jobs, not inbox rows.
	River bool
}

// Delivered reads the keys of the rows stored since since.
func (i Inbox) Delivered(ctx context.Context, since time.Time) (*Counts, error) {
	sql := `SELECT token_key FROM ` + i.Schema.Name("mailroom_inbox") + ` WHERE received_at >= $1`
	if i.River {
		sql = `SELECT args->>'token_key' FROM ` + i.Schema.Name("river_job") + ` WHERE kind = 'mailroom_token' AND created_at >= $1`
	}
	rows, err := i.Pool.Query(ctx, sql, since)
	if err != nil {
		return nil, fmt.Errorf("read the consumer's database: %w", err)
	}
	defer rows.Close()
	c := &Counts{}
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, fmt.Errorf("read the consumer's database: %w", err)
		}
		c.Add(k)
	}
	return c, rows.Err()
}

// Lines is a durable feeding a pipe, whose reader's output is a file of
// the collector's lines (tailer subscribe > FILE, or a sender writing
// them): the tokens it holds, by the key each carries.
type Lines struct {
	Floor
	Path string
}

// Delivered reads the keys of every token of the file's lines.
func (l Lines) Delivered(context.Context, time.Time) (*Counts, error) {
	f, err := os.Open(l.Path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	c := &Counts{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64*1024), 16<<20)
	for sc.Scan() {
		toks, err := subscriber.DecodeLine(strings.TrimSuffix(sc.Text(), "\r"))
		if err != nil {
			continue
		}
		for _, t := range toks {
			if k, ok := token.KeyOfToken(t.Token); ok {
				c.keys, c.sorted = append(c.keys, k), false
			}
		}
	}
	return c, sc.Err()
}

// Record is a durable feeding a pipe or an --exec sender, whose output
// the audit cannot read: what it delivered is what its own record (the
// subscriber's progress, in the stream's key-value bucket) says its
// readers finished, the tokens of the messages through its floor and of
// the batches it says done, read from the stream through consumer.
type Record struct {
	Floor
	Consumer string
}

// Delivered reads the record, and the keys of what it says done.
func (r Record) Delivered(ctx context.Context, since time.Time) (*Counts, error) {
	p, err := subscriber.ReadProgress(ctx, r.JS, r.Stream, r.Durable)
	if err != nil {
		return nil, err
	}
	stream, err := r.JS.Stream(ctx, r.Stream)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", r.Stream, err)
	}
	c := &Counts{}
	_, _, err = subscriber.ReadKeys(ctx, stream, r.Consumer, since, stream.CachedInfo().State.LastSeq, func(seq uint64, batch int, k string) {
		if m := p.Messages[seq]; seq <= p.Floor || m != nil && m.Done.Has(batch) {
			c.Add(k)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("read the stream for the record of %s: %w", r.Durable, err)
	}
	return c, nil
}
