package inbox

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/publish/consume"
)

// A transaction of the subscriber's (a unit) stores a group of the small
// messages at hand, or a part of a large one. Up to unitsAtOnce run side by
// side (River's insert alone, one transaction at a time, went at about
// three quarters of its pace four at a time, issue 47) and commit in
// whatever order they finish: in the order they were cut, River went at
// 0.65-0.80× its own insert alone. Each writes, with its tokens, the newest
// message before which every message delivered is stored, itself
// included (StoredThroughTable): where a lost consumer is made again, so
// that a process killed between two commits out of order leaves nothing
// behind it unstored.
type unit struct {
	parts []part
	// wrote is the message the unit's transaction wrote into
	// StoredThroughTable, nil if none.
	wrote *received
}

// part is tokens of one message to store in a unit.
type part struct {
	r *received
	b *consume.Decoded
}

// unitsAtOnce bounds the units in flight.
const unitsAtOnce = 4

// pipeline runs the units of a consume.
type pipeline struct {
	c       *Consumer
	slots   chan struct{}
	wg      sync.WaitGroup
	pruning atomic.Bool

	mu sync.Mutex
	// inflight are the messages stored and not yet acknowledged, by
	// stream sequence: one delivered again meanwhile (its ack wait ran
	// out) is acknowledged with it, not stored twice at once.
	inflight map[uint64]*received
	// order are the messages delivered, in delivery order, from the first
	// not yet stored on.
	order []*received
	// written is the newest message a committed unit wrote into
	// StoredThroughTable; commits counts the units committed.
	written *received
	commits int
}

// pruneEvery is how many commits apart the rows of StoredThroughTable
// below the newest one written are removed.
const pruneEvery = 64

// newPipeline makes c's pipeline: at most as many units as the pool has
// connections, since a unit that waits for the one before holds its own.
func newPipeline(c *Consumer) *pipeline {
	n := min(unitsAtOnce, max(int(c.Pool.Config().MaxConns), 1))
	return &pipeline{c: c, slots: make(chan struct{}, n), inflight: map[uint64]*received{}}
}

// add cuts rs into units and starts them, waiting for room.
func (p *pipeline) add(ctx context.Context, rs []*received) {
	var small []part
	for _, r := range rs {
		p.mu.Lock()
		if first := p.inflight[r.m.Seq]; first != nil {
			first.again = append(first.again, r.msg)
			p.mu.Unlock()
			continue
		}
		p.inflight[r.m.Seq] = r
		p.order = append(p.order, r)
		p.mu.Unlock()
		if len(r.b.Tokens) <= minPartTokens {
			small = append(small, part{r, r.b})
			continue
		}
		parts := split(r.b, partSize(len(r.b.Tokens)))
		r.units = len(parts)
		for _, b := range parts {
			p.start(ctx, []part{{r, b}})
		}
	}
	if len(small) > 0 {
		for _, pt := range small {
			pt.r.units = 1
		}
		p.start(ctx, small)
	}
}

// start runs one unit once a slot is free.
func (p *pipeline) start(ctx context.Context, parts []part) {
	select {
	case p.slots <- struct{}{}:
	case <-ctx.Done():
		return
	}
	u := &unit{parts: parts}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer func() { <-p.slots }()
		if p.run(ctx, u) {
			p.done(ctx, u)
		}
	}()
}

// run stores u's parts in a transaction, trying again while the database
// cannot take it; false when ctx ended first.
func (p *pipeline) run(ctx context.Context, u *unit) bool {
	c := p.c
	for delay, failing := 250*time.Millisecond, false; ; delay = min(2*delay, 5*time.Second) {
		added, err := p.store(ctx, u)
		if err == nil {
			for i, pt := range u.parts {
				pt.r.addAdded(added[i])
			}
			if failing {
				c.Log.Info("storing again", "stream_seq", u.parts[0].r.m.Seq)
			}
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		if !failing {
			c.Log.Warn("cannot store a message; trying again, not acknowledging it meanwhile", "stream_seq", u.parts[0].r.m.Seq, "err", err)
			failing = true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(delay):
		}
	}
}

// store stores u's parts in one transaction, with where the messages are
// stored through should it commit (through); it returns how many tokens
// each part added.
func (p *pipeline) store(ctx context.Context, u *unit) ([]int, error) {
	added := make([]int, len(u.parts))
	var ms []Received
	var at []int
	for i, pt := range u.parts {
		if len(pt.b.Tokens) > 0 {
			ms, at = append(ms, Received{pt.r.m, pt.b}), append(at, i)
		}
	}
	err := pgx.BeginFunc(ctx, p.c.Pool, func(tx pgx.Tx) error {
		if len(ms) > 0 {
			n, err := p.c.Sink.StoreAll(ctx, tx, ms)
			if err != nil {
				return err
			}
			for k, i := range at {
				added[i] = n[k]
			}
		}
		if r := p.through(u); r != nil {
			u.wrote = r
			return writeThrough(ctx, tx, r)
		}
		return nil
	})
	return added, err
}

// through is the newest message before which every message delivered is
// stored, should u commit, if u's commit moves it; nil if not.
func (p *pipeline) through(u *unit) *received {
	p.mu.Lock()
	defer p.mu.Unlock()
	var last *received
	for _, r := range p.order {
		if !r.stored && !u.completes(r) {
			break
		}
		last = r
	}
	return last
}

// completes reports whether u holds every part of r not yet committed.
func (u *unit) completes(r *received) bool {
	n := 0
	for _, pt := range u.parts {
		if pt.r == r {
			n++
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return n > 0 && r.units == n
}

// done acknowledges the messages whose last unit u was, each ack's answer
// awaited side by side, and now and then prunes StoredThroughTable.
func (p *pipeline) done(ctx context.Context, u *unit) {
	var complete []*received
	for _, pt := range u.parts {
		if pt.r.unitDone() {
			complete = append(complete, pt.r)
		}
	}
	p.mu.Lock()
	for _, r := range complete {
		r.stored = true
	}
	n := 0
	for n < len(p.order) && p.order[n].stored {
		n++
	}
	p.order = slices.Delete(p.order, 0, n)
	if u.wrote != nil && (p.written == nil || u.wrote.m.Seq > p.written.m.Seq) {
		p.written = u.wrote
	}
	p.commits++
	prune := p.commits%pruneEvery == 0 && p.written != nil
	written := p.written
	p.mu.Unlock()
	if prune && p.pruning.CompareAndSwap(false, true) {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.pruning.Store(false)
			if err := pruneThrough(ctx, p.c.Pool, written.m.Stream, written.m.Durable, written.m.Seq); err != nil {
				p.c.Log.Warn("cannot prune; trying again later", "err", err)
			}
		}()
	}
	var wg sync.WaitGroup
	for _, r := range complete {
		p.mu.Lock()
		delete(p.inflight, r.m.Seq)
		again := r.again
		p.mu.Unlock()
		wg.Add(1)
		go func() { defer wg.Done(); p.c.acknowledge(ctx, r, again) }()
	}
	wg.Wait()
}

// heartbeat keeps the messages in flight from being delivered again while
// they wait for their unit, until ctx ends.
func (p *pipeline) heartbeat(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.mu.Lock()
		for _, r := range p.inflight {
			r.msg.InProgress()
		}
		p.mu.Unlock()
	}
}

// wait waits for the units in flight to end.
func (p *pipeline) wait() { p.wg.Wait() }

// received is a message to store: where it is, its tokens (of the
// durable's action) and the message to acknowledge once they are stored.
type received struct {
	msg  jetstream.Msg
	meta *jetstream.MsgMetadata
	m    Meta
	b    *consume.Decoded

	mu sync.Mutex
	// units counts the units holding its tokens not committed yet; added
	// the tokens they added; again are deliveries of it that came while
	// it was in flight (under the pipeline's mu).
	units int
	added int
	again []jetstream.Msg
	// stored: every unit of it committed (under the pipeline's mu).
	stored bool
}

func (r *received) addAdded(n int) {
	r.mu.Lock()
	r.added += n
	r.mu.Unlock()
}

// unitDone notes one of r's units committed, and reports whether it was
// the last.
func (r *received) unitDone() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.units--
	return r.units == 0
}
