package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/internal/testutil/tailertest"
	"github.com/mailroom/tailer/publish/wire"
)

// Three --into inbox subscribers on one durable that does not pin (made
// by hand, as before nats-server 2.11): each is given a share of every
// chain. Under SIGKILLs, SIGSTOPs, SIGTERMs and two restarts of the
// consumer's PostgreSQL, every token is in the inbox once, and no
// subscriber says a message was given to another client or went missing
// while nothing is (issue 71: 3,793 and 63 such ERRORs in a 300 s run,
// an on-call engineer sent to delete the consumer or resync for nothing).
// A message really removed from the stream before any read it is still
// said.
func TestSharedInboxDurable(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pgtest.Shared(t), 10, 50*time.Millisecond)
	p := c.tailer()
	p.waitLog("msg=streaming", 1, 30*time.Second)
	consumerPG := ownServer(t)
	consumerURL := consumerPG.CreateDB(t)
	js := c.jsOf()
	if _, err := js.CreateConsumer(c.ctx, "MAILROOM", jetstream.ConsumerConfig{
		Durable: "shared", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 2 * time.Second,
		DeliverPolicy: jetstream.DeliverAllPolicy, FilterSubjects: wire.DataSubjects("mailroom.batches"), MaxAckPending: 1000,
	}); err != nil {
		t.Fatal(err)
	}
	start := func() *proc {
		return c.command([]string{"subscribe", "--durable", "shared", "--into", "inbox", "--migrate", "--from-start", "--ack-wait", "2s"},
			"MAILROOM_INBOX_URL="+consumerURL)
	}
	subs := []*proc{start(), start(), start()}
	all := append([]*proc{}, subs...)
	w := c.startWriter(3, 10*time.Millisecond)
	for round := range 40 {
		time.Sleep(time.Duration(100+rand.IntN(400)) * time.Millisecond)
		// One started while the database restarted exits 1, naming it.
		for j, s := range subs {
			select {
			case <-s.done:
				if !strings.Contains(s.out.String(), "subscribe failed") {
					t.Fatalf("a subscriber exited by itself:\n%s", s.out.String())
				}
				subs[j] = start()
				all = append(all, subs[j])
			default:
			}
		}
		i := rand.IntN(len(subs))
		switch round % 4 {
		case 0, 2:
			subs[i].kill()
		case 1:
			subs[i].freeze()
			time.Sleep(time.Duration(500+rand.IntN(3000)) * time.Millisecond)
			subs[i].thaw()
			continue
		case 3:
			// -1: the signal came before the process set its handlers.
			if code := subs[i].term(30 * time.Second); code != exitOK && code != -1 && !strings.Contains(subs[i].out.String(), "subscribe failed") {
				t.Fatalf("subscriber: exit %d after SIGTERM:\n%s", code, subs[i].out.String())
			}
		}
		subs[i] = start()
		all = append(all, subs[i])
		if round == 10 || round == 30 {
			if err := consumerPG.Stop("fast"); err != nil {
				t.Fatal(err)
			}
			time.Sleep(500 * time.Millisecond)
			if err := consumerPG.Start(); err != nil {
				t.Fatal(err)
			}
		}
	}
	w.halt()
	if w.err != nil {
		t.Fatal(w.err)
	}
	written := c.expectExactlyOnce(60 * time.Second)
	conn, err := pgx.Connect(c.ctx, consumerURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	tailertest.EventuallyProgressing(t, time.Minute, func() (int, error) {
		var n int
		if err := conn.QueryRow(c.ctx, `SELECT count(*) FROM mailroom_inbox`).Scan(&n); err != nil {
			return 0, err
		}
		if n != written {
			return n, fmt.Errorf("%d of %d tokens in the inbox", n, written)
		}
		return n, nil
	})
	t.Logf("%d tokens once in the inbox through %d subscriber processes", written, len(all))
	for _, s := range all {
		for _, alarm := range []string{"given to another client", "messages missing"} {
			if strings.Contains(s.out.String(), alarm) {
				t.Fatalf("a subscriber said %q while nothing was missing:\n%s", alarm, grepLines(s.out.String(), alarm))
			}
		}
	}

	// A message removed before any subscriber read it is said.
	for _, s := range subs {
		s.kill()
	}
	c.accountsOnStream("gone", 3)
	stream, err := js.Stream(c.ctx, "MAILROOM")
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.DeleteMsg(c.ctx, c.messageOf(c.tokenIDs("gone")[0])); err != nil {
		t.Fatal(err)
	}
	start().waitLog("messages missing", 1, 30*time.Second)
}
