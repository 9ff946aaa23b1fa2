package main

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/internal/testutil/pgtest"
)

// restoreStream makes the stream again from its messages as a backup
// restore does (nats stream restore: the same configuration, every
// message at its sequence with its headers; another creation time), up to
// sequence upTo (all of them when all; less: a backup older than the
// stream, perhaps empty).
func restoreStream(t *testing.T, c *cluster, upTo uint64, all bool) {
	t.Helper()
	nc, err := nats.Connect(c.natsURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(c.ctx, "MAILROOM")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(c.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.FirstSeq != 1 {
		t.Fatalf("stream starts at %d: a restore by republishing needs every message", info.State.FirstSeq)
	}
	var msgs []*jetstream.RawStreamMsg
	last := info.State.LastSeq
	if !all {
		last = upTo
	}
	for seq := info.State.FirstSeq; seq <= last; seq++ {
		m, err := s.GetMsg(c.ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, m)
	}
	if err := js.DeleteStream(c.ctx, "MAILROOM"); err != nil {
		t.Fatal(err)
	}
	// A second later: another creation time, as a restore has.
	time.Sleep(1100 * time.Millisecond)
	if _, err := js.CreateStream(c.ctx, info.Config); err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		ack, err := js.PublishMsg(c.ctx, &nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data})
		if err != nil {
			t.Fatal(err)
		}
		if ack.Sequence != m.Sequence {
			t.Fatalf("message %d restored at %d", m.Sequence, ack.Sequence)
		}
	}
}

// streamLastSeq is the stream's last sequence, markers included.
func streamLastSeq(t *testing.T, c *cluster) uint64 {
	t.Helper()
	s, done, err := c.stream()
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	info, err := s.Info(c.ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.LastSeq
}

// A stream made again from a backup taken after the tailer's clean stop
// (the move of a stream from one NATS server to a cluster) is taken for
// the same: it holds, where the tailer stopped, the message it last saw.
// After a crash the newest message a tailer recorded (the slot record's
// anchor: its session's markers, recorded before any batch, or the newest
// a check found) decides the same way. A backup older than the stop or
// the anchor is refused as a stream deleted and made again, or one that
// lost a message.
func TestRestoredStream(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// crash: the tailer is killed, not stopped; anchored: after its
		// record names an anchor (else it never checks the stream while
		// it runs); again: a clean stop, then a session that publishes
		// more and is killed, the backup from the clean stop.
		crash, anchored, again bool
		// older: the backup lacks the stream's last message, or with
		// anchored the anchor's.
		older bool
		// taken: the tailer logs this and streams; refused: it waits,
		// naming this.
		taken, refused string
	}{
		{name: "backup after a clean stop", taken: "restored"},
		{name: "backup older than the stop", older: true, refused: "was deleted and made again"},
		{name: "backup after a crash before any check", crash: true, taken: "judged by the messages this tailer stored last"},
		{name: "backup older than the markers after a crash before any check", crash: true, older: true, refused: "no longer holds message"},
		{name: "backup after a crash", crash: true, anchored: true, taken: "judged by the messages this tailer stored last"},
		{name: "backup older than the anchor after a crash", crash: true, anchored: true, older: true, refused: "no longer holds message"},
		{name: "backup of a clean stop before a session that crashed", again: true, refused: "was deleted and made again"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := newCluster(t, pgtest.Shared(t), 10, 50*time.Millisecond)
			// The stream is checked, and its anchor recorded, every
			// MAILROOM_LAG_INTERVAL; never, within the test, without one.
			interval := "MAILROOM_LAG_INTERVAL=3600000"
			if tc.anchored {
				interval = "MAILROOM_LAG_INTERVAL=200"
			}
			p := c.tailer(interval)
			p.waitLog("msg=streaming", 1, 30*time.Second)
			c.accounts("before", 25)
			c.expectExactlyOnce(30 * time.Second)
			if tc.anchored {
				c.anchorRecorded()
			}
			if tc.crash {
				p.kill()
			} else if code := p.term(30 * time.Second); code != exitOK {
				t.Fatalf("SIGTERM: exit %d", code)
			}
			var upTo uint64
			all := !tc.older && !tc.again
			switch {
			case tc.older && tc.crash:
				upTo = c.recordedAnchor() - 1
			case tc.older:
				upTo = streamLastSeq(t, c) - 1
			}
			if tc.again {
				upTo = streamLastSeq(t, c)
				p := c.tailer("MAILROOM_LAG_INTERVAL=3600000")
				p.waitLog("msg=streaming", 1, 30*time.Second)
				c.accounts("between", 5)
				c.expectExactlyOnce(30 * time.Second)
				p.kill()
			}
			restoreStream(t, c, upTo, all)

			w := c.watchedTailer()
			c.accounts("after", 10)
			if tc.refused != "" {
				w.blocked(c, "stream", tc.refused)
				return
			}
			w.waitLog(tc.taken, 1, 30*time.Second)
			if n := c.expectExactlyOnce(30 * time.Second); n != 35 {
				t.Fatalf("%d tokens on the stream, want 35", n)
			}
			// Streaming cleared the stop's record: only a clean stop after
			// the last session leaves one.
			var stopped *int64
			if err := c.Conn.QueryRow(c.ctx, `SELECT stopped_seq FROM tailer_slot WHERE slot = 'mailroom'`).Scan(&stopped); err != nil || stopped != nil {
				t.Fatalf("stopped_seq %v (%v) while a session streams", stopped, err)
			}
		})
	}
}

// A stream made again under a running tailer with every message it held
// (a backup restored; the replicas of a restored R3 stream each report
// their own creation time, so a leader change looks the same): another
// creation time, the same content. The tailer holds it by the messages it
// stored last and goes on streaming (issue 45: refused as a stream deleted
// and made again at a leader kill, until a manual resync).
func TestStreamRestoredUnderTheTailer(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pgtest.Shared(t), 10, 50*time.Millisecond)
	p := c.watchedTailer()
	p.waitLog("msg=streaming", 1, 30*time.Second)
	c.accounts("before", 25)
	c.expectExactlyOnce(30 * time.Second)
	// Frozen, so that nothing is published into the stream as it is made
	// again; its checks run again once it is thawed.
	p.freeze()
	restoreStream(t, c, 0, true)
	p.thaw()
	c.accounts("after", 10)
	if n := c.expectExactlyOnce(30 * time.Second); n != 35 {
		t.Fatalf("%d tokens on the stream, want 35", n)
	}
	// Past several checks (every 200 ms here).
	time.Sleep(time.Second)
	p.ready(c)
	if strings.Contains(p.out.String(), "was deleted and made again") {
		t.Fatalf("the restored stream was refused:\n%s", p.out.String())
	}
}
