package protocol

import (
	"testing"
	"time"

	"github.com/mailroom/tailer/publish/wire"
)

// header is a message's headers, as the chain reads them.
type header map[string]string

func (h header) Get(k string) string { return h[k] }

// holding is a machine holding message 5 (two batches, none done) under
// pin p1.
func holding(t *testing.T) *Machine {
	t.Helper()
	m := &Machine{}
	m.Pin = "p1"
	taken := m.Step(Offer{Seq: 5, Mark: "m5", Tokens: []int{1, 1}, Msg: "d5"})[0].(Taken)
	if taken.Held == nil || len(taken.Attempts) != 2 || len(m.Held()) != 1 {
		t.Fatalf("offer taken as %+v, holding %d", taken, len(m.Held()))
	}
	return m
}

// A delivery is claimed first when the pin changed, or after an idle
// stretch; not otherwise.
func TestMachineDelivered(t *testing.T) {
	m := &Machine{}
	m.Pin = "p1"
	if got := show(m.Step(Delivered{Pin: "p1", Idle: time.Second})); got != "" {
		t.Fatalf("same pin, busy: %s, want nothing", got)
	}
	if got := show(m.Step(Delivered{Pin: "p2", Idle: time.Second})); got != "protocol.ClaimFirst{};" {
		t.Fatalf("new pin: %s, want a claim first", got)
	}
	if m.Pin != "p2" {
		t.Fatalf("pin %q, want p2", m.Pin)
	}
	if got := show(m.Step(Delivered{Pin: "p2", Idle: time.Hour})); got != "protocol.ClaimFirst{};" {
		t.Fatalf("idle an hour: %s, want a claim first", got)
	}
}

// An arrival follows the chain (a gap past the seed is said, a marker
// follows none) and counts the batches done before of a redelivery.
func TestMachineArrived(t *testing.T) {
	m := &Machine{}
	m.Step(SeedChain{At: wire.Anchor{Seq: 3, Mark: "m3"}})
	m.Step(SeedChain{At: wire.Anchor{Seq: 9, Mark: "m9"}})
	if m.Record.Chain.Seed.Seq != 3 {
		t.Fatalf("seed %v: a second seed moved the first", m.Record.Chain.Seed)
	}
	f := m.Step(Arrived{Seq: 7, Mark: "m7", Subject: "S", Header: header{wire.HeaderPrev: "m5", wire.HeaderPrevSeq: "5"}})[0].(Follows)
	if f.Gap == nil || f.Gap.Given.Seq != 3 {
		t.Fatalf("follows %+v, want a gap after the seed", f)
	}
	if m.Record.Last.Seq != 7 || !m.Dirty {
		t.Fatalf("last %v dirty %v: the arrival not noted", m.Record.Last, m.Dirty)
	}
	f = m.Step(Arrived{Seq: 8, Mark: "m8", Subject: "S", Header: header{wire.HeaderFence: "f", wire.HeaderPrev: "x", wire.HeaderPrevSeq: "1"}})[0].(Follows)
	if f.Gap != nil {
		t.Fatalf("a marker follows %+v, want no gap", f)
	}
	m.Record.MessageAt(7, "m7", 3).Done.Add(1)
	if f := m.Step(Arrived{Seq: 7, Mark: "m7", Subject: "S", Header: header{}, Again: true})[0].(Follows); f.DoneBefore != 1 {
		t.Fatalf("done before %d, want 1", f.DoneBefore)
	}
	if f := m.Step(Arrived{Seq: 7, Mark: "other", Subject: "S", Header: header{}, Again: true})[0].(Follows); f.DoneBefore != 0 {
		t.Fatalf("another message at 7: done before %d, want 0", f.DoneBefore)
	}
	m.Step(FollowAfresh{})
	if len(m.Record.Chain.Subjects) != 0 || m.Record.Chain.Seed.Seq != 0 {
		t.Fatalf("chain %+v after FollowAfresh", m.Record.Chain)
	}
}

// The heartbeat and the pin's keepalive go out while messages are held
// (the keepalive under a pin); not otherwise.
func TestMachineHeartbeatAndKeepPin(t *testing.T) {
	m := &Machine{}
	if got := show(m.Step(HeartbeatDue{})) + show(m.Step(KeepPinDue{})); got != "" {
		t.Fatalf("holding nothing: %s", got)
	}
	m = holding(t)
	if c := m.Step(HeartbeatDue{}); len(c) != 1 || len(c[0].(InProgress).Msgs) != 1 {
		t.Fatalf("heartbeat: %s", show(c))
	}
	if got := show(m.Step(KeepPinDue{})); got != "protocol.KeepPin{p1};" {
		t.Fatalf("keepalive: %s", got)
	}
	m.Pin = ""
	if got := show(m.Step(KeepPinDue{})); got != "" {
		t.Fatalf("no pin: %s", got)
	}
}

// The pin's watch looks while messages are held under a pin, and says it
// lost the pin at the second look in a row that finds another's.
func TestMachinePinWatch(t *testing.T) {
	m := &Machine{}
	if got := show(m.Step(PinWatchDue{})); got != "" {
		t.Fatalf("holding nothing: %s", got)
	}
	m = holding(t)
	if got := show(m.Step(PinWatchDue{})); got != "protocol.LookAtPin{0};" {
		t.Fatalf("holding: %s", got)
	}
	steps := []struct {
		pinned, want string
	}{{"p2", ""}, {"p1", ""}, {"p2", ""}, {"", "protocol.PinLost{};"}}
	for i, s := range steps {
		if got := show(m.Step(PinLooked{For: ForWatch, Pinned: s.pinned})); got != s.want {
			t.Fatalf("look %d (%q): %s, want %q", i, s.pinned, got, s.want)
		}
	}
}

// A missed heartbeat counts while messages are held, or when the server
// pins nobody, or this one; not for a standby while another is pinned.
func TestMachineHeartbeatMissed(t *testing.T) {
	m := &Machine{}
	m.Pin = "p1"
	if got := show(m.Step(HeartbeatMissed{})); got != "protocol.LookAtPin{1};" {
		t.Fatalf("holding nothing: %s", got)
	}
	for pinned, want := range map[string]string{"p2": "", "": "protocol.CountMiss{};", "p1": "protocol.CountMiss{};"} {
		if got := show(m.Step(PinLooked{For: ForMiss, Pinned: pinned})); got != want {
			t.Fatalf("pinned %q: %s, want %q", pinned, got, want)
		}
	}
	m = holding(t)
	if got := show(m.Step(HeartbeatMissed{})); got != "protocol.CountMiss{};" {
		t.Fatalf("holding: %s", got)
	}
}

// A subscriber that stops lets the server pin another only when it is
// the one pinned.
func TestMachineStopping(t *testing.T) {
	m := &Machine{}
	if got := show(m.Step(Stopping{})); got != "" {
		t.Fatalf("no pin: %s", got)
	}
	m.Pin = "p1"
	if got := show(m.Step(Stopping{})); got != "protocol.LookAtPin{2};" {
		t.Fatalf("pinned once: %s", got)
	}
	if got := show(m.Step(PinLooked{For: ForStop, Pinned: "p2"})); got != "" {
		t.Fatalf("another pinned: %s", got)
	}
	if got := show(m.Step(PinLooked{For: ForStop, Pinned: "p1"})); got != "protocol.Unpin{};" {
		t.Fatalf("pinned here: %s", got)
	}
}

// A drain ends once nothing is left, counting what the machine holds and
// the acks on their way.
func TestMachineDrainLook(t *testing.T) {
	m := &Machine{}
	if got := show(m.Step(DrainLook{})); got != "protocol.StopDrained{};" {
		t.Fatalf("nothing left: %s", got)
	}
	if got := show(m.Step(DrainLook{Drain: Drain{Acking: true}})); got != "" {
		t.Fatalf("the driver's ack on its way: %s", got)
	}
	m = holding(t)
	if got := show(m.Step(DrainLook{Drain: Drain{AckPending: 2}})); got != "" {
		t.Fatalf("holding one of two pending: %s", got)
	}
	h := m.Held()[0]
	m.Step(Done{Batches: []HeldBatch{{h, 0}, {h, 1}}})
	m.ToAck(h)
	if got := show(m.Step(DrainLook{Drain: Drain{AckPending: 1}})); got != "" {
		t.Fatalf("its ack on its way: %s", got)
	}
	m.Step(Acked{Held: h, OK: true})
	if got := show(m.Step(DrainLook{})); got != "protocol.StopDrained{};" {
		t.Fatalf("acknowledged: %s", got)
	}
}

// A serial reader's next unit waits on a save once a batch done is
// unsaved; a consumer gone forgets what was held.
func TestMachineNextUnitAndConsumerGone(t *testing.T) {
	m := holding(t)
	if got := show(m.Step(NextUnit{})); got != "" {
		t.Fatalf("nothing done: %s", got)
	}
	h := m.Held()[0]
	m.Step(Done{Batches: []HeldBatch{{h, 0}}})
	if got := show(m.Step(NextUnit{})); got != "protocol.SaveBeforeNext{};" {
		t.Fatalf("a batch done unsaved: %s", got)
	}
	m.Step(ConsumerGone{})
	if m.Holding() {
		t.Fatal("holds messages of a consumer gone")
	}
}

// The record's place is read, and a record of another stream dropped.
func TestMachineRecordAt(t *testing.T) {
	m := &Machine{}
	m.Record = Progress{Last: wire.Anchor{Seq: 9, Mark: "m9"}, Floor: 8}
	if got := show(m.Step(RecordAt{})); got != "protocol.RecordIs{{9 m9} 8};" {
		t.Fatalf("record at: %s", got)
	}
	m.Step(RecordDropped{})
	if m.Record.Last.Seq != 0 || m.Record.Floor != 0 || !m.Dirty {
		t.Fatalf("record %+v dirty %v after RecordDropped", m.Record, m.Dirty)
	}
	m.Pin, m.DoneUnsaved = "p3", 2
	if got := show(m.Step(Look{})); got != "protocol.Status{p3 0 2};" {
		t.Fatalf("look: %s", got)
	}
}
