package protocol

import (
	"syscall"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// A message done before is acknowledged and nothing of it handed on;
// otherwise each batch has one fate: a batch done is never handed on
// again, one on which MaxDeliveries readers failed is set aside when
// there is somewhere to set it, one with nothing for the sink is done as
// it is, and every other is handed on.
func TestPlan(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		batches := rapid.SliceOfN(rapid.Custom(func(t *rapid.T) PlanBatch {
			return PlanBatch{Done: rapid.Bool().Draw(t, "done"), Attempts: rapid.IntRange(0, 4).Draw(t, "attempts"), Tokens: rapid.IntRange(0, 3).Draw(t, "tokens")}
		}), 0, 6).Draw(t, "batches")
		m := Delivery{Seq: rapid.Uint64Range(1, 10).Draw(t, "seq"), Floor: rapid.Uint64Range(0, 10).Draw(t, "floor"), Acked: rapid.Bool().Draw(t, "acked"),
			Held: rapid.Bool().Draw(t, "held"), Batches: batches}
		r := Rules{MaxDeliveries: rapid.IntRange(0, 3).Draw(t, "max deliveries"), DeadLetters: rapid.Bool().Draw(t, "dead letters")}
		fates, ack := Plan(m, r)
		allDone := true
		for _, b := range batches {
			allDone = allDone && b.Done
		}
		if want := m.Seq <= m.Floor || m.Acked || allDone; ack != want {
			t.Fatalf("acknowledge %v, want %v", ack, want)
		}
		if ack || m.Held {
			if fates != nil {
				t.Fatalf("a message done before or held has fates %v", fates)
			}
			return
		}
		if len(fates) != len(batches) {
			t.Fatalf("%d fates for %d batches", len(fates), len(batches))
		}
		for i, b := range batches {
			var want Fate
			switch {
			case b.Done:
				want = DoneBefore
			case r.MaxDeliveries > 0 && r.DeadLetters && b.Attempts >= r.MaxDeliveries:
				want = SetAside
			case b.Tokens == 0:
				want = NothingForSink
			default:
				want = Hand
			}
			if fates[i] != want {
				t.Fatalf("batch %d %+v: fate %d, want %d", i, b, fates[i], want)
			}
		}
	})
}

// Scenarios of the plan, each a past loss or repeat.
func TestPlanScenarios(t *testing.T) {
	for _, tc := range []struct {
		name  string
		m     Delivery
		r     Rules
		fates []Fate
		ack   bool
	}{
		{name: "below the floor (a consumer made again below it)", m: Delivery{Seq: 3, Floor: 3, Batches: []PlanBatch{{Tokens: 1}}}, ack: true},
		{name: "acknowledged before, its ack lost", m: Delivery{Seq: 4, Floor: 3, Acked: true, Batches: []PlanBatch{{Tokens: 1}}}, ack: true},
		{name: "every batch done by a subscriber that died before its ack", m: Delivery{Seq: 4, Floor: 3, Batches: []PlanBatch{{Done: true}, {Done: true}}}, ack: true},
		{name: "redelivered after a reader died: the batch done is skipped", m: Delivery{Seq: 4, Floor: 3, Batches: []PlanBatch{{Done: true, Tokens: 2}, {Tokens: 1, Attempts: 1}}},
			fates: []Fate{DoneBefore, Hand}},
		{name: "a batch failed as often as allowed is set aside", m: Delivery{Seq: 4, Batches: []PlanBatch{{Tokens: 1, Attempts: 2}, {Tokens: 1, Attempts: 1}}},
			r: Rules{MaxDeliveries: 2, DeadLetters: true}, fates: []Fate{SetAside, Hand}},
		{name: "nowhere to set it aside: handed again", m: Delivery{Seq: 4, Batches: []PlanBatch{{Tokens: 1, Attempts: 2}}},
			r: Rules{MaxDeliveries: 2}, fates: []Fate{Hand}},
		{name: "held, delivered again: nothing handed again", m: Delivery{Seq: 4, Floor: 3, Held: true, Batches: []PlanBatch{{Done: true, Tokens: 1}, {Tokens: 1}}}},
		{name: "held and done: acknowledged again", m: Delivery{Seq: 4, Floor: 3, Held: true, Batches: []PlanBatch{{Done: true, Tokens: 1}}}, ack: true},
		{name: "a batch of another action", m: Delivery{Seq: 4, Batches: []PlanBatch{{Tokens: 0}, {Tokens: 1}}}, fates: []Fate{NothingForSink, Hand}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fates, ack := Plan(tc.m, tc.r)
			if ack != tc.ack || len(fates) != len(tc.fates) {
				t.Fatalf("Plan = %v, %v; want %v, %v", fates, ack, tc.fates, tc.ack)
			}
			for i := range fates {
				if fates[i] != tc.fates[i] {
					t.Fatalf("Plan = %v; want %v", fates, tc.fates)
				}
			}
		})
	}
}

// The record is read again at a new pin, or after more than a second
// idle with nothing in hand; what was read is taken over only while this
// subscriber holds nothing, and kept as its own only when nobody wrote.
func TestRecordDecisions(t *testing.T) {
	for _, tc := range []struct {
		pin, holding bool
		idle         time.Duration
		stale        bool
	}{
		{pin: true, holding: true, stale: true},
		{pin: true, stale: true},
		{idle: time.Second},
		{idle: time.Second + 1, stale: true},
		{holding: true, idle: time.Hour},
	} {
		if got := MustReread(tc.pin, tc.holding, tc.idle); got != tc.stale {
			t.Errorf("MustReread(%v, %v, %s) = %v", tc.pin, tc.holding, tc.idle, got)
		}
	}
	for _, tc := range []struct {
		holding, mine bool
		want          Reread
	}{
		{holding: true, mine: false, want: TakenOver},
		{holding: true, mine: true, want: KeepOwn},
		{holding: false, mine: true, want: KeepOwn},
		{holding: false, mine: false, want: Merge},
	} {
		if got := AfterReread(tc.holding, tc.mine); got != tc.want {
			t.Errorf("AfterReread(%v, %v) = %d, want %d", tc.holding, tc.mine, got, tc.want)
		}
	}
	for _, tc := range []struct {
		serial bool
		n      int
		want   bool
	}{{true, 0, false}, {true, 1, true}, {true, 2, true}, {false, 5, false}} {
		if got := SaveFirst(tc.serial, tc.n); got != tc.want {
			t.Errorf("SaveFirst(%v, %d) = %v", tc.serial, tc.n, got)
		}
	}
}

// The messages in hand are kept by the consumer's own ack wait, whatever
// the subscriber's setting (issue 62: every token 2-4 times by the
// flag's); the pin by a quarter of its TTL; a pull waits 5 s, under a pin
// at most half its TTL.
func TestCadences(t *testing.T) {
	for _, tc := range []struct{ consumer, setting, def, want time.Duration }{
		{3 * time.Second, 30 * time.Second, 10 * time.Second, time.Second},
		{0, 6 * time.Second, 10 * time.Second, 2 * time.Second},
		{0, 0, 9 * time.Second, 3 * time.Second},
		{0, 0, 0, 0},
	} {
		if got := InProgressEvery(tc.consumer, tc.setting, tc.def); got != tc.want {
			t.Errorf("InProgressEvery(%s, %s, %s) = %s, want %s", tc.consumer, tc.setting, tc.def, got, tc.want)
		}
	}
	for _, tc := range []struct{ ttl, want time.Duration }{{10 * time.Second, 2500 * time.Millisecond}, {0, 0}, {-time.Second, 0}} {
		if got := KeepPinEvery(tc.ttl); got != tc.want {
			t.Errorf("KeepPinEvery(%s) = %s, want %s", tc.ttl, got, tc.want)
		}
	}
	for _, tc := range []struct{ ttl, want time.Duration }{{0, 5 * time.Second}, {4 * time.Second, 2 * time.Second}, {10 * time.Second, 5 * time.Second}, {30 * time.Second, 5 * time.Second}} {
		if got := PullExpiry(tc.ttl); got != tc.want {
			t.Errorf("PullExpiry(%s) = %s, want %s", tc.ttl, got, tc.want)
		}
	}
}

// A sender's exit: 0 or a transient code is its own choice, a signal
// from outside says nothing of the batch (issue 64: a killed sender was
// counted as a failure), anything else fails the batch it held.
func TestEndOfSender(t *testing.T) {
	for _, tc := range []struct {
		code      int
		transient bool
		sig       syscall.Signal
		want      SenderEnd
	}{
		{code: 0, want: SenderFinished},
		{code: 75, transient: true, want: SenderStopped},
		{code: 1, want: SenderFailed},
		{code: 137, sig: syscall.SIGKILL, want: SenderKilled},
		{code: 143, sig: syscall.SIGTERM, want: SenderKilled},
		{code: 130, sig: syscall.SIGINT, want: SenderKilled},
		{code: 129, sig: syscall.SIGHUP, want: SenderKilled},
		{code: 139, sig: syscall.SIGSEGV, want: SenderFailed},
		{code: 134, sig: syscall.SIGABRT, want: SenderFailed},
	} {
		if got := EndOfSender(tc.code, tc.transient, tc.sig); got != tc.want {
			t.Errorf("EndOfSender(%d, %v, %v) = %d, want %d", tc.code, tc.transient, tc.sig, got, tc.want)
		}
	}
}

// A sender that got through a batch starts again at once; one that did
// not waits twice as long each time, from 250 ms to 10 s.
func TestRestartIn(t *testing.T) {
	var waits []time.Duration
	d := time.Duration(0)
	for range 8 {
		d = RestartIn(d, false)
		waits = append(waits, d)
	}
	want := []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second}
	for i := range want {
		if waits[i] != want[i] {
			t.Fatalf("waits %v, want %v", waits, want)
		}
	}
	if got := RestartIn(10*time.Second, true); got != 0 {
		t.Fatalf("after a batch: %s", got)
	}
}

// A reader is stalled only while lines wait for it and it neither takes
// a byte of them nor finishes a batch for longer than the timeout: an
// idle one never is, a slow one that finishes a batch within the timeout
// never is (issue 62: a slow sender is not a dead one), and one that
// stops moving with lines waiting is, within the timeout and a look.
func TestStall(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		d := time.Duration(rapid.IntRange(1, 10).Draw(t, "timeout s")) * time.Second
		var s Stall
		now := time.Unix(1000, 0)
		unread, handed, finished := 0, 0, 0
		// moved is the look at which it last moved, had nothing waiting,
		// or had lines waiting first: lines that came between two looks
		// count from the second.
		var moved time.Time
		wasWaiting := false
		for range rapid.IntRange(1, 40).Draw(t, "looks") {
			now = now.Add(time.Duration(rapid.IntRange(0, 4000).Draw(t, "ms")) * time.Millisecond)
			switch rapid.IntRange(0, 3).Draw(t, "reader") {
			case 0: // lines arrive in its pipe
				unread += rapid.IntRange(1, 100).Draw(t, "bytes")
			case 1: // it takes some
				if unread > 0 {
					unread -= rapid.IntRange(1, unread).Draw(t, "taken")
					handed++
					moved = now
				}
			case 2: // it finishes a batch
				if handed > 0 {
					handed--
					finished++
					moved = now
				}
			}
			waiting := unread > 0 || handed > 0
			if !waiting || !wasWaiting || moved.IsZero() {
				moved = now
			}
			wasWaiting = waiting
			got := s.Look(now, unread, handed, finished, d)
			if want := waiting && now.Sub(moved) > d; got != want {
				t.Fatalf("at %s: stalled %v, want %v (waiting %v, last moved %s, timeout %s)", now.Sub(time.Unix(1000, 0)), got, want, waiting, moved.Sub(time.Unix(1000, 0)), d)
			}
		}
	})
	// Lines waiting, and nothing moves: stalled only past the timeout.
	var s Stall
	at := time.Unix(1000, 0)
	s.Look(at, 10, 0, 0, time.Second)
	if s.Look(at.Add(time.Second), 10, 0, 0, time.Second) {
		t.Fatal("stalled at the timeout, not past it")
	}
	if !s.Look(at.Add(time.Second+1), 10, 0, 0, time.Second) {
		t.Fatal("not stalled past the timeout")
	}
	// Lines that came after a look that found none count from the look
	// that found them (the simulation's seed 602993969).
	var c Stall
	c.Look(at, 0, 0, 0, time.Second)
	c.Look(at.Add(900*time.Millisecond), 0, 1, 0, time.Second)
	if c.Look(at.Add(1500*time.Millisecond), 0, 1, 0, time.Second) {
		t.Fatal("stalled 0.6 s after its line was first seen waiting (timeout 1 s)")
	}
	for _, tc := range []struct{ d, want time.Duration }{{time.Minute, 5 * time.Second}, {2 * time.Second, time.Second + time.Millisecond}} {
		if got := StallLookEvery(tc.d); got != tc.want {
			t.Errorf("StallLookEvery(%s) = %s, want %s", tc.d, got, tc.want)
		}
	}
}

// A record is kept while the stream holds, where it saw last, what it
// saw, or the stream goes on past a removed message; the record of a
// stream made again is dropped when something else says where to go on,
// and refused when the consumer would be made at its sequences (issue 64:
// a stream rebuilt under a reader had its old record applied).
func TestCheckRecord(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		at := HeldAtLast(rapid.IntRange(0, 3).Draw(t, "at"))
		missing, fromStart, keepsOwn := rapid.Bool().Draw(t, "missing"), rapid.Bool().Draw(t, "from start"), rapid.Bool().Draw(t, "keeps own")
		got := CheckRecord(at, missing, fromStart, keepsOwn)
		switch {
		case at == Unanchored && got != DropRecord:
			t.Fatalf("a floor that names no message kept or refused: %d", got)
		case at == Unanchored:
		case at != OtherMessage && got != KeepRecord:
			t.Fatalf("the stream's own record (%d): %d", at, got)
		case at == OtherMessage && got == KeepRecord:
			t.Fatal("another stream's record applied")
		case at == OtherMessage && got == RefuseRecord && !(missing && !fromStart && !keepsOwn):
			t.Fatalf("refused though something says where to go on (missing %v, from start %v, keeps own %v)", missing, fromStart, keepsOwn)
		case at == OtherMessage && got == DropRecord && missing && !fromStart && !keepsOwn:
			t.Fatal("dropped with nothing to say where to go on: the consumer would be made at its sequences")
		}
	})
}

// A consumer missing is made after the record's floor only when the
// record names a message of this stream and the sink keeps no record of
// its own.
func TestMakeAt(t *testing.T) {
	for _, anchored := range []bool{false, true} {
		for _, keepsOwn := range []bool{false, true} {
			want := AsSinkSays
			if anchored && !keepsOwn {
				want = AfterFloor
			}
			if got := MakeAt(anchored, keepsOwn); got != want {
				t.Errorf("MakeAt(anchored %v, keeps own %v) = %d, want %d", anchored, keepsOwn, got, want)
			}
		}
	}
}

// A reader that said it finished everything, without reports, finished
// every batch it held; one that ended on its own saying it finished what
// it took (exit 0) finished the batches it took whole; one that failed
// counts against the oldest batch it took whole (from a pipe: the batch's
// end within what it took), and against none that it never took.
func TestSettle(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		sizes := rapid.SliceOfN(rapid.Int64Range(1, 50), 0, 5).Draw(t, "batch sizes")
		e := ReaderEnd{Done: rapid.Bool().Draw(t, "done"), Reports: rapid.Bool().Draw(t, "reports"), Pipe: rapid.Bool().Draw(t, "pipe")}
		e.Failed = !e.Done && rapid.Bool().Draw(t, "failed")
		e.Took = !e.Done && !e.Failed && rapid.Bool().Draw(t, "took")
		var written int64
		for _, n := range sizes {
			written += n
			e.Ends = append(e.Ends, written)
		}
		e.Taken = rapid.Int64Range(0, written).Draw(t, "taken")
		done, blamed := AfterReaderEnd(e)
		wantDone := 0
		switch {
		case e.Reports:
		case e.Done:
			wantDone = len(e.Ends)
		case e.Took:
			for _, end := range e.Ends {
				if e.Pipe && end > e.Taken {
					break
				}
				wantDone++
			}
		}
		if done != wantDone {
			t.Fatalf("done %d, want %d (ends %v, taken %d, pipe %v)", done, wantDone, e.Ends, e.Taken, e.Pipe)
		}
		want := -1
		if e.Failed {
			for i, end := range e.Ends {
				if !e.Pipe || end <= e.Taken {
					want = i
					break
				}
			}
		}
		if blamed != want {
			t.Fatalf("blamed %d, want %d (ends %v, taken %d, pipe %v)", blamed, want, e.Ends, e.Taken, e.Pipe)
		}
	})
	// Three batches of 10 bytes, 15 taken: the first taken whole.
	if _, b := AfterReaderEnd(ReaderEnd{Failed: true, Pipe: true, Taken: 15, Ends: []int64{10, 20, 30}}); b != 0 {
		t.Fatalf("blamed %d, want the first batch", b)
	}
	// 10 taken: the first taken whole, to its last byte.
	if _, b := AfterReaderEnd(ReaderEnd{Failed: true, Pipe: true, Taken: 10, Ends: []int64{10, 20, 30}}); b != 0 {
		t.Fatalf("blamed %d, want the first batch", b)
	}
	// 5 taken: none whole, none blamed.
	if _, b := AfterReaderEnd(ReaderEnd{Failed: true, Pipe: true, Taken: 5, Ends: []int64{10, 20, 30}}); b != -1 {
		t.Fatalf("blamed %d, want none", b)
	}
	// head -n 1: one batch taken, then exit 0: that one is done.
	if d, b := AfterReaderEnd(ReaderEnd{Took: true, Pipe: true, Taken: 10, Ends: []int64{10, 20}}); d != 1 || b != -1 {
		t.Fatalf("done %d blamed %d, want the first done", d, b)
	}
}

// A run that must end stops on a command the shell cannot run, at once,
// and on a sender that ended GiveUpAfter times in a row without a batch.
func TestAfterSenderEnd(t *testing.T) {
	for _, tc := range []struct {
		code, ends int
		want       SenderVerdict
	}{
		{127, 1, CannotStart},
		{126, 1, CannotStart},
		{1, 1, StartAgain},
		{1, GiveUpAfter - 1, StartAgain},
		{1, GiveUpAfter, KeepsFailing},
		{75, GiveUpAfter + 1, KeepsFailing},
		{0, 0, StartAgain},
	} {
		if got := AfterSenderEnd(tc.code, tc.ends); got != tc.want {
			t.Errorf("AfterSenderEnd(exit %d, %d ends in a row) = %d, want %d", tc.code, tc.ends, got, tc.want)
		}
	}
}

// A subscriber that runs until drained stops only with nothing left to
// deliver, nothing handled, in doubt or being acknowledged, and every
// message awaiting an ack its own.
func TestDrained(t *testing.T) {
	for _, tc := range []struct {
		name string
		d    Drain
		want bool
	}{
		{"nothing at all", Drain{}, true},
		{"its last message held, done and acknowledged", Drain{AckPending: 1, Holding: 1}, true},
		{"an ack on its way (issue 45)", Drain{Acking: true, AckPending: 1, Holding: 1}, false},
		{"a delivery being handed on", Drain{Handling: true}, false},
		{"a pipe's reader with batches in doubt", Drain{InDoubt: true, AckPending: 1, Holding: 1}, false},
		{"messages not delivered yet", Drain{Pending: 1}, false},
		{"a message another resend holds", Drain{AckPending: 1}, false},
		{"another's and its own", Drain{AckPending: 2, Holding: 1}, false},
	} {
		if got := Drained(tc.d); got != tc.want {
			t.Errorf("%s: Drained(%+v) = %v, want %v", tc.name, tc.d, got, tc.want)
		}
	}
}

func TestOnGap(t *testing.T) {
	for _, c := range []struct {
		there, stored, pinned, shared bool
		want                          GapVerdict
	}{
		{false, false, true, false, RemovedFirst},
		{false, false, false, false, RemovedFirst},
		{false, false, false, true, RemovedFirst},
		{true, false, true, false, NotMissing},
		{true, false, false, true, NotMissing},
		{true, false, true, true, NotMissing},
		{true, false, false, false, TakenElsewhere},
		// The sink's own word: it stored the message, gone or not.
		{false, true, true, true, NotMissing},
		{false, true, false, true, NotMissing},
		{true, true, false, false, NotMissing},
	} {
		if got := OnGap(c.there, c.stored, c.pinned, c.shared); got != c.want {
			t.Errorf("OnGap(there %v, stored %v, pinned %v, shared %v) = %d, want %d", c.there, c.stored, c.pinned, c.shared, got, c.want)
		}
	}
}
