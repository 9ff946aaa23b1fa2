package sim

import (
	"errors"
	"fmt"
	"slices"
	"syscall"
	"time"

	"github.com/mailroom/tailer/publish/subscriber/protocol"
)

// heldMsg is a message delivered and not acknowledged (the subscriber's held).
type heldMsg struct {
	m       *smsg
	inc     int
	rec     *protocol.MessageProgress
	pending int
	acking  bool
	// landsAt is when its ack, on its way, reaches the server.
	landsAt time.Duration
}

// unit is one batch handed to the sink (subscriber.Unit).
type unit struct {
	h    *heldMsg
	line int
	done bool
}

func (u *unit) key() batchKey { return batchKey{u.h.inc, u.h.m.seq, u.line} }

// delivery is a message the server gave, waiting on the record.
type delivery struct {
	m     *smsg
	pin   int
	stale bool
}

// proc is one tailer subscribe process and its sink: it composes the
// decisions of publish/subscriber/protocol as publish/subscriber and
// cmd/internal/subscribe do, and carries them out against the models.
type proc struct {
	w           *world
	id          int
	alive       bool
	frozenUntil time.Duration
	// epoch counts the times this process let go of what it held (killed,
	// frozen, stood by, its sender ended): a batch it handed before may
	// be written again.
	epoch   int
	refused string
	// exited: a resend that ended, drained or giving up on its sender
	// (gaveUp).
	exited, gaveUp bool
	endsInARow     int

	loaded, reloading bool
	kept              protocol.Progress
	rec               protocol.Progress
	rev               uint64
	dirty, takenOver  bool
	doneUnsaved       int
	pin               int
	lastDelivery      time.Duration
	held              []*heldMsg
	toHand            []*unit
	taking            *delivery
	acking            []*heldMsg
	inFlight          []*heldMsg
	missed            int
	// bound is the consumer the process consumes from.
	bound *durableModel
	// unsaved are the batches this process's sender wrote that the
	// record in the bucket does not say are done.
	unsaved map[batchKey]bool

	nextSave, nextProgress, nextKeepPin, nextWatch, nextPull time.Duration

	// A sender: the line in hand since startedAt; down until restartAt.
	inHand               *unit
	startedAt            time.Duration
	senderDown           bool
	restartAt, restartIn time.Duration
	progressed           bool
	// An inbox: the units of the transaction that commits at commitAt.
	committing []*unit
	commitAt   time.Duration
}

func (p *proc) now() time.Duration { return p.w.now }
func (p *proc) cfg() *config       { return &p.w.cfg }

func (p *proc) runs() bool {
	return p.alive && !p.exited && p.refused == "" && p.now() >= p.frozenUntil
}

// start loads the record and holds it against the stream, as Run does
// before it consumes.
func (p *proc) start() {
	cur, rev, err := p.w.kv.get()
	if err != nil {
		return
	}
	p.rec, p.rev, p.dirty, p.doneUnsaved, p.pin = cur, rev, false, 0, 0
	p.lastDelivery = -time.Hour
	if !p.remake(false) {
		return
	}
	p.loaded = true
	now := p.now()
	p.nextSave, p.nextProgress, p.nextKeepPin, p.nextWatch, p.nextPull = now+time.Second, now, now, now+time.Second, now
}

// remake holds the record against the stream (checkRecord) and makes the
// consumer when it is missing: where the record says, or at the stream's
// first message.
func (p *proc) remake(lost bool) bool {
	w := p.w
	missing := w.dur == nil || w.dur.gone
	if p.rec.Last.Seq != 0 || p.rec.Floor != 0 {
		switch protocol.CheckRecord(w.atLast(p.rec.Last), missing, p.cfg().fromStart, p.cfg().inbox) {
		case protocol.RefuseRecord:
			p.refused = fmt.Sprintf("the record's last sequence %d holds another message: --from-start", p.rec.Last.Seq)
			w.logf("p%d refuses: %s", p.id, p.refused)
			return false
		case protocol.DropRecord:
			w.logf("p%d drops the record (last %d)", p.id, p.rec.Last.Seq)
			p.rec, p.dirty = protocol.Progress{}, true
		}
	}
	if missing {
		from, ok := p.makeAt(lost)
		if !ok {
			return false
		}
		w.dur = newDurable(p.cfg().ackWait, p.cfg().ttl, from, &w.pins)
		w.logf("p%d makes the consumer at %d", p.id, from)
	}
	p.bound = w.dur
	return true
}

// makeAt is where the missing consumer is made (Subscriber.consumer,
// fromSink): after the floor, from the stream's first message, or after
// its last (a consumer made anew delivers what comes); refused for one
// the process was bound to (lost) when nothing says where it was.
func (p *proc) makeAt(lost bool) (uint64, bool) {
	w, cfg := p.w, p.cfg()
	switch {
	case protocol.MakeAt(p.rec.Last.Seq != 0, cfg.inbox) == protocol.AfterFloor:
		return p.rec.Floor + 1, true
	case cfg.inbox || cfg.fromStart:
		return w.stream.first(), true
	case lost:
		p.refused = "the consumer is gone and no record says where it was: --from-start"
		w.logf("p%d refuses: %s", p.id, p.refused)
		return 0, false
	}
	w.newFrom[w.stream.inc] = w.stream.last + 1
	return w.stream.last + 1, true
}

// step runs what is due for the process at the world's time.
func (p *proc) step() {
	if !p.runs() {
		return
	}
	if !p.loaded {
		p.start()
		if !p.loaded {
			return
		}
	}
	if p.bound != p.w.dur || p.w.dur.gone {
		p.consumerLost()
		return
	}
	if p.reloading {
		p.reload()
	}
	p.landAcks()
	p.timers()
	p.sink()
	if len(p.acking) > 0 {
		hs := p.acking
		p.acking = nil
		p.finish(hs...)
	}
	if d := p.taking; d != nil {
		// Waiting on the bucket, the message is kept from redelivery
		// (loadProgress's wait, untilSaved).
		p.w.dur.inProgress(d.m.seq, p.now())
		p.taking = nil
		p.take(d)
	}
	p.handNext()
	p.pull()
	if p.cfg().resend {
		p.untilDrained()
	}
}

// blocked: the consume loop waits in handle (a delivery on the record,
// units the sink has not taken, a save before an ack).
func (p *proc) blocked() bool {
	return p.taking != nil || len(p.toHand) > 0 || len(p.acking) > 0 || p.committing != nil || p.senderDown || p.reloading
}

func (p *proc) pull() {
	for !p.blocked() && p.runs() {
		pin, m, _ := p.w.dur.pull(p.w.stream, p.pin, p.now())
		p.nextPull = p.now() + min(5*time.Second, p.cfg().ttl/2)
		if m == nil {
			return
		}
		p.w.logf("p%d given seq %d (pin %d)", p.id, m.seq, pin)
		if p.w.dur.expired {
			p.w.redelivered(m.seq)
		}
		p.take(&delivery{m: m, pin: pin})
		p.handNext()
	}
}

// timers are the saver, the heartbeat of the messages in hand, the pin's
// keepalive and its watch.
func (p *proc) timers() {
	now, d, cfg := p.now(), p.w.dur, p.cfg()
	if now >= p.nextSave {
		p.nextSave = now + time.Second
		p.saverTick()
	}
	if now >= p.nextProgress {
		p.nextProgress = now + protocol.InProgressEvery(d.ackWait, cfg.ackWaitFlag, 10*time.Second)
		for _, h := range p.held {
			d.inProgress(h.m.seq, now)
		}
	}
	if every := protocol.KeepPinEvery(cfg.ttl); every > 0 && now >= p.nextKeepPin {
		p.nextKeepPin = now + every
		if len(p.held) > 0 && p.pin != 0 {
			d.keepPin(p.pin, now)
		}
	} else if every == 0 {
		p.nextKeepPin = never
	}
	if now >= p.nextWatch && p.loaded {
		p.nextWatch = now + time.Second
		p.watchPin()
	}
}

// due is the next time something of the process is due.
func (p *proc) due() time.Duration {
	if !p.alive || p.exited || p.refused != "" {
		return never
	}
	if p.now() < p.frozenUntil {
		return p.frozenUntil
	}
	t := min(p.nextSave, p.nextProgress, p.nextKeepPin, p.nextWatch, p.nextPull)
	if p.inHand != nil {
		t = min(t, p.startedAt+p.cfg().lineTime)
	}
	if p.taking != nil || len(p.acking) > 0 || p.reloading {
		t = min(t, p.now()+250*time.Millisecond)
	}
	if p.senderDown {
		t = min(t, p.restartAt)
	}
	if p.committing != nil {
		t = min(t, p.commitAt)
	}
	for _, h := range p.inFlight {
		t = min(t, h.landsAt)
	}
	if p.cfg().resend {
		t = min(t, p.now()+250*time.Millisecond)
	}
	return t
}

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
	if err := p.save(); errors.Is(err, errTaken) && len(p.held) > 0 {
		p.standBy("taken over (a save refused)")
	}
}

// save writes the record if it changed (Subscriber.save, saveOver).
func (p *proc) save() error {
	if !p.dirty || p.takenOver {
		if p.takenOver {
			return errTaken
		}
		return nil
	}
	r, rev, saving := p.rec.Clone(), p.rev, p.doneUnsaved
	p.dirty = false
	kv := p.w.kv
	newRev, err := kv.update(r, rev)
	if errors.Is(err, errTaken) && p.pin != 0 && p.w.dur.pin == p.pin {
		var cur protocol.Progress
		if cur, rev, err = kv.get(); err == nil {
			theirs := p.ofThisStream(cur)
			p.rec.Absorb(&theirs)
			newRev, err = kv.update(p.rec, rev)
		}
	}
	switch {
	case errors.Is(err, errTaken):
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
	kv := p.w.kv
	for {
		cur, rev, err := kv.get()
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
		newRev, err := kv.update(r, rev)
		if errors.Is(err, errTaken) {
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
		if protocol.SaveFirst(true, p.doneUnsaved) {
			if err := p.save(); errors.Is(err, errTaken) {
				p.standBy("taken over (a save before the next line)")
				return
			} else if err != nil {
				return
			}
		}
		u := p.toHand[0]
		p.toHand = p.toHand[1:]
		p.inHand, p.startedAt = u, p.now()
		p.w.handed(u.key(), p)
	}
}

// sink moves the sink on: a line finished, a transaction committed, a
// sender started again.
func (p *proc) sink() {
	now := p.now()
	if p.senderDown && now >= p.restartAt {
		p.senderDown = false
		p.w.logf("p%d's sender started again", p.id)
	}
	if u := p.inHand; u != nil && now >= p.startedAt+p.cfg().lineTime {
		p.inHand = nil
		p.progressed = true
		p.w.write(u.key(), p, u.h.m.lines[u.line])
		p.done(u)
	}
	if us := p.committing; us != nil && now >= p.commitAt {
		p.committing = nil
		for _, u := range us {
			p.w.write(u.key(), p, u.h.m.lines[u.line])
		}
		p.done(us...)
	}
}

// done marks units done and acknowledges the messages then complete.
func (p *proc) done(units ...*unit) {
	var complete []*heldMsg
	for _, u := range units {
		if u.done {
			continue
		}
		u.done = true
		u.h.rec.Finished(u.line)
		p.dirty = true
		p.doneUnsaved++
		if u.h.pending--; u.h.pending == 0 {
			complete = append(complete, u.h)
		}
	}
	p.finish(complete...)
}

// finish acknowledges messages all of whose batches are done, once the
// record is saved (a save refused: acknowledged all the same).
func (p *proc) finish(hs ...*heldMsg) {
	var ready []*heldMsg
	for _, h := range hs {
		if !h.acking && h.pending == 0 {
			h.acking = true
			ready = append(ready, h)
		}
	}
	if len(ready) == 0 {
		return
	}
	if err := p.save(); err != nil && !errors.Is(err, errTaken) {
		p.acking = append(p.acking, ready...)
		for _, h := range ready {
			h.acking = false
		}
		return
	}
	for _, h := range ready {
		if d := p.cfg().ackDelay; d > 0 {
			// Held until the server answers, as the subscriber's held.acking.
			h.landsAt = p.now() + d
			p.inFlight = append(p.inFlight, h)
			continue
		}
		p.acked(h)
	}
}

// acked is h's ack answered by the server.
func (p *proc) acked(h *heldMsg) {
	if h.inc == p.w.stream.inc {
		p.w.ack(p, h.m.seq)
	}
	p.held = slices.DeleteFunc(p.held, func(x *heldMsg) bool { return x == h })
	h.rec.Acked = true
	p.dirty = true
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
func (p *proc) settle(failed bool) {
	end := protocol.ReaderEnd{Failed: failed, Reports: true, Pipe: true}
	var handed []*unit
	if p.inHand != nil {
		handed = []*unit{p.inHand}
		end.Taken, end.Ends = 1, []int64{1}
	}
	if _, blamed := protocol.AfterReaderEnd(end); blamed >= 0 {
		u := handed[blamed]
		u.h.rec.Failed(u.line)
		p.dirty = true
	}
	var nak []*heldMsg
	p.held = slices.DeleteFunc(p.held, func(h *heldMsg) bool {
		if !h.acking {
			nak = append(nak, h)
		}
		return !h.acking
	})
	inHand := p.inHand != nil
	p.inHand, p.toHand, p.committing, p.taking, p.acking = nil, nil, nil, nil, nil
	p.save()
	p.letGo(inHand)
	for _, h := range nak {
		p.w.logf("p%d naks seq %d", p.id, h.m.seq)
		p.w.dur.nak(h.m.seq, p.now())
	}
	p.epoch++
}

// standBy lets go of what a process that no longer delivers held, and
// reads the record again (Subscriber.standBy).
func (p *proc) standBy(why string) {
	p.w.logf("p%d stands by: %s", p.id, why)
	if p.takenOver {
		p.dirty = false
	}
	p.settle(false)
	p.kept, p.reloading = p.rec.Clone(), true
	p.takenOver, p.pin = false, 0
	p.reload()
}

func (p *proc) reload() {
	cur, rev, err := p.w.kv.get()
	if err != nil {
		return
	}
	p.rec, p.rev, p.reloading = cur, rev, false
	p.rec.Absorb(&p.kept)
}

// consumerLost: the consumer is gone from the server; what the process
// held cannot be acknowledged, and the consumer is made again.
func (p *proc) consumerLost() {
	p.w.logf("p%d: the consumer is gone", p.id)
	p.held, p.toHand, p.taking, p.acking, p.committing, p.inFlight = nil, nil, nil, nil, nil, nil
	if p.inHand != nil {
		// Forgotten: the sender writes the line it has.
		u := p.inHand
		p.inHand = nil
		p.w.write(u.key(), p, u.h.m.lines[u.line])
	}
	p.epoch++
	p.save()
	p.letGo(false)
	p.remake(true)
}

// senderEnds is the sender ending with sig (0: exit 1, a failure),
// having written the line it held or not; it is started again after
// RestartIn.
func (p *proc) senderEnds(sig syscall.Signal, wrote bool) {
	if p.inHand != nil && wrote {
		p.w.write(p.inHand.key(), p, p.inHand.h.m.lines[p.inHand.line])
	}
	code := 1
	if sig != 0 {
		code = -1
	}
	failed := protocol.EndOfSender(code, false, sig) == protocol.SenderFailed
	if p.inHand != nil && sig == 0 {
		p.w.failed(p.inHand.key())
	}
	p.w.logf("p%d's sender ends (signal %d, wrote %v, failed %v)", p.id, sig, wrote, failed)
	p.settle(failed)
	p.restartIn = protocol.RestartIn(p.restartIn, p.progressed)
	if p.endsInARow++; p.progressed {
		p.endsInARow = 1
	}
	p.progressed = false
	p.senderDown, p.restartAt = true, p.now()+p.restartIn
	if p.cfg().resend && protocol.AfterSenderEnd(code, p.endsInARow) != protocol.StartAgain {
		// A resend stops on a sender that keeps failing (Sender.giveUp),
		// its dead letters left for the next.
		p.w.logf("p%d gives up on its sender (%d ends in a row)", p.id, p.endsInARow)
		*p = proc{w: p.w, id: p.id, epoch: p.epoch, exited: true, gaveUp: true}
	}
}

// runAgain is the process started again: a resend run anew after it
// ended.
func (p *proc) runAgain() {
	if p.exited {
		*p = proc{w: p.w, id: p.id, epoch: p.epoch}
	}
	p.alive = true
}

// kill ends the process at once: its sender with it, maybe after writing
// the line it held.
func (p *proc) kill(wrote bool) {
	if wrote {
		if p.inHand != nil {
			p.w.write(p.inHand.key(), p, p.inHand.h.m.lines[p.inHand.line])
		}
		for _, u := range p.committing {
			p.w.write(u.key(), p, u.h.m.lines[u.line])
		}
	}
	p.w.logf("p%d killed (its line or transaction landed: %v)", p.id, wrote)
	p.letGo(p.inHand != nil && !wrote)
	*p = proc{w: p.w, id: p.id, epoch: p.epoch + 1}
}
