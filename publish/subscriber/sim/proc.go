package sim

import (
	"strconv"

	"fmt"
	"github.com/mailroom/tailer/publish/subscriber"
	"syscall"
	"time"

	"github.com/mailroom/tailer/publish/subscriber/protocol"
)

// heldMsg is a message delivered and not acknowledged: the core's Held
// (the subscriber's own), and the model's message it came as.
type heldMsg struct {
	*protocol.Held
	m   *smsg
	inc int
	// landsAt is when its ack, on its way, reaches the server.
	landsAt time.Duration
}

// heldOf is the model's message h was taken from.
func heldOf(h *protocol.Held) *heldMsg { return h.Msg.(*heldMsg) }

// unit is one batch handed to the sink (subscriber.Unit).
type unit struct {
	h    *heldMsg
	line int
	done bool
	// out is the unit as the sender's book keeps it.
	out *protocol.Handout
}

func (u *unit) key() batchKey { return batchKey{u.h.inc, u.h.m.seq, u.line} }

// delivery is a message the server gave, waiting on the record.
type delivery struct {
	m     *smsg
	inc   int
	pin   int
	stale bool
	again bool
}

// proc is one tailer subscribe process and its sink: it steps
// protocol.Machine and takes the core's decisions as publish/subscriber
// and cmd/internal/subscribe do, and carries them out against the models.
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
	// h is what the process holds and its record, changed by the core's
	// methods alone, as the subscriber's is.
	h            protocol.Machine
	lastDelivery time.Duration
	toHand       []*unit
	taking       *delivery
	acking       []*protocol.Held
	inFlight     []*heldMsg
	// bound is the consumer the process consumes from.
	bound *durableModel
	// store is the process's own subscriber.KVProgress on the bucket: the
	// writes whose answers it lost are its own, and go with it.
	store *subscriber.KVProgress
	// unsaved are the batches this process's sender wrote that the
	// record in the bucket does not say are done.
	unsaved map[batchKey]bool
	// failing counts the failures of its senders, by batch, since its
	// last save landed (world.failed).
	failing map[batchKey]int

	nextSave, nextProgress, nextKeepPin, nextWatch, nextPull time.Duration
	// mute is when the process last could not ask the server for
	// anything (noteMute); waits, whether it waits on a pull
	// (world.checkPins), since waitsSince.
	mute       time.Duration
	waits      bool
	waitsSince time.Duration

	// A sender: the line in hand since startedAt (stalled until
	// stuckUntil); down until restartAt.
	inHand               *unit
	startedAt            time.Duration
	stuckUntil           time.Duration
	senderDown           bool
	restartAt, restartIn time.Duration
	progressed           bool
	// book is what the sender was handed and has not finished, and its
	// stall, as Lines keeps them (its stall looked at nextStallLook);
	// moved is when the sender last took a line, finished one or was
	// started, as the world sees it.
	book                 protocol.ReaderBook
	nextStallLook, moved time.Duration
	// awake is when the process started; lineKept: its sender's line was
	// let go at a stand-by (standBy).
	awake    time.Duration
	lineKept bool
	// An inbox: the units of the transaction that commits at commitAt.
	committing []*unit
	commitAt   time.Duration
}

func (p *proc) now() time.Duration { return p.w.now }

// pin is the pin of the process's last delivery, as the durable's model
// numbers pins (0: none).
func (p *proc) pin() int {
	n, _ := strconv.Atoi(p.h.Pin)
	return n
}

// pinName is pin as the core keeps it.
func pinName(pin int) string {
	if pin == 0 {
		return ""
	}
	return strconv.Itoa(pin)
}

// kv is the record's store as the process reads and writes it: the
// shipping KVProgress on the bucket's model.
func (p *proc) kv() *subscriber.KVProgress {
	if p.store == nil {
		p.store = subscriber.NewKVProgress(p.w.kv, "durable")
	}
	return p.store
}
func (p *proc) cfg() *config { return &p.w.cfg }

// record is where the durable's record says its subscribers got to
// (Subscriber.record).
func (p *proc) record() protocol.RecordIs {
	return p.h.Step(protocol.RecordAt{})[0].(protocol.RecordIs)
}

func (p *proc) runs() bool {
	return p.alive && !p.exited && p.refused == "" && p.now() >= p.frozenUntil
}

// start loads the record and holds it against the stream, as Run does
// before it consumes.
func (p *proc) start() {
	p.h = protocol.Machine{}
	if end, _ := p.talk(protocol.Reload{}); end.Outcome != protocol.RecordRead {
		return
	}
	if at := p.w.inboxAt; p.cfg().inbox && at.Seq != 0 {
		// Where the inbox's own record says the durable got to
		// (Subscriber.seed).
		p.h.Step(protocol.SeedChain{At: at})
	}
	p.lastDelivery = -time.Hour
	if !p.remake(false) {
		return
	}
	p.loaded = true
	now := p.now()
	p.nextSave, p.nextProgress, p.nextKeepPin, p.nextWatch, p.nextPull = now+time.Second, now, now, now+time.Second, now
	p.nextStallLook, p.moved, p.awake = now, now, now
	p.book.Step(protocol.NewReader{At: instant(now)})
}

// remake holds the record against the stream (checkRecord) and makes the
// consumer when it is missing: where the record says, or at the stream's
// first message.
func (p *proc) remake(lost bool) bool {
	w := p.w
	missing := w.dur == nil || w.dur.gone
	if rec := p.record(); rec.Last.Seq != 0 || rec.Floor != 0 {
		switch protocol.CheckRecord(w.atLast(rec.Last), missing, p.cfg().fromStart, p.cfg().inbox) {
		case protocol.RefuseRecord:
			p.refused = fmt.Sprintf("the record's last sequence %d holds another message: --from-start", rec.Last.Seq)
			w.logf("p%d refuses: %s", p.id, p.refused)
			return false
		case protocol.DropRecord:
			w.logf("p%d drops the record (last %d)", p.id, rec.Last.Seq)
			p.h.Step(protocol.RecordDropped{})
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
	switch rec := p.record(); {
	case protocol.MakeAt(rec.Last.Seq != 0, cfg.inbox) == protocol.AfterFloor:
		return rec.Floor + 1, true
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
	p.noteMute()
	defer p.noteMute()
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
		pin, m, n := p.w.dur.pull(p.w.stream, p.pin(), p.now())
		p.nextPull = p.now() + protocol.PullExpiry(p.cfg().ttl)
		if m == nil {
			return
		}
		p.w.logf("p%d given seq %d (pin %d)", p.id, m.seq, pin)
		if p.w.dur.expired {
			p.w.redelivered(m.seq)
		}
		p.take(&delivery{m: m, inc: p.w.stream.inc, pin: pin, again: n > 1})
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
		for _, c := range p.h.Step(protocol.HeartbeatDue{}) {
			for _, h := range c.(protocol.InProgress).Msgs {
				d.inProgress(h.Seq, now)
			}
		}
	}
	if every := protocol.KeepPinEvery(cfg.ttl); every > 0 && now >= p.nextKeepPin {
		p.nextKeepPin = now + every
		for _, c := range p.h.Step(protocol.KeepPinDue{}) {
			pin, _ := strconv.Atoi(c.(protocol.KeepPin).Pin)
			d.keepPin(pin, now)
		}
	} else if every == 0 {
		p.nextKeepPin = never
	}
	if now >= p.nextWatch && p.loaded {
		p.nextWatch = now + time.Second
		p.watchPin()
	}
	if !cfg.inbox && cfg.stallTimeout > 0 && now >= p.nextStallLook {
		p.nextStallLook = now + protocol.StallLookEvery(cfg.stallTimeout)
		p.lookForStall()
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
		t = min(t, p.lineDone())
	}
	if !p.cfg().inbox && p.cfg().stallTimeout > 0 {
		t = min(t, p.nextStallLook)
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

// standBy lets go of what a process that no longer delivers held, and
// reads the record again (Subscriber.standBy).
func (p *proc) standBy(why string) {
	p.w.logf("p%d stands by: %s", p.id, why)
	// The model lets go of the sender's line; the real sender, the same
	// process, still works on it, and the line taken next is no move of
	// its (the simulation, seed 2745252518: a stall said 4 s after the
	// model's sender took a line, 16 s after the real one's last).
	p.lineKept = p.inHand != nil
	p.settle(false, true)
	p.reloading = true
	p.reload()
}

// reload reads the record again after standing by (Subscriber.load):
// the machine's reload, tried again at the next steps while the bucket
// does not answer.
func (p *proc) reload() {
	if end, _ := p.talk(protocol.Reload{}); end.Outcome == protocol.RecordRead {
		p.reloading = false
	}
}

// consumerLost: the consumer is gone from the server; what the process
// held cannot be acknowledged, and the consumer is made again.
func (p *proc) consumerLost() {
	p.w.logf("p%d: the consumer is gone", p.id)
	p.h.Step(protocol.ConsumerGone{})
	p.book.Step(protocol.ForgetHanded{})
	p.toHand, p.taking, p.acking, p.committing, p.inFlight = nil, nil, nil, nil, nil
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

// senderEnd is how a sender ends: its exit code, whether the code is
// one of --transient-exit, the signal that ended it (0: none).
type senderEnd struct {
	code      int
	transient bool
	sig       syscall.Signal
}

// senderEnds are the ways a sender ends with a batch in hand, as
// docs/consumers.md's table names them; a failure drawn oftener, so that
// batches reach --max-deliveries.
var senderEnds = []senderEnd{
	{code: 1}, {code: 1}, {code: 1}, // a failure
	{code: 75, transient: true}, // EX_TEMPFAIL: its mail server away
	{code: -1, sig: syscall.SIGSEGV},
	{code: -1, sig: syscall.SIGABRT},
	{code: -1, sig: syscall.SIGTERM},
	{code: -1, sig: syscall.SIGHUP},
	{code: 0}, // on its own, before the end of its input
}

// counts says whether the end counts a failed delivery against the batch
// in hand, as the docs' table says, written apart from the core's
// EndOfSender: another exit code than 0 and the transient ones, or a
// crash of the sender's own; not a signal from outside.
func (e senderEnd) counts() bool {
	switch e.sig {
	case 0:
		return e.code != 0 && !e.transient
	case syscall.SIGSEGV, syscall.SIGABRT, syscall.SIGBUS, syscall.SIGFPE, syscall.SIGILL:
		return true
	}
	return false
}

// senderEnds is the sender ending as e, having written the line it held
// or not; it is started again after RestartIn.
func (p *proc) senderEnds(e senderEnd, wrote bool) {
	if p.inHand != nil && wrote {
		p.w.write(p.inHand.key(), p, p.inHand.h.m.lines[p.inHand.line])
	}
	failed := protocol.EndOfSender(e.code, e.transient, e.sig) == protocol.SenderFailed
	if p.inHand != nil && e.counts() {
		p.w.failed(p, p.inHand.key())
	}
	p.w.logf("p%d's sender ends (%+v, wrote %v, failed %v)", p.id, e, wrote, failed)
	p.settle(failed, false)
	p.restartIn = protocol.RestartIn(p.restartIn, p.progressed)
	if p.endsInARow++; p.progressed {
		p.endsInARow = 1
	}
	p.progressed = false
	p.senderDown, p.restartAt = true, p.now()+p.restartIn
	if p.cfg().resend && protocol.AfterSenderEnd(e.code, p.endsInARow) != protocol.StartAgain {
		// A resend stops on a sender that keeps failing (Sender.giveUp),
		// its dead letters left for the next.
		p.w.logf("p%d gives up on its sender (%d ends in a row)", p.id, p.endsInARow)
		p.w.forgets(p)
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
	p.w.forgets(p)
	*p = proc{w: p.w, id: p.id, epoch: p.epoch + 1}
}
