package sim

// The durable's pin held both ways, as docs/subscribers.md promises: the
// server lets go of a subscriber's pin only once it stopped asking (not
// too early), and a standby is pinned within a second of the pinned TTL
// running out, or of the pinned one's clean stop (not too late).

import (
	"time"

	"github.com/mailroom/tailer/publish/subscriber/protocol"
)

// release is a pin the durable let go: by its TTL, its holder having
// asked last at lastAsk, or by hand (UnpinConsumer).
type release struct {
	pin     int
	lastAsk time.Duration
	byHand  bool
}

// takeoverBound is how long after the pin went free a standby able to
// pull may wait for it, while the durable has a message to give.
const takeoverBound = time.Second

// checkPins holds the pins let go since the last look not too early, and
// the takeover not too late.
func (w *world) checkPins() {
	d := w.dur
	if d == nil || d.gone {
		return
	}
	for _, r := range d.released {
		if !r.byHand {
			w.pinExpired(r)
		}
	}
	d.released = nil
	for _, p := range w.procs {
		switch ready := p.ready(); {
		case !ready:
			p.waits = false
		case !p.waits:
			p.waits, p.waitsSince = true, w.now
		}
	}
	switch seq, _ := d.offer(w.stream, w.now); {
	case seq == 0:
		w.offers = nil
	case w.offers != d:
		w.offers, w.offersSince = d, w.now
	}
	w.takeoverDue()
}

// pinExpired holds a pin let go by its TTL not too early: no process
// that holds it and runs kept asking since its last ask. One frozen, or
// waiting on the bucket or its sink with no message held (it neither
// pulls nor keeps the pin then), stopped asking.
func (w *world) pinExpired(r release) {
	for _, p := range w.procs {
		if p.pin() == r.pin && p.loaded && p.runs() && p.frozenUntil <= r.lastAsk && p.mute < r.lastAsk {
			w.fail("the server let go of p%d's pin %d, which asked last %s ago (--pinned-ttl %s) and has run since",
				p.id, r.pin, w.now-r.lastAsk, w.cfg.ttl)
		}
	}
}

// takeoverDue holds the takeover not too late: takeoverBound after the
// pin went free (its TTL ran out, or it was let go by hand), or after
// the pinned process stopped cleanly, after a process began to wait on a
// pull, and after the durable came to have a message to give, that
// process is not waiting still. Each of the three counts: make sim seed
// 3595205384 (frozen across a rebuild) took a process woken 2 s after the
// pin went free for one waiting since, and seed 523655401 (takeovers) a
// message acknowledged into room the second after for one there since.
func (w *world) takeoverDue() {
	d := w.dur
	due := d.freeSince(w.now)
	if w.pins == w.stopPins {
		due = min(due, w.stopAt)
	}
	if due == never || w.offers != d || w.now <= due+takeoverBound {
		return
	}
	seq, _ := d.offer(w.stream, w.now)
	for _, p := range w.procs {
		if since := max(due, p.waitsSince, w.offersSince); p.waits && w.now > since+takeoverBound {
			w.fail("p%d waits on a pull %s after the pin went free or its holder stopped, and it began to wait (bound %s), with seq %d to give",
				p.id, w.now-since, takeoverBound, seq)
			return
		}
	}
}

// parked reports whether a process's pull, waiting on the server, would
// be given a message now: the server answers it at once, where the model
// pulls as a process steps.
func (w *world) parked() bool {
	d := w.dur
	if d == nil || d.gone {
		return false
	}
	if seq, _ := d.offer(w.stream, w.now); seq == 0 {
		return false
	}
	pin := d.pinned(w.now)
	for _, p := range w.procs {
		if p.ready() && (pin == 0 || pin == p.pin()) {
			return true
		}
	}
	return false
}

// ready: p runs, bound to the durable, and its consume loop waits on a
// pull (Subscriber.consume between two groups).
func (p *proc) ready() bool {
	return p.runs() && p.loaded && !p.blocked() && p.bound == p.w.dur && !p.w.dur.gone
}

// noteMute notes when p last could not ask the server for anything: its
// consume loop waiting on the bucket or its sink with no message held
// under the pin, so neither pulling nor keeping the pin.
func (p *proc) noteMute() {
	if p.blocked() && !p.h.Holding() {
		p.mute = p.now()
	}
}

// stop is a clean stop (SIGTERM, cmd/tailer's subscribe): the reader
// ends, what the process held is handed back once the record is saved,
// and, pinned still, it lets the server pin another at once
// (Subscriber.ReaderEnded, Subscriber.Unpin).
func (p *proc) stop() {
	w := p.w
	w.logf("p%d stops", p.id)
	if p.loaded && p.bound == w.dur && !w.dur.gone {
		held := p.pinnedHere()
		p.settle(false, false)
		p.unpinAsItStops(held)
	}
	w.forgets(p)
	*p = proc{w: w, id: p.id, epoch: p.epoch + 1}
}

// pinnedHere reports whether the server pins p, as the world sees it.
func (p *proc) pinnedHere() bool {
	return p.pin() != 0 && p.pin() == p.w.dur.pinned(p.now())
}

// unpinAsItStops lets the server pin another at once if p, stopping, is
// the one it pins, as the machine judges it (Subscriber.Unpin); held:
// the server pinned p as it began to stop, and a standby is owed the
// pin at once.
func (p *proc) unpinAsItStops(held bool) {
	w := p.w
	if _, ok := p.withPin(protocol.Stopping{}).(protocol.Unpin); ok {
		w.unpinned(p)
	}
	if held {
		w.stopAt, w.stopPins = w.now, w.pins
	}
}

// unpinned: p had the server pin another at once: its own pin alone,
// not one the server gave another since.
func (w *world) unpinned(p *proc) {
	was := w.dur.unpin(w.now)
	w.logf("p%d unpins (the server's pin was %d)", p.id, was)
	if was != 0 && was != p.pin() {
		w.fail("p%d let go of pin %d, another's (its own %d)", p.id, was, p.pin())
	}
}
