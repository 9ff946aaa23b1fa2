package sim

import (
	"maps"
	"slices"

	"github.com/mailroom/tailer/publish/subscriber/protocol"
)

// untilDrained ends a resend once protocol.Drained says it may
// (Subscriber.untilDrained), as it sees itself and its consumer.
func (p *proc) untilDrained() {
	if !p.loaded || !p.runs() {
		return
	}
	d := p.w.dur
	pending := 0
	for seq := range p.w.stream.msgs {
		if seq >= d.next {
			pending++
		}
	}
	drain := protocol.Drain{
		Handling:   p.taking != nil || len(p.toHand) > 0 || p.reloading,
		InDoubt:    p.inHand != nil,
		Acking:     len(p.inFlight) > 0 || len(p.acking) > 0,
		Pending:    pending,
		AckPending: len(d.pend),
	}
	if len(p.h.Step(protocol.DrainLook{Drain: drain})) > 0 {
		p.exitDrained()
	}
}

// exitDrained ends the resend: its acks still on their way are cut
// short, its reader ends (the record saved: the sender's Run, then
// ReaderEnded), it lets go of its pin (Unpin), and it removes the dead
// letters at or below its consumer's ack floor (subscriber.RemoveResent).
// A resend that ends drained with no other running leaves none listed:
// the next would send them again, or none would. Without the save, the
// next resend's chain missed the last message handed (make sim, seed
// 1058058775: a gap said of a dead letter written and removed).
func (p *proc) exitDrained() {
	w := p.w
	w.logf("p%d drained, ends (acks cut short: %d)", p.id, len(p.inFlight))
	if p.inHand != nil {
		w.fail("p%d ended drained with batch %v in its sender's hand", p.id, p.inHand.key())
	}
	p.inFlight = nil
	held := p.pinnedHere()
	p.settle(false, false)
	p.unpinAsItStops(held)
	for _, seq := range slices.Sorted(maps.Keys(w.stream.msgs)) {
		m := w.stream.msgs[seq]
		if seq > w.dur.floor {
			continue
		}
		if w.written[m.lines[0][0]] == 0 {
			w.fail("p%d removed dead letter %d, never written", p.id, seq)
		}
		delete(w.stream.msgs, seq)
		w.logf("p%d removes dead letter %d", p.id, seq)
	}
	*p = proc{w: w, id: p.id, epoch: p.epoch, exited: true}
	others := slices.ContainsFunc(w.procs, func(q *proc) bool { return q != p && q.alive && !q.exited })
	if left := slices.Sorted(maps.Keys(w.stream.msgs)); !others && len(left) > 0 {
		w.fail("p%d, the last resend, ended drained leaving dead letters %v listed", p.id, left)
	}
}
