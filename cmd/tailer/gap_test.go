package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/internal/testutil/tailertest"
)

// Messages removed from the stream before a durable read them (a limit
// trimmed them while its subscribers were down; a purge of the subject is
// the same to a reader): a subscriber into a file, one into the inbox and
// one into an inbox of one action only say so as they read past the place, on /readyz, their metric and the
// log, naming tailer resync, and deliver what the stream still holds.
// tailer resync, as the runbook says, publishes the tokens again: each
// subscriber has every token once, and is ready again.
func TestSubscribersSeeAGap(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pgtest.Shared(t), 10, 50*time.Millisecond)
	nc, err := nats.Connect(c.natsURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if _, err := js.CreateStream(c.ctx, jetstream.StreamConfig{Name: "MAILROOM", Subjects: []string{"mailroom.batches", "mailroom.batches.>"},
		Storage: jetstream.FileStorage, MaxMsgs: 12}); err != nil {
		t.Fatal(err)
	}
	tailer := c.tailer()
	// Two inboxes: one of every token, one of the activation tokens only
	// (--filter-action: the database's last token is no place in the
	// stream, the consumer's ack floor is).
	var dbURLs [2]string
	var conns [2]*pgx.Conn
	for k := range dbURLs {
		dbURLs[k] = pgtest.Shared(t).CreateDB(t)
		conn, err := pgx.Connect(c.ctx, dbURLs[k])
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		conns[k] = conn
	}
	inboxRows := func(n int) {
		t.Helper()
		for _, conn := range conns {
			tailertest.Eventually(t, 30*time.Second, func() error {
				var rows int
				conn.QueryRow(c.ctx, `SELECT count(*) FROM mailroom_inbox`).Scan(&rows)
				if rows != n {
					return fmt.Errorf("%d rows in the inbox, want %d", rows, n)
				}
				return nil
			})
		}
	}
	out := filepath.Join(t.TempDir(), "lines")
	var addrs [3]string
	for k := range addrs {
		port, err := pgtest.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		addrs[k] = fmt.Sprintf("127.0.0.1:%d", port)
	}
	start := func() []*proc {
		return []*proc{
			c.subscriber(out, "--durable", "file", "--from-start", "--dedup-window", "1000", "--health-addr", addrs[0]),
			c.command([]string{"subscribe", "--durable", "inbox", "--into", "inbox", "--migrate", "--from-start", "--health-addr", addrs[1]}, "MAILROOM_INBOX_URL="+dbURLs[0]),
			c.command([]string{"subscribe", "--durable", "activations", "--into", "inbox", "--filter-action", "activation", "--migrate", "--from-start", "--health-addr", addrs[2]},
				"MAILROOM_INBOX_URL="+dbURLs[1]),
		}
	}
	c.accounts("a", 5)
	subs := start()
	waitOutput(t, out, 5)
	inboxRows(5)
	for _, p := range subs {
		if code := p.term(30 * time.Second); code != exitOK {
			t.Fatalf("exit %d:\n%s", code, p.out.String())
		}
	}
	// 20 messages of a token while they are down, each on the stream
	// before the next: the stream keeps the last 12.
	for n := range 20 {
		last := streamLastSeq(t, c)
		c.accounts(fmt.Sprintf("b%d_", n), 1)
		tailertest.Eventually(t, 30*time.Second, func() error {
			if streamLastSeq(t, c) == last {
				return fmt.Errorf("message %d not on the stream yet", n)
			}
			return nil
		})
	}
	subs = start()
	for k, p := range subs {
		tailertest.Eventually(t, 30*time.Second, func() error {
			code, body := httpGet("http://" + addrs[k] + "/readyz")
			if code != 503 || !strings.Contains(body, "a gap in the stream") || !strings.Contains(body, "tailer resync") {
				return fmt.Errorf("/readyz: %d %s", code, body)
			}
			return nil
		})
		page := awaitMetrics(t, "http://"+addrs[k]+"/metrics", "mailroom_subscriber_stream_gaps_total")
		if got := grepLines(page, "mailroom_subscriber_stream_gaps_total{"); !strings.HasSuffix(got, "} 1") {
			t.Fatalf("/metrics: %s", got)
		}
		p.waitLog("messages missing: removed from the stream before this durable read them", 1, 10*time.Second)
	}
	// What the stream still holds is delivered, once.
	waitOutput(t, out, 5+12)
	inboxRows(5 + 12)
	// A streaming tailer holds the slot: stopped for the resync, started
	// again after it.
	if code := tailer.term(30 * time.Second); code != exitOK {
		t.Fatalf("tailer: exit %d:\n%s", code, tailer.out.String())
	}
	r := c.command([]string{"resync"})
	if code := r.exit(60 * time.Second); code != exitOK {
		t.Fatalf("resync: exit %d:\n%s", code, r.out.String())
	}
	c.tailer()
	for k := range subs {
		tailertest.Eventually(t, 30*time.Second, func() error {
			if code, body := httpGet("http://" + addrs[k] + "/readyz"); code != 200 {
				return fmt.Errorf("/readyz after the resync: %d %s", code, body)
			}
			return nil
		})
	}
	inboxRows(25)
	waitOutput(t, out, 25)
	if missing, repeats := countOutput(t, out, c.signedTokens()); missing > 0 || repeats > 0 {
		t.Fatalf("%d tokens missing, %d written twice", missing, repeats)
	}
}
