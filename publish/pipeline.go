package publish

import (
	"context"
	"github.com/mailroom/tailer/decoder/wal"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/mailroom/tailer/batch"
	"github.com/mailroom/tailer/decoder"
	"github.com/mailroom/tailer/publish/join"
	"github.com/mailroom/tailer/publish/wire"
)

// StateJoiner fills in each token's current state, for several batches at
// once; join.Joiner is the one the tailer runs.
type StateJoiner interface {
	JoinMany(ctx context.Context, tokens [][]decoder.Token, rows [][]join.TokenState) error
}

// Observer is told what happened to every batch and message (metrics).
type Observer interface {
	// BatchPublished is called once the PubAcks for a batch with published
	// tokens arrived; latency runs from the pipeline taking the batch to
	// the last PubAck, and so includes its join and its wait for a message.
	BatchPublished(b *batch.Batch, published int, latency time.Duration)
	// MessagePublished is called for every PubAck: the message carried
	// batches batches (lines) and tokens tokens, and took latency from
	// publish to PubAck.
	MessagePublished(batches, tokens int, latency time.Duration)
	// TokensSkipped counts tokens not published, by reason.
	TokensSkipped(reason join.Skip, n int)
	// Joined is called for every query that joined tokens tokens to their
	// accounts, which took latency (its waits for transactions not yet
	// visible included).
	Joined(tokens int, latency time.Duration)
	// BatchDone is called for every batch whose tokens are all published
	// or skipped, just before Done.
	BatchDone(b *batch.Batch)
}

// Pipeline turns cut batches into published messages: it joins accounts,
// signs and encodes, publishes without waiting, and reports each batch done
// in order, per lane, once its PubAck (or its skip) is in.
//
// It commits batches to the stream in groups: at most MaxInFlight messages
// await their PubAck at once, and the batches that become ready meanwhile go
// out together, in one message, when the next PubAck frees a place. A store
// that syncs to disk before every PubAck then syncs once per message, not
// once per batch: under load the messages grow, and at low load a batch
// still goes out alone, at once.
type Pipeline struct {
	Publisher *Publisher
	Joiner    StateJoiner
	Encoder   *Encoder
	Format    wire.Format
	// MaxInFlight bounds the messages published but not yet acknowledged.
	MaxInFlight int
	// MaxBatches bounds the batches one message carries; 1 publishes every
	// batch in a message of its own.
	MaxBatches int
	// MaxBytes is the most bytes a message may have, body and headers
	// (the server's max_payload): the batches ready at once go out in as
	// many messages as they need, and a batch too big for one message is
	// split, each message naming the positions it covers. 0: no limit.
	MaxBytes int
	// Done is called, in order within each lane, for every batch whose
	// tokens are all published or skipped: batch.Feeder.MarkDone, which
	// moves the slot's confirmed position past it.
	Done     func(*batch.Batch)
	Observer Observer
	Log      *slog.Logger
	// Snapshot, when set, says the batches come from a resync's snapshot
	// (exported with the slot whose consistent point Snapshot is), not
	// from the slot: their tokens have no WAL positions, so each message
	// is named resync-<Snapshot>-<n> and carries Mailroom-Resync instead.
	Snapshot string
	// Tracer, when set, records the spans of tokens whose transactions
	// carried a traceparent (see tracing.go); nil records none.
	Tracer trace.Tracer

	messages int
	// waiting is when the oldest message awaiting its PubAck was
	// published (Unix ns; 0: none awaits one), for PubAckWait.
	waiting atomic.Int64
	// Scratch of the join, reused.
	joinTokens [][]decoder.Token
	joinRows   [][]join.TokenState
}

// ready is a batch the pipeline took, waiting to go out; it is joined when
// a place for a message frees. encoded is how many of its tokens earlier
// messages covered, published the tokens they carried, since when it was
// taken.
type ready struct {
	b         *batch.Batch
	rows      []join.TokenState
	encoded   int
	published int
	// joined: rows hold the join's answer.
	joined bool
	since  time.Time
}

// inFlight is one message, in publishing order; fut is nil when none of the
// tokens it covers was to be published.
type inFlight struct {
	fut     jetstream.PubAckFuture
	id      string
	keys    string
	body    []byte
	n       int
	batches int
	started time.Time
	// done are the batches whose last tokens this message covers.
	done []*ready
	// spans are the message's publish spans (traced tokens only).
	spans []trace.Span
}

// Bounds of one coalesced join, and of the tokens joined and waiting for a
// message.
const (
	maxGroupBatches = 1024
	maxGroupTokens  = 8192
	maxReadyTokens  = 4 * maxGroupTokens
)

// Run processes batches from in until in is closed (returning nil once every
// batch is done) or a failure (returning it). A failure stops the pipeline:
// the caller restarts from the replication slot, and the stream's last
// message tells the next run where to resume.
func (p *Pipeline) Run(ctx context.Context, in <-chan *batch.Batch) error {
	if p.MaxInFlight <= 0 {
		p.MaxInFlight = DefaultMaxInFlight
	}
	if p.MaxBatches <= 0 {
		p.MaxBatches = DefaultMaxBatches
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	// Places for messages awaiting their PubAck: taken to publish, given
	// back by awaitAcks; and what awaitAcks hands back for reuse once a
	// message is acknowledged: its body's buffer, its batches' ready.
	inFlightSlots := make(chan struct{}, p.MaxInFlight)
	for range p.MaxInFlight {
		inFlightSlots <- struct{}{}
	}
	acks := make(chan inFlight, p.MaxInFlight)
	spareBodies := make(chan []byte, p.MaxInFlight+1)
	spareReady := make(chan *ready, 256)
	ackErr := make(chan error, 1)
	go func() {
		err := p.awaitAcks(ctx, acks, inFlightSlots, spareBodies, spareReady)
		if err != nil {
			cancel(err)
		}
		ackErr <- err
	}()

	err := p.produce(ctx, in, acks, inFlightSlots, spareBodies, spareReady)
	close(acks)
	if aerr := <-ackErr; aerr != nil {
		return aerr
	}
	return err
}

// Defaults of Pipeline.MaxInFlight and MaxBatches.
const (
	DefaultMaxInFlight = 1
	DefaultMaxBatches  = 1000
)

// InFlightFor is how many messages to keep awaiting their PubAck on a
// stream of replicas copies. A stream of one stores (and syncs) one
// message at a time, so a second message in flight only splits the group
// that would have gone out after the first, and doubles the syncs: drains
// at the default batch limit measured 45,113-45,410 tokens/s with one
// against 32,062-37,621 with two (docs/performance.md). A replicated
// stream's leader overlaps the replication rounds of the messages it has.
func InFlightFor(replicas int) int {
	if replicas > 1 {
		return 2
	}
	return DefaultMaxInFlight
}

func (p *Pipeline) produce(ctx context.Context, in <-chan *batch.Batch, acks chan<- inFlight, inFlightSlots <-chan struct{}, spareBodies chan []byte, spareReady chan *ready) error {
	var (
		waiting []*ready
		tokens  int
	)
	take := func(b *batch.Batch) {
		var r *ready
		select {
		case r = <-spareReady:
		default:
			r = new(ready)
		}
		r.b, r.encoded, r.published, r.joined, r.since = b, 0, 0, false, time.Now()
		waiting = append(waiting, r)
		tokens += len(b.Tokens)
	}
	for in != nil || len(waiting) > 0 {
		// Batches are taken while fewer than maxReadyTokens wait; a place
		// for a message is only waited for when there is something to
		// put in it.
		input, place := in, inFlightSlots
		if tokens >= maxReadyTokens {
			input = nil
		}
		if len(waiting) == 0 {
			place = nil
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case b, ok := <-input:
			if !ok {
				in = nil
				continue
			}
			take(b)
		case <-place:
			// Batches already cut go with the ones waiting, and all are
			// joined only now, in as few queries as their number allows:
			// while messages are in flight, batches pile up and share a
			// round trip to the database as they share a message.
		more:
			for in != nil && tokens < maxReadyTokens {
				select {
				case b, ok := <-in:
					if !ok {
						in = nil
						break more
					}
					take(b)
				default:
					break more
				}
			}
			if err := p.joinWaiting(ctx, waiting); err != nil {
				return err
			}
			var body []byte
			select {
			case body = <-spareBodies:
			default:
			}
			item, covered, err := p.publishNext(body, &waiting)
			if err != nil {
				return err
			}
			tokens -= covered
			select {
			case acks <- item:
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}
	}
	return nil
}

// joinWaiting joins the waiting batches not joined yet, at most
// maxGroupBatches batches and maxGroupTokens tokens a query.
func (p *Pipeline) joinWaiting(ctx context.Context, waiting []*ready) error {
	for i := 0; i < len(waiting); {
		if waiting[i].joined {
			i++
			continue
		}
		j, tokens := i, 0
		for j < len(waiting) && !waiting[j].joined && j-i < maxGroupBatches && (j == i || tokens+len(waiting[j].b.Tokens) <= maxGroupTokens) {
			tokens += len(waiting[j].b.Tokens)
			j++
		}
		if err := p.join(ctx, waiting[i:j]); err != nil {
			return err
		}
		i = j
	}
	return nil
}

// join marks tokens already on the stream (by key, as Resume found them)
// and joins the rest of group's
// tokens in one query.
func (p *Pipeline) join(ctx context.Context, group []*ready) error {
	p.joinTokens, p.joinRows = p.joinTokens[:0], p.joinRows[:0]
	toJoin := 0
	for _, r := range group {
		b := r.b
		if p.Log != nil {
			p.Log.Debug("batch cut", "tokens", len(b.Tokens), "first", b.First().String(), "last", b.Last().String(), "cut", b.Cut.String())
		}
		r.rows = resetRows(r.rows, len(b.Tokens))
		r.joined = true
		for i := range b.Tokens {
			on, err := p.Publisher.OnStream(ctx, &b.Tokens[i])
			if err != nil {
				return err
			}
			if on {
				r.rows[i].Skip = join.SkipAlreadyPublished
			} else {
				toJoin++
			}
		}
		p.joinTokens = append(p.joinTokens, b.Tokens)
		p.joinRows = append(p.joinRows, r.rows)
	}
	end := p.traceDecodeAndJoin(ctx, p.joinTokens)
	if toJoin == 0 {
		end(nil)
		return nil
	}
	start := time.Now()
	err := p.Joiner.JoinMany(ctx, p.joinTokens, p.joinRows)
	end(err)
	if err == nil && p.Observer != nil {
		p.Observer.Joined(toJoin, time.Since(start))
	}
	return err
}

// publishNext encodes the next message and publishes it without waiting for
// its PubAck: the first waiting batch's lane, and every batch of that lane
// waiting behind it, until the message is full. Batches it covers to the
// end leave waiting. It returns the message and how many tokens it covers.
func (p *Pipeline) publishNext(body []byte, waiting *[]*ready) (inFlight, int, error) {
	lane := (*waiting)[0].b.Lane
	item := inFlight{started: time.Now()}
	var first, last wal.Position
	covered := 0
	p.Encoder.Begin(body, p.MaxBytes)
	rest := (*waiting)[:0]
	full := false
	batches := 0
	for _, r := range *waiting {
		if full || r.b.Lane != lane {
			rest = append(rest, r)
			continue
		}
		if batches++; batches == p.MaxBatches {
			full = true
		}
		tokens := r.b.Tokens[r.encoded:]
		n := p.Encoder.Add(tokens, r.rows[r.encoded:])
		if n > 0 {
			if covered == 0 {
				first = tokens[0].Pos
			}
			last = tokens[n-1].Pos
			covered += n
			if p.Observer != nil {
				p.countSkips(tokens[:n], r.rows[r.encoded:r.encoded+n])
			}
			r.published += countPublished(r.rows[r.encoded : r.encoded+n])
			r.encoded += n
		}
		if r.encoded < len(r.b.Tokens) {
			full = true
			rest = append(rest, r)
			continue
		}
		item.done = append(item.done, r)
	}
	clear((*waiting)[len(rest):])
	*waiting = rest

	if p.Snapshot != "" {
		item.id = "resync-" + p.Snapshot + "-" + strconv.Itoa(p.messages+1)
	} else {
		item.id = p.Publisher.BatchID(first, last)
	}
	enc := p.Encoder.Finish(item.id)
	item.body, item.n, item.batches = enc.Body, enc.N, enc.Batches
	if enc.N == 0 {
		return item, covered, nil
	}
	m := &Message{Lane: lane, Count: enc.N, TokenIDs: enc.IDs, TokenKeys: enc.Keys, BatchSizes: enc.Sizes, KeyID: enc.KeyID, Format: p.Format, Body: enc.Body,
		Traces: enc.Traces, TraceTokens: enc.TraceTokens}
	if p.Snapshot != "" {
		m.ID, m.Resync = item.id, p.Snapshot
	} else {
		m.First, m.Last = first, last
	}
	item.spans = p.tracePublish(enc.Traces, enc.TraceCounts, p.Publisher.subjects[lane])
	fut, err := p.Publisher.PublishAsync(m)
	if err != nil {
		endSpans(item.spans, err)
		return item, covered, err
	}
	p.messages++
	item.fut, item.keys = fut, enc.Keys
	return item, covered, nil
}

// countPublished counts the rows that went into a message.
func countPublished(rows []join.TokenState) int {
	n := 0
	for i := range rows {
		if rows[i].Skip == join.Publish {
			n++
		}
	}
	return n
}

func (p *Pipeline) countSkips(tokens []decoder.Token, rows []join.TokenState) {
	var counts [join.NumSkips]int
	for i := range rows {
		counts[rows[i].Skip]++
		if rows[i].Skip == join.SkipUnsafeField && p.Log != nil {
			// The token id and position, never the field: it is the
			// user's, and may be crafted to forge log lines too.
			p.Log.Warn("token not published in a line: its email or login holds "+wire.Unsafe,
				"reason", "unsafe_field", "token_id", tokens[i].ID, "position", tokens[i].Pos.String())
		}
	}
	for _, r := range join.Reasons {
		if counts[r] > 0 {
			p.Observer.TokensSkipped(r, counts[r])
		}
	}
}
