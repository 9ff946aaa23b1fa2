package sim

// A process and the durable's record: deliveries taken on it, the record
// read again and claimed, saved, and what letting go costs.

import (
	"context"

	"errors"
	"github.com/mailroom/tailer/publish/subscriber"
	"slices"

	"github.com/mailroom/tailer/publish/subscriber/protocol"
)

// watchPin stands by once the server pins another or none while this one
// holds messages, seen twice a second apart.
func (p *proc) watchPin() {
	if len(p.held) == 0 || p.pin == 0 {
		p.missed = 0
		return
	}
	p.w.dur.expire(p.now())
	if p.w.dur.pin == p.pin {
		p.missed = 0
		return
	}
	if p.missed++; p.missed == 2 {
		p.standBy("the pin is lost")
	}
}

// saverTick reads the ack floor and saves the record if it changed.
func (p *proc) saverTick() {
	if f := p.w.dur.floor; f > p.rec.Floor {
		p.rec.Prune(f)
		p.dirty = true
	}
	if err := p.save(); errors.Is(err, subscriber.ErrTakenOver) && len(p.held) > 0 {
		p.standBy("taken over (a save refused)")
	}
}

// save writes the record if it changed (Subscriber.save, saveOver).
func (p *proc) save() error {
	if !p.dirty || p.takenOver {
		if p.takenOver {
			return subscriber.ErrTakenOver
		}
		return nil
	}
	r, rev, saving := p.rec.Clone(), p.rev, p.doneUnsaved
	p.dirty = false
	kv, ctx := p.kv(), context.Background()
	newRev, err := kv.Save(ctx, &r, rev)
	if errors.Is(err, subscriber.ErrTakenOver) && p.pin != 0 && p.w.dur.pin == p.pin {
		var cur protocol.Progress
		if cur, rev, err = kv.Load(ctx); err == nil {
			theirs := p.ofThisStream(cur)
			p.rec.Absorb(&theirs)
			newRev, err = kv.Save(ctx, &p.rec, rev)
		}
	}
	switch {
	case errors.Is(err, subscriber.ErrTakenOver):
		if len(p.held) > 0 {
			p.takenOver = true
		}
		return err
	case err != nil:
		p.dirty = true
		return err
	}
	p.rev = newRev
	p.doneUnsaved -= saving
	p.saved()
	return nil
}

// saved notes the record in the bucket: the batches it says are done
// are no longer unsaved.
func (p *proc) saved() {
	for k := range p.unsaved {
		if m := p.rec.Messages[k.seq]; k.inc != p.w.stream.inc || m != nil && m.Done.Has(k.line) || k.seq <= p.rec.Floor {
			delete(p.unsaved, k)
		}
	}
}

// letGo checks what letting go of its batches costs: a sender's line in
// hand (inHand) and the batches it wrote that the bucket's record does
// not say are done, each written again by the next to deliver, at most
// MaxDoneUnsaved and the line in hand.
func (p *proc) letGo(inHand bool) {
	n := len(p.unsaved)
	if inHand {
		n++
	}
	if !p.cfg().inbox && n > protocol.MaxDoneUnsaved+1 {
		p.w.fail("p%d let go of %d batches its sender had or wrote unrecorded (bound %d): %v", p.id, n, protocol.MaxDoneUnsaved+1, p.unsaved)
	}
	p.unsaved = nil
}

// ofThisStream is r, a record another wrote, held against the stream
// (Subscriber.ofThisStream): of another stream, or naming no message,
// it is dropped.
func (p *proc) ofThisStream(r protocol.Progress) protocol.Progress {
	if r.Last.Seq == 0 && r.Floor == 0 {
		return r
	}
	if protocol.CheckRecord(p.w.atLast(r.Last), false, p.cfg().fromStart, p.cfg().inbox) == protocol.DropRecord {
		p.w.logf("p%d drops the record read back (last %d, floor %d)", p.id, r.Last.Seq, r.Floor)
		return protocol.Progress{}
	}
	return r
}

// take takes a delivered message (Subscriber.take).
func (p *proc) take(d *delivery) {
	if !p.refresh(d) {
		return
	}
	m := d.m
	p.lastDelivery = p.now()
	if p.rec.Saw(m.seq, m.mark) {
		p.dirty = true
	}
	rec := p.rec.MessageAt(m.seq, m.mark, len(m.lines))
	batches := make([]protocol.PlanBatch, len(m.lines))
	for i, line := range m.lines {
		batches[i] = protocol.PlanBatch{Done: rec.Done.Has(i), Attempts: rec.Attempts[i], Tokens: len(line)}
	}
	held := slices.ContainsFunc(p.held, func(h *heldMsg) bool { return h.rec == rec && !h.acking })
	fates, ack := protocol.Plan(protocol.Delivery{Seq: m.seq, Floor: p.rec.Floor, Acked: rec.Acked, Held: held, Batches: batches},
		protocol.Rules{MaxDeliveries: p.cfg().maxDeliveries, DeadLetters: true})
	if ack {
		p.w.ack(p, m.seq)
		return
	}
	if fates == nil {
		return
	}
	h := &heldMsg{m: m, inc: p.w.stream.inc, rec: rec}
	p.held = append(p.held, h)
	p.dirty = true
	var dead []*unit
	for i, f := range fates {
		switch f {
		case protocol.SetAside:
			h.pending++
			dead = append(dead, &unit{h: h, line: i})
		case protocol.NothingForSink:
			rec.Done.Add(i)
		case protocol.Hand:
			h.pending++
			p.toHand = append(p.toHand, &unit{h: h, line: i})
		}
	}
	for _, u := range dead {
		p.w.deadLetter(u.key(), rec.Attempts[u.line])
		p.done(u)
	}
	if h.pending == 0 {
		p.finish(h)
	}
}

// refresh reads the record again when another may have written it, and
// claims what it decides on (Subscriber.refresh); false: the delivery
// waits on the bucket, or this process no longer delivers.
func (p *proc) refresh(d *delivery) bool {
	if !d.stale {
		d.stale = protocol.MustReread(d.pin != p.pin, len(p.held) > 0, p.now()-p.lastDelivery)
		p.pin = d.pin
	}
	if !d.stale {
		return true
	}
	kv, ctx := p.kv(), context.Background()
	for {
		cur, rev, err := kv.Load(ctx)
		if err != nil {
			p.taking = d
			return false
		}
		holding, mine := len(p.held) > 0, rev == p.rev
		if !mine {
			cur = p.ofThisStream(cur)
		}
		var r protocol.Progress
		decided := protocol.AfterReread(holding, mine)
		switch decided {
		case protocol.TakenOver:
			p.w.dur.nak(d.m.seq, p.now())
			p.standBy("taken over (the record read again)")
			return false
		case protocol.KeepOwn:
			r = p.rec.Clone()
		case protocol.Merge:
			r = cur
			r.Absorb(&p.rec)
		}
		newRev, err := kv.Save(ctx, &r, rev)
		if errors.Is(err, subscriber.ErrTakenOver) {
			continue
		}
		if err != nil {
			p.taking = d
			return false
		}
		p.rev = newRev
		if decided == protocol.Merge {
			p.rec = r
		}
		p.saved()
		if !holding {
			p.dirty, p.doneUnsaved = false, 0
		}
		return true
	}
}
