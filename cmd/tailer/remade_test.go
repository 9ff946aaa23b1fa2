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
	"github.com/mailroom/tailer/publish/subscriber"
)

// The stream deleted and made again under running subscribers, then tailer
// resync as the lost-stream runbook says, a writer before and after (issue
// 45: each subscriber's consumer was made again at a sequence of the old
// stream, and the inbox, the exactly-once mode, lost every token written
// after). A sequence names a place only in its own stream; each reader
// checks what its record says it read against what the stream holds there:
//   - the inbox and River (running, and inboxes started after the new
//     stream was made, with and without --from-start) read the new stream
//     from its first message: every token once, by key;
//   - a file or --exec subscriber started with --from-start reads the new stream from
//     its first message, its dedup window taking out what it wrote before;
//     one started before the new stream was made waits for it and does the
//     same;
//   - a file subscriber without --from-start refuses, naming --from-start;
//     started again with it, every token arrives once.
func TestStreamMadeAgainUnderSubscribers(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pgtest.Shared(t), 10, 50*time.Millisecond)
	p := c.watchedTailer()
	p.waitLog("msg=streaming", 1, 30*time.Second)
	// The second inbox in a database of its own: rows are keyed by token.
	dbURL, laterURL, fromURL := pgtest.Shared(t).CreateDB(t), pgtest.Shared(t).CreateDB(t), pgtest.Shared(t).CreateDB(t)
	conn, err := pgx.Connect(c.ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	laterConn, err := pgx.Connect(c.ctx, laterURL)
	if err != nil {
		t.Fatal(err)
	}
	defer laterConn.Close(context.Background())
	fromConn, err := pgx.Connect(c.ctx, fromURL)
	if err != nil {
		t.Fatal(err)
	}
	defer fromConn.Close(context.Background())
	dir := t.TempDir()
	out := func(name string) string { return filepath.Join(dir, name) }
	window := []string{"--dedup-window", "1000"}
	into := func(durable, sink string, args ...string) *proc {
		url := map[string]string{"later": laterURL, "later-from-start": fromURL}[durable]
		if url == "" {
			url = dbURL
		}
		return c.command(append([]string{"subscribe", "--durable", durable, "--into", sink, "--migrate"}, args...), "MAILROOM_INBOX_URL="+url)
	}
	fromStart := c.subscriber(out("from-start"), append([]string{"--durable", "from-start", "--from-start"}, window...)...)
	next := c.subscriber(out("next"), append([]string{"--durable", "next"}, window...)...)
	waiting := c.subscriber(out("waiting"), append([]string{"--durable", "waiting", "--from-start"}, window...)...)
	c.execSubscriber(t, "exec", "cat >> "+out("exec"), window...)
	into("inbox", "inbox", "--from-start")
	into("river", "river", "--from-start")
	later := into("later", "inbox", "--from-start")
	laterFrom := into("later-from-start", "inbox", "--from-start")
	for _, s := range []*proc{fromStart, next, waiting} {
		s.waitLog("consuming", 1, 30*time.Second)
	}
	// Many messages, so that the old stream's sequences run past where the
	// new one gets to.
	for i := range 25 {
		c.accounts(fmt.Sprintf("before%d_", i), 2)
		time.Sleep(80 * time.Millisecond)
	}
	c.expectExactlyOnce(30 * time.Second)
	for _, name := range []string{"from-start", "next", "waiting", "exec"} {
		waitOutput(t, out(name), 50)
	}
	intoCounts := map[string]string{
		"inbox":            `SELECT count(*), count(DISTINCT token_key) FROM mailroom_inbox WHERE durable = 'inbox'`,
		"later":            `SELECT count(*), count(DISTINCT token_key) FROM mailroom_inbox WHERE durable = 'later'`,
		"later-from-start": `SELECT count(*), count(DISTINCT token_key) FROM mailroom_inbox WHERE durable = 'later-from-start'`,
		"river":            `SELECT count(*), count(DISTINCT args->>'token_key') FROM river_job WHERE kind = 'mailroom_token'`,
	}
	expectRows := func(durable string, n int) {
		t.Helper()
		tailertest.Eventually(t, 60*time.Second, func() error {
			var rows, keys int
			db := map[string]*pgx.Conn{"later": laterConn, "later-from-start": fromConn}[durable]
			if db == nil {
				db = conn
			}
			db.QueryRow(c.ctx, intoCounts[durable]).Scan(&rows, &keys)
			if rows != n || keys != n {
				return fmt.Errorf("%s: %d rows of %d keys, want %d", durable, rows, keys, n)
			}
			return nil
		})
	}
	for _, d := range []string{"inbox", "later", "later-from-start", "river"} {
		expectRows(d, 50)
	}
	if code := waiting.term(30 * time.Second); code != exitOK {
		t.Fatalf("subscriber SIGTERM: exit %d", code)
	}
	for _, p := range []*proc{later, laterFrom} {
		if code := p.term(30 * time.Second); code != exitOK {
			t.Fatalf("inbox subscriber SIGTERM: exit %d", code)
		}
	}

	nc, err := nats.Connect(c.natsURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if err := js.DeleteStream(c.ctx, "MAILROOM"); err != nil {
		t.Fatal(err)
	}
	// Started while there is no stream: it waits for the new one.
	waiting = c.subscriber(out("waiting"), append([]string{"--durable", "waiting", "--from-start"}, window...)...)
	waiting.waitLog("the stream is not there yet", 1, 30*time.Second)
	if _, err := js.CreateStream(c.ctx, jetstream.StreamConfig{Name: "MAILROOM", Subjects: []string{"mailroom.batches", "mailroom.batches.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	c.accounts("during", 5)
	p.blocked(c, "stream", "was deleted and made again")
	r := c.command([]string{"resync"})
	if code := r.exit(60 * time.Second); code != exitOK {
		t.Fatalf("resync: exit %d:\n%s", code, r.out.String())
	}
	p.ready(c)
	into("later", "inbox")
	into("later-from-start", "inbox", "--from-start")
	c.accounts("after", 5)
	want := c.signedTokens()
	if len(want) != 60 {
		t.Fatalf("%d tokens in the database, want 60", len(want))
	}

	for _, d := range []string{"inbox", "later", "later-from-start", "river"} {
		expectRows(d, len(want))
	}
	// Without --from-start: refused, naming it; then the step it names.
	if code := next.exit(30 * time.Second); code != exitFailure || !strings.Contains(next.out.String(), "start the subscriber with --from-start") {
		t.Fatalf("the subscriber without --from-start: exit %d, want %d naming --from-start:\n%s", code, exitFailure, next.out.String())
	}
	c.subscriber(out("next"), append([]string{"--durable", "next", "--from-start"}, window...)...)
	for _, name := range []string{"from-start", "next", "waiting", "exec"} {
		tailertest.EventuallyProgressing(t, 60*time.Second, func() (int, error) {
			if missing, _ := countOutput(t, out(name), want); missing > 0 {
				return len(want) - missing, fmt.Errorf("%s: %d of %d tokens never written", name, missing, len(want))
			}
			return len(want), nil
		})
		// Into a file a batch is done once written, and the dedup window
		// knows it; through a pipe the batches in doubt when the consumer
		// went (the last two) may come again.
		inDoubt := 0
		if name == "exec" {
			inDoubt = 2 * 10
		}
		if missing, repeats := countOutput(t, out(name), want); missing != 0 || repeats > inDoubt {
			t.Fatalf("%s: %d tokens missing, %d written twice (at most %d may be)", name, missing, repeats, inDoubt)
		}
	}
}

// A subscriber's consumer counts the batches alone as pending, never the
// session markers every tailer session starts with (issue 45: they
// counted in every consumer's pending, and showed as empty messages).
func TestMarkersNotPending(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pgtest.Shared(t), 10, 50*time.Millisecond)
	for i := range 3 {
		p := c.tailer()
		p.waitLog("msg=streaming", 1, 30*time.Second)
		c.accounts(fmt.Sprintf("s%d_", i), 5)
		c.expectExactlyOnce(30 * time.Second)
		if code := p.term(30 * time.Second); code != exitOK {
			t.Fatalf("SIGTERM: exit %d", code)
		}
	}
	nc, err := nats.Connect(c.natsURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	cons, err := subscriber.Durable{Stream: "MAILROOM", Subject: "mailroom.batches", Name: "count", FromStart: true}.Ensure(c.ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(c.ctx)
	if err != nil {
		t.Fatal(err)
	}
	batches := len(c.messages())
	if s, err := js.Stream(c.ctx, "MAILROOM"); err != nil || s.CachedInfo().State.Msgs <= uint64(batches) {
		t.Fatalf("the stream holds no markers beside its %d batches (%v)", batches, err)
	}
	if info.NumPending != uint64(batches) {
		t.Fatalf("a new consumer has %d messages pending, want the %d batches alone", info.NumPending, batches)
	}
}
