package subscriber

import (
	"sync"
	"time"

	"github.com/mailroom/tailer/publish/subscriber/protocol"
)

// keeper is the one goroutine that steps a subscriber's machine. The
// goroutines that find things (a delivery, the sink's word, a timer, a
// talk with the record) hand each to it and wait for the answer, so no
// two steps interleave and no lock guards a decision, as the relay's
// session alone steps its Relay. It also keeps the talks with the record
// to one at a time, which the machine needs of its driver: a talk asked
// for while another is under way begins, in the order asked, once that
// one ends. While a consume runs it carries out its duties itself, on
// its own clocks: the heartbeat of the messages in hand and the pin's
// keepalive.
type keeper struct {
	asks chan ask
	duty chan duties
	// closed is closed by stop; gone as the goroutine returns, after it
	// left the machine in last (read only after gone).
	closed, gone chan struct{}
	last         protocol.Machine
	once         sync.Once
	replies      sync.Pool
}

// ask is a step asked of the keeper: ev, in role, answered on reply.
type ask struct {
	ev    protocol.Found
	role  askRole
	reply chan []protocol.ToDo
}

// askRole is what a step is to the talks with the record.
type askRole uint8

const (
	// outside a talk (a delivery, the sink's word, a timer).
	outside askRole = iota
	// opens a talk: it waits on the one under way.
	opens
	// inTalk answers a command of the talk under way.
	inTalk
)

// newKeeper starts the goroutine that steps h.
func newKeeper(h protocol.Machine) *keeper {
	k := &keeper{asks: make(chan ask), duty: make(chan duties), closed: make(chan struct{}), gone: make(chan struct{})}
	k.replies.New = func() any { return make(chan []protocol.ToDo, 1) }
	go k.run(h)
	return k
}

// run steps h with each ask as it comes, but for a talk asked for while
// another is under way: it waits until that one ends.
func (k *keeper) run(h protocol.Machine) {
	defer close(k.gone)
	talking := false
	var waiting []ask
	var d duties
	var beat, keepPin clock
	defer beat.set(0)
	defer keepPin.set(0)
	for {
		select {
		case <-k.closed:
			k.last = h
			return
		case d = <-k.duty:
			beat.set(d.heartbeat)
			keepPin.set(d.keepPin)
		case <-beat.c:
			d.carryOut(&h, protocol.HeartbeatDue{})
		case <-keepPin.c:
			d.carryOut(&h, protocol.KeepPinDue{})
		case a := <-k.asks:
			if a.role == opens && talking {
				waiting = append(waiting, a)
				continue
			}
			talking = answer(&h, a, talking)
			for !talking && len(waiting) > 0 {
				talking = answer(&h, waiting[0], false)
				waiting = waiting[1:]
			}
		}
	}
}

// answer steps h with a and replies; it returns whether a talk is under
// way after. A talk ends with a TalkEnded, or with no answer to an input
// of its own (a driver's slip, which talk reports).
func answer(h *protocol.Machine, a ask, talking bool) bool {
	cmds := h.Step(a.ev)
	a.reply <- cmds
	if a.role == outside {
		return talking
	}
	for _, c := range cmds {
		if _, ok := c.(protocol.TalkEnded); ok {
			return false
		}
	}
	return len(cmds) > 0
}

// step has the keeper step the machine with e and returns the answer: none
// once the keeper is stopped.
func (k *keeper) step(e protocol.Found, role askRole) []protocol.ToDo {
	reply := k.replies.Get().(chan []protocol.ToDo)
	select {
	case k.asks <- ask{ev: e, role: role, reply: reply}:
	case <-k.closed:
		k.replies.Put(reply)
		return nil
	}
	select {
	case cmds := <-reply:
		k.replies.Put(reply)
		return cmds
	case <-k.gone:
		// Stopped with the talk it asked for still waiting: the answer,
		// if it came before, is the one to give.
		select {
		case cmds := <-reply:
			return cmds
		default:
			return nil
		}
	}
}

// carry has the keeper carry out d from now on, in place of the duties
// it had (none: duties{}).
func (k *keeper) carry(d duties) {
	select {
	case k.duty <- d:
	case <-k.closed:
	}
}

// duties are what the keeper carries out itself while a consume runs:
// every heartbeat, an in-progress ack of each message in hand
// (inProgress), so the server does not deliver it again while the sink
// works; every keepPin (0: the consumer pins none), a request naming the
// pin (keepPinIO), so the server keeps pinning this subscriber. Neither
// answers the machine: their IO must not wait, as no step is answered
// meanwhile.
type duties struct {
	heartbeat, keepPin time.Duration
	inProgress         func(*protocol.Held)
	keepPinIO          func(pin string)
}

// carryOut steps h with a duty's event and carries out what it says.
func (d duties) carryOut(h *protocol.Machine, e protocol.Found) {
	for _, c := range h.Step(e) {
		switch c := c.(type) {
		case protocol.InProgress:
			for _, held := range c.Msgs {
				d.inProgress(held)
			}
		case protocol.KeepPin:
			d.keepPinIO(c.Pin)
		}
	}
}

// clock ticks every set period; it has no ticks (c nil) while off.
type clock struct {
	t *time.Ticker
	c <-chan time.Time
}

// set ticks every every from now on; 0 turns it off.
func (c *clock) set(every time.Duration) {
	if c.t != nil {
		c.t.Stop()
		c.t, c.c = nil, nil
	}
	if every > 0 {
		c.t = time.NewTicker(every)
		c.c = c.t.C
	}
}

// stopped reports whether stop was called.
func (k *keeper) stopped() bool {
	select {
	case <-k.closed:
		return true
	default:
		return false
	}
}

// stop stops the keeper and returns the machine as it left it. A step
// asked after, or a talk still waiting on another, gets no answer.
func (k *keeper) stop() protocol.Machine {
	k.once.Do(func() { close(k.closed) })
	<-k.gone
	return k.last
}
