package sim

import (
	"fmt"
	"slices"
	"time"

	"github.com/mailroom/tailer/publish/subscriber/protocol"
	"github.com/mailroom/tailer/publish/wire"
)

// config is a schedule's settings: the sink, the durable's and the
// subscribers'.
type config struct {
	// inbox: the sink keeps each token once and a record of its own;
	// else a sender that reports each line it finished.
	inbox bool
	// lineTime is how long the sender takes a line (the inbox a
	// transaction).
	lineTime                  time.Duration
	ttl, ackWait, ackWaitFlag time.Duration
	maxDeliveries             int
	fromStart                 bool
	// stallTimeout is the sender's --stall-timeout.
	stallTimeout time.Duration
	// resend: the processes are tailer dead-letters resend, each ending
	// once drained, the stream the dead letters; an ack reaches the
	// server ackDelay after it is sent.
	resend   bool
	ackDelay time.Duration
}

// msgKey names a message of one incarnation of the stream.
type msgKey struct {
	inc int
	seq uint64
}

// hand is a batch handed to a sink by a process in one of its epochs.
type hand struct{ proc, epoch int }

// world is the simulated system and what the invariants need of its
// history.
type world struct {
	cfg    config
	now    time.Duration
	stream *streamModel
	dur    *durableModel
	kv     *kvModel
	procs  []*proc
	tokens int
	pins   int
	trace  []string

	// written counts each token written by a sender, or kept by the
	// inbox; hands are the hands of each batch; charged, the batches
	// written again on account of each let-go (process, epoch).
	written map[string]int
	hands   map[batchKey][]hand
	charged map[hand]map[batchKey]bool
	// writers are the processes, in their epochs, whose sinks wrote
	// each batch.
	writers map[batchKey][]hand
	// frozeHolding are the messages each process held as it was frozen.
	frozeHolding map[hand]map[msgKey]bool
	// dead are the batches set aside; failures counts the senders that
	// failed with each in hand.
	dead     map[batchKey]bool
	failures map[batchKey]int
	// published are the messages published, whatever became of them;
	// given those the durable gave a process.
	published map[msgKey]*smsg
	given     map[msgKey]bool
	// lost counts the failures a process counted and died with before a
	// save of its landed: the record never had them.
	lost map[batchKey]int
	// rebuilt: the stream was made again (a refusal has a cause).
	rebuilt bool
	// newFrom is, by incarnation of the stream, the first message a
	// consumer made anew, without --from-start, delivers: those before
	// it are not the durable's.
	newFrom map[int]uint64
	// lastNew is when a batch was first written, set aside or a message
	// acknowledged; lastFault when a fault last happened.
	lastNew, lastFault time.Duration
	// stopAt is when the pinned process last stopped cleanly, and
	// stopPins the pins given by then: a standby is owed the pin at once.
	stopAt   time.Duration
	stopPins int
	// inboxAt is the message of the highest stream sequence a token of
	// which the inbox stored, whatever the stream's incarnation
	// (inbox.Inbox.Position).
	inboxAt wire.Anchor
	// inboxHolds are the messages a token of which the inbox stored
	// (inbox.Inbox.Holds), by place and mark.
	inboxHolds map[wire.Anchor]bool
	// offers is the durable when it has had a message to give since
	// offersSince (nil: it has none).
	offers      *durableModel
	offersSince time.Duration
	violation   string
}

func newWorld(cfg config) *world {
	w := &world{cfg: cfg, stream: &streamModel{inc: 1, msgs: map[uint64]*smsg{}},
		written: map[string]int{}, inboxHolds: map[wire.Anchor]bool{}, hands: map[batchKey][]hand{}, charged: map[hand]map[batchKey]bool{}, frozeHolding: map[hand]map[msgKey]bool{}, writers: map[batchKey][]hand{},
		dead: map[batchKey]bool{}, failures: map[batchKey]int{}, lost: map[batchKey]int{}, published: map[msgKey]*smsg{}, given: map[msgKey]bool{}, newFrom: map[int]uint64{}}
	w.kv = &kvModel{now: func() time.Duration { return w.now }}
	w.stopAt, w.stopPins = never, -1
	return w
}

func (w *world) logf(format string, args ...any) {
	w.trace = append(w.trace, fmt.Sprintf("%8.1fs ", w.now.Seconds())+fmt.Sprintf(format, args...))
}

func (w *world) fail(format string, args ...any) {
	if w.violation == "" {
		w.violation = fmt.Sprintf("at %.1fs: ", w.now.Seconds()) + fmt.Sprintf(format, args...)
		w.logf("VIOLATION: %s", w.violation)
	}
}

// atLast is what the stream holds where the record saw last.
func (w *world) atLast(a wire.Anchor) protocol.HeldAtLast {
	if a.Seq == 0 {
		return protocol.Unanchored
	}
	m := w.stream.msgs[a.Seq]
	switch {
	case m != nil && m.mark == a.Mark:
		return protocol.SameMessage
	case m == nil && w.stream.last > a.Seq:
		return protocol.Removed
	}
	return protocol.OtherMessage
}

func (w *world) publish(batches, size int) {
	lines := make([][]string, batches)
	for i := range lines {
		for range size {
			w.tokens++
			lines[i] = append(lines[i], fmt.Sprintf("t%d", w.tokens))
		}
	}
	m := w.stream.append(lines)
	w.published[msgKey{w.stream.inc, m.seq}] = m
	w.logf("published seq %d: %d batches", m.seq, batches)
}

func (w *world) handed(k batchKey, p *proc) {
	w.hands[k] = append(w.hands[k], hand{p.id, p.epoch})
}

// write is a batch written by p's sink: into a pipe, written again only
// if a process that handed it let go of it since (and at most
// MaxDoneUnsaved and the line in hand for each let-go); into an inbox,
// each token kept once.
func (w *world) write(k batchKey, p *proc, tokens []string) {
	w.logf("p%d writes %v", p.id, k)
	if p.unsaved == nil {
		p.unsaved = map[batchKey]bool{}
	}
	p.unsaved[k] = true
	for _, t := range tokens {
		if w.cfg.inbox && w.written[t] > 0 {
			continue
		}
		w.written[t]++
	}
	if m := w.published[msgKey{k.inc, k.seq}]; w.cfg.inbox && m != nil {
		at := wire.Anchor{Seq: k.seq, Mark: m.mark}
		w.inboxHolds[at] = true
		if k.seq >= w.inboxAt.Seq {
			w.inboxAt = at
		}
	}
	by := hand{p.id, p.epoch}
	again := slices.Contains(w.writers[k], by)
	w.writers[k] = append(w.writers[k], by)
	switch {
	case w.written[tokens[0]] == 1:
		w.lastNew = w.now
		return
	case again:
		w.fail("p%d wrote batch %v twice without letting go of it", p.id, k)
		return
	}
	for _, h := range w.hands[k] {
		if w.procs[h.proc].epoch > h.epoch {
			w.charge(h, k)
			return
		}
	}
	// A process frozen with the message in hand, woken, may hand one
	// more of its batches before it learns another delivers it now (its
	// save before the line lands ahead of the other's claim).
	for h, seqs := range w.frozeHolding {
		if seqs[msgKey{k.inc, k.seq}] {
			w.charge(h, k)
			return
		}
	}
	w.fail("batch %v written again (%d times) though no process that held it let go of it", k, w.written[tokens[0]])
}

// charge counts batch k written again on account of let-go h, at most
// MaxDoneUnsaved and the line in hand.
func (w *world) charge(h hand, k batchKey) {
	if w.charged[h] == nil {
		w.charged[h] = map[batchKey]bool{}
	}
	w.charged[h][k] = true
	if n := len(w.charged[h]); n > protocol.MaxDoneUnsaved+1 {
		w.fail("p%d let go of %d batches written again (bound %d): %v", h.proc, n, protocol.MaxDoneUnsaved+1, w.charged[h])
	}
}

// freeze stops p until d from now, noting the messages it holds: those
// it took, and one delivered to it that waits on the bucket to be taken
// (the server counts it p's, kept from redelivery while p waits).
func (w *world) freeze(p *proc, d time.Duration) {
	held := map[msgKey]bool{}
	for _, h := range p.h.Held() {
		held[msgKey{heldOf(h).inc, h.Seq}] = true
	}
	if t := p.taking; t != nil {
		held[msgKey{t.inc, t.m.seq}] = true
	}
	w.frozeHolding[hand{p.id, p.epoch}] = held
	p.frozenUntil, p.epoch = w.now+d, p.epoch+1
	w.lastFault = max(w.lastFault, w.now+d)
	w.logf("p%d frozen for %s", p.id, d)
}

// failed is a sender of p failing with k in hand, as the docs' table
// counts failures: p's record has it from its next save on.
func (w *world) failed(p *proc, k batchKey) {
	w.failures[k]++
	if p.failing == nil {
		p.failing = map[batchKey]int{}
	}
	p.failing[k]++
}

// forgets: p ends with failures its record never saved.
func (w *world) forgets(p *proc) {
	for k, n := range p.failing {
		w.lost[k] += n
	}
}

// handedAgain checks that p hands k to its sender short of
// --max-deliveries: not too late. The failures the record has are the
// world's count but those lost, and those of other processes not saved
// yet (p's own are in its memory).
func (w *world) handedAgain(p *proc, k batchKey) {
	if w.cfg.maxDeliveries == 0 || w.cfg.resend {
		return
	}
	recorded := w.failures[k] - w.lost[k]
	for _, q := range w.procs {
		if q != p {
			recorded -= q.failing[k]
		}
	}
	if recorded >= w.cfg.maxDeliveries {
		w.fail("p%d hands batch %v to its sender again after %d recorded failures (max deliveries %d): set aside too late", p.id, k, recorded, w.cfg.maxDeliveries)
	}
}

// redelivered is seq delivered again after its ack wait: none that ran
// then holds it, or its in-progress acks would have kept it.
func (w *world) redelivered(seq uint64) {
	for _, p := range w.procs {
		if p.runs() && p.loaded && p.frozenUntil < w.dur.expiredAt && slices.ContainsFunc(p.h.Held(), func(h *protocol.Held) bool { return h.Seq == seq && heldOf(h).inc == w.stream.inc }) {
			w.fail("seq %d redelivered after the ack wait (%s) while p%d holds it", seq, w.dur.ackWait, p.id)
		}
	}
}

// gap judges what the chain said before m, delivered to p, as
// subscriber.Gaps does (the predecessor looked up in the stream, and in
// the inbox when the stream lost it; protocol.OnGap), and holds it not
// too early: messages are said missing only when the one m names before
// it has a batch neither written nor set aside, or, into a pipe, was
// given to a process whose record never said so (unsure). (The last
// given, Given, may be of a stream made again since, under a record that
// could not tell: its sequence bounds nothing.)
func (w *world) gap(p *proc, m *smsg, g *wire.Gap) {
	if g == nil || g.Resynced {
		return
	}
	prev := w.stream.msgs[g.Prev.Seq]
	there := prev != nil && prev.mark == g.Prev.Mark
	stored := !there && w.cfg.inbox && w.inboxHolds[g.Prev]
	switch protocol.OnGap(there, stored, w.cfg.ttl > 0, w.cfg.inbox) {
	case protocol.RemovedFirst:
		w.logf("p%d says messages missing before seq %d (after %v)", p.id, m.seq, g.Given)
		if !w.lacking(g.Prev) && !w.unsure(g.Prev) {
			w.fail("p%d says messages missing before seq %d, though every batch of seq %d, before it, was written or set aside", p.id, m.seq, g.Prev.Seq)
		}
	case protocol.TakenElsewhere:
		w.fail("p%d says seq %d taken by another client of a durable that pins one", p.id, g.Prev.Seq)
	}
}

// gapDue holds the chain not too late: m, given to p for the first time
// past the newest its chain knew on the subject, names before it a
// message the stream lost before the durable gave it to anyone; the gap
// must be said (g, which gap judges). Before the chain knows a subject's
// newest it can say nothing (wire.Chain's seed), nor of a message
// delivered again, nor of one a stream made again numbers below it.
func (w *world) gapDue(p *proc, m *smsg, g *wire.Gap) {
	k := msgKey{w.stream.inc, m.prev.Seq}
	prev := w.published[k]
	if prev == nil || prev.mark != m.prev.Mark || w.given[k] {
		return
	}
	if now := w.stream.msgs[m.prev.Seq]; now != nil && now.mark == prev.mark {
		return
	}
	if g == nil {
		w.fail("p%d says nothing of seq %d, before seq %d: removed from the stream before the durable gave it to anyone", p.id, m.prev.Seq, m.seq)
	}
}

// unsure reports whether a subscriber that said messages missing before
// the one published at a could not know better: into a pipe, a was
// given to a process, the durable's record does not say it was the
// newest handled (a process killed before its record said so), and the
// stream lost it since. A pipe keeps no record of its own to ask (make
// sim seed 3341109095, everything): the tokens may have reached the
// sender or not, and said missing, a resync publishes them again, which
// --dedup-window drops.
func (w *world) unsure(a wire.Anchor) bool {
	k := msgKey{w.stream.inc, a.Seq}
	if m := w.published[k]; w.cfg.inbox || m == nil || m.mark != a.Mark || !w.given[k] {
		return false
	}
	rec, err := protocol.ParseProgress(w.kv.value)
	return err != nil || rec.Chain.Subjects["MAILROOM.batch"] != a
}

// lacking reports whether the message published at a (of this stream)
// has a batch neither written nor set aside; true when a names none.
func (w *world) lacking(a wire.Anchor) bool {
	m := w.published[msgKey{w.stream.inc, a.Seq}]
	if m == nil || m.mark != a.Mark {
		return true
	}
	for i, line := range m.lines {
		if !w.dead[batchKey{w.stream.inc, a.Seq, i}] && w.written[line[0]] == 0 {
			return true
		}
	}
	return false
}

func (w *world) deadLetter(k batchKey, attempts int) {
	w.logf("dead letter %v after %d attempts", k, attempts)
	if w.failures[k] < w.cfg.maxDeliveries {
		w.fail("batch %v set aside after %d senders failed with it (max deliveries %d)", k, w.failures[k], w.cfg.maxDeliveries)
	}
	if !w.dead[k] {
		w.lastNew = w.now
	}
	w.dead[k] = true
}

// ack is p's ack of seq: each batch of the message is written or set
// aside by then.
func (w *world) ack(p *proc, seq uint64) {
	m := w.stream.msgs[seq]
	if m != nil {
		for i := range m.lines {
			if k := (batchKey{w.stream.inc, seq, i}); !w.dead[k] && w.written[m.lines[i][0]] == 0 {
				w.fail("p%d acknowledged seq %d with batch %d never written", p.id, seq, i)
			}
		}
	}
	w.logf("p%d acks seq %d", p.id, seq)
	if w.dur.acked[seq] || w.dur.floor >= seq {
		return
	}
	w.dur.ack(w.stream, seq)
	w.lastNew = w.now
}

// advance moves the time on by d, stepping every process at each moment
// something of it, or of the server, is due.
func (w *world) advance(d time.Duration) {
	until := w.now + d
	for w.violation == "" {
		w.stepAll()
		w.checkProgress()
		w.checkPins()
		next := until
		if w.dur != nil && !w.dur.gone {
			next = min(next, w.dur.due(w.now))
		}
		if w.parked() {
			next = min(next, w.now+time.Millisecond)
		}
		for _, p := range w.procs {
			next = min(next, p.due())
		}
		if next <= w.now {
			next = w.now + time.Millisecond
		}
		if next > until {
			w.now = until
			w.stepAll()
			w.checkPins()
			return
		}
		w.now = next
	}
}

func (w *world) stepAll() {
	for _, p := range w.procs {
		p.step()
	}
}

// outstanding reports whether the stream holds a batch neither written
// nor set aside.
func (w *world) outstanding() bool {
	for seq, m := range w.stream.msgs {
		if seq < w.newFrom[w.stream.inc] {
			continue
		}
		for i, line := range m.lines {
			if !w.dead[batchKey{w.stream.inc, seq, i}] && w.written[line[0]] == 0 {
				return true
			}
		}
	}
	return false
}

// progressBound is how long the durable may go without a batch written
// first, set aside or a message acknowledged, while a process runs and
// its sink accepts, since the last fault.
func (w *world) progressBound() time.Duration {
	c := w.cfg
	return 2*(c.lineTime+c.ttl+c.ackWait+10*time.Second) + 30*time.Second
}

func (w *world) checkProgress() {
	healthy := false
	for _, p := range w.procs {
		healthy = healthy || p.runs() && !p.senderDown
	}
	if !healthy || !w.outstanding() {
		w.lastNew = max(w.lastNew, w.now)
		return
	}
	if since := w.now - max(w.lastNew, w.lastFault); since > w.progressBound() {
		w.fail("nothing written, set aside or acknowledged for %s with a process running and its sink accepting (livelock)", since)
	}
}
