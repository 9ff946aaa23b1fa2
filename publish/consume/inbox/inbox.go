package inbox

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/publish/consume"
	"github.com/mailroom/tailer/publish/wire"
)

// Meta says where a message is on the stream, and which durable consumer
// stores it ("" for a service's own).
type Meta struct {
	Stream  string
	Seq     uint64
	Durable string
}

// Sink stores the tokens of a decoded message in tx, adding nothing for a
// token it holds already; it reports how many it added. Position says
// where a durable consumer got to: the last message it stored a token of;
// ok is false when it stored none.
type Sink interface {
	Store(ctx context.Context, tx pgx.Tx, m Meta, b *consume.Decoded) (added int, err error)
	Position(ctx context.Context, pool *pgxpool.Pool, stream, durable string) (at Stored, ok bool, err error)
}

// Stored is a message a durable stored a token of, by its place on the
// stream and by its content: the message's id and one token's key. The
// place counts only where the stream still holds that content there.
type Stored struct {
	Seq          uint64
	BatchID, Key string
}

// holds matches the message at.Seq of a stream against at's content.
func (at Stored) holds(m *jetstream.RawStreamMsg) bool {
	return m.Header.Get(nats.MsgIdHdr) == at.BatchID && consume.HoldsKey(at.Key)(m)
}

// Inbox stores tokens as rows of mailroom_inbox (Migrate makes it).
type Inbox struct{}

// Store inserts b's tokens, those already there (by token key) left alone.
func (Inbox) Store(ctx context.Context, tx pgx.Tx, m Meta, b *consume.Decoded) (int, error) {
	n := len(b.Tokens)
	var (
		keys, actions, emails, logins, toks, codes = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		traces                                     = make([]string, n)
		ids, expires                               = make([]int64, n), make([]*int64, n)
		lines                                      = make([]int32, n)
	)
	i := 0
	for line, batch := range b.Lines() {
		for _, t := range batch {
			keys[i], ids[i], actions[i], emails[i], logins[i], toks[i], codes[i], traces[i] = t.Key, t.ID, t.Action, t.Email, t.Login, t.Token, t.Code, t.Traceparent
			if t.ExpiresAt != 0 {
				expires[i] = &t.ExpiresAt
			}
			lines[i] = int32(line)
			i++
		}
	}
	tag, err := tx.Exec(ctx, `
		INSERT INTO mailroom_inbox (token_key, token_id, action, email, login, token, code, expires_at, key_id, batch_id, line, stream, stream_seq, durable, traceparent)
		SELECT t.key, t.id, t.action, t.email, t.login, t.token, t.code, t.expires_at, nullif($9, ''), $10, t.line, $11, $12, nullif($14, ''), nullif(t.trace, '')
		FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::bigint[], $13::int[], $15::text[])
			AS t(key, id, action, email, login, token, code, expires_at, line, trace)
		ON CONFLICT (token_key) DO NOTHING`,
		keys, ids, actions, emails, logins, toks, codes, expires, b.KeyID, b.ID, m.Stream, int64(m.Seq), lines, m.Durable, traces)
	if err != nil {
		return 0, fmt.Errorf("insert into mailroom_inbox: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// Position is the message of the highest stream sequence a token of
// which durable stored in mailroom_inbox.
func (Inbox) Position(ctx context.Context, pool *pgxpool.Pool, stream, durable string) (Stored, bool, error) {
	return position(ctx, pool, `SELECT stream_seq, batch_id, token_key FROM mailroom_inbox
		WHERE stream = $1 AND durable = $2 ORDER BY stream_seq DESC LIMIT 1`, stream, durable)
}

func position(ctx context.Context, pool *pgxpool.Pool, query, stream, durable string) (Stored, bool, error) {
	var (
		seq int64
		at  Stored
	)
	err := pool.QueryRow(ctx, query, stream, durable).Scan(&seq, &at.BatchID, &at.Key)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Stored{}, false, nil
	case err != nil:
		return Stored{}, false, fmt.Errorf("where the consumer got to: %w", err)
	}
	at.Seq = uint64(seq)
	return at, true, nil
}

//go:embed schema.sql
var schema string

// Migrate makes the inbox table in the database at pool, if it is not
// there, in one transaction (a process killed half way leaves nothing
// half made) under an advisory lock (subscribers started together make it
// once).
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('mailroom_inbox migration'))`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, schema)
		return err
	})
	if err != nil {
		return fmt.Errorf("make the inbox table: %w", err)
	}
	return nil
}

// Consumer copies messages from a durable consumer into the consumer's
// database through Sink, a transaction a message (a large one in parts),
// acknowledging each after its commit.
type Consumer struct {
	Durable consume.Durable
	Pool    *pgxpool.Pool
	Sink    Sink
	Log     *slog.Logger

	// Messages counts the messages stored and acknowledged, Added the
	// tokens they added, Again the messages with tokens stored before
	// (all, or some when a delivery was cut short between parts): their
	// ack was lost, or never sent.
	Messages, Added, Again atomic.Int64
	// Recreated counts the times the consumer was found gone and made
	// again; LastDelivery is when a message last came (Unix ms).
	Recreated, LastDelivery atomic.Int64
	// Gaps are the places where the stream lacked messages the durable
	// had not stored.
	Gaps consume.Gaps
	// consuming: Run is bound to the consumer.
	consuming atomic.Bool
	// chain is followed by the one goroutine that handles messages; js is
	// Run's.
	chain wire.Chain
	js    jetstream.JetStream
}

// Consuming reports whether Run is bound to its consumer.
func (c *Consumer) Consuming() bool { return c.consuming.Load() }

// pullBatch is how many messages a pull asks for: they are stored one
// after the other, each acknowledged after its commit.
const pullBatch = 16

// Run stores messages until ctx is done. A message the database cannot
// take now (it is down, say) is tried again, kept from redelivery
// meanwhile, and never acknowledged before it is stored. A consumer gone
// from the server is made again at the last message the database holds a
// token of (storing it again adds only what it lacks).
func (c *Consumer) Run(ctx context.Context, js jetstream.JetStream) error {
	c.js = js
	if c.Durable.MaxAckPending < pullBatch {
		c.Durable.MaxAckPending = pullBatch
	}
	at, ok, err := c.Sink.Position(ctx, c.Pool, c.Durable.Stream, c.Durable.Name)
	if err != nil {
		return err
	}
	if ok {
		c.seed(at)
	}
	for lost := false; ; lost = true {
		cons, err := c.consumer(ctx, js, lost)
		if err != nil {
			return err
		}
		c.seedAtFloor(cons)
		if err := c.consume(ctx, cons); !errors.Is(err, errLost) {
			return err
		}
		c.Recreated.Add(1)
	}
}

var errLost = errors.New("the consumer is gone from the server")

// consumer looks the durable up, making it again at the last message
// stored when it is missing and the database holds tokens it stored (lost:
// Run was bound to it and saw it go).
func (c *Consumer) consumer(ctx context.Context, js jetstream.JetStream, lost bool) (jetstream.Consumer, error) {
	d := c.Durable
	_, err := consume.LookUp(ctx, js, d.Stream, d.Name, c.Log)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		// Of a stream that may be another now: followed afresh.
		c.chain = wire.Chain{}
		at, ok, err := c.Sink.Position(ctx, c.Pool, d.Stream, d.Name)
		if err != nil {
			return nil, err
		}
		if ok {
			if ok, err = c.stillThere(ctx, js, at); err != nil {
				return nil, err
			}
			d.FromStart = d.FromStart || !ok
		}
		if ok {
			c.seed(at)
		}
		switch {
		case ok:
			// At that message, not after it: a large message is stored in
			// parts, and the rest of one cut short comes again.
			d.StartSeq = at.Seq
			c.Log.Warn("the consumer was not on the server: made again at the last message the database holds a token of",
				"durable", d.Name, "start_seq", d.StartSeq)
		case d.FromStart:
		case lost:
			return nil, fmt.Errorf("consumer %s on stream %s: %w: the database holds none of its tokens; start the subscriber with --from-start to store what the stream holds (stored tokens add nothing), or make the consumer by hand", d.Name, d.Stream, consume.ErrPositionUnknown)
		}
	}
	return d.Ensure(ctx, js)
}

// stillThere reports whether the stream holds at at.Seq the message the
// durable stored there. When it does not (the stream was deleted and made
// again, restored from an older backup, or purged), that sequence names
// nothing of this stream, and the consumer reads it from its first
// message: the token key decides what is stored, and what is there adds
// nothing.
func (c *Consumer) stillThere(ctx context.Context, js jetstream.JetStream, at Stored) (bool, error) {
	ok, err := consume.StreamHolds(ctx, js, c.Durable.Stream, at.Seq, at.holds, c.Log)
	if err == nil && !ok {
		c.Log.Warn("the stream does not hold what the durable stored from it (deleted and made again, restored or purged): reading it from its first message; the tokens stored before add nothing",
			"durable", c.Durable.Name, "stored_seq", at.Seq, "batch_id", at.BatchID)
	}
	return ok, err
}

// pullExpiry bounds how long a pull request waits on the server.
const pullExpiry = 5 * time.Second

func (c *Consumer) consume(ctx context.Context, cons jetstream.Consumer) error {
	iter, err := cons.Messages(jetstream.PullMaxMessages(pullBatch), jetstream.PullExpiry(pullExpiry))
	if err != nil {
		return fmt.Errorf("consume %s: %w", c.Durable.Name, err)
	}
	stop := context.AfterFunc(ctx, iter.Stop)
	defer stop()
	c.consuming.Store(true)
	defer c.consuming.Store(false)
	c.Log.Info("consuming into PostgreSQL", "stream", c.Durable.Stream, "durable", c.Durable.Name, "sink", fmt.Sprintf("%T", c.Sink))
	var stranded consume.Stranded
	for {
		msg, err := iter.Next()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			if consume.Lost(ctx, cons, err) {
				c.Log.Error("the consumer is gone from the server", "durable", c.Durable.Name, "err", err)
				return errLost
			}
			if errors.Is(err, jetstream.ErrNoHeartbeat) {
				c.Log.Warn("no heartbeat from the consumer; asking again", "durable", c.Durable.Name, "server", c.js.Conn().ConnectedServerName())
				stranded.Missed(c.js.Conn(), c.Log, c.Durable.Name, "no heartbeat from the consumer")
				continue
			}
			return fmt.Errorf("consume %s: %w", c.Durable.Name, err)
		}
		stranded.Heard()
		c.LastDelivery.Store(time.Now().UnixMilli())
		if err := c.handle(ctx, msg); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
}

func (c *Consumer) handle(ctx context.Context, msg jetstream.Msg) error {
	meta, err := msg.Metadata()
	if err != nil {
		return fmt.Errorf("message metadata: %w", err)
	}
	b, err := consume.Decode(msg.Headers(), msg.Data())
	if err != nil {
		// Redelivering it would not fix it: report and take it off this
		// consumer (it stays in the stream).
		c.Log.Error("skipping a malformed message", "subject", msg.Subject(), "stream_seq", meta.Sequence.Stream, "err", err)
		return msg.Term()
	}
	c.follow(ctx, msg, meta)
	if c.Durable.Action != "" {
		b = b.Only(c.Durable.Action)
	}
	m := Meta{Stream: meta.Stream, Seq: meta.Sequence.Stream, Durable: c.Durable.Name}
	added := 0
	for delay, failing := 250*time.Millisecond, false; len(b.Tokens) > 0; {
		added, err = c.store(ctx, m, b)
		if err == nil {
			if failing {
				c.Log.Info("storing again", "stream_seq", m.Seq)
			}
			break
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !failing {
			c.Log.Warn("cannot store a message; trying again, not acknowledging it meanwhile", "stream_seq", m.Seq, "err", err)
			failing = true
		}
		// Kept from redelivery while it waits: the next try is ours.
		msg.InProgress()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Second)
	}
	if added < len(b.Tokens) {
		// All of it (or, cut short between parts, some) was stored by a
		// delivery whose ack never came.
		c.Again.Add(1)
		c.Log.Info("message stored before: acknowledging it", "stream_seq", m.Seq, "deliveries", meta.NumDelivered, "tokens", len(b.Tokens), "added", added)
	}
	c.Added.Add(int64(added))
	if err := msg.DoubleAck(ctx); err != nil {
		// Stored: delivered again, it adds nothing.
		c.Log.Warn("ack not confirmed; the message will be delivered again and add nothing", "stream_seq", m.Seq, "err", err)
		return nil
	}
	c.Messages.Add(1)
	return nil
}

// seed starts the chain at at, the last message the durable stored; not
// with an action (Durable.Action): messages without its tokens store
// nothing, and the last one stored says nothing of those after it.
func (c *Consumer) seed(at Stored) {
	if c.Durable.Action == "" {
		c.chain.Seed = wire.Anchor{Seq: at.Seq, Mark: wire.IDMark(at.BatchID)}
	}
}

// seedAtFloor starts the chain, with an action, at the consumer's ack
// floor: every message up to it was handled, stored or holding none of the
// action's tokens, which the database cannot say (seed).
func (c *Consumer) seedAtFloor(cons jetstream.Consumer) {
	if c.Durable.Action == "" || c.chain.Seed.Seq != 0 {
		return
	}
	c.chain.Seed = wire.Anchor{Seq: cons.CachedInfo().AckFloor.Stream}
}

// follow checks that msg follows the last message stored from its
// subject: what a purge or a limit removed before the durable read it
// is said, and counted; the rest is stored all the same.
func (c *Consumer) follow(ctx context.Context, msg jetstream.Msg, meta *jetstream.MsgMetadata) {
	h := msg.Headers()
	if wire.IsMarker(h) {
		return
	}
	gap := c.chain.Follow(msg.Subject(), meta.Sequence.Stream, h, wire.Mark(msg.Subject(), h, msg.Data()), meta.NumDelivered > 1)
	c.Gaps.Note(ctx, c.js, c.Durable.Stream, c.Durable.Name, c.Log, h, gap, func() { msg.InProgress() })
}

// partTokens and partsAtOnce: a message of more than partTokens tokens (a
// backlog's, with group commit: up to thousands) is stored in parts of
// about that many, partsAtOnce transactions at a time, so that the sink's
// work (River's, above all) and the database's run side by side.
const (
	partTokens  = 1000
	partsAtOnce = 4
)

// store stores b: in one transaction, or a large message in parts, each in
// a transaction of its own. The message is acknowledged only once every
// part committed; a crash between parts leaves some stored, and storing
// the message again adds the rest.
func (c *Consumer) store(ctx context.Context, m Meta, b *consume.Decoded) (int, error) {
	parts := split(b, partTokens)
	if len(parts) == 1 {
		return c.storePart(ctx, m, b)
	}
	var (
		mu    sync.Mutex
		added int
		first error
		wg    sync.WaitGroup
	)
	sem := make(chan struct{}, partsAtOnce)
	for _, part := range parts {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			n, err := c.storePart(ctx, m, part)
			mu.Lock()
			defer mu.Unlock()
			added += n
			if err != nil && first == nil {
				first = err
			}
		}()
	}
	wg.Wait()
	return added, first
}

// storePart runs Sink.Store in a transaction of its own and commits it.
func (c *Consumer) storePart(ctx context.Context, m Meta, b *consume.Decoded) (int, error) {
	var added int
	err := pgx.BeginFunc(ctx, c.Pool, func(tx pgx.Tx) error {
		var err error
		added, err = c.Sink.Store(ctx, tx, m, b)
		return err
	})
	return added, err
}

// split cuts b at batch (line) boundaries into parts of about n tokens.
// Each part keeps the lines before it as empty ones, so that Lines gives
// every token the line number it has in b.
func split(b *consume.Decoded, n int) []*consume.Decoded {
	if len(b.Tokens) <= n {
		return []*consume.Decoded{b}
	}
	var parts []*consume.Decoded
	from, at, size := 0, 0, 0
	for i, k := range b.Sizes {
		size += k
		if size < n && i < len(b.Sizes)-1 {
			continue
		}
		if size > 0 {
			sizes := make([]int, i+1)
			copy(sizes[from:], b.Sizes[from:i+1])
			parts = append(parts, &consume.Decoded{ID: b.ID, KeyID: b.KeyID, Tokens: b.Tokens[at : at+size], Sizes: sizes})
		}
		from, at, size = i+1, at+size, 0
	}
	return parts
}
