package main

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/internal/testutil/tailertest"
	"github.com/mailroom/tailer/publish/subscriber"
	"github.com/mailroom/tailer/publish/wire"
)

// Two tailer dead-letters resend of one durable started together on its
// 12 dead letters, twenty times over (the dead letters put back between
// runs): each run writes each of their tokens once and leaves none
// (issue 71: 3 tokens written twice, the two resends taking turns to
// lose the record's compare-and-swap, each loss letting a batch done and
// not yet saved be written again).
func TestResendsAtOnce(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pgtest.Shared(t), 1, 50*time.Millisecond)
	c.Exec(`INSERT INTO accounts (email, login) SELECT 'poison' || g || '@x', 'poison' || g FROM generate_series(1, 12) g`)
	c.Exec(`INSERT INTO accounts (email, login) SELECT 'fine' || g || '@x', 'fine' || g FROM generate_series(1, 8) g`)
	c.tailer()
	c.expectExactlyOnce(time.Minute)
	all := c.signedTokens()
	poison := map[int64]string{}
	for _, id := range c.tokenIDs("poison") {
		poison[id] = all[id]
	}
	p := c.execSubscriber(t, "f", `while IFS= read -r l; do case "$l" in *poison*) exit 1;; esac; done`,
		"--max-deliveries", "1", "--ack-wait", "5s")
	js := c.jsOf()
	tailertest.EventuallyProgressing(t, 2*time.Minute, func() (int, error) {
		n, err := subscriber.CountDeadLetters(c.ctx, js, "MAILROOM", "f")
		if err == nil && n < len(poison) {
			err = fmt.Errorf("%d dead letters, waiting for %d", n, len(poison))
		}
		return n, err
	})
	if code := p.term(30 * time.Second); code != exitOK {
		t.Fatalf("subscribe: exit %d:\n%s", code, p.out.String())
	}
	letters, err := subscriber.ListDeadLetters(c.ctx, js, "MAILROOM", "f")
	if err != nil || len(letters) != len(poison) {
		t.Fatalf("%d dead letters (%v), want %d", len(letters), err, len(poison))
	}
	dir := t.TempDir()
	for run := range 20 {
		if run > 0 {
			putBack(t, c, js, letters, run)
		}
		out := filepath.Join(dir, fmt.Sprintf("out%d", run))
		var rs []*proc
		for range 2 {
			rs = append(rs, c.command([]string{"dead-letters", "resend", "--durable", "f", "--exec", "cat >> " + out}))
		}
		for _, r := range rs {
			if code := r.exit(60 * time.Second); code != exitOK {
				t.Fatalf("run %d: dead-letters resend: exit %d:\n%s", run, code, r.out.String())
			}
		}
		if missing, repeats := countOutput(t, out, poison); missing > 0 || repeats > 0 {
			t.Fatalf("run %d: two resends at once: %d tokens missing, %d written again; they said:\n%s\n%s",
				run, missing, repeats, rs[0].out.String(), rs[1].out.String())
		}
		if n, err := subscriber.CountDeadLetters(c.ctx, js, "MAILROOM", "f"); err != nil || n != 0 {
			t.Fatalf("run %d: %d dead letters left (%v), want 0", run, n, err)
		}
	}
}

// putBack publishes the dead letters again, as if set aside anew (a
// message id of the run's, so that JetStream does not drop them as
// duplicates).
func putBack(t *testing.T, c *cluster, js jetstream.JetStream, letters []subscriber.Listed, run int) {
	t.Helper()
	for _, l := range letters {
		h := nats.Header{}
		for k, v := range l.Header {
			h[k] = v
		}
		h.Set(wire.HeaderMsgID, fmt.Sprintf("%s:again%d", l.Header.Get(wire.HeaderMsgID), run))
		m := &nats.Msg{Subject: subscriber.DeadSubject("MAILROOM", "f"), Header: h, Data: l.Body}
		if _, err := js.PublishMsg(c.ctx, m); err != nil {
			t.Fatal(err)
		}
	}
}
