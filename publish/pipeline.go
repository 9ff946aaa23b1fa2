package publish

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/batch"
	"github.com/mailroom/tailer/batch/join"
	"github.com/mailroom/tailer/decoder"
	"github.com/mailroom/tailer/publish/wire"
)

// Joiner fills in each token's current state, for several batches at once;
// see join.Joiner.
type Joiner interface {
	JoinMany(ctx context.Context, tokens [][]decoder.Token, rows [][]join.TokenState) error
}

// Observer is told what happened to every batch (metrics).
type Observer interface {
	// BatchPublished is called once the PubAck for a batch with published
	// tokens arrived; latency runs from the publish call to the PubAck.
	BatchPublished(b *batch.Batch, published int, latency time.Duration)
	// TokensSkipped counts tokens not published, by reason.
	TokensSkipped(reason join.Skip, n int)
}

// Pipeline turns cut batches into published messages: it joins accounts,
// signs and encodes, publishes without waiting, and reports each batch done
// strictly in order once its PubAck (or its skip) is in.
type Pipeline struct {
	Publisher *Publisher
	Joiner    Joiner
	Encoder   *Encoder
	Format    wire.Format
	// MaxInFlight bounds the messages published but not yet acknowledged.
	MaxInFlight int
	// MaxBytes is the most bytes a message may have, body and headers
	// (the server's max_payload); a batch that would exceed it goes out as
	// several messages, each naming the positions it covers. 0: no limit.
	MaxBytes int
	// Done is called in batch order for every batch whose tokens are all
	// published or skipped.
	Done     func(*batch.Batch)
	Observer Observer
	Log      *slog.Logger
	// Snapshot, when set, says the batches come from a resync's snapshot
	// (exported with the slot whose consistent point Snapshot is), not
	// from the slot: their tokens have no WAL positions, so each message
	// is named resync-<Snapshot>-<n> and carries Mailroom-Resync instead.
	Snapshot string

	messages int
}

// inFlight is one message of a batch; last is set on the batch's last.
type inFlight struct {
	b       *batch.Batch
	fut     jetstream.PubAckFuture
	id      string
	body    []byte
	n       int
	last    bool
	started time.Time
}

// Run processes batches from in until in is closed (returning nil once every
// batch is done) or a failure (returning it). A failure stops the pipeline:
// the caller restarts from the replication slot, and the stream's last
// message tells the next run where to resume.
func (p *Pipeline) Run(ctx context.Context, in <-chan *batch.Batch) error {
	if p.MaxInFlight <= 0 {
		p.MaxInFlight = 16
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	acks := make(chan inFlight, p.MaxInFlight)
	bodies := make(chan []byte, p.MaxInFlight+1)
	ackErr := make(chan error, 1)
	go func() {
		err := p.awaitAcks(ctx, acks, bodies)
		if err != nil {
			cancel(err)
		}
		ackErr <- err
	}()

	err := p.produce(ctx, in, acks, bodies)
	close(acks)
	if aerr := <-ackErr; aerr != nil {
		return aerr
	}
	return err
}

// Bounds of one coalesced join.
const (
	maxGroupBatches = 64
	maxGroupTokens  = 8192
)

func (p *Pipeline) produce(ctx context.Context, in <-chan *batch.Batch, acks chan<- inFlight, bodies chan []byte) error {
	var (
		group  []*batch.Batch
		tokens [][]decoder.Token
		rows   [][]join.TokenState
	)
	for {
		group = group[:0]
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case b, ok := <-in:
			if !ok {
				return nil
			}
			group = append(group, b)
		}
		// Batches already waiting share the join's round trip.
		closed := false
		n := len(group[0].Tokens)
	more:
		for len(group) < maxGroupBatches && n < maxGroupTokens {
			select {
			case b, ok := <-in:
				if !ok {
					closed = true
					break more
				}
				group = append(group, b)
				n += len(b.Tokens)
			default:
				break more
			}
		}
		if err := p.joinGroup(ctx, group, &tokens, &rows); err != nil {
			return err
		}
		for k, b := range group {
			if err := p.publish(ctx, b, rows[k], acks, bodies); err != nil {
				return err
			}
		}
		if closed {
			return nil
		}
	}
}

// joinGroup marks tokens already on the stream and joins the rest of the
// group's tokens in one query; rows[k] belongs to group[k].
func (p *Pipeline) joinGroup(ctx context.Context, group []*batch.Batch, tokens *[][]decoder.Token, rows *[][]join.TokenState) error {
	*tokens = (*tokens)[:0]
	for len(*rows) < len(group) {
		*rows = append(*rows, nil)
	}
	toJoin := 0
	for k, b := range group {
		if p.Log != nil {
			p.Log.Debug("batch cut", "tokens", len(b.Tokens), "first", b.First().String(), "last", b.Last().String(), "cut", b.Cut.String())
		}
		r := resetRows((*rows)[k], len(b.Tokens))
		(*rows)[k] = r
		last := p.Publisher.LastPosition(b.Lane)
		for i := range b.Tokens {
			if !last.IsZero() && !last.Less(b.Tokens[i].Pos) {
				r[i].Skip = join.SkipAlreadyPublished
			} else {
				toJoin++
			}
		}
		*tokens = append(*tokens, b.Tokens)
	}
	if toJoin == 0 {
		return nil
	}
	return p.Joiner.JoinMany(ctx, *tokens, (*rows)[:len(group)])
}

// publish encodes b and publishes it without waiting for the PubAcks, which
// awaitAcks collects in order: one message, or several when the batch's
// tokens exceed MaxBytes.
func (p *Pipeline) publish(ctx context.Context, b *batch.Batch, rows []join.TokenState, acks chan<- inFlight, bodies chan []byte) error {
	// Once its last message is handed to awaitAcks, b may be done and
	// recycled: nothing of it is read after that.
	for start, end := 0, len(b.Tokens); start < end; {
		var body []byte
		select {
		case body = <-bodies:
		default:
		}
		item := inFlight{b: b, started: time.Now()}
		tokens := b.Tokens[start:]
		id := func(covered int) string {
			if p.Snapshot != "" {
				item.id = "resync-" + p.Snapshot + "-" + strconv.Itoa(p.messages+1)
			} else {
				item.id = BatchID(tokens[0].Pos, tokens[covered-1].Pos)
			}
			return item.id
		}
		enc := p.Encoder.Encode(body[:0], id, tokens, rows[start:], p.MaxBytes)
		if item.id == "" {
			id(enc.Covered)
		}
		item.body, item.n = enc.Body, enc.N
		if p.Observer != nil {
			p.countSkips(tokens[:enc.Covered], rows[start:start+enc.Covered])
		}
		if enc.N > 0 {
			m := &Message{Lane: b.Lane, Count: enc.N, TokenIDs: enc.IDs, TokenKeys: enc.Keys, Format: p.Format, Body: enc.Body}
			if p.Snapshot != "" {
				m.ID, m.Resync = item.id, p.Snapshot
			} else {
				m.First, m.Last = tokens[0].Pos, tokens[enc.Covered-1].Pos
			}
			fut, err := p.Publisher.PublishAsync(m)
			if err != nil {
				return err
			}
			p.messages++
			item.fut = fut
		}
		start += enc.Covered
		item.last = start == end
		select {
		case acks <- item:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	return nil
}

func (p *Pipeline) countSkips(tokens []decoder.Token, rows []join.TokenState) {
	var counts [join.NumSkips]int
	for i := range rows {
		counts[rows[i].Skip]++
		if rows[i].Skip == join.SkipUnsafeField && p.Log != nil {
			// The token id and position, never the field: it is the
			// user's, and may be crafted to forge log lines too.
			p.Log.Warn("token not published in a line: its email or login holds a comma, CR, LF or NUL, or exceeds 254 bytes",
				"reason", "unsafe_field", "token_id", tokens[i].ID, "position", tokens[i].Pos.String())
		}
	}
	for _, r := range join.Reasons {
		if counts[r] > 0 {
			p.Observer.TokensSkipped(r, counts[r])
		}
	}
}

func (p *Pipeline) awaitAcks(ctx context.Context, acks <-chan inFlight, bodies chan<- []byte) error {
	for it := range acks {
		if it.fut != nil {
			select {
			case ack := <-it.fut.Ok():
				if p.Log != nil {
					p.Log.Debug("batch acknowledged", "batch", it.id, "tokens", it.n, "seq", ack.Sequence, "duplicate", ack.Duplicate)
				}
				if ack.Duplicate {
					if err := p.Publisher.CheckDuplicate(ctx, it.id, ack.Sequence); err != nil {
						return err
					}
					if p.Log != nil {
						p.Log.Info("batch was already on the stream", "batch", it.id, "seq", ack.Sequence)
					}
				}
			case err := <-it.fut.Err():
				return fmt.Errorf("publish batch %s: %w", it.id, err)
			case <-ctx.Done():
				return errors.Join(errors.New("waiting for PubAck"), context.Cause(ctx))
			}
			if p.Observer != nil {
				p.Observer.BatchPublished(it.b, it.n, time.Since(it.started))
			}
		}
		select {
		case bodies <- it.body:
		default:
		}
		if it.last {
			p.Done(it.b)
		}
	}
	return nil
}

// resetRows returns rows with length n, all zero (Publish).
func resetRows(rows []join.TokenState, n int) []join.TokenState {
	if cap(rows) < n {
		rows = make([]join.TokenState, n)
	}
	rows = rows[:n]
	clear(rows)
	return rows
}
