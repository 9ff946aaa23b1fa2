package inbox

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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

// Sink stores the tokens of decoded messages in tx, adding nothing for a
// token it holds already; it reports how many each message added.
// Position says where a durable consumer got to: the last message it
// stored a token of; ok is false when it stored none.
type Sink interface {
	StoreAll(ctx context.Context, tx pgx.Tx, ms []Received) (added []int, err error)
	Position(ctx context.Context, pool *pgxpool.Pool, stream, durable string) (at Stored, ok bool, err error)
}

// Received is a decoded message to store, and where it is.
type Received struct {
	Meta
	*consume.Decoded
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

// inboxColumns are the columns Store fills, in its rows' order.
var inboxColumns = []string{"token_key", "token_id", "action", "email", "login", "token", "code", "expires_at", "key_id", "batch_id", "line", "stream", "stream_seq", "durable", "traceparent"}

// Store inserts b's tokens, those already there (by token key) left alone.
//
// It first copies them in (COPY) in a savepoint: in a drain that takes the
// database less than the insert that passes over rows already there,
// which COPY cannot do (a unique conflict fails it whole). A message whose
// tokens are there in part or in full (delivered again) is rolled back to
// the savepoint and takes that insert.
func (i Inbox) Store(ctx context.Context, tx pgx.Tx, m Meta, b *consume.Decoded) (int, error) {
	added, err := i.StoreAll(ctx, tx, []Received{{m, b}})
	if err != nil {
		return 0, err
	}
	return added[0], nil
}

// StoreAll is Store for several messages, in one COPY when none of their
// tokens is there.
func (Inbox) StoreAll(ctx context.Context, tx pgx.Tx, ms []Received) ([]int, error) {
	added := make([]int, len(ms))
	err := copyNew(ctx, tx, ms)
	if err == nil {
		for i, m := range ms {
			added[i] = len(m.Tokens)
		}
		return added, nil
	}
	if !errors.Is(err, errStoredBefore) {
		return nil, err
	}
	for i, m := range ms {
		if added[i], err = insertNew(ctx, tx, m.Meta, m.Decoded); err != nil {
			return nil, err
		}
	}
	return added, nil
}

// copyNew copies the tokens of ms into mailroom_inbox in a savepoint of
// tx, rolled back when a row of theirs is there (errStoredBefore).
func copyNew(ctx context.Context, tx pgx.Tx, ms []Received) error {
	var rows [][]any
	for _, m := range ms {
		b := m.Decoded
		for line, batch := range b.Lines() {
			for _, t := range batch {
				var expires any
				if t.ExpiresAt != 0 {
					expires = t.ExpiresAt
				}
				rows = append(rows, []any{t.Key, t.ID, t.Action, t.Email, t.Login, t.Token, t.Code, expires, nullIfEmpty(b.KeyID), b.ID,
					int32(line), m.Stream, int64(m.Seq), nullIfEmpty(m.Durable), nullIfEmpty(t.Traceparent)})
			}
		}
	}
	_, err := inSavepoint(ctx, tx, "mailroom_inbox_pkey", func(sp pgx.Tx) (int, error) {
		n, err := sp.CopyFrom(ctx, pgx.Identifier{"mailroom_inbox"}, inboxColumns, pgx.CopyFromRows(rows))
		return int(n), err
	})
	return err
}

// nullIfEmpty is s, or SQL NULL for "".
func nullIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// errStoredBefore: a row or job of the tokens copied is stored already.
var errStoredBefore = errors.New("a token of these is stored already")

// inSavepoint runs insert in a savepoint of tx, rolled back when it
// violates the unique constraint constraint (errStoredBefore).
func inSavepoint(ctx context.Context, tx pgx.Tx, constraint string, insert func(pgx.Tx) (int, error)) (int, error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("savepoint: %w", err)
	}
	n, err := insert(sp)
	if err == nil {
		if err := sp.Commit(ctx); err != nil {
			return 0, fmt.Errorf("release savepoint: %w", err)
		}
		return n, nil
	}
	if rerr := sp.Rollback(ctx); rerr != nil {
		return 0, fmt.Errorf("roll back to savepoint: %w (after %w)", rerr, err)
	}
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == pgerrcode.UniqueViolation && pgErr.ConstraintName == constraint {
		return 0, errStoredBefore
	}
	return 0, err
}

// insertNew inserts b's tokens, those already there (by token key) left
// alone.
func insertNew(ctx context.Context, tx pgx.Tx, m Meta, b *consume.Decoded) (int, error) {
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

// pullBatch is how many messages a pull asks for: those at hand are
// stored together (gather), each acknowledged after the commit.
const pullBatch = 16

// Run stores messages until ctx is done. A message the database cannot
// take now (it is down, say) is tried again, kept from redelivery
// meanwhile, and never acknowledged before it is stored. A consumer gone
// from the server is made again at the last message the database holds a
// token of (storing it again adds only what it lacks).
func (c *Consumer) Run(ctx context.Context, js jetstream.JetStream) error {
	c.js = js
	// Room for a pull's messages in each unit in flight.
	if c.Durable.MaxAckPending < unitsAtOnce*pullBatch {
		c.Durable.MaxAckPending = unitsAtOnce * pullBatch
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
	p := newPipeline(c)
	hbCtx, stopHeartbeat := context.WithCancel(ctx)
	go p.heartbeat(hbCtx, cmp.Or(cons.CachedInfo().Config.AckWait, consume.DefaultAckWait)/3)
	// The units in flight end before the consumer is made again or Run
	// returns: what they store is where a lost consumer is made again.
	defer func() { stopHeartbeat(); p.wait() }()
	var stranded consume.Stranded
	for {
		msg, err := iter.Next()
		var group []jetstream.Msg
		if err == nil {
			stranded.Heard()
			c.LastDelivery.Store(time.Now().UnixMilli())
			group, err = gather(iter, msg)
		}
		if len(group) > 0 {
			if err := c.handle(ctx, p, group); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
		}
		if err != nil {
			if done, err := c.iterErr(ctx, cons, err, &stranded); done {
				return err
			}
		}
	}
}

// gather is msg and the messages the iterator holds already, up to
// groupTokens tokens (by Mailroom-Count) and pullBatch messages: stored in
// one transaction, messages of a few hundred tokens (a drain's, group
// commit behind one PubAck at a time) cost a commit and an ack round trip
// each otherwise, one after the other (issue 47: the inbox at 0.64× the
// drain, River at 0.52× its own insert alone). It returns the iterator's
// error that ended the gathering, but for the wait for more running out.
func gather(iter jetstream.MessagesContext, msg jetstream.Msg) ([]jetstream.Msg, error) {
	group := []jetstream.Msg{msg}
	tokens := count(msg)
	for tokens < groupTokens && len(group) < pullBatch {
		m, err := iter.Next(jetstream.NextMaxWait(time.Millisecond))
		if errors.Is(err, nats.ErrTimeout) {
			return group, nil
		}
		if err != nil {
			return group, err
		}
		group = append(group, m)
		tokens += count(m)
	}
	return group, nil
}

// count is how many tokens msg says it carries.
func count(msg jetstream.Msg) int {
	n, _ := strconv.Atoi(msg.Headers().Get(wire.HeaderCount))
	return n
}

// groupTokens bounds the tokens of the messages stored in one
// transaction; a message larger than it alone is stored in parts.
const groupTokens = 2000

// iterErr handles an error of the iterator: done when the consume ends
// (with err: nil when ctx ended, errLost when the consumer is gone).
func (c *Consumer) iterErr(ctx context.Context, cons jetstream.Consumer, err error, stranded *consume.Stranded) (bool, error) {
	switch {
	case ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed):
		return true, nil
	case consume.Lost(ctx, cons, err):
		c.Log.Error("the consumer is gone from the server", "durable", c.Durable.Name, "err", err)
		return true, errLost
	case errors.Is(err, jetstream.ErrNoHeartbeat):
		c.Log.Warn("no heartbeat from the consumer; asking again", "durable", c.Durable.Name, "server", c.js.Conn().ConnectedServerName())
		stranded.Missed(c.js.Conn(), c.Log, c.Durable.Name, "no heartbeat from the consumer")
		return false, nil
	}
	return true, fmt.Errorf("consume %s: %w", c.Durable.Name, err)
}

// handle decodes a group of messages, in delivery order, and hands them
// to the pipeline, which stores them (small ones together, a large one in
// parts) and acknowledges each once stored. A message that does not
// decode is taken off the consumer.
func (c *Consumer) handle(ctx context.Context, p *pipeline, group []jetstream.Msg) error {
	var rs []*received
	for _, msg := range group {
		r, err := c.receive(ctx, msg)
		if err != nil {
			return err
		}
		if r != nil {
			rs = append(rs, r)
		}
	}
	p.add(ctx, rs)
	return nil
}

// receive decodes msg and follows its subject's chain; nil for a message
// that does not decode, taken off this consumer (it stays in the stream).
func (c *Consumer) receive(ctx context.Context, msg jetstream.Msg) (*received, error) {
	meta, err := msg.Metadata()
	if err != nil {
		return nil, fmt.Errorf("message metadata: %w", err)
	}
	b, err := consume.Decode(msg.Headers(), msg.Data())
	if err != nil {
		// Redelivering it would not fix it: report and take it off.
		c.Log.Error("skipping a malformed message", "subject", msg.Subject(), "stream_seq", meta.Sequence.Stream, "err", err)
		return nil, msg.Term()
	}
	c.follow(ctx, msg, meta)
	if c.Durable.Action != "" {
		b = b.Only(c.Durable.Action)
	}
	return &received{msg: msg, meta: meta, m: Meta{Stream: meta.Stream, Seq: meta.Sequence.Stream, Durable: c.Durable.Name}, b: b}, nil
}

// acknowledge acknowledges r, stored, and its deliveries again that came
// meanwhile.
func (c *Consumer) acknowledge(ctx context.Context, r *received, again []jetstream.Msg) {
	for _, msg := range again {
		msg.Ack()
	}
	if r.added < len(r.b.Tokens) {
		// All of it (or, cut short between parts, some) was stored by a
		// delivery whose ack never came.
		c.Again.Add(1)
		c.Log.Info("message stored before: acknowledging it", "stream_seq", r.m.Seq, "deliveries", r.meta.NumDelivered, "tokens", len(r.b.Tokens), "added", r.added)
	}
	c.Added.Add(int64(r.added))
	if err := r.msg.DoubleAck(ctx); err != nil {
		// Stored: delivered again, it adds nothing.
		c.Log.Warn("ack not confirmed; the message will be delivered again and add nothing", "stream_seq", r.m.Seq, "err", err)
		return
	}
	c.Messages.Add(1)
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

// minPartTokens: a message of more than minPartTokens tokens (a
// backlog's, with group commit: thousands) is stored in up to unitsAtOnce
// parts of about equal size, no smaller than that, each a unit of its own
// (pipeline), so that the sink's work (River's, above all) and the
// database's run side by side.
const minPartTokens = 500

// partSize is the size of the parts of a message of n tokens.
func partSize(n int) int { return max(minPartTokens, (n+unitsAtOnce-1)/unitsAtOnce) }

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
