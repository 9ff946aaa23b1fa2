package protocol

import (
	"time"

	"github.com/mailroom/tailer/publish/wire"
)

// What the machine is told outside its talks with the record: a delivery
// on its way to the sink, the timers of the messages held and of the pin,
// a look at the pin, a drain, and what the driver finds of the consumer.
// Each is answered at once (no talk); several may come while a talk is
// under way, from the driver's other goroutines.

// Delivered: a message delivered, before anything else is done with it,
// Pin its pin ("": none) and Idle the time since the delivery before.
// Answered with ClaimFirst when the record is to be read again and
// claimed before it is taken (MustReread), with nothing otherwise.
type Delivered struct {
	Pin  string
	Idle time.Duration
}

// ClaimFirst: read the record again and claim it (a ClaimRecord talk)
// before the delivery is taken.
type ClaimFirst struct{}

// Arrived: a delivered message the subscriber may take (its claim, if
// any, landed), at Seq of Mark on Subject with Header; Again: delivered
// before. Answered with Follows.
type Arrived struct {
	Seq           uint64
	Mark, Subject string
	Header        wire.Header
	Again         bool
}

// Follows: where Arrived stands. Gap is what the stream lacks before it
// in its subject's chain (nil: nothing, or a session marker's, which no
// chain follows); DoneBefore, of a message delivered again, counts its
// batches done before.
type Follows struct {
	Gap        *wire.Gap
	DoneBefore int
}

// Offer: a delivered message decoded, Tokens the count of each batch's
// tokens (of the subscriber's action), taken under Rules; Msg is the
// driver's handle of it. Answered with Taken.
type Offer struct {
	Seq    uint64
	Mark   string
	Tokens []int
	Rules  Rules
	Msg    any
}

// HeartbeatDue: a third of the ack wait went by; answered with
// InProgress when messages are held.
type HeartbeatDue struct{}

// InProgress has the server told that Msgs are still being worked on,
// so that it does not deliver them again.
type InProgress struct{ Msgs []*Held }

// KeepPinDue: the pin's keepalive is due; answered with KeepPin while
// messages are held under a pin.
type KeepPinDue struct{}

// KeepPin asks the server, naming Pin, for nothing: the server's timer
// of the pin starts over.
type KeepPin struct{ Pin string }

// PinWatchDue: a second went by since the pin was last looked at;
// answered with LookAtPin while messages are held under a pin.
type PinWatchDue struct{}

// HeartbeatMissed: the consumer's pulls went without a heartbeat.
// Answered with CountMiss while messages are held (the server is not
// heard), with LookAtPin otherwise: a standby's pulls wait without
// heartbeats while another is pinned, which says nothing of its server.
type HeartbeatMissed struct{}

// Stopping: the subscriber stops; answered with LookAtPin when it had a
// pin, so that, pinned still, it lets the server pin another at once.
type Stopping struct{}

// PinLook says what a look at the pin is for.
type PinLook uint8

const (
	// ForWatch: the watch of the pin while messages are held.
	ForWatch PinLook = iota
	// ForMiss: a missed heartbeat of a subscriber holding nothing.
	ForMiss
	// ForStop: a subscriber that stops.
	ForStop
)

// LookAtPin asks the server whom it pins now, answered with PinLooked
// (For as asked).
type LookAtPin struct{ For PinLook }

// PinLooked: the pin the server gives the durable's group ("": none, or
// the server did not say), for what LookAtPin asked.
type PinLooked struct {
	For    PinLook
	Pinned string
}

// PinLost: the server pins another subscriber, or none, while this one
// holds messages: it is to stand by.
type PinLost struct{}

// CountMiss: the heartbeat missed counts as the server not heard.
type CountMiss struct{}

// Unpin lets the server pin another subscriber at once.
type Unpin struct{}

// DrainLook: what the driver sees of a drain (the consumer's counts, its
// own hands); the machine adds what it holds and the acks on their way.
// Answered with StopDrained once nothing is left.
type DrainLook struct{ Drain Drain }

// StopDrained: everything was delivered and nothing is in hand.
type StopDrained struct{}

// ConsumerGone: the consumer is no longer on the server; its deliveries
// cannot be acknowledged, and the one made again delivers what they held
// again.
type ConsumerGone struct{}

// NextUnit: a serial reader (a pipe's, which says it finished a batch
// only by taking the next) is to be given its next batch; answered with
// SaveBeforeNext when what it finished is to be saved first.
type NextUnit struct{}

// SaveBeforeNext: save the record (a SaveDue talk) before the reader
// gets more.
type SaveBeforeNext struct{}

// RecordAt asks where the record says the durable's subscribers got to;
// answered with RecordIs.
type RecordAt struct{}

// RecordIs: the message the record saw last, and its ack floor.
type RecordIs struct {
	Last  wire.Anchor
	Floor uint64
}

// RecordDropped: the record is of another stream, or names no message;
// it is dropped (and the empty record saved).
type RecordDropped struct{}

// SeedChain: the chain starts at At when nothing is known of it (where a
// sink's own record says the durable got to).
type SeedChain struct{ At wire.Anchor }

// FollowAfresh: the chain followed was of a stream that may be another
// now; it is followed afresh.
type FollowAfresh struct{}

// Look asks for the machine's state, for counts and logs; answered with
// Status. No decision is made on it.
type Look struct{}

// Status is what Look found.
type Status struct {
	Pin         string
	Held        int
	DoneUnsaved int
}

func (Delivered) found()       {}
func (Arrived) found()         {}
func (Offer) found()           {}
func (HeartbeatDue) found()    {}
func (KeepPinDue) found()      {}
func (PinWatchDue) found()     {}
func (HeartbeatMissed) found() {}
func (Stopping) found()        {}
func (PinLooked) found()       {}
func (DrainLook) found()       {}
func (ConsumerGone) found()    {}
func (NextUnit) found()        {}
func (RecordAt) found()        {}
func (RecordDropped) found()   {}
func (SeedChain) found()       {}
func (FollowAfresh) found()    {}
func (Look) found()            {}

func (ClaimFirst) toDo()     {}
func (Follows) toDo()        {}
func (Taken) toDo()          {}
func (InProgress) toDo()     {}
func (KeepPin) toDo()        {}
func (LookAtPin) toDo()      {}
func (PinLost) toDo()        {}
func (CountMiss) toDo()      {}
func (Unpin) toDo()          {}
func (StopDrained) toDo()    {}
func (SaveBeforeNext) toDo() {}
func (RecordIs) toDo()       {}
func (Status) toDo()         {}

// stepOutside steps what comes outside the talks (ok: e is one of
// those).
func (m *Machine) stepOutside(e Found) (cmds []ToDo, ok bool) {
	switch e := e.(type) {
	case Delivered:
		if m.Reread(e.Pin, e.Idle) {
			return []ToDo{ClaimFirst{}}, true
		}
		return nil, true
	case Arrived:
		return []ToDo{m.arrived(e)}, true
	case Offer:
		return []ToDo{m.Take(e.Seq, e.Mark, e.Tokens, e.Rules, e.Msg)}, true
	case HeartbeatDue:
		if held := m.Held(); len(held) > 0 {
			return []ToDo{InProgress{held}}, true
		}
		return nil, true
	case KeepPinDue:
		if m.Holding() && m.Pin != "" {
			return []ToDo{KeepPin{m.Pin}}, true
		}
		return nil, true
	case PinLooked:
		return m.pinLooked(e), true
	}
	return m.stepAside(e)
}

// stepAside steps the rest of what comes outside the talks.
func (m *Machine) stepAside(e Found) (cmds []ToDo, ok bool) {
	switch e := e.(type) {
	case PinWatchDue:
		return m.lookIf(m.WatchesPin(), ForWatch), true
	case HeartbeatMissed:
		if m.Holding() {
			return []ToDo{CountMiss{}}, true
		}
		return []ToDo{LookAtPin{ForMiss}}, true
	case Stopping:
		return m.lookIf(m.Pin != "", ForStop), true
	case DrainLook:
		d := e.Drain
		d.Acking, d.Holding = d.Acking || m.Acking(), len(m.held)
		if Drained(d) {
			return []ToDo{StopDrained{}}, true
		}
		return nil, true
	case ConsumerGone:
		m.Forget()
		return nil, true
	case NextUnit:
		if SaveFirst(true, m.DoneUnsaved) {
			return []ToDo{SaveBeforeNext{}}, true
		}
		return nil, true
	}
	return m.stepRecord(e)
}

// stepRecord steps what the driver finds of the record as it binds to
// the consumer, and Look.
func (m *Machine) stepRecord(e Found) (cmds []ToDo, ok bool) {
	switch e := e.(type) {
	case RecordAt:
		return []ToDo{RecordIs{Last: m.Record.Last, Floor: m.Record.Floor}}, true
	case RecordDropped:
		m.Record, m.Dirty = Progress{}, true
		return nil, true
	case SeedChain:
		if c := &m.Record.Chain; c.Seed.Seq == 0 && len(c.Subjects) == 0 {
			c.Seed = e.At
		}
		return nil, true
	case FollowAfresh:
		m.Record.Chain = wire.Chain{}
		return nil, true
	case Look:
		return []ToDo{Status{Pin: m.Pin, Held: len(m.held), DoneUnsaved: m.DoneUnsaved}}, true
	}
	return nil, false
}

// lookIf asks for a look at the pin, for what, when ask.
func (m *Machine) lookIf(ask bool, what PinLook) []ToDo {
	if !ask {
		return nil
	}
	return []ToDo{LookAtPin{what}}
}

// pinLooked judges a look at the pin.
func (m *Machine) pinLooked(e PinLooked) []ToDo {
	switch e.For {
	case ForWatch:
		// Held messages may have gone meanwhile: the watch starts over.
		if m.WatchesPin() && m.PinSeen(e.Pinned) {
			return []ToDo{PinLost{}}
		}
	case ForMiss:
		if m.Holding() || e.Pinned == "" || e.Pinned == m.Pin {
			return []ToDo{CountMiss{}}
		}
	case ForStop:
		if m.PinnedHere(e.Pinned) {
			return []ToDo{Unpin{}}
		}
	}
	return nil
}

// arrived notes a message delivered: the newest the durable's
// subscribers were given, and where it stands in its subject's chain.
func (m *Machine) arrived(e Arrived) Follows {
	m.Saw(e.Seq, e.Mark)
	var f Follows
	if !wire.IsMarker(e.Header) {
		f.Gap = m.Record.Chain.Follow(e.Subject, e.Seq, e.Header, e.Mark, e.Again)
	}
	if msg := m.Record.Messages[e.Seq]; e.Again && msg != nil && msg.Mark == e.Mark {
		f.DoneBefore = msg.Done.Len()
	}
	return f
}
