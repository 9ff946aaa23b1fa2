package sim

// A process and the durable's record: deliveries taken on it, the record
// read again and claimed, saved, and what letting go costs.

import (
	"context"
	"strconv"

	"github.com/mailroom/tailer/publish/wire"

	"github.com/nats-io/nats.go"

	"errors"
	"github.com/mailroom/tailer/publish/subscriber"

	"github.com/mailroom/tailer/publish/subscriber/protocol"
)

// watchPin stands by once the server pins another or none while this one
// holds messages, as the core judges the pins it is shown a second apart.
func (p *proc) watchPin() {
	if _, lost := p.withPin(protocol.PinWatchDue{}).(protocol.PinLost); lost {
		p.standBy("the pin is lost")
	}
}

// withPin steps the machine with e, and again with the pin the durable's
// model gives when it asks for it (Subscriber.withPin). It returns the
// machine's last answer (nil: none).
func (p *proc) withPin(e protocol.Found) protocol.ToDo {
	cmds := p.h.Step(e)
	if len(cmds) == 0 {
		return nil
	}
	look, ok := cmds[0].(protocol.LookAtPin)
	if !ok {
		return cmds[0]
	}
	p.w.dur.expire(p.now())
	if cmds = p.h.Step(protocol.PinLooked{For: look.For, Pinned: pinName(p.w.dur.pin)}); len(cmds) == 0 {
		return nil
	}
	return cmds[0]
}

// saverTick reads the ack floor and saves the record if it changed
// (Subscriber.saver).
func (p *proc) saverTick() {
	if end, _ := p.talk(protocol.SaveDue{Floor: p.w.dur.floor}); end.StandBy {
		p.standBy("taken over (a save refused)")
	}
}

// save writes the record if it changed (Subscriber.save): the machine's
// save talk, carried out against the bucket's model.
func (p *proc) save() error {
	switch end, err := p.talk(protocol.SaveDue{}); end.Outcome {
	case protocol.SaveRefused:
		return subscriber.ErrTakenOver
	case protocol.SaveFailed:
		return err
	}
	return nil
}

// talk steps the machine with first and carries out its commands, each
// answered by stepping it again, until the talk ends
// (Subscriber.talk): the reads and writes through the process's own
// KVProgress on the bucket's model, the check against the stream's model,
// the pin the durable's model gives; each write that lands is noted
// (saved). It returns how the talk ended and the error of the IO that
// ended it.
func (p *proc) talk(first protocol.Found) (protocol.TalkEnded, error) {
	kv, ctx := p.kv(), context.Background()
	var ioErr error
	cmds := p.h.Step(first)
	for len(cmds) > 0 {
		var ev protocol.Found
		switch c := cmds[0].(type) {
		case protocol.TalkEnded:
			return c, ioErr
		case protocol.Load:
			r, rev, err := kv.Load(ctx)
			ev, ioErr = protocol.Loaded{Record: r, Rev: rev}, err
		case protocol.Check:
			ev = protocol.Checked{Record: p.ofThisStream(c.Record)}
		case protocol.Write:
			rev, err := kv.Save(ctx, &c.Record, c.Rev)
			ev, ioErr = protocol.Wrote{Rev: rev}, err
			if errors.Is(err, subscriber.ErrTakenOver) {
				ev, ioErr = protocol.WriteRefused{}, nil
			}
		case protocol.AskPin:
			p.w.dur.expire(p.now())
			ev = protocol.PinIs{Pinned: pinName(p.w.dur.pin)}
		}
		if ioErr != nil {
			ev = protocol.Unanswered{}
		}
		cmds = append(cmds[1:], p.h.Step(ev)...)
		if _, ok := ev.(protocol.Wrote); ok {
			p.saved()
		}
	}
	p.w.fail("p%d: the record's talk stopped without an end", p.id)
	return protocol.TalkEnded{}, nil
}

// saved notes the record in the bucket: the batches it says are done
// are no longer unsaved.
func (p *proc) saved() {
	// Blamed at the hand back, the failures are in what was saved.
	p.failing = nil
	for k := range p.unsaved {
		if m := p.h.Record.Messages[k.seq]; k.inc != p.w.stream.inc || m != nil && m.Done.Has(k.line) || k.seq <= p.h.Record.Floor {
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
	hdr := nats.Header{}
	// A dead letter names no predecessor (DeadLetter drops HeaderPrev):
	// a resend follows no chain.
	chained := !p.cfg().resend
	if chained {
		hdr.Set(wire.HeaderPrev, m.prev.Mark)
	}
	hdr.Set(wire.HeaderPrevSeq, strconv.FormatUint(m.prev.Seq, 10))
	newest, known := p.h.Record.Chain.Subjects["MAILROOM.batch"]
	p.w.given[msgKey{p.w.stream.inc, m.seq}] = true
	f := p.h.Step(protocol.Arrived{Seq: m.seq, Mark: m.mark, Subject: "MAILROOM.batch", Header: hdr, Again: d.again})[0].(protocol.Follows)
	p.w.gap(p, m, f.Gap)
	if chained && known && !d.again && m.seq > newest.Seq {
		p.w.gapDue(p, m, f.Gap)
	}
	tokens := make([]int, len(m.lines))
	for i, line := range m.lines {
		tokens[i] = len(line)
	}
	hm := &heldMsg{m: m, inc: p.w.stream.inc}
	offer := protocol.Offer{Seq: m.seq, Mark: m.mark, Tokens: tokens, Rules: protocol.Rules{MaxDeliveries: p.cfg().maxDeliveries, DeadLetters: true}, Msg: hm}
	t := p.h.Step(offer)[0].(protocol.Taken)
	if t.Ack {
		p.w.ack(p, m.seq)
		return
	}
	if t.Held == nil {
		return
	}
	hm.Held = t.Held
	var dead []*unit
	for i, f := range t.Fates {
		switch f {
		case protocol.SetAside:
			dead = append(dead, &unit{h: hm, line: i})
		case protocol.Hand:
			u := &unit{h: hm, line: i}
			p.w.handedAgain(p, u.key())
			p.toHand = append(p.toHand, u)
		}
	}
	for _, u := range dead {
		p.w.deadLetter(u.key(), t.Attempts[u.line])
		p.done(u)
	}
	if hm.Pending == 0 {
		p.finish(hm.Held)
	}
}

// refresh reads the record again when another may have written it, and
// claims what it decides on (Subscriber.refresh): the machine's claim
// talk. False: the delivery waits on the bucket, or this process no
// longer delivers.
func (p *proc) refresh(d *delivery) bool {
	if !d.stale {
		d.stale = len(p.h.Step(protocol.Delivered{Pin: pinName(d.pin), Idle: p.now() - p.lastDelivery})) > 0
	}
	if !d.stale {
		return true
	}
	switch end, _ := p.talk(protocol.ClaimRecord{}); end.Outcome {
	case protocol.GiveBack:
		p.w.dur.nak(d.m.seq, p.now())
		p.standBy("taken over (the record read again)")
		return false
	case protocol.Waits:
		p.taking = d
		return false
	}
	return true
}
