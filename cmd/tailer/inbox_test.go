package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/internal/testutil/tailertest"
	"github.com/mailroom/tailer/publish/token"
)

// Into PostgreSQL, exactly once (issue 35, acceptance 1): 20,000 tokens
// taken by two database subscribers, one into the inbox table and one into
// River jobs, each SIGKILLed 25 times while the tokens are written, their
// acks held a moment by a lossy link so that kills land between a commit
// and its ack (the subscribers count the messages they find stored
// already), and the consumer's PostgreSQL restarted twice meanwhile. Every
// token key is in the inbox once and in River once.
func TestSubscribeIntoPostgres(t *testing.T) {
	t.Parallel()
	const total = 20_000
	c := newCluster(t, pgtest.Shared(t), 10, 50*time.Millisecond)
	p := c.tailer()
	p.waitLog("msg=streaming", 1, 30*time.Second)
	consumerPG := ownServer(t)
	consumerURL := consumerPG.CreateDB(t)
	link := lossyDelayProxy(t, fmt.Sprintf("127.0.0.1:%d", c.natsPort), 60*time.Millisecond)
	link.Arm()
	start := func(into string) *proc {
		return c.command([]string{"subscribe", "--durable", into, "--into", into, "--migrate", "--from-start", "--ack-wait", "2s"},
			"MAILROOM_NATS_URL=nats://"+link.Addr, "MAILROOM_INBOX_URL="+consumerURL)
	}
	subs := map[string]*proc{"inbox": start("inbox"), "river": start("river")}
	var exited []*proc

	// A kill lands where it tests something once the subscriber stores:
	// on a slow machine a fresh one may take longer than the pause to
	// get there.
	consuming := func(p *proc) {
		tailertest.Eventually(t, time.Minute, func() error {
			select {
			case <-p.done:
				return nil
			default:
			}
			if !strings.Contains(p.out.String(), "sink=*inbox.DB") {
				return errors.New("not consuming yet")
			}
			return nil
		})
	}
	w := c.startWriter(20, 5*time.Millisecond)
	kills := 0
	for kills < 50 {
		into := []string{"inbox", "river"}[kills%2]
		consuming(subs[into])
		time.Sleep(time.Duration(200+rand.IntN(600)) * time.Millisecond)
		subs[into].kill()
		exited = append(exited, subs[into])
		subs[into] = start(into)
		kills++
		if kills == 15 || kills == 35 {
			if err := consumerPG.Stop("fast"); err != nil {
				t.Fatal(err)
			}
			time.Sleep(500 * time.Millisecond)
			if err := consumerPG.Start(); err != nil {
				t.Fatal(err)
			}
		}
		if w.count.Load() >= total {
			w.halt()
		}
	}
	tailertest.Eventually(t, 120*time.Second, func() error {
		if n := w.count.Load(); n < total {
			return fmt.Errorf("%d tokens written", n)
		}
		return nil
	})
	w.halt()
	if w.err != nil {
		t.Fatal(w.err)
	}
	written := c.expectExactlyOnce(60 * time.Second)

	rows, _ := c.Conn.Query(c.ctx, `SELECT secret FROM tokens`)
	secrets, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, s := range secrets {
		want[string(token.AppendKey(nil, (*[32]byte)(s)))] = true
	}
	conn, err := pgx.Connect(c.ctx, consumerURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for _, q := range []struct{ name, query string }{
		{"inbox rows", `SELECT token_key FROM mailroom_inbox`},
		{"River jobs", `SELECT args->>'token_key' FROM river_job WHERE kind = 'mailroom_token'`},
	} {
		tailertest.EventuallyProgressing(t, 30*time.Second, func() (int, error) {
			rows, _ := conn.Query(c.ctx, q.query)
			keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				return 0, err
			}
			seen := map[string]int{}
			for _, k := range keys {
				if seen[k]++; seen[k] > 1 {
					t.Fatalf("%s: token key %s twice", q.name, k)
				}
				if !want[k] {
					t.Fatalf("%s: token key %s of no token", q.name, k)
				}
			}
			if len(seen) < len(want) {
				return len(seen), fmt.Errorf("%s: %d of %d tokens", q.name, len(seen), len(want))
			}
			return len(seen), nil
		})
	}
	again := 0
	for _, s := range append(exited, subs["inbox"], subs["river"]) {
		again += strings.Count(s.out.String(), "message stored before")
	}
	t.Logf("%d tokens, %d kills, 2 PostgreSQL restarts; %d messages found stored already (killed between commit and ack, or the ack lost)", written, kills, again)
	if again == 0 {
		t.Fatal("no kill came between a commit and its ack: the test did not test that")
	}
}
