package sim

import (
	"fmt"
	"github.com/mailroom/tailer/decoder/wal"
	"slices"
	"strings"
	"time"

	"github.com/mailroom/tailer/publish/relay"
	"pgregory.net/rapid"
)

// Profile narrows the schedules rapid draws to a part of the space, so
// that a few thousand of them reach its rarer interleavings: which
// faults may be injected and how many, how many messages a session keeps
// in flight, and how often each action is drawn.
type Profile struct {
	Name string
	// Faults are the names of the faults drawn from (nil: every one);
	// MaxFaults the most a schedule injects.
	Faults    []string
	MaxFaults int
	// InFlight is the range of the relays' MaxInFlight (0: by replicas).
	InFlight [2]int
	// Weights draws an action that many times as often (default 1).
	Weights map[string]int
}

// Profiles are the schedules TestSimulation runs, each as many times.
var Profiles = []Profile{
	{Name: "everything", MaxFaults: 3, InFlight: [2]int{0, 3}},
	{Name: "stream", MaxFaults: 4, InFlight: [2]int{0, 3}, Weights: map[string]int{"fault": 3, "tick": 2},
		Faults: []string{"purge", "purge of the batches' subject", "purge of the session markers' subject", "a message deleted", "the stream made again", "a backup taken",
			"the stream restored from its last backup", "a replica of the stream's own", "another replica leads", "the stream's limits edited"}},
	{Name: "processes", MaxFaults: 2, InFlight: [2]int{1, 3}, Weights: map[string]int{"kill": 2, "freeze": 2, "freeze the holder": 2, "deliver": 3, "step": 2},
		Faults: []string{"a replica of the stream's own", "another replica leads"}},
	// Tailers killed and started again, and no check while streaming: what
	// one knows of the stream is what the record says.
	{Name: "restarts", MaxFaults: 2, InFlight: [2]int{1, 2}, Weights: map[string]int{"kill": 2, "step": 3, "deliver": 2, "resync": 1,
		"tick": 0, "time passes": 0, "freeze": 0, "freeze the holder": 0},
		Faults: []string{"purge", "purge of the batches' subject", "a message deleted", "the stream made again", "a backup taken", "the stream restored from its last backup"}},
	// The database's files put back under a stream that holds batches
	// of what they lost: new tokens at positions already published.
	{Name: "database put back", MaxFaults: 4, InFlight: [2]int{1, 2}, Weights: map[string]int{"commit": 3, "step": 3, "deliver": 2, "fault": 2,
		"resync": 0, "tick": 0, "time passes": 0, "freeze": 0, "freeze the holder": 0},
		Faults: []string{"the database's files copied", "the database's files put back, with its slot"}},
	{Name: "database", MaxFaults: 4, InFlight: [2]int{0, 3}, Weights: map[string]int{"fault": 2, "commit": 2, "resync": 0},
		Faults: []string{"the publication changed and changed back", "the slot lost", "the database's files copied", "the database's files put back, with its slot",
			"a table attached to tokens holding rows", "the slot advanced by another process", "the slot dropped", "a failover to a standby"}},
}

// Schedule returns the schedules of profile p: each runs the real Relay,
// in up to two tailer processes, against the models of the slot and of
// JetStream: tokens committed, processes stepped, killed, frozen and
// started, publishes landing late or never, and the faults that broke
// summaries before (a stream purged, whole or of the batches' subject, a
// message deleted, the stream made again or restored from an older
// backup, replicas with their own creation times, limits, the
// publication changed between two checks, the slot lost or dropped, the
// database put back with its slot, a failover to a standby with its
// slot or without, and short of the last transactions). After every step: no token is twice on the
// stream, the slot is never confirmed past a token not acknowledged, and
// no session streams where the record refuses the slot. At the end, the
// faults stopped and the processes left to run: every token is on the
// stream once, or a refusal stands (and only for a fault that calls for
// one), and after its way out every token is. A failing schedule logs
// its steps.
func (p Profile) Schedule(rt *rapid.T) {
	m := &machine{w: newWorld(0), faults: rapid.IntRange(0, p.MaxFaults).Draw(rt, "faults"), kinds: p.kinds()}
	switch rapid.IntRange(0, 5).Draw(rt, "limited") {
	case 0:
		m.w.stream.limit(12, false)
	case 1:
		// Discard new, a limit never reached: it removes nothing.
		m.w.stream.limit(1000, true)
	}
	m.w.closing = func() bool { return rapid.Bool().Draw(rt, "lands as its session ends") }
	m.inFlight = func(t *rapid.T) int { return rapid.IntRange(p.InFlight[0], p.InFlight[1]).Draw(t, "max in flight") }
	m.start(rt)
	defer func() {
		r := recover()
		if r != nil || rt.Failed() {
			rt.Logf("schedule:\n%s", strings.Join(m.w.trace, "\n"))
		}
		if r != nil {
			panic(r)
		}
	}()
	rt.Repeat(p.weigh(m.actions()))
	m.settle(rt)
}

// kinds are the faults p draws from.
func (p Profile) kinds() []faultKind {
	if p.Faults == nil {
		return faultKinds
	}
	var out []faultKind
	for _, k := range faultKinds {
		if slices.Contains(p.Faults, k.name) {
			out = append(out, k)
		}
	}
	if len(out) != len(p.Faults) {
		panic(fmt.Sprintf("profile %s names faults that do not exist: %v", p.Name, p.Faults))
	}
	return out
}

// weigh repeats each action of actions as often as p weighs it (rapid
// draws among their names alike).
func (p Profile) weigh(actions map[string]func(*rapid.T)) map[string]func(*rapid.T) {
	out := map[string]func(*rapid.T){}
	for name, f := range actions {
		n, ok := p.Weights[name]
		if !ok || name == "" {
			n = 1
		}
		for i := range n {
			out[name+strings.Repeat("'", i)] = f
		}
	}
	return out
}

// machine is the state machine rapid drives.
type machine struct {
	w *world
	// faults is how many faults the schedule may still inject, of kinds.
	faults int
	kinds  []faultKind
	// inFlight draws a process's MaxInFlight: each its own, as a
	// tailer restarted with other settings.
	inFlight func(*rapid.T) int
}

func (m *machine) start(t *rapid.T) {
	w := m.w
	p := newProc(w, len(w.procs)+1, m.inFlight(t))
	w.procs = append(w.procs, p)
	w.say("process %d starts", p.id)
}

// alive are the processes that have not been killed or exited.
func (m *machine) alive() []*simProc {
	var out []*simProc
	for _, p := range m.w.procs {
		if p.alive && !p.exited {
			out = append(out, p)
		}
	}
	return out
}

func (m *machine) actions() map[string]func(*rapid.T) {
	w := m.w
	return map[string]func(*rapid.T){
		"": m.invariants,
		"commit": func(t *rapid.T) {
			w.db.commit(rapid.IntRange(1, 3).Draw(t, "tokens"))
			w.say("commit of %d tokens at %s", len(w.db.txs[len(w.db.txs)-1].toks), w.db.txs[len(w.db.txs)-1].commit)
		},
		"step": func(t *rapid.T) {
			ps := m.runnable()
			if len(ps) == 0 {
				t.Skip("nothing runs")
			}
			p := rapid.SampledFrom(ps).Draw(t, "process")
			for range rapid.IntRange(1, 24).Draw(t, "steps") {
				p.step()
			}
		},
		"deliver": func(t *rapid.T) {
			if len(w.net) == 0 {
				t.Skip("nothing on its way")
			}
			w.deliver(rapid.IntRange(0, len(w.net)-1).Draw(t, "flight"))
		},
		"tick": func(*rapid.T) { m.pass(time.Second) },
		// Long enough for a frozen holder's lease to lapse.
		"time passes": func(*rapid.T) { m.pass(10 * time.Second) },
		"kill":        m.kill,
		"freeze":      m.freeze,
		"fault":       m.fault,
		"resync":      m.operatorResync,
	}
}

// pass lets d pass: every process that is not frozen looks at what it
// streams through.
func (m *machine) pass(d time.Duration) {
	m.w.now += d
	for _, p := range m.alive() {
		if !p.frozen {
			p.check()
		}
	}
}

func (m *machine) runnable() []*simProc {
	var out []*simProc
	for _, p := range m.alive() {
		if p.runnable() {
			out = append(out, p)
		}
	}
	return out
}

// kill kills a process (SIGKILL): its connection closes, and the server
// takes what reached it before (each of its publishes on their way lands
// now, in order, or never); a new one starts, as a supervisor does. A
// frozen process's publishes, instead, stay on their way for as long as
// it is frozen.
func (m *machine) kill(t *rapid.T) {
	ps := m.alive()
	if len(ps) == 0 {
		t.Skip("none alive")
	}
	p := rapid.SampledFrom(ps).Draw(t, "killed")
	p.alive = false
	if m.w.lease == p {
		m.w.lease = nil
	}
	m.w.say("process %d killed", p.id)
	reached := rapid.IntRange(0, len(m.w.net)).Draw(t, "reached")
	for i := 0; i < len(m.w.net); {
		if m.w.net[i].s.p != p {
			i++
			continue
		}
		if reached > 0 {
			reached--
			m.w.deliver(i)
			continue
		}
		m.w.net = append(m.w.net[:i], m.w.net[i+1:]...)
	}
	if len(m.alive()) < 2 {
		m.start(t)
	}
}

// freeze freezes a process (SIGSTOP) or thaws a frozen one; a standby
// starts beside a frozen holder.
func (m *machine) freeze(t *rapid.T) {
	ps := m.alive()
	if len(ps) == 0 {
		t.Skip("none alive")
	}
	p := rapid.SampledFrom(ps).Draw(t, "frozen")
	p.frozen = !p.frozen
	if p.frozen && m.w.lease == p {
		m.w.leaseUntil = m.w.now + 20*time.Second
	}
	m.w.say("process %d frozen: %v", p.id, p.frozen)
	if p.frozen && len(m.alive()) < 2 {
		m.start(t)
	}
}

// freezeHolder freezes the lease's holder for longer than the lease
// outlives it (SIGSTOP past idle_session_timeout): its publishes stay on
// their way, and a standby may take the slot over.
func (m *machine) freezeHolder(t *rapid.T) {
	p := m.w.lease
	if p == nil || p.frozen {
		t.Skip("no running holder")
	}
	p.frozen, m.w.leaseUntil = true, m.w.now
	m.w.say("process %d, the holder, frozen past its lease", p.id)
	if len(m.alive()) < 2 {
		m.start(t)
	}
	m.pass(20 * time.Second)
}

// operatorResync is tailer resync, run by the operator while no tailer
// holds the slot.
func (m *machine) operatorResync(t *rapid.T) {
	w := m.w
	if w.lease != nil && !w.lease.frozen || w.lease != nil && w.now < w.leaseUntil {
		t.Skip("a tailer holds the slot")
	}
	w.lease = nil
	w.resync()
}

// invariants hold after every step.
func (m *machine) invariants(t *rapid.T) {
	w := m.w
	for k, n := range w.stream.keys() {
		if n > 1 && !w.strayDup[k] {
			t.Fatalf("token %s is %d times on the stream", k, n)
		}
	}
	if w.db.slot == nil {
		return
	}
	for _, tx := range w.db.txs {
		if !tx.inSlot || tx.commit <= w.db.slot.made || tx.commit > w.db.slot.confirmed {
			continue
		}
		for _, k := range tx.toks {
			if !w.acked[k.key] && !w.skipped[k.key] {
				t.Fatalf("the slot is confirmed at %s, past token %s at %s, which no PubAck acknowledged", w.db.slot.confirmed, k.key, k.pos)
			}
		}
	}
}

// settle stops the faults and lets the processes run: every token must
// reach the stream once, or a refusal stand; after its way out, every
// token is on the stream.
func (m *machine) settle(t *rapid.T) {
	w := m.w
	for _, p := range w.procs {
		p.frozen = false
	}
	if len(m.alive()) == 0 {
		m.start(t)
	}
	w.say("settling")
	m.run(t)
	if m.refused() && !w.causes && !(w.limited && m.refusedFor(relay.WindowTrimmed)) {
		t.Fatalf("a refusal stands, and no fault called for one: %v", m.refusals())
	}
	if origin, end, ok := w.pastBranch(); ok && !m.refused() {
		t.Fatalf("the stream holds batches published from %s past %s, where a failover left that timeline, and no refusal stands", origin, end)
	}
	if missing := m.missing(); len(missing) > 0 {
		if !m.refused() {
			t.Fatalf("%d tokens are not on the stream (%v), and no refusal stands (the stream lost acknowledged batches: %v)", len(missing), missing, w.lost)
		}
		w.say("a refusal stands: the operator runs tailer resync")
		for _, p := range m.alive() {
			p.alive = false
		}
		w.lease = nil
		w.resync()
		m.start(t)
		m.run(t)
		if missing := m.missing(); len(missing) > 0 {
			t.Fatalf("after tailer resync, %d tokens are not on the stream: %v", len(missing), missing)
		}
	}
}

// run lets time pass and the processes work until nothing is left to do.
func (m *machine) run(t *rapid.T) {
	w := m.w
	idle := 0
	for round := 0; round < 400; round++ {
		for len(w.net) > 0 {
			w.deliver(0)
		}
		before := m.fingerprint()
		for _, p := range m.alive() {
			for range 20 {
				p.step()
			}
		}
		if m.fingerprint() != before || len(w.net) > 0 {
			idle = 0
			continue
		}
		// Idle: time passes, and the checks look; quiet after two looks
		// found nothing to do.
		if idle++; idle > 2 && m.quiet() {
			return
		}
		w.now += time.Second
		for _, p := range m.alive() {
			p.check()
		}
	}
	t.Fatalf("the processes did not settle: %v", m.state())
}

// quiet reports whether every process waits between sessions, refused or
// standing by, or streams with nothing left to publish or confirm.
func (m *machine) quiet() bool {
	w := m.w
	for _, p := range m.alive() {
		if p.s != nil && p.s.streaming {
			if p.s.queued() > 0 || p.s.pending > 0 || len(p.s.acks) > 0 || w.db.slot == nil || w.db.slot.confirmed < w.db.wal() {
				return false
			}
		}
	}
	streams := slices.ContainsFunc(m.alive(), func(p *simProc) bool { return p.s != nil && p.s.streaming })
	stale := slices.ContainsFunc(m.alive(), func(p *simProc) bool { return p.refused != nil && p.refusedAt < w.resyncs })
	return (streams || m.refused()) && !stale
}

// refused reports whether a refusal stands: no process streams, and one
// says why.
func (m *machine) refused() bool {
	refused := false
	for _, p := range m.alive() {
		if p.s != nil && p.s.streaming {
			return false
		}
		refused = refused || p.refused != nil
	}
	return refused
}

// missing are the committed tokens the stream does not hold (but those
// its limits removed).
func (m *machine) missing() []string {
	on := m.w.stream.keys()
	var out []string
	for k := range m.w.db.eligible() {
		if on[k] == 0 && !m.w.trimmed[k] && !m.w.unseen[k] {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

func (m *machine) state() string {
	var b strings.Builder
	for _, p := range m.w.procs {
		fmt.Fprintf(&b, "process %d alive %v frozen %v exited %v session %v cmds %d; ", p.id, p.alive, p.frozen, p.exited, p.s != nil, len(p.cmds))
	}
	return b.String()
}

// fingerprint is what a round of steps changes when it gets anything
// done (a standby asking for the lease, or a refused process looking
// again, changes none of it).
func (m *machine) fingerprint() string {
	w := m.w
	streaming := 0
	for _, p := range m.alive() {
		if p.s != nil && p.s.streaming {
			streaming++
		}
	}
	confirmed := wal.LSN(0)
	if w.db.slot != nil {
		confirmed = w.db.slot.confirmed
	}
	return fmt.Sprintf("%d/%d/%s/%d/%d/%d/%+v", w.stream.last, len(w.stream.msgs), confirmed, len(w.acked), streaming, len(w.net), w.db.rec)
}

// refusedFor reports whether every refusal standing is of fact f.
func (m *machine) refusedFor(f relay.Fact) bool {
	for _, p := range m.alive() {
		if p.refused != nil && p.refused.Fact != f {
			return false
		}
	}
	return true
}

// refusals are what the processes say.
func (m *machine) refusals() []string {
	var out []string
	for _, p := range m.alive() {
		if p.refused != nil {
			out = append(out, p.refused.Error())
		}
	}
	return out
}
