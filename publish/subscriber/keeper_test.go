package subscriber

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/mailroom/tailer/publish/subscriber/protocol"
)

// kept gives s a keeper of h, stopped as the test ends.
func kept(t *testing.T, s *Subscriber, h protocol.Machine) *Subscriber {
	t.Helper()
	s.keep = newKeeper(h)
	t.Cleanup(func() { s.keep.stop() })
	return s
}

// A talk asked for while another is under way begins once that one
// ended: the machine has one talk at a time, and the keeper, its one
// stepper, keeps them so.
func TestKeeperTalksOneAtATime(t *testing.T) {
	k := newKeeper(protocol.Machine{})
	defer k.stop()
	if cmds := k.step(protocol.Reload{}, opens); len(cmds) != 1 {
		t.Fatalf("the first reload: %v, want a Load", cmds)
	}
	second := make(chan []protocol.ToDo)
	go func() { second <- k.step(protocol.Reload{}, opens) }()
	// Outside the talk, steps are answered meanwhile.
	if cmds := k.step(protocol.Look{}, outside); len(cmds) != 1 {
		t.Fatalf("a look during the talk: %v", cmds)
	}
	select {
	case cmds := <-second:
		t.Fatalf("the second talk began (%v) while the first was under way", cmds)
	case <-time.After(50 * time.Millisecond):
	}
	ended := k.step(protocol.Loaded{Rev: 1}, inTalk)
	if _, ok := answerOf[protocol.TalkEnded](ended); !ok {
		t.Fatalf("the first talk's read: %v, want its end", ended)
	}
	if cmds := <-second; len(cmds) != 1 {
		t.Fatalf("the second reload, once the first ended: %v, want a Load", cmds)
	}
	if _, ok := answerOf[protocol.TalkEnded](k.step(protocol.Loaded{Rev: 2}, inTalk)); !ok {
		t.Fatal("the second talk's read did not end it")
	}
	if h := k.stop(); h.Rev != 2 {
		t.Fatalf("revision %d after the two reads, want 2", h.Rev)
	}
}

// A talk that ends at once (a Complete with nothing to acknowledge) lets
// the next one begin.
func TestKeeperTalkEndedAtOnce(t *testing.T) {
	k := newKeeper(protocol.Machine{})
	defer k.stop()
	for range 3 {
		if _, ok := answerOf[protocol.TalkEnded](k.step(protocol.Complete{}, opens)); !ok {
			t.Fatal("a Complete of nothing did not end at once")
		}
	}
	if cmds := k.step(protocol.Reload{}, opens); len(cmds) != 1 {
		t.Fatalf("a reload after three talks that ended at once: %v", cmds)
	}
}

// A talk's input the machine answers with nothing (a driver's slip,
// which talk reports) ends the talk for the keeper: the next one begins
// rather than waiting for ever.
func TestKeeperTalkStoppedWithoutAnEnd(t *testing.T) {
	k := newKeeper(protocol.Machine{})
	defer k.stop()
	if cmds := k.step(protocol.Loaded{}, inTalk); cmds != nil {
		t.Fatalf("a read answered with no talk under way: %v", cmds)
	}
	next := make(chan []protocol.ToDo, 1)
	go func() { next <- k.step(protocol.Reload{}, opens) }()
	select {
	case cmds := <-next:
		if len(cmds) != 1 {
			t.Fatalf("the next talk: %v, want a Load", cmds)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the next talk waits on one that stopped without an end")
	}
}

// Once closed, a subscriber steps nothing: Run says so, Stats holds no
// pin, and a talk left waiting gets no answer rather than hanging.
func TestClosedSubscriber(t *testing.T) {
	s, err := NewSubscriber(Config{Stream: "S", Subject: "b", Durable: "d", Sink: &Lines{Out: io.Discard}})
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan []protocol.ToDo)
	s.keep.step(protocol.Reload{}, opens)
	go func() { waiting <- s.keep.step(protocol.Reload{}, opens) }()
	s.Close()
	if cmds := <-waiting; cmds != nil {
		t.Fatalf("a talk waiting as the subscriber closed: %v", cmds)
	}
	if err := s.Run(context.Background(), nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Run after Close: %v", err)
	}
	if st := s.Stats(); st.PinID != "" {
		t.Fatalf("Stats after Close: %+v", st)
	}
	if cmds := s.step(protocol.Look{}); cmds != nil {
		t.Fatalf("a step after Close: %v", cmds)
	}
	s.Close()
}

// The keeper carries out the heartbeat and the pin's keepalive itself,
// on its clocks, while a talk is under way too, and stops as the consume
// that asked for them gives them back.
func TestKeeperCarriesOutItsDuties(t *testing.T) {
	h := protocol.Machine{}
	h.Pin = "p1"
	if _, ok := answerOf[protocol.Taken](h.Step(protocol.Offer{Seq: 5, Mark: "m5", Tokens: []int{1}, Msg: "d5"})); !ok {
		t.Fatal("the offer was not taken")
	}
	k := newKeeper(h)
	defer k.stop()
	beats, pins := make(chan uint64, 100), make(chan string, 100)
	k.step(protocol.Reload{}, opens) // a talk under way: its IO waits on nothing of the duties
	k.carry(duties{heartbeat: time.Millisecond, keepPin: time.Millisecond,
		inProgress: func(held *protocol.Held) { beats <- held.Seq },
		keepPinIO:  func(pin string) { pins <- pin }})
	for range 3 {
		if seq := <-beats; seq != 5 {
			t.Fatalf("an in-progress ack of seq %d, want 5", seq)
		}
		if pin := <-pins; pin != "p1" {
			t.Fatalf("a keepalive naming %q, want p1", pin)
		}
	}
	// The keeper takes the duties back between two of its steps: none
	// is carried out after.
	k.carry(duties{})
	n := len(beats) + len(pins)
	time.Sleep(20 * time.Millisecond)
	if m := len(beats) + len(pins); m != n {
		t.Fatalf("%d in-progress acks and keepalives after the duties were given back", m-n)
	}
}

// What a step costs through the keeper (two goroutine hand-offs), beside
// the machine's own step: the subscriber makes a dozen or so a message.
func BenchmarkKeeperStep(b *testing.B) {
	k := newKeeper(protocol.Machine{})
	defer k.stop()
	for b.Loop() {
		k.step(protocol.Look{}, outside)
	}
}

func BenchmarkMachineStep(b *testing.B) {
	var h protocol.Machine
	for b.Loop() {
		h.Step(protocol.Look{})
	}
}
