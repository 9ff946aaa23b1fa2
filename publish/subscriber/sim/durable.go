package sim

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/mailroom/tailer/publish/wire"
)

// batchKey names one batch of one message of one incarnation of the
// stream.
type batchKey struct {
	inc  int
	seq  uint64
	line int
}

func (k batchKey) String() string { return fmt.Sprintf("%d/%d/%d", k.inc, k.seq, k.line) }

// smsg is a message on the stream: a batch of lines of tokens.
type smsg struct {
	seq   uint64
	mark  string
	lines [][]string
	// prev is the message published before it on the subject, as its
	// chain headers name it (wire.HeaderPrev).
	prev wire.Anchor
}

// streamModel is the stream: its messages by sequence. A purge or a
// delete keeps the last sequence; made again, it starts over at 1.
type streamModel struct {
	inc  int
	msgs map[uint64]*smsg
	last uint64
}

func (s *streamModel) append(lines [][]string) *smsg {
	prev := wire.Anchor{Mark: wire.ChainStart}
	if s.last > 0 {
		prev = wire.Anchor{Seq: s.last, Mark: fmt.Sprintf("m%d.%d", s.inc, s.last)}
	}
	s.last++
	m := &smsg{seq: s.last, mark: fmt.Sprintf("m%d.%d", s.inc, s.last), lines: lines, prev: prev}
	s.msgs[s.last] = m
	return m
}

// first is the stream's first message's sequence (last+1 when empty).
func (s *streamModel) first() uint64 {
	f := s.last + 1
	for seq := range s.msgs {
		f = min(f, seq)
	}
	return f
}

// pending is a message delivered and not acknowledged.
type pending struct {
	deadline time.Duration
	naked    bool
	// queued orders the naks of one moment (the redelivery queue).
	queued int
}

// durableModel is the durable pull consumer with a pinned priority group:
// it pins the first client that pulls when none is pinned, refuses the
// pulls of others, and lets go of a pin that asked for nothing within
// the pinned TTL, or by hand (unpin); it redelivers a message not
// acknowledged within the ack wait (reset by in-progress, ended by a
// nak), at most maxAckPending at once.
type durableModel struct {
	gone          bool
	ackWait, ttl  time.Duration
	maxAckPending int
	next          uint64
	pend          map[uint64]*pending
	deliveries    map[uint64]int
	acked         map[uint64]bool
	floor         uint64
	// pins counts the pins given on the server, by every consumer: a
	// pin id is unique (a nuid).
	pin      int
	pins     *int
	lastPull time.Duration
	// freedAt is when the pin was let go last (never: since one was
	// given, or none ever was); released, the pins let go since the
	// world last looked (world.checkPins).
	freedAt  time.Duration
	released []release
	// expired: the last message redelivered was not acknowledged
	// within the ack wait (not naked).
	expired   bool
	expiredAt time.Duration
	naks      int
}

// before reports whether p became due before q: it is redelivered first.
func before(p, q *pending) bool {
	if p.deadline != q.deadline {
		return p.deadline < q.deadline
	}
	return p.queued < q.queued
}

func newDurable(ackWait, ttl time.Duration, from uint64, pins *int) *durableModel {
	return &durableModel{ackWait: ackWait, ttl: ttl, maxAckPending: 2, next: from, floor: from - 1, pins: pins, freedAt: never,
		pend: map[uint64]*pending{}, deliveries: map[uint64]int{}, acked: map[uint64]bool{}}
}

// expire lets go of a pin that asked for nothing within the TTL.
func (d *durableModel) expire(now time.Duration) {
	if d.pin != 0 && now-d.lastPull > d.ttl {
		d.let(release{pin: d.pin, lastAsk: d.lastPull}, d.lastPull+d.ttl)
	}
}

// unpin lets go of the pin by hand (UnpinConsumer): the next client that
// pulls is pinned. It returns the pin let go (0: none).
func (d *durableModel) unpin(now time.Duration) int {
	d.expire(now)
	was := d.pin
	if was != 0 {
		d.let(release{pin: was, lastAsk: d.lastPull, byHand: true}, now)
	}
	return was
}

func (d *durableModel) let(r release, at time.Duration) {
	d.pin, d.freedAt = 0, at
	d.released = append(d.released, r)
}

// freeSince is since when the server pins no client, as it would say at
// now: never while one is.
func (d *durableModel) freeSince(now time.Duration) time.Duration {
	switch {
	case d.pin == 0:
		return d.freedAt
	case now-d.lastPull > d.ttl:
		return d.lastPull + d.ttl
	}
	return never
}

// pinned is the pin the server gives at now (0: none).
func (d *durableModel) pinned(now time.Duration) int {
	if d.freeSince(now) <= now {
		return 0
	}
	return d.pin
}

// pull is a pull request naming pin (0: none): the pin the server gives
// with the message delivered (nil: none, or the pull refused).
func (d *durableModel) pull(s *streamModel, pin int, now time.Duration) (int, *smsg, int) {
	d.expire(now)
	if d.pin != 0 && pin != d.pin {
		return 0, nil, 0
	}
	if d.pin != 0 {
		d.lastPull = now
	}
	maps.DeleteFunc(d.pend, func(seq uint64, _ *pending) bool { return s.msgs[seq] == nil })
	seq, again := d.offer(s, now)
	if again {
		p := d.pend[seq]
		d.expired, d.expiredAt = !p.naked, p.deadline
		return d.deliver(seq, s.msgs[seq], now)
	}
	if len(d.pend) >= d.maxAckPending {
		return d.pin, nil, 0
	}
	d.expired = false
	if seq == 0 {
		d.next = max(d.next, s.last+1)
		return d.pin, nil, 0
	}
	d.next = seq + 1
	return d.deliver(seq, s.msgs[seq], now)
}

// offer is the message a pull would be given at now (0: none), and
// whether it comes again: one due again first (naked, or its ack wait
// run out), in the order they became due (the server's redelivery
// queue); else the next new one while fewer than maxAckPending are
// pending.
func (d *durableModel) offer(s *streamModel, now time.Duration) (seq uint64, again bool) {
	live := 0
	for _, q := range slices.Sorted(maps.Keys(d.pend)) {
		p := d.pend[q]
		if s.msgs[q] == nil {
			continue
		}
		live++
		if (p.naked || p.deadline <= now) && (seq == 0 || before(p, d.pend[seq])) {
			seq = q
		}
	}
	if seq != 0 {
		return seq, true
	}
	if live >= d.maxAckPending {
		return 0, false
	}
	for n := d.next; n <= s.last; n++ {
		if s.msgs[n] != nil {
			return n, false
		}
	}
	return 0, false
}

// deliver gives m to the pull: the server pins the pull's client when
// none is pinned.
func (d *durableModel) deliver(seq uint64, m *smsg, now time.Duration) (int, *smsg, int) {
	if d.pin == 0 {
		*d.pins++
		d.pin, d.lastPull, d.freedAt = *d.pins, now, never
	}
	d.deliveries[seq]++
	d.pend[seq] = &pending{deadline: now + d.ackWait}
	return d.pin, m, d.deliveries[seq]
}

// keepPin is a pull that asks for nothing, naming pin.
func (d *durableModel) keepPin(pin int, now time.Duration) {
	d.expire(now)
	if pin != 0 && pin == d.pin {
		d.lastPull = now
	}
}

func (d *durableModel) inProgress(seq uint64, now time.Duration) {
	if p := d.pend[seq]; p != nil {
		p.deadline = now + d.ackWait
	}
}

func (d *durableModel) nak(seq uint64, now time.Duration) {
	// A message queued already keeps its place.
	if p := d.pend[seq]; p != nil && !p.naked {
		d.naks++
		p.deadline, p.naked, p.queued = now, true, d.naks
	}
}

// ack acknowledges seq, and raises the floor over what is acknowledged
// or gone from the stream.
func (d *durableModel) ack(s *streamModel, seq uint64) {
	delete(d.pend, seq)
	if seq < d.next {
		d.acked[seq] = true
	}
	for d.floor+1 < d.next && (d.acked[d.floor+1] || s.msgs[d.floor+1] == nil && d.pend[d.floor+1] == nil) {
		d.floor++
		delete(d.acked, d.floor)
	}
}

// purged is the stream purged whole: the consumer goes on after it.
func (d *durableModel) purged(last uint64) {
	d.pend = map[uint64]*pending{}
	d.next = max(d.next, last+1)
	d.floor = max(d.floor, last)
}

// due is when something changes at the server without a request: a
// redelivery, a pin let go.
func (d *durableModel) due(now time.Duration) time.Duration {
	next := never
	for _, p := range d.pend {
		if p.deadline > now {
			next = min(next, p.deadline)
		}
	}
	if d.pin != 0 {
		next = min(next, d.lastPull+d.ttl+time.Millisecond)
	}
	return next
}

const never = time.Duration(1<<63 - 1)
