package sim

// A process and its sink: units handed, done, their messages acknowledged,
// a reader's end settled.

import (
	"errors"
	"fmt"
	"github.com/mailroom/tailer/publish/subscriber"
	"slices"
	"time"

	"github.com/mailroom/tailer/publish/subscriber/protocol"
)

// handNext gives the sink what it can take: a sender one line at a
// time, the record saved first while a batch done is unsaved; an inbox
// all of them in one transaction.
func (p *proc) handNext() {
	if p.cfg().inbox {
		if p.committing == nil && len(p.toHand) > 0 {
			p.committing, p.toHand = p.toHand, nil
			p.commitAt = p.now() + p.cfg().lineTime
			for _, u := range p.committing {
				p.w.handed(u.key(), p)
			}
		}
		return
	}
	for len(p.toHand) > 0 && p.inHand == nil && !p.senderDown {
		if len(p.h.Step(protocol.NextUnit{})) > 0 {
			if err := p.save(); errors.Is(err, subscriber.ErrTakenOver) {
				p.standBy("taken over (a save before the next line)")
				return
			} else if err != nil {
				return
			}
		}
		u := p.toHand[0]
		p.toHand = p.toHand[1:]
		p.inHand, p.startedAt = u, p.now()
		u.out = &protocol.Handout{Unit: u, Lines: []string{fmt.Sprint(u.key())}, Size: 1}
		p.book.Step(protocol.Handing{Outs: []*protocol.Handout{u.out}, Reports: true})
		if !p.lineKept {
			p.moved = p.now()
		}
		p.lineKept = false
		p.w.handed(u.key(), p)
	}
}

// sink moves the sink on: a line finished, a transaction committed, a
// sender started again.
func (p *proc) sink() {
	now := p.now()
	if p.senderDown && now >= p.restartAt {
		p.senderDown, p.moved, p.lineKept = false, now, false
		p.book.Step(protocol.NewReader{At: instant(now)})
		p.w.logf("p%d's sender started again", p.id)
	}
	if u := p.inHand; u != nil && now >= p.lineDone() {
		p.inHand = nil
		p.progressed = true
		p.moved = now
		p.w.write(u.key(), p, u.h.m.lines[u.line])
		// The sender reports the line it finished (Lines.ReadReports).
		p.doneOuts(p.book.Step(protocol.ReportedLine{Line: u.out.Lines[0]}))
	}
	if us := p.committing; us != nil && now >= p.commitAt {
		p.committing = nil
		for _, u := range us {
			p.w.write(u.key(), p, u.h.m.lines[u.line])
		}
		p.done(us...)
	}
}

// doneOuts marks done the units the book says are (Lines.finish).
func (p *proc) doneOuts(cmds []protocol.ReaderToDo) {
	for _, c := range cmds {
		if d, ok := c.(protocol.OutsDone); ok {
			for _, h := range d.Outs {
				p.done(h.Unit.(*unit))
			}
		}
	}
}

// done marks units done and acknowledges the messages then complete.
func (p *proc) done(units ...*unit) {
	var batches []protocol.HeldBatch
	for _, u := range units {
		if u.done {
			continue
		}
		u.done = true
		batches = append(batches, protocol.HeldBatch{Held: u.h.Held, Line: u.line})
	}
	for _, c := range p.h.Step(protocol.Done{Batches: batches}) {
		if f, ok := c.(protocol.Finish); ok {
			p.finish(f.Msgs...)
		}
	}
}

// finish acknowledges messages all of whose batches are done, once the
// record is saved (the machine's Complete talk; a save refused:
// acknowledged all the same; one that failed: their acks wait).
func (p *proc) finish(held ...*protocol.Held) {
	if len(held) == 0 {
		return
	}
	end, _ := p.talk(protocol.Complete{Msgs: held})
	switch end.Outcome {
	case protocol.SaveFailed:
		p.acking = append(p.acking, end.Acks...)
		return
	case protocol.Acking:
	default:
		return
	}
	for _, h := range end.Acks {
		hm := heldOf(h)
		if d := p.cfg().ackDelay; d > 0 {
			// Held until the server answers, as the subscriber's Held.Acking.
			hm.landsAt = p.now() + d
			p.inFlight = append(p.inFlight, hm)
			continue
		}
		p.acked(hm)
	}
}

// acked is h's ack answered by the server.
func (p *proc) acked(h *heldMsg) {
	if h.inc == p.w.stream.inc {
		p.w.ack(p, h.m.seq)
	}
	p.h.Step(protocol.Acked{Held: h.Held, OK: true})
}

// landAcks lands the acks on their way that reach the server by now.
func (p *proc) landAcks() {
	p.inFlight = slices.DeleteFunc(p.inFlight, func(h *heldMsg) bool {
		if h.landsAt > p.now() {
			return false
		}
		p.acked(h)
		return true
	})
}

// settle lets go of what the process held as its reader ended
// (Subscriber.ReaderEnded, Lines.settle): the batch a failure counts against,
// the messages handed back after the record is saved.
func (p *proc) settle(failed, standBy bool) {
	// Its pipe empty: the sender took the line it held.
	st := p.book.Step(protocol.ReaderEnds{End: protocol.ReaderEnd{Failed: failed, Reports: true, Pipe: true}})[0].(protocol.Settled)
	var blame *protocol.HeldBatch
	if st.Blamed != nil {
		u := st.Blamed.Unit.(*unit)
		blame = &protocol.HeldBatch{Held: u.h.Held, Line: u.line}
	}
	inHand := p.inHand != nil
	p.inHand, p.toHand, p.committing, p.taking, p.acking = nil, nil, nil, nil, nil
	back, _ := p.talk(protocol.HandBack{Blame: blame, StandBy: standBy})
	p.letGo(inHand)
	for _, h := range back.Naks {
		p.w.logf("p%d naks seq %d", p.id, h.Seq)
		p.w.dur.nak(h.Seq, p.now())
	}
	p.epoch++
}

// lineDone is when the sender finishes the line in hand.
func (p *proc) lineDone() time.Duration {
	return max(p.startedAt+p.cfg().lineTime, p.stuckUntil)
}

// lookForStall looks at the sender as Lines.Stalled does, through the
// core's Stall, and holds what it says to the world's view both ways: a
// stall said only when the sender held a line and moved not for the
// stall timeout; said within the timeout and 10 s (two looks of at most
// 5 s, as StallLookEvery promises), counted from the sender's last move
// or the process's waking, whichever is later.
func (p *proc) lookForStall() {
	now, d := p.now(), p.cfg().stallTimeout
	said := p.book.Step(protocol.StallLook{Now: instant(now), Timeout: d})[0].(protocol.StallIs).Stalled
	still := now - p.moved
	if said && (p.inHand == nil || still <= d) {
		p.w.fail("p%d says its sender stalled, which moved %s ago (--stall-timeout %s; a line in hand: %v)", p.id, still, d, p.inHand != nil)
	}
	bound := d + 10*time.Second + time.Millisecond
	if !said && p.inHand != nil && now-max(p.moved, p.frozenUntil, p.awake) > bound {
		p.w.fail("p%d does not say its sender stalled, which moved %s ago (--stall-timeout %s, bound %s)", p.id, still, d, bound)
	}
}

// instant is the world's time d as a time.Time.
func instant(d time.Duration) time.Time { return time.Unix(0, 0).Add(d) }
