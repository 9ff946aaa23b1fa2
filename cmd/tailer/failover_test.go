package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/internal/testutil/tailertest"
)

// failover is a primary with a streaming standby that the primary waits
// for (synchronized_standby_slots), a cluster on the primary, and the URL
// of both hosts that follows whichever is primary.
type failover struct {
	*cluster
	primary, standby *pgtest.Server
	dbName, both     string
}

func newFailover(t *testing.T) *failover {
	t.Helper()
	major, err := pgtest.Major()
	if err != nil {
		t.Fatal(err)
	}
	if major < 17 {
		t.Skipf("PostgreSQL %d has no failover slots (CI runs this on 17 and 18: make test-pg VERSION=17)", major)
	}
	primary := ownServer(t)
	c := newCluster(t, primary, 10, 50*time.Millisecond)
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
	f := &failover{cluster: c, primary: primary, standby: standby}
	f.dbName = c.URL[strings.LastIndex(c.URL, "/")+1 : strings.Index(c.URL, "?")]
	f.both = fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/%s?sslmode=disable&target_session_attrs=read-write", primary.Port, standby.Port, f.dbName)
	return f
}

// writeThrough inserts accounts through the URL of both hosts until stop
// is closed, going on after the primary dies once the standby is
// promoted; it returns how many inserts committed.
func (f *failover) writeThrough(stop <-chan struct{}) <-chan int {
	done := make(chan int, 1)
	go func() {
		n := 0
		defer func() { done <- n }()
		var wc *pgx.Conn
		for i := 0; ; i++ {
			select {
			case <-stop:
				if wc != nil {
					wc.Close(context.Background())
				}
				return
			default:
			}
			if wc == nil {
				ctx, cancel := context.WithTimeout(f.ctx, 2*time.Second)
				c, err := pgx.Connect(ctx, f.both)
				cancel()
				if err != nil {
					time.Sleep(50 * time.Millisecond)
					continue
				}
				wc = c
			}
			if _, err := wc.Exec(f.ctx, fmt.Sprintf(`INSERT INTO accounts (email, login) SELECT 'w%d_' || g || '@x', 'w%d_' || g FROM generate_series(1, 5) g`, i, i)); err != nil {
				wc.Close(context.Background())
				wc = nil
				continue
			}
			n += 5
		}
	}()
	return done
}

// failOver kills the primary (immediate stop, as a SIGKILL of its
// postmaster) under writes and promotes the standby; the test's own
// statements then go to the new primary.
//
// A slot that is not a failover slot is sent changes the standby may not
// have yet, and a tailer that published them faces a new primary that
// never had them: that is a failover of its own (TestFailoverLosingPublishedWAL).
// To fail over without it, hold is stopped (SIGSTOP) before the kill until
// the standby has received all the WAL the primary could have sent it,
// and let go once the standby is promoted.
func (f *failover) failOver(t *testing.T, stop chan struct{}, written <-chan int, hold *proc) *pgx.Conn {
	t.Helper()
	time.Sleep(300 * time.Millisecond)
	if hold != nil {
		hold.freeze()
		defer hold.thaw()
		f.standbyReceivedAll(t)
	}
	if err := f.primary.Stop("immediate"); err != nil {
		t.Fatal(err)
	}
	if err := f.standby.Promote(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	close(stop)
	t.Logf("%d tokens written through both hosts", <-written)
	conn, err := pgx.Connect(f.ctx, f.standby.URL(f.dbName))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	f.Conn, f.URL = conn, f.standby.URL(f.dbName)
	return conn
}

// standbyReceivedAll waits until the standby has received the WAL the
// primary had flushed, which bounds what a walsender sent before now.
func (f *failover) standbyReceivedAll(t *testing.T) {
	t.Helper()
	var s string
	if err := f.Conn.QueryRow(f.ctx, `SELECT pg_current_wal_flush_lsn()::text`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	flushed, err := pglogrepl.ParseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	sconn, err := pgx.Connect(f.ctx, f.standby.URL(f.dbName))
	if err != nil {
		t.Fatal(err)
	}
	defer sconn.Close(context.Background())
	tailertest.Eventually(t, 30*time.Second, func() error {
		var got *string
		if err := sconn.QueryRow(f.ctx, `SELECT pg_last_wal_receive_lsn()::text`).Scan(&got); err != nil {
			return err
		}
		if got != nil {
			if l, _ := pglogrepl.ParseLSN(*got); l >= flushed {
				return nil
			}
		}
		return fmt.Errorf("the standby has received WAL up to %v, the primary flushed %s", got, flushed)
	})
}

// noneLost checks that every token on the stream is one the new primary
// holds: none was published that the failover lost.
func (f *failover) noneLost(t *testing.T) {
	t.Helper()
	rows, _ := f.Conn.Query(f.ctx, `SELECT id FROM tokens`)
	have, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	exists := map[int64]bool{}
	for _, id := range have {
		exists[id] = true
	}
	for id := range f.tokenCounts() {
		if !exists[id] {
			t.Errorf("token %d was published but the promoted standby never had it: the primary sent logical changes the standby lacked", id)
		}
	}
}

// A primary failover on PostgreSQL 17+, as a failover manager does it: the
// slot is a failover slot (tailer run makes the one migrate made so),
// synchronized to the standby; the primary dies under writes and the
// standby is promoted. The same tailer process, given both hosts with
// target_session_attrs=read-write, goes on from the promoted standby on
// its next timeline: every token the new primary holds once, none it
// lacks.
func TestFailoverSlotSurvivesPromotion(t *testing.T) {
	t.Parallel()
	f := newFailover(t)
	p := f.tailer("MAILROOM_DATABASE_URL="+f.both, "MAILROOM_REPLICATION_TIMEOUT=5000")
	p.waitLog("msg=streaming", 1, 30*time.Second)
	p.waitLog("slot failover changed", 1, 10*time.Second)
	f.Exec(`INSERT INTO accounts (email, login) SELECT 'fo' || g || '@x', 'fo' || g FROM generate_series(1, 30) g`)
	if n := f.expectExactlyOnce(30 * time.Second); n != 30 {
		t.Fatalf("%d tokens before the failover", n)
	}

	// The standby has the slot, synced, at or past what was confirmed.
	ctx := f.ctx
	sconn, err := pgx.Connect(ctx, f.standby.URL(f.dbName))
	if err != nil {
		t.Fatal(err)
	}
	defer sconn.Close(context.Background())
	confirmed := f.ConfirmedLSN("mailroom")
	nudged := time.Time{}
	tailertest.Eventually(t, 60*time.Second, func() error {
		var synced bool
		var lsn *string
		// The standby keeps its copy only once the primary's restart_lsn
		// has passed the WAL the standby reserved for it, and restart_lsn
		// moves at running-xacts records, which the background writer
		// logs every 15 s at best: on a loaded machine that took longer
		// than this wait. A record written here (once a second) moves it
		// at the tailer's next confirmation.
		if time.Since(nudged) > time.Second {
			f.Exec(`SELECT pg_log_standby_snapshot()`)
			nudged = time.Now()
		}
		sconn.Exec(ctx, `SELECT pg_sync_replication_slots()`)
		err := sconn.QueryRow(ctx, `SELECT synced AND NOT temporary, confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'mailroom'`).Scan(&synced, &lsn)
		if err == nil && synced && lsn != nil {
			if l, _ := pglogrepl.ParseLSN(*lsn); l >= confirmed {
				return nil
			}
		}
		return fmt.Errorf("the slot never synced to the standby at %s: synced=%v lsn=%v err=%v", confirmed, synced, lsn, err)
	})
	rep, code := f.status(1 << 40)
	if code != 0 || !rep.Failover || rep.Synced {
		t.Fatalf("status on the primary: exit %d, %+v", code, rep)
	}
	primaryURL := f.URL
	f.URL = f.standby.URL(f.dbName)
	rep, _ = f.status(1 << 40)
	if !rep.Failover || !rep.Synced || rep.Incarnation == "" {
		t.Fatalf("status on the standby: %+v", rep)
	}
	f.URL = primaryURL

	stop := make(chan struct{})
	f.failOver(t, stop, f.writeThrough(stop), nil)
	n := f.expectExactlyOnce(90 * time.Second)
	f.noneLost(t)
	if strings.Contains(p.out.String(), "holds batches") || strings.Contains(p.out.String(), "level=ERROR msg=fatal") {
		t.Fatalf("the tailer refused the promoted standby:\n%s", p.out.String())
	}
	rep, code = f.status(1 << 40)
	if code != 0 || !rep.Active || !rep.Failover {
		t.Fatalf("status on the promoted standby: exit %d, %+v", code, rep)
	}
	t.Logf("%d tokens exactly once across the failover", n)
}

// The same failover with MAILROOM_SLOT_FAILOVER=false, as on PostgreSQL 16
// and older: the promoted standby has no slot, the tailer refuses to make
// one (the tokens since its last confirmation are in no slot) and names
// tailer resync, which then publishes every token once.
func TestFailoverWithoutFailoverSlot(t *testing.T) {
	t.Parallel()
	f := newFailover(t)
	p := f.watchedTailer("MAILROOM_DATABASE_URL="+f.both, "MAILROOM_REPLICATION_TIMEOUT=5000", "MAILROOM_SLOT_FAILOVER=false")
	p.waitLog("msg=streaming", 1, 30*time.Second)
	f.Exec(`INSERT INTO accounts (email, login) SELECT 'fo' || g || '@x', 'fo' || g FROM generate_series(1, 30) g`)
	f.expectExactlyOnce(30 * time.Second)
	stop := make(chan struct{})
	f.failOver(t, stop, f.writeThrough(stop), p.proc)
	// tailer status has no slot to show; /readyz and the log say why.
	want := "does not exist, but this database recorded it"
	tailertest.Eventually(t, 60*time.Second, func() error {
		code, body := httpGet(p.base + "/readyz")
		if code == 503 && strings.Contains(body, want) && strings.Contains(body, "tailer resync") && strings.Contains(p.out.String(), want) {
			return nil
		}
		return fmt.Errorf("not blocked naming %q: /readyz %d %s\n%s", want, code, body, p.out.String())
	})
	r := f.command([]string{"resync"}, "MAILROOM_DATABASE_URL="+f.both)
	if code := r.exit(60 * time.Second); code != exitOK {
		t.Fatalf("resync: exit %d:\n%s", code, r.out.String())
	}
	f.Exec(`INSERT INTO accounts (email, login) SELECT 'after' || g || '@x', 'after' || g FROM generate_series(1, 10) g`)
	t.Logf("%d tokens exactly once after the resync", f.expectExactlyOnce(60*time.Second))
	f.noneLost(t)
}

// A failover that loses WAL the tailer already published, as it can
// without a failover slot (asynchronous replication, 16 and older or the
// setting off): the standby is stopped, tokens committed on the primary
// are published, then the primary dies and the standby is promoted
// without them. The tailer must not go on as if the stream described the
// new primary: it refuses, naming the branch point and tailer resync, and
// the resync then publishes every token the new primary holds once. The
// lost tokens stay on the stream (they were mailed); none else is there.
func TestFailoverLosingPublishedWAL(t *testing.T) {
	t.Parallel()
	f := newFailover(t)
	p := f.watchedTailer("MAILROOM_DATABASE_URL="+f.both, "MAILROOM_REPLICATION_TIMEOUT=5000", "MAILROOM_SLOT_FAILOVER=false")
	p.waitLog("msg=streaming", 1, 30*time.Second)
	f.Exec(`INSERT INTO accounts (email, login) SELECT 'kept' || g || '@x', 'kept' || g FROM generate_series(1, 30) g`)
	f.expectExactlyOnce(30 * time.Second)
	f.standbyReceivedAll(t)

	// Stopped, the standby receives nothing; the slot is not a failover
	// slot, so the primary does not wait for it.
	if err := f.standby.Stop("fast"); err != nil {
		t.Fatal(err)
	}
	var kept int64
	if err := f.Conn.QueryRow(f.ctx, `SELECT max(id) FROM tokens`).Scan(&kept); err != nil {
		t.Fatal(err)
	}
	f.Exec(`INSERT INTO accounts (email, login) SELECT 'lost' || g || '@x', 'lost' || g FROM generate_series(1, 20) g`)
	f.expectExactlyOnce(30 * time.Second)
	rows, _ := f.Conn.Query(f.ctx, `SELECT id FROM tokens WHERE id > $1`, kept)
	lost, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil || len(lost) != 20 {
		t.Fatalf("%d tokens committed while the standby was cut off, want 20 (%v)", len(lost), err)
	}

	if err := f.primary.Stop("immediate"); err != nil {
		t.Fatal(err)
	}
	if err := f.standby.Start(); err != nil {
		t.Fatal(err)
	}
	if err := f.standby.Promote(); err != nil {
		t.Fatal(err)
	}
	sconn, err := pgx.Connect(f.ctx, f.standby.URL(f.dbName))
	if err != nil {
		t.Fatal(err)
	}
	defer sconn.Close(context.Background())
	f.Conn, f.URL = sconn, f.standby.URL(f.dbName)
	// Said where an operator looks, the same way: the log, /readyz,
	// tailer_blocked and tailer status; the tailer waits (under a
	// supervisor it no longer exits again and again).
	want := "published past the point where this server's timeline branched"
	p.blocked(f.cluster, "stream", want)
	if !strings.Contains(p.out.String(), "tailer resync") {
		t.Fatalf("the refusal does not name tailer resync:\n%s", p.out.String())
	}

	r := f.command([]string{"resync"}, "MAILROOM_DATABASE_URL="+f.both)
	if code := r.exit(60 * time.Second); code != exitOK {
		t.Fatalf("resync: exit %d:\n%s", code, r.out.String())
	}
	// The new primary hands out the lost tokens' ids again (sequences
	// recover to their last logged value): consumers tell tokens apart by
	// key, and so that this test can count by id, new ones start past them.
	f.Exec(`SELECT setval('tokens_id_seq', 1000)`)
	// The waiting tailer goes on by itself from the new slot.
	p.waitLog("msg=streaming", 2, 60*time.Second)
	p.ready(f.cluster)
	f.Exec(`INSERT INTO accounts (email, login) SELECT 'after' || g || '@x', 'after' || g FROM generate_series(1, 10) g`)
	n := f.expectExactlyOnce(60 * time.Second)
	counts := f.tokenCounts()
	for _, id := range lost {
		if counts[id] != 1 {
			t.Errorf("lost token %d is on the stream %d times, want the once it was published", id, counts[id])
		}
	}
	if len(counts) != n+len(lost) {
		t.Errorf("%d tokens on the stream, want the new primary's %d and the %d lost", len(counts), n, len(lost))
	}
	t.Logf("%d tokens exactly once after the resync, and the %d lost ones once", n, len(lost))
}

// MAILROOM_SLOT_FAILOVER=true where the server has no failover slots is a
// configuration error: exit 2, naming the setting and the version, before
// anything is made.
func TestFailoverRefusedBefore17(t *testing.T) {
	t.Parallel()
	if major, err := pgtest.Major(); err != nil {
		t.Fatal(err)
	} else if major >= 17 {
		t.Skipf("PostgreSQL %d has failover slots", major)
	}
	c := newClusterWithoutSlot(t, pgtest.Shared(t), 10, 50*time.Millisecond)
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
