package publish

import (
	"context"
	"errors"
	"github.com/mailroom/tailer/decoder/wal"
	"github.com/mailroom/tailer/publish/relay"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/decoder"
	"github.com/mailroom/tailer/publish/wire"
)

// tokenAt is token i of the resume tests: its own secret, at a position of
// its own (a transaction each, in order).
func tokenAt(i int) *decoder.Token {
	return testToken(byte(i), wal.Position{Commit: wal.LSN(0x2000 + 0x10*i)})
}

// batchOf is a message of tokens first..last.
func batchOf(first, last int) *Message {
	var keys []string
	for i := first; i <= last; i++ {
		keys = append(keys, keyOf(tokenAt(i)))
	}
	return &Message{First: tokenAt(first).Pos, Last: tokenAt(last).Pos, Count: len(keys), TokenIDs: "1", TokenKeys: strings.Join(keys, ","), Body: []byte("x")}
}

var resumeOrigin = relay.Origin{SystemID: "7", Timeline: 1, Database: "mailroom"}

// session starts a publishing session that replays the tokens after
// token after (0: all), keeping inFlight messages in flight.
func session(t *testing.T, ctx context.Context, nc *nats.Conn, after, inFlight int) *Publisher {
	t.Helper()
	p, err := NewPublisher(ctx, nc, Destination{Name: "R", Subject: "mailroom.batches", Origin: resumeOrigin})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	o := relay.Owner{Origin: resumeOrigin, Incarnation: "i", InFlight: inFlight, After: 0x2000}
	if after > 0 {
		o.After = tokenAt(after).Pos.Commit + 1
	}
	if err := p.Resume(ctx, o); err != nil {
		t.Fatal(err)
	}
	return p
}

func publishWait(t *testing.T, p *Publisher, m *Message) {
	t.Helper()
	fut, err := p.PublishAsync(m)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-fut.Ok():
	case err := <-fut.Err():
		t.Fatal(err)
	}
}

// onStream checks which of tokens first..last the session takes for on
// the stream.
func onStream(t *testing.T, p *Publisher, first, last int, want func(i int) bool) {
	t.Helper()
	var wrong []string
	for i := first; i <= last; i++ {
		got, err := p.OnStream(context.Background(), tokenAt(i))
		if err != nil {
			t.Fatal(err)
		}
		if got != want(i) {
			wrong = append(wrong, strconv.Itoa(i)+"="+strconv.FormatBool(got))
		}
	}
	if len(wrong) > 0 {
		t.Fatalf("OnStream wrong for tokens %s", strings.Join(wrong, " "))
	}
}

// A killed session's publish still on its way when the next session
// starts is refused whenever it arrives: the new session's markers moved
// the stream past every sequence it can expect (it kept two in flight,
// and so does the new session's fence).
func TestMarkersKeepLatePublishesOut(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, _ := testJetStream(t)
	old := session(t, ctx, nc, 0, 2)
	// The new session starts before the old one's two last messages
	// reach the server.
	next := session(t, ctx, nc, 0, 1)
	for i, m := range []*Message{batchOf(1, 7), batchOf(8, 10)} {
		fut, err := old.PublishAsync(m)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case ack := <-fut.Ok():
			t.Fatalf("the old session's message %d landed after the new session's markers, at %d", i+1, ack.Sequence)
		case err := <-fut.Err():
			if !isWrongLastSequence(err) {
				t.Fatalf("message %d: %v, want wrong last sequence", i+1, err)
			}
		}
	}
	publishWait(t, next, batchOf(1, 10))
	messages, _, _, _, fence := next.Window()
	if messages != 0 || fence != 2 {
		t.Fatalf("the new session found %d messages and set %d markers, want 0 and 2 (the old session's in-flight)", messages, fence)
	}
}

// What a session skips comes from the tokens the stream holds, not from
// its last message: with a late publish of tokens 1-7 landed and a refused
// message's successor (11-13) on top of it, tokens 8-10 are not on the
// stream, whatever the last position says.
func TestResumeByContentNotPosition(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, js := testJetStream(t)
	seed := session(t, ctx, nc, 0, 1)
	seed.Close()
	for _, m := range []*Message{batchOf(1, 7), batchOf(11, 13)} {
		nm := nats.NewMsg("mailroom.batches")
		nm.Header.Set(wire.HeaderPosFirst, m.First.String())
		nm.Header.Set(wire.HeaderPosLast, m.Last.String())
		nm.Header.Set(wire.HeaderCount, strconv.Itoa(m.Count))
		nm.Header.Set(wire.HeaderTokenKeys, m.TokenKeys)
		nm.Header.Set(wire.HeaderOrigin, resumeOrigin.String())
		nm.Header.Set(wire.HeaderIncarnation, "i")
		nm.Data = m.Body
		if _, err := js.PublishMsg(ctx, nm); err != nil {
			t.Fatal(err)
		}
	}
	p := session(t, ctx, nc, 0, 1)
	onStream(t, p, 1, 15, func(i int) bool { return i <= 7 || (i >= 11 && i <= 13) })
}

// Two lanes on one subject (activations and recoveries of the same
// transactions): their messages cover overlapping positions, each lane's
// in order. The next session finds every token of either lane, the
// messages' keys read back as the replay reaches them (issue 47).
func TestResumeLanesOverlap(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, _ := testJetStream(t)
	s1 := session(t, ctx, nc, 0, 1)
	lane := func(idx ...int) *Message {
		var keys []string
		for _, i := range idx {
			keys = append(keys, keyOf(tokenAt(i)))
		}
		return &Message{First: tokenAt(idx[0]).Pos, Last: tokenAt(idx[len(idx)-1]).Pos, Count: len(keys), TokenIDs: "1", TokenKeys: strings.Join(keys, ","), Body: []byte("x")}
	}
	for _, m := range []*Message{lane(1, 3, 5, 7), lane(2, 4, 6, 8), lane(9, 11, 13), lane(10, 12, 14), lane(15, 17)} {
		publishWait(t, s1, m)
	}
	s2 := session(t, ctx, nc, 0, 1)
	onStream(t, s2, 1, 20, func(i int) bool { return i <= 15 || i == 17 })
	// Out of order too.
	onStream(t, s2, 1, 1, func(int) bool { return true })
}

// Each session finds what the sessions before it published past the
// slot's confirmed position: the messages after the last markers, and,
// through the markers, the ones before them; and, for a slot confirmed
// less far than an earlier session's (a restored database), further
// back, marker by marker.
func TestResumeAcrossSessions(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, _ := testJetStream(t)
	s1 := session(t, ctx, nc, 0, 1)
	publishWait(t, s1, batchOf(1, 5))
	publishWait(t, s1, batchOf(6, 10))
	// Killed having confirmed token 3: 4-10 are replayed, and on the
	// stream.
	s2 := session(t, ctx, nc, 3, 2)
	onStream(t, s2, 4, 12, func(i int) bool { return i <= 10 })
	publishWait(t, s2, batchOf(11, 12))
	// Killed before it confirmed anything: the next session finds s1's
	// messages through s2's markers.
	s3 := session(t, ctx, nc, 3, 1)
	onStream(t, s3, 4, 14, func(i int) bool { return i <= 12 })
	publishWait(t, s3, batchOf(13, 14))
	// Confirmed up to 12.
	s4 := session(t, ctx, nc, 12, 1)
	onStream(t, s4, 13, 16, func(i int) bool { return i <= 14 })
	if messages, tokens, _, _, _ := s4.Window(); messages != 1 || tokens != 2 {
		t.Fatalf("confirmed up to 12, the window holds %d messages of %d tokens, want 1 of 2", messages, tokens)
	}
	// A restore puts the slot back at token 1.
	s5 := session(t, ctx, nc, 1, 1)
	onStream(t, s5, 2, 16, func(i int) bool { return i <= 14 })
}

// Incomplete markers (a session whose markers an earlier session's late
// publish interrupted) may be followed by such publishes, in any order:
// the next session reads all of them and sets at least as many markers.
func TestResumeAfterIncompleteMarkers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, js := testJetStream(t)
	seed := session(t, ctx, nc, 0, 1)
	seed.Close()
	publish := func(subject string, h map[string]string) {
		nm := nats.NewMsg(subject)
		for k, v := range h {
			nm.Header.Set(k, v)
		}
		if _, err := js.PublishMsg(ctx, nm, jetstream.WithExpectStream("R")); err != nil {
			t.Fatal(err)
		}
	}
	marker := map[string]string{wire.HeaderFence: "1/3", wire.HeaderInFlight: "3", wire.HeaderWindowAfter: "0/2000", wire.HeaderWindowFloor: "2",
		wire.HeaderOrigin: resumeOrigin.String(), wire.HeaderIncarnation: "i"}
	publish(wire.MarkerSubject("mailroom.batches"), marker)
	for _, r := range [][2]int{{6, 9}, {1, 3}} {
		m := batchOf(r[0], r[1])
		publish("mailroom.batches", map[string]string{wire.HeaderPosLast: m.Last.String(), wire.HeaderCount: strconv.Itoa(m.Count), wire.HeaderTokenKeys: m.TokenKeys,
			wire.HeaderOrigin: resumeOrigin.String(), wire.HeaderIncarnation: "i"})
	}
	p := session(t, ctx, nc, 0, 1)
	onStream(t, p, 1, 10, func(i int) bool { return i <= 3 || (i >= 6 && i <= 9) })
	if _, _, _, _, fence := p.Window(); fence != 3 {
		t.Fatalf("%d markers after incomplete markers of 3, want 3", fence)
	}
}

// Messages on the subjects that are not the tailer's are counted and
// passed over; a stream that does not take the markers' subject is
// refused, naming what to add.
func TestStraysAndMarkerSubject(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, js := testJetStream(t)
	s1 := session(t, ctx, nc, 0, 1)
	publishWait(t, s1, batchOf(1, 3))
	if _, err := js.Publish(ctx, "mailroom.batches", []byte("hello")); err != nil {
		t.Fatal(err)
	}
	p := session(t, ctx, nc, 0, 1)
	onStream(t, p, 1, 4, func(i int) bool { return i <= 3 })
	if _, _, _, strays, _ := p.Window(); strays != 1 {
		t.Fatalf("%d stray messages counted, want 1", strays)
	}

	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "NARROW", Subjects: []string{"narrow.batches"}}); err != nil {
		t.Fatal(err)
	}
	_, err := NewPublisher(ctx, nc, Destination{Name: "NARROW", Subject: "narrow.batches"})
	var se *SubjectError
	if !errors.As(err, &se) || !se.Marker || se.Subject != "narrow.batches._session" || se.Configured != "narrow.batches" {
		t.Fatalf("a stream without the markers' subject: %v", err)
	}
}

// FuzzReadStored reads arbitrary header values as a message the stream
// holds: it must not panic, a marker is one only with a place among its
// session's markers, and a batch only with its keys and count.
func FuzzReadStored(f *testing.F) {
	f.Add("1/2", "2", "0/16B3748", "7", "0/16B3748:3", "a,b", "2", "")
	f.Add("", "", "", "", "0/1:0", "k", "1", "0/1")
	f.Add("3/2", "x", "zz", "-1", "bad", ",,", "0", "")
	f.Add("1/1", "1", "0/0", "18446744073709551615", "", "", "", "")
	f.Fuzz(func(t *testing.T, fence, inFlight, after, floor, posLast, keys, count, resync string) {
		h := nats.Header{}
		for k, v := range map[string]string{wire.HeaderFence: fence, wire.HeaderInFlight: inFlight, wire.HeaderWindowAfter: after,
			wire.HeaderWindowFloor: floor, wire.HeaderPosLast: posLast, wire.HeaderTokenKeys: keys, wire.HeaderCount: count, wire.HeaderResync: resync} {
			if v != "" {
				h.Set(k, v)
			}
		}
		s := readStored(&jetstream.RawStreamMsg{Subject: "mailroom.batches", Sequence: 9, Header: h})
		switch s.Is {
		case relay.Marker:
			if s.FenceN < 1 || s.FenceN > s.FenceK {
				t.Fatalf("marker %d of %d", s.FenceN, s.FenceK)
			}
		case relay.Batch:
			if keys == "" || count == "" || s.Keys != keys {
				t.Fatalf("a batch of keys %q (header %q) and count %q", s.Keys, keys, count)
			}
		}
	})
}

// A stream whose limits removed a message the session replays the tokens
// of (published, never confirmed to the slot) is refused at resume: which
// of them the stream had is gone, and publishing them again would repeat
// them (issue 45: max_msgs=5 and a tailer killed again and again). A
// replay whose messages are all there goes on.
func TestResumeRefusesATrimmedWindow(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, js := testJetStream(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "R", Subjects: []string{"mailroom.batches", "mailroom.batches.>"}, MaxMsgs: 4}); err != nil {
		t.Fatal(err)
	}
	s1 := session(t, ctx, nc, 0, 1)
	for i := 1; i <= 6; i++ {
		publishWait(t, s1, batchOf(2*i-1, 2*i))
	}
	// Confirmed up to token 2: tokens 3-6 were in messages gone, after
	// the last session's markers (gone too) and before them.
	resume := func(after int) error {
		t.Helper()
		p, err := NewPublisher(ctx, nc, Destination{Name: "R", Subject: "mailroom.batches", Origin: resumeOrigin})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		return p.Resume(ctx, relay.Owner{Origin: resumeOrigin, Incarnation: "i", InFlight: 1, After: tokenAt(after).Pos.Commit + 1})
	}
	var trimmed *relay.WindowTrimmedError
	if err := resume(2); !errors.As(err, &trimmed) || trimmed.Limits != "max_msgs=4" || trimmed.Seq != 3 {
		t.Fatalf("Resume = %v, want a WindowTrimmedError at message 3 naming max_msgs=4", err)
	}
	// Confirmed up to token 10: the window is the last message, there.
	s2 := session(t, ctx, nc, 10, 1)
	onStream(t, s2, 11, 12, func(int) bool { return true })
	if err := resume(2); !errors.As(err, &trimmed) {
		t.Fatalf("Resume before the markers = %v, want a WindowTrimmedError", err)
	}
}

// Each batch message names the one before it on its subject, across
// sessions and their markers; the first names none.
func TestBatchesChained(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, _ := testJetStream(t)
	p := session(t, ctx, nc, 0, 1)
	publishWait(t, p, batchOf(1, 3))
	publishWait(t, p, batchOf(4, 6))
	p = session(t, ctx, nc, 6, 2)
	publishWait(t, p, batchOf(7, 9))
	want, wantSeq := wire.ChainStart, "0"
	n := 0
	for seq := uint64(1); seq <= p.next; seq++ {
		msg, err := p.getMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		if wire.IsMarker(msg.Header) {
			if msg.Header.Get(wire.HeaderPrev) != "" {
				t.Fatalf("marker %d names a predecessor", seq)
			}
			continue
		}
		if got := msg.Header.Get(wire.HeaderPrev); got != want {
			t.Fatalf("message %d follows %q, want %q", seq, got, want)
		}
		if got := msg.Header.Get(wire.HeaderPrevSeq); got != wantSeq {
			t.Fatalf("message %d follows sequence %q, want %q", seq, got, wantSeq)
		}
		want, wantSeq = wire.Mark(msg.Subject, msg.Header, msg.Data), strconv.FormatUint(seq, 10)
		n++
	}
	if n != 3 {
		t.Fatalf("%d batch messages, want 3", n)
	}
}
