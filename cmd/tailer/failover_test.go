package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/mailroom/tailer/testutil/pgtest"
)

// A primary failover on PostgreSQL 17+, as a failover manager does it: the
// slot is a failover slot (tailer run makes the one migrate made so),
// synchronized to a streaming standby that the primary waits for
// (synchronized_standby_slots); the primary dies under writes and the
// standby is promoted. The same tailer process, given both hosts with
// target_session_attrs=read-write, goes on from the promoted standby on
// its next timeline: every token once, none published that the failover
// lost.
func TestFailoverSlotSurvivesPromotion(t *testing.T) {
	primary, err := pgtest.Start(pgtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { primary.Close() })
	c := newCluster(t, primary, 10, 50*time.Millisecond)
	if major := c.serverMajor(); major < 17 {
		t.Skipf("PostgreSQL %d has no failover slots (CI runs this on 17 and 18: make test-pg VERSION=17)", major)
	}
	// The slot is synchronized by hand (pg_sync_replication_slots), at the
	// points the test chooses; sync_replication_slots=on does the same in
	// a loop.
	standby, err := primary.Standby("standby1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { standby.Close() })
	c.Exec(`ALTER SYSTEM SET synchronized_standby_slots = 'standby1'`)
	c.Exec(`SELECT pg_reload_conf()`)

	dbName := c.URL[strings.LastIndex(c.URL, "/")+1 : strings.Index(c.URL, "?")]
	both := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/%s?sslmode=disable&target_session_attrs=read-write", primary.Port, standby.Port, dbName)
	p := c.tailer("MAILROOM_DATABASE_URL="+both, "MAILROOM_REPLICATION_TIMEOUT=5000")
	p.waitLog("msg=streaming", 1, 30*time.Second)
	p.waitLog("slot failover changed", 1, 10*time.Second)
	c.Exec(`INSERT INTO accounts (email, login) SELECT 'fo' || g || '@x', 'fo' || g FROM generate_series(1, 30) g`)
	if n := c.expectExactlyOnce(30 * time.Second); n != 30 {
		t.Fatalf("%d tokens before the failover", n)
	}

	// The standby has the slot, synced, at or past what was confirmed.
	ctx := c.ctx
	sconn, err := pgx.Connect(ctx, standby.URL(dbName))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { sconn.Close(context.Background()) }()
	confirmed := c.ConfirmedLSN("mailroom")
	deadline := time.Now().Add(60 * time.Second)
	for {
		var synced bool
		var lsn *string
		sconn.Exec(ctx, `SELECT pg_sync_replication_slots()`)
		err := sconn.QueryRow(ctx, `SELECT synced AND NOT temporary, confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'mailroom'`).Scan(&synced, &lsn)
		if err == nil && synced && lsn != nil {
			if l, _ := pglogrepl.ParseLSN(*lsn); l >= confirmed {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the slot never synced to the standby at %s: synced=%v lsn=%v err=%v", confirmed, synced, lsn, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	rep, code := c.status(1 << 40)
	if code != 0 || !rep.Failover || rep.Synced {
		t.Fatalf("status on the primary: exit %d, %+v", code, rep)
	}
	primaryURL := c.URL
	c.URL = standby.URL(dbName)
	rep, _ = c.status(1 << 40)
	if !rep.Failover || !rep.Synced || rep.Incarnation == "" {
		t.Fatalf("status on the standby: %+v", rep)
	}
	c.URL = primaryURL

	// Writes go on while the primary dies; those it had not sent to the
	// standby are lost with it, and must not have been published.
	writes := make(chan int)
	go func() {
		n := 0
		defer func() { writes <- n }()
		wc, err := pgx.Connect(ctx, c.URL)
		if err != nil {
			return
		}
		defer wc.Close(context.Background())
		for i := 0; ; i++ {
			if _, err := wc.Exec(ctx, fmt.Sprintf(`INSERT INTO accounts (email, login) SELECT 'w%d_' || g || '@x', 'w%d_' || g FROM generate_series(1, 5) g`, i, i)); err != nil {
				return
			}
			n += 5
		}
	}()
	time.Sleep(300 * time.Millisecond)
	if err := primary.Stop("immediate"); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d tokens written before the primary died", <-writes)
	if err := standby.Promote(); err != nil {
		t.Fatal(err)
	}
	c.Conn, c.URL = sconn, standby.URL(dbName)
	c.Exec(`INSERT INTO accounts (email, login) SELECT 'after' || g || '@x', 'after' || g FROM generate_series(1, 20) g`)
	n := c.expectExactlyOnce(90 * time.Second)
	var have []int64
	rows, _ := sconn.Query(ctx, `SELECT id FROM tokens`)
	if have, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
		t.Fatal(err)
	}
	exists := map[int64]bool{}
	for _, id := range have {
		exists[id] = true
	}
	for id := range c.tokenCounts() {
		if !exists[id] {
			t.Errorf("token %d was published but the promoted standby never had it: the primary sent logical changes the standby lacked", id)
		}
	}
	if strings.Contains(p.out.String(), "another database") || strings.Contains(p.out.String(), "level=ERROR msg=fatal") {
		t.Fatalf("the tailer refused the promoted standby:\n%s", p.out.String())
	}
	rep, code = c.status(1 << 40)
	if code != 0 || !rep.Active || !rep.Failover {
		t.Fatalf("status on the promoted standby: exit %d, %+v", code, rep)
	}
	t.Logf("%d tokens exactly once across the failover", n)
}

// MAILROOM_SLOT_FAILOVER=true where the server has no failover slots is a
// configuration error: exit 2, naming the setting and the version, before
// anything is made.
func TestFailoverRefusedBefore17(t *testing.T) {
	c := newClusterWithoutSlot(t, pgtest.Shared(t), 10, 50*time.Millisecond)
	if major := c.serverMajor(); major >= 17 {
		t.Skipf("PostgreSQL %d has failover slots", major)
	}
	for _, args := range [][]string{{"migrate"}, {"run", "--http-addr="}} {
		p := c.command(args, "MAILROOM_SLOT_FAILOVER=true")
		out := p.out
		if code := p.exit(30 * time.Second); code != exitConfig || !strings.Contains(out.String(), "MAILROOM_SLOT_FAILOVER") || !strings.Contains(out.String(), "PostgreSQL 17") {
			t.Fatalf("tailer %s with MAILROOM_SLOT_FAILOVER=true: exit %d, want %d naming the setting:\n%s", args[0], code, exitConfig, out.String())
		}
	}
	var slots int
	if err := c.Conn.QueryRow(c.ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'mailroom'`).Scan(&slots); err != nil || slots != 0 {
		t.Fatalf("a slot was made anyway (%d, %v)", slots, err)
	}
}
