package sim

import (
	"fmt"
	"slices"
	"strings"
	"syscall"
	"time"

	"pgregory.net/rapid"
)

// Profile narrows the schedules rapid draws to a part of the space: the
// faults drawn from and how many, how long a sink takes a line, and how
// often each action is drawn.
type Profile struct {
	Name      string
	Faults    []string
	MaxFaults int
	// LineTime is the range of the sink's time for a line.
	LineTime [2]time.Duration
	// Standbys: at least two processes (else one to three).
	Standbys bool
	// Weights draws an action that many times as often (default 1).
	Weights map[string]int
	// Resend: the processes are tailer dead-letters resend runs, on a
	// stream of dead letters, each ending once drained.
	Resend bool
}

var allFaults = []string{"kill", "stop", "freeze", "sender killed", "sender fails", "sender stalls", "stream made again", "purge", "a message deleted", "bucket unanswered", "bucket answers lost"}

// Profiles are the schedules TestSimulation runs, each as many times.
var Profiles = []Profile{
	{Name: "everything", Faults: allFaults, MaxFaults: 3, LineTime: [2]time.Duration{10 * time.Millisecond, 2 * time.Second}},
	// A sender slower than the pinned TTL, and a consumer's ack wait
	// shorter than the subscriber's flag.
	{Name: "slow sender", Faults: []string{"kill", "freeze", "sender killed", "sender stalls"}, MaxFaults: 1,
		LineTime: [2]time.Duration{3 * time.Second, 40 * time.Second}, Weights: map[string]int{"time passes": 3}},
	{Name: "senders", Faults: []string{"sender killed", "sender fails", "sender stalls", "kill"}, MaxFaults: 5,
		LineTime: [2]time.Duration{10 * time.Millisecond, 3 * time.Second}, Weights: map[string]int{"fault": 4}},
	{Name: "stream", Faults: []string{"stream made again", "purge", "a message deleted", "bucket unanswered", "kill"}, MaxFaults: 3,
		LineTime: [2]time.Duration{10 * time.Millisecond, 2 * time.Second}, Weights: map[string]int{"fault": 3, "saver": 0}},
	// Saves that wait on a bucket that does not answer, under senders
	// quicker than the saver's second.
	{Name: "saves", Faults: []string{"bucket unanswered", "bucket answers lost", "kill"}, MaxFaults: 3,
		LineTime: [2]time.Duration{10 * time.Millisecond, time.Second}, Weights: map[string]int{"fault": 2, "tick": 3}},
	// A stream made again under a pinned subscriber and its standbys,
	// one killed before it saved what it decided.
	{Name: "rebuilt under standbys", Faults: []string{"stream made again", "kill", "stop"}, MaxFaults: 3, Standbys: true,
		LineTime: [2]time.Duration{10 * time.Millisecond, time.Second}, Weights: map[string]int{"fault": 2, "saver": 0}},
	// The same, the pinned one frozen across it while the bucket does
	// not answer: it saves the old record as it wakes.
	{Name: "frozen across a rebuild", Faults: []string{"stream made again", "freeze", "bucket unanswered"}, MaxFaults: 3, Standbys: true,
		LineTime: [2]time.Duration{10 * time.Millisecond, time.Second}, Weights: map[string]int{"fault": 3, "saver": 0}},
	// The pin passing between a pinned subscriber and its standbys:
	// frozen past the TTL, stopped cleanly (a stale pin among them),
	// killed, started again.
	{Name: "takeovers", Faults: []string{"freeze", "stop", "kill"}, MaxFaults: 4, Standbys: true,
		LineTime: [2]time.Duration{10 * time.Millisecond, 2 * time.Second}, Weights: map[string]int{"fault": 3, "start": 2}},
	{Name: "processes", Faults: []string{"kill", "stop", "freeze", "bucket unanswered", "bucket answers lost"}, MaxFaults: 3,
		LineTime: [2]time.Duration{10 * time.Millisecond, 3 * time.Second}, Weights: map[string]int{"fault": 3, "start": 2}},
	// Two or three resends at once on one durable's dead letters, their
	// acks slow to land, killed, frozen, their senders killed or
	// failing, run again.
	{Name: "resends", Faults: []string{"kill", "freeze", "sender killed", "sender fails"}, MaxFaults: 4, Standbys: true, Resend: true,
		LineTime: [2]time.Duration{10 * time.Millisecond, time.Second}, Weights: map[string]int{"fault": 2, "start": 2}},
}

// Schedule runs one schedule of p: tailer subscribe processes composing
// the decisions of publish/subscriber/protocol against the models, tokens
// published, time passing, and p's faults. After every step: no batch
// into a sender is written again but one a process that handed it let
// go of (at most MaxDoneUnsaved and the line in hand each time), none
// into an inbox twice, no message acknowledged with a batch not written
// or set aside, none set aside before max deliveries senders failed
// with it, and progress within a bound while a process runs and its
// sink accepts. At the end, the faults stopped and the processes left
// to run: every batch written or set aside, or a refusal stands for a
// stream made again. A failing schedule logs its steps.
func (p Profile) Schedule(rt *rapid.T) {
	w := newWorld(p.config(rt))
	least := 1
	if p.Standbys {
		least = 2
	}
	if p.Resend {
		for range rapid.IntRange(1, 5).Draw(rt, "dead letters") {
			w.publish(1, rapid.IntRange(1, 2).Draw(rt, "tokens"))
		}
	}
	for i := range rapid.IntRange(least, 3).Draw(rt, "processes") {
		w.procs = append(w.procs, &proc{w: w, id: i, alive: true})
	}
	s := &schedule{w: w, faults: rapid.IntRange(0, p.MaxFaults).Draw(rt, "faults"), kinds: p.Faults}
	defer func() {
		if r := recover(); r != nil || rt.Failed() {
			rt.Logf("config %+v\nschedule:\n%s", w.cfg, strings.Join(w.trace, "\n"))
			if r != nil {
				panic(r)
			}
		}
	}()
	rt.Repeat(p.weigh(s.actions()))
	s.settle(rt)
}

func (p Profile) config(rt *rapid.T) config {
	d := func(name string, ds ...time.Duration) time.Duration { return rapid.SampledFrom(ds).Draw(rt, name) }
	if p.Resend {
		// A resend reads a dead-letter stream from its first message,
		// sets nothing aside, and hands on to a sender.
		return config{
			resend:       true,
			ackDelay:     time.Duration(rapid.IntRange(1, 300).Draw(rt, "ack delay ms")) * time.Millisecond,
			lineTime:     time.Duration(rapid.Int64Range(int64(p.LineTime[0]), int64(p.LineTime[1])).Draw(rt, "line time")).Round(time.Millisecond),
			ttl:          d("pinned ttl", 5*time.Second, 10*time.Second),
			ackWait:      d("ack wait", 3*time.Second, 10*time.Second, 30*time.Second),
			fromStart:    true,
			stallTimeout: d("--stall-timeout", 10*time.Second, 30*time.Second, 2*time.Minute),
		}
	}
	return config{
		inbox:         rapid.IntRange(0, 2).Draw(rt, "inbox") == 0,
		lineTime:      time.Duration(rapid.Int64Range(int64(p.LineTime[0]), int64(p.LineTime[1])).Draw(rt, "line time")).Round(time.Millisecond),
		ttl:           d("pinned ttl", 5*time.Second, 10*time.Second),
		ackWait:       d("ack wait", 3*time.Second, 10*time.Second, 30*time.Second),
		ackWaitFlag:   d("--ack-wait", 0, 3*time.Second, 30*time.Second),
		maxDeliveries: rapid.IntRange(0, 3).Draw(rt, "max deliveries"),
		fromStart:     rapid.Bool().Draw(rt, "from start"),
		stallTimeout:  d("--stall-timeout", 10*time.Second, 30*time.Second, 2*time.Minute),
	}
}

// weigh repeats each action as often as p weighs it; a fault's weight is
// "fault"'s.
func (p Profile) weigh(actions map[string]func(*rapid.T)) map[string]func(*rapid.T) {
	out := map[string]func(*rapid.T){}
	for name, f := range actions {
		n, ok := p.Weights[name]
		if slices.Contains(allFaults, name) {
			n, ok = p.Weights["fault"]
		}
		if !ok {
			n = 1
		}
		for i := range n {
			out[name+strings.Repeat("'", i)] = f
		}
	}
	return out
}

type schedule struct {
	w      *world
	faults int
	kinds  []string
}

func (s *schedule) actions() map[string]func(*rapid.T) {
	w := s.w
	a := map[string]func(*rapid.T){
		"publish": func(t *rapid.T) {
			if len(w.stream.msgs) >= 10 {
				s.idle(t)
				return
			}
			batches := 1
			if !w.cfg.resend {
				batches = rapid.IntRange(1, 3).Draw(t, "batches")
			}
			w.publish(batches, rapid.IntRange(1, 2).Draw(t, "tokens"))
			s.advance(t, 0)
		},
		"tick":        func(t *rapid.T) { s.advance(t, time.Duration(rapid.IntRange(1, 1000).Draw(t, "ms"))*time.Millisecond) },
		"time passes": func(t *rapid.T) { s.advance(t, time.Duration(rapid.IntRange(1, 20).Draw(t, "s"))*time.Second) },
		"saver": func(t *rapid.T) {
			p := s.pick(t, func(p *proc) bool { return p.runs() && p.loaded })
			if p == nil {
				s.idle(t)
				return
			}
			w.logf("p%d's saver runs", p.id)
			p.saverTick()
			s.advance(t, 0)
		},
		"start": func(t *rapid.T) {
			p := s.pick(t, func(p *proc) bool { return !p.alive || p.exited })
			if p == nil {
				s.idle(t)
				return
			}
			p.runAgain()
			// A fault that lasts (a freeze, a stall) still does.
			w.lastFault = max(w.lastFault, w.now)
			w.logf("p%d started", p.id)
			s.advance(t, 0)
		},
	}
	for _, k := range s.kinds {
		a[k] = func(t *rapid.T) {
			if s.faults == 0 || !s.fault(t, k) {
				s.idle(t)
				return
			}
			s.faults--
			w.lastFault = max(w.lastFault, w.now)
			s.advance(t, 0)
		}
	}
	return a
}

// fault injects the fault named k, if it can be now.
func (s *schedule) fault(t *rapid.T, k string) bool {
	w := s.w
	switch k {
	case "kill":
		p := s.pick(t, func(p *proc) bool { return p.alive })
		if p == nil {
			return false
		}
		p.kill(rapid.Bool().Draw(t, "its line landed"))
	case "stop":
		p := s.pick(t, func(p *proc) bool { return p.runs() })
		if p == nil {
			return false
		}
		p.stop()
	case "freeze":
		p := s.pick(t, func(p *proc) bool { return p.runs() })
		if p == nil {
			return false
		}
		d := time.Duration(rapid.IntRange(1, 40).Draw(t, "frozen s")) * time.Second
		w.freeze(p, d)
	case "sender killed", "sender fails":
		p := s.pick(t, func(p *proc) bool { return p.runs() && p.inHand != nil && !p.senderDown })
		if p == nil {
			return false
		}
		if k == "sender fails" {
			// Each way docs/consumers.md's table says a sender exits
			// with a batch in hand: the count of failures is the
			// world's own (senderEnd.counts), the fate the core's.
			p.senderEnds(rapid.SampledFrom(senderEnds).Draw(t, "how"), false)
		} else {
			p.senderEnds(senderEnd{sig: syscall.SIGKILL}, rapid.Bool().Draw(t, "its line written"))
		}
	case "sender stalls":
		// It takes no byte more and finishes nothing for a while.
		p := s.pick(t, func(p *proc) bool { return p.runs() && p.inHand != nil && !p.senderDown })
		if p == nil {
			return false
		}
		p.stuckUntil = w.now + time.Duration(rapid.IntRange(5, 180).Draw(t, "stalled s"))*time.Second
		w.lastFault = max(w.lastFault, p.stuckUntil)
		w.logf("p%d's sender stalls until %s", p.id, p.stuckUntil)
	case "stream made again":
		w.stream = &streamModel{inc: w.stream.inc + 1, msgs: map[uint64]*smsg{}}
		if w.dur != nil {
			w.dur.gone = true
		}
		w.rebuilt = true
		w.logf("the stream made again")
	case "purge":
		w.stream.msgs = map[uint64]*smsg{}
		if w.dur != nil {
			w.dur.purged(w.stream.last)
		}
		w.logf("the stream purged")
	case "a message deleted":
		seq := uint64(rapid.IntRange(1, int(max(w.stream.last, 1))).Draw(t, "deleted seq"))
		delete(w.stream.msgs, seq)
		w.logf("seq %d deleted", seq)
	case "bucket unanswered":
		d := time.Duration(rapid.IntRange(1, 20).Draw(t, "unanswered s")) * time.Second
		w.kv.downUntil = w.now + d
		w.lastFault = max(w.lastFault, w.now+d)
		w.logf("the bucket does not answer for %s", d)
	case "bucket answers lost":
		// Writes land, and neither their answers nor reads come back:
		// a leader cut off after it stored the write.
		d := time.Duration(rapid.IntRange(1, 10).Draw(t, "answers lost s")) * time.Second
		w.kv.lostUntil = w.now + d
		w.lastFault = max(w.lastFault, w.now+d)
		w.logf("the bucket's answers are lost for %s", d)
	default:
		panic(fmt.Sprintf("no fault %q", k))
	}
	return true
}

func (s *schedule) pick(t *rapid.T, ok func(*proc) bool) *proc {
	var cands []*proc
	for _, p := range s.w.procs {
		if ok(p) {
			cands = append(cands, p)
		}
	}
	if len(cands) == 0 {
		return nil
	}
	return rapid.SampledFrom(cands).Draw(t, "process")
}

// idle lets a little time pass, for an action that cannot be taken now:
// skipped, too many in a row would end the schedule.
func (s *schedule) idle(t *rapid.T) {
	s.advance(t, time.Duration(rapid.IntRange(1, 500).Draw(t, "idle ms"))*time.Millisecond)
}

func (s *schedule) advance(t *rapid.T, d time.Duration) {
	s.w.advance(d)
	if s.w.violation != "" {
		t.Fatal(s.w.violation)
	}
}

// settle stops the faults and lets the processes run until every batch
// is written or set aside, then checks the end.
func (s *schedule) settle(t *rapid.T) {
	w := s.w
	w.logf("faults stop; the processes run")
	w.kv.downUntil, w.kv.lostUntil = 0, 0
	for _, p := range w.procs {
		p.alive, p.frozenUntil, p.stuckUntil = true, min(p.frozenUntil, w.now), min(p.stuckUntil, w.now)
	}
	w.lastFault = w.now
	if w.cfg.resend {
		s.settleResends(t)
		return
	}
	for i := 0; i < 200 && w.outstanding(); i++ {
		s.advance(t, 30*time.Second)
	}
	refused := slices.ContainsFunc(w.procs, func(p *proc) bool { return p.refused != "" })
	if refused && !w.rebuilt {
		t.Fatal("a subscriber refused, and no stream was made again")
	}
	if w.outstanding() && !refused {
		t.Fatalf("batches neither written nor set aside after the faults stopped (%s of running)", w.now)
	}
}

// settleResends runs every resend again that is not running, as an
// operator would, until each ended drained: then no dead letter is
// listed, and each was written.
func (s *schedule) settleResends(t *rapid.T) {
	w := s.w
	for _, p := range w.procs {
		if p.exited {
			p.runAgain()
		}
	}
	running := func() bool { return slices.ContainsFunc(w.procs, func(p *proc) bool { return !p.exited }) }
	for i := 0; i < 200 && running(); i++ {
		s.advance(t, 30*time.Second)
		for _, p := range w.procs {
			if p.refused != "" || p.gaveUp {
				t.Fatalf("p%d stopped after the faults: %s (gave up: %v)", p.id, p.refused, p.gaveUp)
			}
		}
	}
	if running() {
		t.Fatalf("resends still running after the faults stopped (%s of running)", w.now)
	}
	if w.outstanding() {
		t.Fatal("dead letters neither written nor removed after every resend ended drained")
	}
}
