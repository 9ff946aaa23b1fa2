package sim

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"pgregory.net/rapid"

	"github.com/mailroom/tailer/internal/testutil/natstest"
	"github.com/mailroom/tailer/internal/testutil/simtest"
)

// Without -rapid.checks, each model test runs defaultChecks cases: each
// waits on the server.
const defaultChecks = "25"

func TestMain(m *testing.M) { simtest.Main(m, defaultChecks, "") }

// fataler is what the checks need of a *testing.T or a *rapid.T.
type fataler interface {
	Fatal(...any)
	Fatalf(string, ...any)
}

// durableCheck runs the same operations on the durable model and on a
// real pinned pull consumer of an embedded nats-server.
type durableCheck struct {
	ctx    context.Context
	nc     *nats.Conn
	js     jetstream.JetStream
	stream string
	s      *streamModel
	d      *durableModel
	now    time.Duration
	pins   int
	// pin is each client's pin, on the server and in the model.
	pin      [2]string
	modelPin [2]int
	// delivery is the last delivery of each sequence, to ack or nak.
	delivery map[uint64]*nats.Msg
}

func (c *durableCheck) make(t fataler, name string, ackWait, ttl time.Duration) {
	c.stream = name
	if _, err := c.js.CreateStream(c.ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".b"}}); err != nil {
		t.Fatal(err)
	}
	_, err := c.js.CreateConsumer(c.ctx, name, jetstream.ConsumerConfig{Durable: "d", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait,
		MaxAckPending: 2, PriorityPolicy: jetstream.PriorityPolicyPinned, PriorityGroups: []string{"g"}, PinnedTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	c.s = &streamModel{inc: 1, msgs: map[uint64]*smsg{}}
	c.d = newDurable(ackWait, ttl, 1, &c.pins)
	c.delivery = map[uint64]*nats.Msg{}
	c.pin, c.modelPin, c.now = [2]string{}, [2]int{}, 0
}

func (c *durableCheck) publish(t fataler) {
	if _, err := c.js.Publish(c.ctx, c.stream+".b", []byte("x")); err != nil {
		t.Fatal(err)
	}
	c.s.append([][]string{{"t"}})
}

// pull is client i's pull request naming its pin: the server answers a
// stale pin, once nobody is pinned, with 423, and nats.go pulls again
// naming none; the model gives the new pin at once.
func (c *durableCheck) pull(t fataler, i int) {
	seq, n, pin, status := c.serverPull(t, c.pin[i])
	if status == "423" && c.d.pin == 0 {
		seq, n, pin, status = c.serverPull(t, "")
	}
	mpin, m, mn := c.d.pull(c.s, c.modelPin[i], c.now)
	var mseq uint64
	if m != nil {
		mseq = m.seq
		c.modelPin[i] = mpin
	}
	if seq != 0 {
		c.pin[i] = pin
	}
	if seq != mseq || n != mn {
		t.Fatalf("client %d's pull: the server gave seq %d (delivery %d, status %q), the model seq %d (delivery %d)", i, seq, n, status, mseq, mn)
	}
	if seq != 0 && (c.pin[0] == c.pin[1]) != (c.modelPin[0] == c.modelPin[1]) {
		t.Fatalf("pins: the server's %q, the model's %v", c.pin, c.modelPin)
	}
}

func (c *durableCheck) serverPull(t fataler, pin string) (uint64, int, string, string) {
	req, _ := json.Marshal(map[string]any{"batch": 1, "expires": int64(25 * time.Millisecond), "group": "g", "id": pin})
	msg, err := c.nc.Request("$JS.API.CONSUMER.MSG.NEXT."+c.stream+".d", req, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if st := msg.Header.Get("Status"); st != "" {
		return 0, 0, "", st
	}
	meta, err := msg.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	c.delivery[meta.Sequence.Stream] = msg
	return meta.Sequence.Stream, int(meta.NumDelivered), msg.Header.Get("Nats-Pin-Id"), ""
}

// answer sends an ack of kind for seq's last delivery and waits for the
// server's answer.
func (c *durableCheck) answer(t *rapid.T, kind string) {
	if len(c.d.pend) == 0 {
		t.Skip("nothing pending")
	}
	seqs := make([]uint64, 0, len(c.d.pend))
	for s := range c.d.pend {
		seqs = append(seqs, s)
	}
	seq := rapid.SampledFrom(seqs).Draw(t, "seq")
	if _, err := c.nc.Request(c.delivery[seq].Reply, []byte(kind), 2*time.Second); err != nil {
		t.Fatalf("%s of seq %d: %v", kind, seq, err)
	}
	switch kind {
	case "+ACK":
		c.d.ack(c.s, seq)
	case "-NAK":
		c.d.nak(seq, c.now)
	case "+WPI":
		c.d.inProgress(seq, c.now)
	}
}

// purge purges the stream whole.
func (c *durableCheck) purge(t *rapid.T) {
	st, err := c.js.Stream(c.ctx, c.stream)
	if err == nil {
		err = st.Purge(c.ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
	c.s.msgs = map[uint64]*smsg{}
	c.d.purged(c.s.last)
}

// delete deletes one message.
func (c *durableCheck) delete(t *rapid.T) {
	if c.s.last == 0 {
		t.Skip("nothing published")
	}
	seq := rapid.Uint64Range(1, c.s.last).Draw(t, "deleted")
	if c.s.msgs[seq] == nil {
		t.Skip("gone already")
	}
	st, err := c.js.Stream(c.ctx, c.stream)
	if err == nil {
		err = st.DeleteMsg(c.ctx, seq)
	}
	if err != nil {
		t.Fatal(err)
	}
	delete(c.s.msgs, seq)
}

// unpin lets go of the pin by hand (Subscriber.Unpin), on both.
func (c *durableCheck) unpin(t fataler) {
	st, err := c.js.Stream(c.ctx, c.stream)
	if err == nil {
		err = st.UnpinConsumer(c.ctx, "d", "g")
	}
	if was := c.d.unpin(c.now); err != nil && was != 0 {
		t.Fatalf("unpin with pin %d in the model: %v", was, err)
	}
}

// wait lets d pass on both.
func (c *durableCheck) wait(d time.Duration) {
	time.Sleep(d)
	c.now += d
}

// The durable model does what a real pinned pull consumer does with the
// operations the simulation uses: pulls naming a pin or none, from two
// clients, acks, naks (of a delivery since given again too), in-progress
// acks, the pin let go by hand, the stream purged and a message deleted,
// on the model and on an embedded nats-server, deliver
// the same sequences with the same delivery counts, and pin the same
// client. Time does not pass: the ack wait and the pinned TTL are a
// minute (TestDurableModelTimes has them run out).
func TestDurableModelAgreesWithJetStream(t *testing.T) {
	c := startDurableCheck(t)
	n := 0
	rapid.Check(t, func(rt *rapid.T) {
		n++
		c.make(rt, "S"+strconv.Itoa(n), time.Minute, time.Minute)
		rt.Repeat(map[string]func(*rapid.T){
			"publish":     func(t *rapid.T) { c.publish(t) },
			"pull":        func(t *rapid.T) { c.pull(t, rapid.IntRange(0, 1).Draw(t, "client")) },
			"ack":         func(t *rapid.T) { c.answer(t, "+ACK") },
			"nak":         func(t *rapid.T) { c.answer(t, "-NAK") },
			"in progress": func(t *rapid.T) { c.answer(t, "+WPI") },
			"unpin":       func(t *rapid.T) { c.unpin(t) },
			"purge":       c.purge,
			"delete":      c.delete,
		})
	})
}

// The ack wait and the pinned TTL (2 s) run out on the model as on the
// server, each step at least 0.4 s from the moment it tells apart: a
// message not acknowledged within the ack wait comes again (not one kept
// by in-progress acks), in the order they became due, and a pin that
// asked for nothing within the TTL goes to the next client that pulls.
func TestDurableModelTimes(t *testing.T) {
	c := startDurableCheck(t)
	c.make(t, "T", 2*time.Second, 2*time.Second)
	for range 3 {
		c.publish(t)
	}
	c.pull(t, 0) // seq 1, pinned
	c.pull(t, 0) // seq 2
	c.wait(1200 * time.Millisecond)
	c.inProgress(t, 2)
	c.pull(t, 0) // nothing: both pending
	c.wait(1200 * time.Millisecond)
	c.pull(t, 0) // seq 1 again: its ack wait ran out; seq 2 kept
	c.wait(3 * time.Second)
	c.pull(t, 1) // the pin ran out: client 1 pinned, given seq 2 again, due first
}

// inProgress is an in-progress ack of seq's last delivery.
func (c *durableCheck) inProgress(t fataler, seq uint64) {
	if _, err := c.nc.Request(c.delivery[seq].Reply, []byte("+WPI"), 2*time.Second); err != nil {
		t.Fatal(err)
	}
	c.d.inProgress(seq, c.now)
}

func startDurableCheck(t *testing.T) *durableCheck {
	nc, js := natstest.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return &durableCheck{ctx: ctx, nc: nc, js: js}
}
