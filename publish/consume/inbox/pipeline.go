package inbox

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/publish/consume"
)

// A transaction of the subscriber's (a unit) stores a group of the small
// messages at hand, or a part of a large one. Up to unitsAtOnce run side by
// side (River's insert alone, one transaction at a time, went at about
// three quarters of its pace four at a time, issue 47), and they commit in
// the order they were cut: the last message the database holds a token of
// is then one before which every message is stored, which is where a lost
// consumer is made again (Position), and a process killed between two
// commits leaves nothing behind it unstored.
type unit struct {
	parts []part
	// prev is closed once the unit cut before this one committed (nil for
	// the first); committed once this one did.
	prev      <-chan struct{}
	committed chan struct{}
}

// part is tokens of one message to store in a unit.
type part struct {
	r *received
	b *consume.Decoded
}

// unitsAtOnce bounds the units in flight.
const unitsAtOnce = 4

// pipeline runs the units of a consume, in order of commit.
type pipeline struct {
	c     *Consumer
	slots chan struct{}
	wg    sync.WaitGroup
	last  <-chan struct{}

	mu sync.Mutex
	// inflight are the messages stored and not yet acknowledged, by
	// stream sequence: one delivered again meanwhile (its ack wait ran
	// out) is acknowledged with it, not stored twice at once.
	inflight map[uint64]*received
}

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
	u := &unit{parts: parts, prev: p.last, committed: make(chan struct{})}
	p.last = u.committed
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer func() { <-p.slots }()
		if p.run(ctx, u) {
			p.done(ctx, u)
		}
	}()
}

// run stores u's parts in a transaction and commits it after the unit
// before, trying again while the database cannot take it; false when ctx
// ended first.
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
			close(u.committed)
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

// store stores u's parts in one transaction, committed once the unit
// before committed; it returns how many tokens each part added.
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
		if u.prev != nil {
			select {
			case <-u.prev:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
	return added, err
}

// done acknowledges the messages whose last unit u was, each ack's answer
// awaited side by side.
func (p *pipeline) done(ctx context.Context, u *unit) {
	var wg sync.WaitGroup
	for _, pt := range u.parts {
		if !pt.r.unitDone() {
			continue
		}
		p.mu.Lock()
		delete(p.inflight, pt.r.m.Seq)
		again := pt.r.again
		p.mu.Unlock()
		wg.Add(1)
		go func() { defer wg.Done(); p.c.acknowledge(ctx, pt.r, again) }()
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
	// it was in flight.
	units int
	added int
	again []jetstream.Msg
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
