package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/internal/testutil/tailertest"
	"github.com/mailroom/tailer/migrations/migratetest"
	"github.com/mailroom/tailer/publish/subscriber"
	"github.com/mailroom/tailer/publish/token"
	"github.com/mailroom/tailer/publish/wire"
	"github.com/mailroom/tailer/publish/wire/wiretest"
)

func TestCrashLoop(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		perAction bool
	}{{"one subject", false}, {"subject per action", true}} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, pgtest.Shared(t), 10, 100*time.Millisecond)
			env := []string{"MAILROOM_SUBJECT_PER_ACTION=" + strconv.FormatBool(tc.perAction)}
			c.Exec(`INSERT INTO accounts (email, login, status) SELECT 'act' || g || '@x', 'act' || g, 'active' FROM generate_series(1, 50) g`)
			// Three tokens a transaction (plus two recoveries per action
			// mode) against batches of ten: a restart resumes at a
			// transaction end inside an already published batch, so
			// replayed batches get new ids and only the stream's last
			// position keeps them from being published twice.
			recoveries := 0
			if tc.perAction {
				recoveries = 2
			}
			w := c.startMixedWriter(3, recoveries, 10*time.Millisecond)
			rng := rand.New(rand.NewPCG(1, 2))
			for i := 0; i < 12; i++ {
				p := c.tailer(env...)
				// Kill at a random moment: sometimes before it streams.
				time.Sleep(time.Duration(50+rng.IntN(600)) * time.Millisecond)
				p.kill()
			}
			w.halt()
			if w.err != nil {
				t.Fatal(w.err)
			}
			p := c.tailer(env...)
			// The killed tailers may have published every token already:
			// a SIGTERM before this one handles signals would kill it.
			p.waitLog("msg=streaming", 1, 30*time.Second)
			n := c.expectExactlyOnce(60 * time.Second)
			if code := p.term(15 * time.Second); code != 0 {
				t.Fatalf("exit code %d after SIGTERM", code)
			}
			t.Logf("%d tokens written during 12 SIGKILLs, each on the stream exactly once", n)
			if n < 100 {
				t.Fatalf("only %d tokens written: the writer did not run", n)
			}
		})
	}
}

func TestSIGTERMPublishesPendingBatch(t *testing.T) {
	t.Parallel()
	// No timeout can cut the batch: only the shutdown does.
	c := newCluster(t, pgtest.Shared(t), 10, time.Hour)
	p, base := c.tailerWithHTTP()
	p.waitLog("msg=streaming", 1, 30*time.Second)
	// MAILROOM_MAX_IN_FLIGHT=auto: one replica stores one message at a time.
	if !strings.Contains(p.out.String(), "replicas=1 ") || !strings.Contains(p.out.String(), "max_in_flight=1") {
		t.Errorf("streaming on an R1 stream with max_in_flight auto:\n%s", p.out.String())
	}
	c.Exec(`INSERT INTO accounts (email, login) SELECT 'h' || g || '@x', 'h' || g FROM generate_series(1, 3) g`)
	end := c.WalLSN()
	// The tailer has read the three tokens into its open batch.
	c.waitPending(base, 3)
	if got := len(c.tokenCounts()); got != 0 {
		t.Fatalf("%d tokens published before SIGTERM with a one-hour timeout", got)
	}
	if code := p.term(15 * time.Second); code != 0 {
		t.Fatalf("exit code %d, want 0:\n%s", code, p.out.String())
	}
	if n := c.expectExactlyOnce(time.Second); n != 3 {
		t.Fatalf("%d tokens, want 3", n)
	}
	if s := c.slot(); s.ConfirmedFlush < end {
		t.Fatalf("slot confirmed at %s after shutdown, before the published batch's end %s", s.ConfirmedFlush, end)
	}
}

func TestStandbyTakesOver(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pgtest.Shared(t), 10, 100*time.Millisecond)
	a := c.tailer()
	a.waitLog("msg=streaming", 1, 30*time.Second)
	port, err := pgtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	b := c.tailer(fmt.Sprintf("MAILROOM_HTTP_ADDR=127.0.0.1:%d", port))
	b.waitLog("standing by", 1, 30*time.Second)
	// The standby says who owns the slot, and that it is not ready.
	if code, body := httpGet(fmt.Sprintf("http://127.0.0.1:%d/readyz", port)); code != 503 || !strings.Contains(body, "standing by: slot mailroom is owned by another process: tailer run (backend pid ") {
		t.Fatalf("standby's /readyz = %d %s", code, body)
	}
	w := c.startWriter(3, 20*time.Millisecond)
	time.Sleep(500 * time.Millisecond)
	a.kill()
	b.waitLog("msg=streaming", 1, 15*time.Second)
	time.Sleep(500 * time.Millisecond)
	w.halt()
	if w.err != nil {
		t.Fatal(w.err)
	}
	c.expectExactlyOnce(30 * time.Second)
}

func TestIdleSlotAdvances(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pgtest.Shared(t), 10, 100*time.Millisecond)
	// Active accounts get no activation token.
	c.Exec(`INSERT INTO accounts (email, login, status) SELECT 'i' || g || '@x', 'i' || g, 'active' FROM generate_series(1, 10000) g`)
	p, base := c.tailerWithHTTP("MAILROOM_HEARTBEAT_INTERVAL=200", "MAILROOM_LAG_INTERVAL=200")
	p.waitLog("msg=streaming", 1, 30*time.Second)

	other, err := pgx.Connect(c.ctx, pgtest.Shared(t).CreateDB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(context.Background())
	if _, err := other.Exec(c.ctx, `CREATE TABLE busy (id int PRIMARY KEY, n int, pad text); INSERT INTO busy SELECT g, 0, repeat('x', 100) FROM generate_series(1, 10000) g`); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name   string
		update func(i int) error
	}{
		{"account updates in the tailer's database", func(i int) error {
			_, err := c.Conn.Exec(c.ctx, `UPDATE accounts SET created_at = created_at + 1 WHERE id % 100 = $1`, i)
			return err
		}},
		// WAL is shared by the whole server: a quiet database on a busy
		// server must not make it retain WAL either.
		{"writes in another database", func(i int) error {
			_, err := other.Exec(c.ctx, `UPDATE busy SET n = n + 1 WHERE id % 100 = $1`, i)
			return err
		}},
	} {
		before := c.WalLSN()
		for i := 0; i < 100; i++ {
			if err := tc.update(i); err != nil {
				t.Fatal(err)
			}
		}
		written := int64(c.WalLSN() - before)
		if written < 2<<20 {
			t.Fatalf("%s: 10,000 updates wrote only %d bytes of WAL: a lag under 1 MiB would prove nothing", tc.name, written)
		}
		// A checkpoint logs the running transactions, which is what lets
		// the walsender move the slot's restart position (every 15 s
		// otherwise, on a server that writes).
		c.Exec(`CHECKPOINT`)
		tailertest.Eventually(t, 15*time.Second, func() error {
			if s := c.slot(); s.LagBytes() >= 1<<20 || s.RetainedBytes() >= 1<<20 {
				return fmt.Errorf("%s: slot lag still %d bytes, retained WAL %d bytes (confirmed %s, restart %s, current %s)", tc.name, s.LagBytes(), s.RetainedBytes(), s.ConfirmedFlush, s.RestartLSN, s.CurrentLSN)
			}
			if lag := lagOf(base); lag < 0 || lag >= 1 {
				return fmt.Errorf("%s: tailer_lag_seconds %v", tc.name, lag)
			}
			return nil
		})
		t.Logf("%s: 10,000 updates wrote %d bytes of WAL; slot lag and retained WAL under 1 MiB, lag under a second", tc.name, written)
	}
	if got := len(c.tokenCounts()); got != 0 {
		t.Fatalf("%d tokens published", got)
	}
	p.term(15 * time.Second)
}

func TestSecondSignalExitsAtOnce(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pgtest.Shared(t), 10, time.Hour)
	p, base := c.tailerWithHTTP()
	p.waitLog("msg=streaming", 1, 30*time.Second)
	c.Exec(`INSERT INTO accounts (email, login) VALUES ('s@x', 's')`)
	c.waitPending(base, 1)
	// With accounts locked the pending batch's join waits, so the graceful
	// stop cannot finish (it would wait out its drain timeout).
	lock, err := pgx.Connect(c.ctx, c.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close(context.Background())
	tx, err := lock.Begin(c.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(c.ctx, `LOCK TABLE accounts IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	time.Sleep(300 * time.Millisecond)
	select {
	case <-p.done:
		t.Fatalf("the graceful stop finished while the join was blocked:\n%s", p.out.String())
	default:
	}
	start := time.Now()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		t.Fatalf("second SIGTERM did not end the process:\n%s", p.out.String())
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 1 {
		t.Fatalf("exit code %d after an interrupted shutdown, want 1", code)
	}
	if !strings.Contains(p.out.String(), "second signal") {
		t.Fatalf("no word of the second signal in the log:\n%s", p.out.String())
	}
	t.Logf("exited %s after the second signal", time.Since(start).Round(time.Millisecond))
}

// A stop that cannot publish what it read says so with exit code 1; the
// tokens stay in the slot.
func TestStopWithoutNATSExitsNonZero(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pgtest.Shared(t), 10, time.Hour)
	p, base := c.tailerWithHTTP()
	p.waitLog("msg=streaming", 1, 30*time.Second)
	c.Exec(`INSERT INTO accounts (email, login) VALUES ('n@x', 'n')`)
	end := c.WalLSN()
	c.waitPending(base, 1)
	c.stopNATS()
	if code := p.term(30 * time.Second); code != 1 {
		t.Fatalf("exit code %d, want 1:\n%s", code, p.out.String())
	}
	if !strings.Contains(p.out.String(), "stay in the slot") {
		t.Fatalf("the log does not say what happened:\n%s", p.out.String())
	}
	if s := c.slot(); s.ConfirmedFlush >= end {
		t.Fatalf("slot confirmed at %s past the unpublished token (%s)", s.ConfirmedFlush, end)
	}
	c.startNATS()
	// The replayed token is cut by the timeout, not the one-hour one above.
	c.tailer("MAILROOM_BATCH_TIMEOUT=100")
	if n := c.expectExactlyOnce(30 * time.Second); n != 1 {
		t.Fatalf("%d tokens", n)
	}
}

func TestNATSOutage(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pgtest.Shared(t), 10, 100*time.Millisecond)
	p := c.tailer()
	p.waitLog("msg=streaming", 1, 30*time.Second)
	w := c.startWriter(2, 10*time.Millisecond)

	// The tailer rides out an outage on its own.
	time.Sleep(300 * time.Millisecond)
	c.stopNATS()
	time.Sleep(3 * time.Second)
	c.startNATS()
	time.Sleep(time.Second)

	// A second outage with the tailer killed in the middle of it: had the
	// slot been confirmed past tokens not yet on the stream, the restarted
	// tailer would never see them again.
	c.stopNATS()
	time.Sleep(1500 * time.Millisecond)
	p.kill()
	time.Sleep(500 * time.Millisecond)
	c.startNATS()
	p = c.tailer()
	time.Sleep(500 * time.Millisecond)
	w.halt()
	if w.err != nil {
		t.Fatal(w.err)
	}
	n := c.expectExactlyOnce(60 * time.Second)
	t.Logf("%d tokens across two NATS outages, each exactly once", n)
}

func TestPostgresFaults(t *testing.T) {
	t.Parallel()
	t.Run("backends terminated", func(t *testing.T) {
		c := newCluster(t, pgtest.Shared(t), 10, 100*time.Millisecond)
		p := c.tailer()
		p.waitLog("msg=streaming", 1, 30*time.Second)
		w := c.startWriter(2, 10*time.Millisecond)
		for i := 0; i < 3; i++ {
			time.Sleep(400 * time.Millisecond)
			// Both of the tailer's backends: the walsender and the query
			// connection.
			c.Exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'tailer'`)
			p.waitLog("msg=streaming", i+2, 30*time.Second)
		}
		w.halt()
		c.expectExactlyOnce(60 * time.Second)
	})
	t.Run("server restarted", func(t *testing.T) {
		pg, err := pgtest.Start(pgtest.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer pg.Close()
		c := newCluster(t, pg, 10, 100*time.Millisecond)
		p := c.tailer()
		p.waitLog("msg=streaming", 1, 30*time.Second)
		c.Exec(`INSERT INTO accounts (email, login) SELECT 'r' || g || '@x', 'r' || g FROM generate_series(1, 25) g`)
		if err := pg.Stop("fast"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		if err := pg.Start(); err != nil {
			t.Fatal(err)
		}
		db, err := pgx.Connect(c.ctx, c.URL)
		if err != nil {
			t.Fatal(err)
		}
		c.Conn = db
		c.Exec(`INSERT INTO accounts (email, login) SELECT 's' || g || '@x', 's' || g FROM generate_series(1, 25) g`)
		p.waitLog("msg=streaming", 2, 60*time.Second)
		if n := c.expectExactlyOnce(60 * time.Second); n != 50 {
			t.Fatalf("%d tokens, want 50", n)
		}
	})
}

func TestLagAndReadinessDuringNATSOutage(t *testing.T) {
	t.Parallel()
	const maxLag = 256 << 10
	c := newCluster(t, pgtest.Shared(t), 10, 100*time.Millisecond)
	port, _ := pgtest.FreePort()
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	c.tailer("MAILROOM_HTTP_ADDR=127.0.0.1:"+strconv.Itoa(port), "MAILROOM_LAG_INTERVAL=100", "MAILROOM_MAX_LAG="+strconv.Itoa(maxLag))
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		tailertest.Eventually(t, 30*time.Second, func() error {
			if !cond() {
				return errors.New("no " + what)
			}
			return nil
		})
	}
	waitFor("/readyz 200", func() bool { code, _ := httpGet(base + "/readyz"); return code == 200 })
	// tailer health, as a container healthcheck runs it: the listen
	// address may be a wildcard.
	health := func() int {
		var out bytes.Buffer
		return run([]string{"health"}, lookup(func(k string) string {
			if k == "MAILROOM_HTTP_ADDR" {
				return "0.0.0.0:" + strconv.Itoa(port)
			}
			return ""
		}), &out, &out)
	}
	if code := health(); code != exitOK {
		t.Fatalf("tailer health exit %d while /readyz is 200", code)
	}
	if code, body := httpGet(base + "/healthz"); code != 200 || !strings.Contains(body, "ok") {
		t.Fatalf("/healthz = %d %s", code, body)
	}
	// Profiles are off unless MAILROOM_PPROF=true.
	if code, _ := httpGet(base + "/debug/pprof/"); code != 404 {
		t.Fatalf("/debug/pprof/ = %d without MAILROOM_PPROF, want 404", code)
	}
	rep, code := c.status(maxLag)
	if code != 0 || !rep.OK || !rep.Active || rep.ActivePID == 0 || rep.Stream != "MAILROOM" || rep.StreamMessages == nil ||
		rep.StreamReplicas == nil || *rep.StreamReplicas != 1 || rep.WALStatus != "reserved" ||
		!strings.HasPrefix(rep.Owner, "tailer run (backend pid ") || rep.Incarnation == "" || rep.ResyncPending || rep.InactiveSince != nil {
		t.Fatalf("status before the outage: exit %d, %+v", code, rep)
	}

	w := c.startWriter(20, 5*time.Millisecond)
	c.stopNATS()
	var readyBody string
	waitFor("/readyz 503", func() bool {
		code, body := httpGet(base + "/readyz")
		readyBody = body
		return code == 503
	})
	var ready struct {
		Ready         bool     `json:"ready"`
		Reasons       []string `json:"reasons"`
		NATSConnected bool     `json:"nats_connected"`
	}
	if err := json.Unmarshal([]byte(readyBody), &ready); err != nil || ready.Ready || len(ready.Reasons) == 0 {
		t.Fatalf("/readyz body %q (%v)", readyBody, err)
	}
	if code := health(); code != exitFailure {
		t.Fatalf("tailer health exit %d while /readyz is 503", code)
	}
	waitFor("slot lag metric above the threshold", func() bool {
		_, page := httpGet(base + "/metrics")
		v, ok := metricValue(page, "tailer_slot_lag_bytes")
		return ok && v > maxLag
	})
	waitFor("tailer status to fail on lag", func() bool {
		rep, code := c.status(maxLag)
		return code == 1 && !rep.OK && rep.LagBytes > maxLag
	})
	_, page := httpGet(base + "/metrics")
	if v, _ := metricValue(page, "tailer_ready"); v != 0 {
		t.Errorf("tailer_ready = %v during the outage", v)
	}

	c.startNATS()
	w.halt()
	if w.err != nil {
		t.Fatal(w.err)
	}
	waitFor("/readyz 200 again", func() bool { code, _ := httpGet(base + "/readyz"); return code == 200 })
	waitFor("slot lag metric back under the threshold", func() bool {
		_, page := httpGet(base + "/metrics")
		v, ok := metricValue(page, "tailer_slot_lag_bytes")
		return ok && v < maxLag
	})
	rep, code = c.status(maxLag)
	if code != 0 || rep.LagBytes > maxLag {
		t.Fatalf("status after the outage: exit %d, %+v", code, rep)
	}
	_, page = httpGet(base + "/metrics")
	if !strings.Contains(page, `tailer_reconnects_total{target="nats"}`) || strings.Contains(page, `tailer_reconnects_total{target="nats"} 0`+"\n") {
		t.Errorf("no NATS reconnect counted:\n%s", grepLines(page, "tailer_reconnects_total"))
	}
	c.expectExactlyOnce(30 * time.Second)
}

// A stream published from one database, pointed at by a tailer of another
// (another database of the server, a fresh cluster): the tailer refuses to
// stream, naming both sides and the way out, in its log (once), on /readyz
// and in tailer_blocked, and tailer status exits 1, instead of skipping or
// repeating tokens.
func TestForeignStreamRefused(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pgtest.Shared(t), 10, 100*time.Millisecond)
	c.publishThenStop("o", 20)
	first := c.firstMessage()
	if first.Header.Get(wire.HeaderOrigin) == "" {
		t.Fatal("messages carry no origin")
	}

	fresh := ownServer(t)
	otherDB := migratetest.NewDB(t, pgtest.Shared(t)).URL
	freshDB := migratetest.NewDB(t, fresh)
	for _, tc := range []struct{ name, url, want string }{
		{"another database", otherDB, "published from another database"},
		{"a fresh cluster", freshDB.URL, "published from another database"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := []string{"MAILROOM_DATABASE_URL=" + tc.url, "MAILROOM_SLOT=foreign"}
			p := c.watchedTailer(env...)
			tailertest.Eventually(t, 30*time.Second, func() error {
				code, body := httpGet(p.base + "/readyz")
				_, metrics := httpGet(p.base + "/metrics")
				v, _ := metricValue(metrics, `tailer_blocked{reason="stream"}`)
				if code != 503 || v != 1 || !strings.Contains(body, tc.want) || !strings.Contains(body, first.Header.Get(wire.HeaderOrigin)) ||
					!strings.Contains(body, "MAILROOM_NATS_STREAM") || !strings.Contains(body, "tailer resync") {
					return fmt.Errorf("/readyz %d %s, tailer_blocked{stream} %v:\n%s", code, body, v, p.out.String())
				}
				return nil
			})
			if _, code := c.statusWith(1<<40, env...); code != exitFailure {
				t.Errorf("tailer status exit %d, want %d", code, exitFailure)
			}
			time.Sleep(time.Second)
			if n := strings.Count(p.out.String(), tc.want); n != 1 {
				t.Errorf("refusal said %d times, want once:\n%s", n, p.out.String())
			}
			if strings.Contains(p.out.String(), "msg=streaming") {
				t.Fatalf("streamed from a foreign stream:\n%s", p.out.String())
			}
			// Stopped: after the resync below, a tailer still waiting
			// here would take the slot first.
			p.kill()
		})
	}

	t.Run("resync is the way out", func(t *testing.T) {
		// The fresh cluster has no token the stream lacks: the resync
		// publishes nothing, and tailer run goes on from its slot all the
		// same, with positions of its own.
		env := []string{"MAILROOM_DATABASE_URL=" + freshDB.URL, "MAILROOM_SLOT=foreign"}
		r := c.command([]string{"resync"}, env...)
		if code := r.exit(30 * time.Second); code != exitOK || !strings.Contains(r.out.String(), " published=0 ") {
			t.Fatalf("resync exit %d:\n%s", code, r.out.String())
		}
		p := c.tailer(env...)
		p.waitLog("streaming", 1, 20*time.Second)
		freshDB.Exec(`INSERT INTO accounts (email, login) SELECT 'f' || g || '@x', 'f' || g FROM generate_series(1, 5) g`)
		tailertest.Eventually(t, 30*time.Second, func() error {
			n := 0
			for _, m := range c.messages() {
				if m.Header.Get(wire.HeaderOrigin) != first.Header.Get(wire.HeaderOrigin) {
					n += len(strings.Split(m.Header.Get(wire.HeaderTokenIDs), ","))
				}
			}
			if n > 5 {
				t.Fatalf("%d tokens of the fresh cluster on the stream, want 5:\n%s", n, p.out.String())
			}
			if n < 5 {
				return fmt.Errorf("%d tokens of the fresh cluster on the stream, want 5:\n%s", n, p.out.String())
			}
			return nil
		})
		p.kill()
	})

	t.Run("positions ahead of the WAL", func(t *testing.T) {
		// A stream of an older tailer (no origin or incarnation header,
		// its slot recorded as legacy by the migration) whose last
		// position is ahead of this server's WAL, as after a restore: its
		// tokens are known by key, and the server's own, at positions
		// below, are published.
		c.Exec(`UPDATE tailer_slot SET legacy = true WHERE slot = 'mailroom'`)
		nc, err := nats.Connect(c.natsURL())
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		if _, err := js.CreateStream(c.ctx, jetstream.StreamConfig{Name: "AHEAD", Subjects: []string{"ahead.batches", "ahead.batches.>"}}); err != nil {
			t.Fatal(err)
		}
		m := nats.NewMsg("ahead.batches")
		m.Header.Set(wire.HeaderMsgID, "FF/0:0-FF/0:0")
		m.Header.Set(wire.HeaderPosLast, "FF/0:0")
		m.Header.Set(wire.HeaderCount, "1")
		m.Header.Set(wire.HeaderTokenKeys, strings.Repeat("A", token.KeyLen))
		m.Data = []byte("x")
		if _, err := js.PublishMsg(c.ctx, m); err != nil {
			t.Fatal(err)
		}
		c.Exec(`INSERT INTO accounts (email, login) VALUES ('behind@x', 'behind')`)
		p := c.tailer("MAILROOM_NATS_STREAM=AHEAD", "MAILROOM_NATS_SUBJECT=ahead.batches")
		p.waitLog("the stream holds batches past this server's WAL", 1, 30*time.Second)
		s, err := js.Stream(c.ctx, "AHEAD")
		if err != nil {
			t.Fatal(err)
		}
		tailertest.Eventually(t, 30*time.Second, func() error {
			msgs, err := wiretest.StoredMessages(c.ctx, s)
			if err != nil {
				return err
			}
			for _, m := range msgs {
				if strings.Contains(string(m.Data), "behind@x") {
					return nil
				}
			}
			return fmt.Errorf("the token made below the stream's last position is not on it (%d batches):\n%s", len(msgs), p.out.String())
		})
	})
}

// A slot the server invalidated (max_slot_wal_keep_size exceeded while no
// tailer ran) is said to be lost, loudly: tailer status exits 1 and says
// so, tailer run logs it once and waits without recreating the slot, and
// /readyz and tailer_slot_invalidated say why.
func TestLostSlotIsReported(t *testing.T) {
	t.Parallel()
	c := newLosableCluster(t)

	// While no tailer runs: tokens, then more WAL than the slot may keep.
	c.Exec(`INSERT INTO accounts (email, login) SELECT 'during' || g || '@x', 'during' || g FROM generate_series(1, 5) g`)
	c.loseSlot()

	rep, code := c.status(1 << 40)
	if code != 1 || rep.OK || rep.WALStatus != "lost" {
		t.Fatalf("tailer status on a lost slot: exit %d, %+v", code, rep)
	}
	// PostgreSQL 17 says why, and since when nothing streams the slot.
	if c.serverMajor() >= 17 {
		if !strings.Contains(rep.Lost, "invalidation_reason wal_removed") || rep.InactiveSince == nil || time.Since(*rep.InactiveSince) > time.Minute {
			t.Errorf("on PostgreSQL 17+ status quotes invalidation_reason and shows inactive_since: %+v", rep)
		}
	} else if strings.Contains(rep.Lost, "invalidation_reason") || rep.InactiveSince != nil {
		t.Errorf("before PostgreSQL 17 there is no invalidation_reason or inactive_since: %+v", rep)
	}

	port, err := pgtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	p := c.tailer(fmt.Sprintf("MAILROOM_HTTP_ADDR=127.0.0.1:%d", port), "MAILROOM_LAG_INTERVAL=200")
	p.waitLog("replication slot cannot be streamed from", 1, 20*time.Second)
	tailertest.Eventually(t, 20*time.Second, func() error {
		code, body := httpGet(base + "/readyz")
		_, metrics := httpGet(base + "/metrics")
		if v, _ := metricValue(metrics, "tailer_slot_invalidated"); code != 503 || !strings.Contains(body, "is lost") || v != 1 {
			return fmt.Errorf("/readyz %d %s; tailer_slot_invalidated %v", code, body, v)
		}
		return nil
	})
	// It keeps checking but says it once, and does not recreate the slot.
	time.Sleep(6 * time.Second)
	out := p.out.String()
	if n := strings.Count(out, "replication slot cannot be streamed from"); n != 1 {
		t.Errorf("lost slot logged %d times, want once:\n%s", n, out)
	}
	if !strings.Contains(out, "tailer resync") {
		t.Errorf("the log does not say how to recover:\n%s", out)
	}
	if s := c.slot(); !s.Lost() {
		t.Errorf("the slot was recreated: wal_status %q", s.WALStatus)
	}
}

// SIGKILL while messages carrying several batches are in flight: with batch
// limit 1, a backlog and a writer, and 20 ms between the tailer and NATS,
// every PubAck takes long enough for batches to pile up behind it, so each
// kill lands inside a group; what the killed tailer had on its way to NATS
// is lost with it. Every token reaches the stream exactly once,
// each message's batches are lines of at most the limit, and groups did
// form.
func TestSIGKILLInsideAGroup(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pgtest.Shared(t), 1, 100*time.Millisecond)
	c.Exec(`INSERT INTO accounts (email, login) SELECT 'g' || g || '@x', 'g' || g FROM generate_series(1, 1500) g`)
	w := c.startWriter(1, 2*time.Millisecond)
	slow := lossyDelayProxy(t, fmt.Sprintf("127.0.0.1:%d", c.natsPort), 20*time.Millisecond)
	slow.Arm()
	rng := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 8; i++ {
		before := c.streamMsgs()
		p := c.tailer("MAILROOM_NATS_URL=nats://" + slow.Addr)
		// Kill once this run has published, at a random moment after.
		deadline := time.Now().Add(30 * time.Second)
		for c.streamMsgs() == before {
			if time.Now().After(deadline) {
				t.Fatalf("run %d published nothing in 30s:\n%s", i, p.out.String())
			}
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(time.Duration(rng.IntN(80)) * time.Millisecond)
		p.kill()
	}
	w.halt()
	if w.err != nil {
		t.Fatal(w.err)
	}
	p := c.tailer()
	p.waitLog("msg=streaming", 1, 30*time.Second)
	n := c.expectExactlyOnce(60 * time.Second)
	if code := p.term(15 * time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM", code)
	}
	// Each token goes to its own account's address: batches joined while
	// earlier ones wait for their message keep their rows.
	emails := map[int64]string{}
	rows, err := c.Conn.Query(c.ctx, `SELECT t.id, a.email FROM tokens t JOIN accounts a ON a.id = t.account`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id int64
		var email string
		if err := rows.Scan(&id, &email); err != nil {
			t.Fatal(err)
		}
		emails[id] = email
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	grouped := 0
	for _, m := range c.messages() {
		b, err := subscriber.Decode(m.Header, m.Data)
		if err != nil {
			t.Fatalf("message %d: %v", m.Sequence, err)
		}
		for _, tok := range b.Tokens {
			if emails[tok.ID] != tok.Email {
				t.Fatalf("message %d: token %d addressed to %q, its account's email is %q", m.Sequence, tok.ID, tok.Email, emails[tok.ID])
			}
		}
		for _, size := range b.Sizes {
			if size != 1 {
				t.Fatalf("message %d: a batch of %d tokens with limit 1", m.Sequence, size)
			}
		}
		if len(b.Sizes) > 1 {
			grouped++
		}
	}
	t.Logf("%d tokens exactly once across 8 SIGKILLs; %d messages carried more than one batch", n, grouped)
	if grouped == 0 {
		t.Fatal("no message carried more than one batch: no group formed for a kill to land in")
	}
}

// A message on the subject that is not the tailer's (another publisher's,
// by mistake): tailer run passes over it and says so, instead of refusing
// the stream as another incarnation's; tailer resync sets it aside and
// says how many; every token is on the stream once (issue 34: run and
// resync both exited 1, status 0, and 1,380 tokens waited).
func TestStrayMessageOnTheSubject(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pgtest.Shared(t), 10, 50*time.Millisecond)
	p := c.tailer()
	p.waitLog("msg=streaming", 1, 30*time.Second)
	c.accounts("before", 10)
	c.expectExactlyOnce(30 * time.Second)
	nc, err := nats.Connect(c.natsURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if _, err := js.Publish(c.ctx, "mailroom.batches", []byte("hello, mailroom")); err != nil {
		t.Fatal(err)
	}
	c.accounts("after", 10)
	p.waitLog("the stream holds messages that are not the tailer's batches", 1, 30*time.Second)
	c.expectExactlyOnce(30 * time.Second)
	if code := p.term(30 * time.Second); code != exitOK {
		t.Fatalf("SIGTERM: exit %d", code)
	}
	r := c.command([]string{"resync"})
	if code := r.exit(60 * time.Second); code != exitOK || !strings.Contains(r.out.String(), " set_aside=1 ") || !strings.Contains(r.out.String(), " published=0 ") {
		t.Fatalf("resync beside a stray message: exit %d:\n%s", code, r.out.String())
	}
	p = c.tailer()
	p.waitLog("msg=streaming", 1, 30*time.Second)
	c.accounts("resynced", 10)
	if n := c.expectExactlyOnce(30 * time.Second); n != 30 {
		t.Fatalf("%d tokens", n)
	}
	if rep, code := c.status(1 << 40); code != exitOK {
		t.Fatalf("tailer status: exit %d: %+v", code, rep)
	}
}

// The stream deleted and made again empty, or purged, under a running
// tailer while its subscriber is stopped (as a move to a three-node cluster
// did): the batches JetStream had acknowledged and no one had read are
// gone. The tailer refuses to go on as if they were there, in its log, on
// /readyz and in tailer status (a purge leaves the stream's sequence where
// it was, and the session's publishes go on over it: the tailer finds it
// within a sample); after tailer resync every token reaches the subscriber
// once (issue 34: it went on, 500 tokens gone).
// anchorRecorded waits until the slot's record names, as its anchor, the
// stream's last batch.
func (c *cluster) anchorRecorded() {
	c.t.Helper()
	tailertest.Eventually(c.t, 30*time.Second, func() error {
		last, err := c.lastBatchSeq()
		if err != nil {
			return err
		}
		if anchor := c.recordedAnchor(); anchor < last {
			return fmt.Errorf("anchor_seq %d, the stream's last batch at %d", anchor, last)
		}
		return nil
	})
}

// recordedAnchor is the slot record's anchor_seq (0: none).
func (c *cluster) recordedAnchor() uint64 {
	c.t.Helper()
	var anchor *int64
	if err := c.Conn.QueryRow(c.ctx, `SELECT anchor_seq FROM tailer_slot WHERE slot = 'mailroom'`).Scan(&anchor); err != nil {
		c.t.Fatal(err)
	}
	if anchor == nil {
		return 0
	}
	return uint64(*anchor)
}

// lastBatchSeq is the sequence of the stream's last batch.
func (c *cluster) lastBatchSeq() (uint64, error) {
	s, done, err := c.stream()
	if err != nil {
		return 0, err
	}
	defer done()
	msg, err := s.GetLastMsgForSubject(c.ctx, "mailroom.batches")
	if err != nil {
		return 0, err
	}
	return msg.Sequence, nil
}

// purgeBatches purges the stream of the batches' subject, the session
// markers kept (the first sequence stays where it was).
func purgeBatches(c *cluster, js jetstream.JetStream, _ *watched) error {
	s, err := js.Stream(c.ctx, "MAILROOM")
	if err != nil {
		return err
	}
	return s.Purge(c.ctx, jetstream.WithPurgeSubject("mailroom.batches"))
}

// deleteLastBatch deletes the stream's last batch (nats stream rmm).
func deleteLastBatch(c *cluster, js jetstream.JetStream, _ *watched) error {
	seq, err := c.lastBatchSeq()
	if err != nil {
		return err
	}
	s, err := js.Stream(c.ctx, "MAILROOM")
	if err != nil {
		return err
	}
	return s.DeleteMsg(c.ctx, seq)
}

// restoreOlder puts back a backup of the stream without its last
// message, the tailer frozen meanwhile so that it publishes nothing into
// the stream as it is made again.
func restoreOlder(c *cluster, _ jetstream.JetStream, p *watched) error {
	p.freeze()
	defer p.thaw()
	restoreStream(c.t, c, streamLastSeq(c.t, c)-1, false)
	return nil
}

// refusedUntilResync checks that the refusal p said lasts: recorded for
// tailer status as lasting until a resync, and said again by tailers
// started after it, each time at once (issue 63: a purge was refused
// once, and streamed on 5 s later, before and after a restart). With
// TAILER_REFUSAL_HOLD (a duration), p is first watched that long, every
// 5 s, for the refusal said everywhere and no session streaming.
func (c *cluster) refusedUntilResync(p *watched, want string, restarts int) *watched {
	c.t.Helper()
	tailertest.Eventually(c.t, 30*time.Second, func() error {
		if rep, code := c.statusWith(1<<40, p.env...); code != 1 || !strings.Contains(rep.Refused, want) {
			return fmt.Errorf("tailer status exit %d, refused %q", code, rep.Refused)
		}
		return nil
	})
	if hold, _ := time.ParseDuration(os.Getenv("TAILER_REFUSAL_HOLD")); hold > 0 {
		streamed := strings.Count(p.out.String(), "msg=streaming")
		for end := time.Now().Add(hold); time.Now().Before(end); time.Sleep(5 * time.Second) {
			p.blocked(c, "stream", want)
			if n := strings.Count(p.out.String(), "msg=streaming"); n != streamed {
				c.t.Fatalf("streamed while refused:\n%s", p.out.String())
			}
		}
		c.t.Logf("refused, naming %q, for %s", want, hold)
	}
	for range restarts {
		if code := p.term(30 * time.Second); code != exitOK {
			c.t.Fatalf("SIGTERM while refused: exit %d:\n%s", code, p.out.String())
		}
		p = c.watchedTailer(p.env...)
		p.blocked(c, "stream", want)
		if strings.Contains(p.out.String(), "msg=streaming") {
			c.t.Fatalf("a tailer started after the refusal streamed:\n%s", p.out.String())
		}
	}
	return p
}

func TestStreamThatLostItsBatchesIsRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, want string
		lose       func(c *cluster, js jetstream.JetStream, p *watched) error
		// killed: the tailer SIGKILLed before the loss and started again
		// after it, with no anchors of its own but the slot's record's.
		killed bool
	}{
		{"deleted and made again", "was deleted and made again", func(c *cluster, js jetstream.JetStream, _ *watched) error {
			if err := js.DeleteStream(c.ctx, "MAILROOM"); err != nil {
				return err
			}
			_, err := js.CreateStream(c.ctx, jetstream.StreamConfig{Name: "MAILROOM", Subjects: []string{"mailroom.batches", "mailroom.batches.>"}, Storage: jetstream.FileStorage})
			return err
		}, false},
		// Said by whichever check sees it first: the stream's sequences
		// ("it was purged") or the messages this process stored there
		// ("no longer holds message ..., or purged").
		{"purged", "purged", func(c *cluster, js jetstream.JetStream, _ *watched) error {
			s, err := js.Stream(c.ctx, "MAILROOM")
			if err != nil {
				return err
			}
			return s.Purge(c.ctx)
		}, false},
		// The markers kept: the stream's first sequence stays where it was
		// (issue 45: not seen, before and after a restart).
		{"purged of the batches' subject", "no longer holds", purgeBatches, false},
		{"purged of the batches' subject while the tailer was killed", "no longer holds", purgeBatches, true},
		{"restored from an older backup", "no longer holds message", restoreOlder, false},
		// nats stream rmm: one message (issue 63: streamed again 6 s
		// later, a second deletion said nothing).
		{"a message deleted", "no longer holds message", deleteLastBatch, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := newCluster(t, pgtest.Shared(t), 10, 50*time.Millisecond)
			p := c.watchedTailer()
			p.waitLog("msg=streaming", 1, 30*time.Second)
			out := filepath.Join(t.TempDir(), "lines")
			sub := []string{"--durable", "sender", "--from-start", "--dedup-window", "1000"}
			c.accounts("read", 10)
			s := c.subscriber(out, sub...)
			waitOutput(t, out, 10)
			if code := s.term(30 * time.Second); code != exitOK {
				t.Fatalf("subscriber SIGTERM: exit %d", code)
			}
			c.accounts("unread", 10)
			c.expectExactlyOnce(30 * time.Second)

			nc, err := nats.Connect(c.natsURL())
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			js, _ := jetstream.New(nc)
			if tc.killed {
				c.anchorRecorded()
				p.kill()
			}
			if err := tc.lose(c, js, p); err != nil {
				t.Fatal(err)
			}
			if tc.killed {
				p = c.watchedTailer()
			}
			c.accounts("during", 5)
			p.blocked(c, "stream", tc.want)
			p = c.refusedUntilResync(p, tc.want, 2)

			r := c.command([]string{"resync"})
			if code := r.exit(60 * time.Second); code != exitOK {
				t.Fatalf("resync: exit %d:\n%s", code, r.out.String())
			}
			p.ready(c)
			c.accounts("after", 5)
			if n := c.expectExactlyOnce(60 * time.Second); n != 30 {
				t.Fatalf("%d tokens", n)
			}
			again := c.subscriber(out, sub...)
			waitOutput(t, out, 30)
			if missing, repeats := countOutput(t, out, c.signedTokens()); missing != 0 || repeats != 0 {
				t.Fatalf("the subscriber wrote %d tokens twice and missed %d", repeats, missing)
			}
			if strings.HasPrefix(tc.name, "purged of the batches' subject") {
				// Its consumer and record are of this stream: it sees the
				// unread batches gone (wire.Chain), before a message of the
				// tailer's or of the resync's.
				again.waitLog("messages missing", 1, 10*time.Second)
			}
		})
	}
}

// A tailer SIGKILLed inside one large transaction that mixes both actions
// on one subject: the two lanes' batches interleave, so the messages of
// the window the restarted tailer replays cover overlapping positions,
// and it reads each one's keys back as the replay reaches them (issue 47:
// it read every key of the window first, its memory growing with the
// replay). Every token is on the stream once, and the restart found what
// the first had published.
func TestKilledInsideALargeTransaction(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pgtest.Shared(t), 10, 100*time.Millisecond)
	c.Exec(`INSERT INTO accounts (email, login, status) SELECT 'r' || g || '@x', 'r' || g, 'active' FROM generate_series(1, 1000) g`)
	c.Exec(`DO $$
	DECLARE
		active bigint[] := ARRAY(SELECT id FROM accounts ORDER BY id);
	BEGIN
		FOR g IN 1..12000 LOOP
			INSERT INTO accounts (email, login) VALUES ('n' || g || '@x', 'n' || g);
			IF g % 3 = 0 THEN
				INSERT INTO tokens (account, action) VALUES (active[1 + g % 1000], 'password_recovery');
			END IF;
		END LOOP;
	END $$`)
	var total int
	if err := c.Conn.QueryRow(c.ctx, `SELECT count(*) FROM tokens`).Scan(&total); err != nil {
		t.Fatal(err)
	}
	// Slow PubAcks and messages of 20 batches, so that the kill lands
	// inside the transaction with many messages published.
	slow := lossyDelayProxy(t, fmt.Sprintf("127.0.0.1:%d", c.natsPort), 20*time.Millisecond)
	slow.Arm()
	p := c.tailer("MAILROOM_NATS_URL=nats://"+slow.Addr, "MAILROOM_MAX_BATCHES_PER_MESSAGE=20")
	tailertest.Eventually(t, time.Minute, func() error {
		if n := len(c.tokenCounts()); n < total*4/10 {
			return fmt.Errorf("%d of %d tokens on the stream", n, total)
		}
		return nil
	})
	p.kill()
	before := len(c.tokenCounts())
	if before == total {
		t.Fatalf("all %d tokens were on the stream before the kill", total)
	}
	p = c.tailer()
	p.waitLog("msg=streaming", 1, 30*time.Second)
	if n := c.expectExactlyOnce(2 * time.Minute); n != total {
		t.Fatalf("%d tokens on the stream, want %d", n, total)
	}
	line := grepLines(p.out.String(), "msg=streaming")
	if strings.Contains(line, "on_stream_tokens=0 ") {
		t.Fatalf("the restart found none of the %d tokens the first tailer published: %s", before, line)
	}
	t.Logf("%d tokens, %d on the stream at the kill; the restart: %s", total, before, line)
}
