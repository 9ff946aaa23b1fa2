package subscriber

import (
	"sync"

	"github.com/mailroom/tailer/publish/subscriber/protocol"
)

// keeper is the one goroutine that steps a subscriber's machine. The
// goroutines that find things (a delivery, the sink's word, a timer, a
// talk with the record) hand each to it and wait for the answer, so no
// two steps interleave and no lock guards a decision, as the relay's
// session alone steps its Relay. It also keeps the talks with the record
// to one at a time, which the machine needs of its driver: a talk asked
// for while another is under way begins, in the order asked, once that
// one ends.
type keeper struct {
	asks chan ask
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
	k := &keeper{asks: make(chan ask), closed: make(chan struct{}), gone: make(chan struct{})}
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
	for {
		select {
		case <-k.closed:
			k.last = h
			return
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
