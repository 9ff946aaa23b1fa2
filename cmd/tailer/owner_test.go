package main

// One owner at a time: a standby that stays up under load, resyncs that
// cannot race, a resync refused while tailer run streams, a restored copy
// that cannot skip, and the collector's cutover kept across resyncs. The
// tokens are counted by their keys (their secrets), which a copy of the
// database does not share with the original for the tokens it makes.

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/internal/testutil/tailertest"
	"github.com/mailroom/tailer/migrations/migratetest"
	"github.com/mailroom/tailer/publish/token"
	"github.com/mailroom/tailer/publish/wire"
	"github.com/mailroom/tailer/publish/wire/wiretest"
	"github.com/mailroom/tailer/replication"
)

// keyCounts counts every token key on the stream.
func (c *cluster) keyCounts() map[string]int {
	c.t.Helper()
	counts := map[string]int{}
	for _, m := range c.messages() {
		for _, k := range wiretest.TokenKeys(m) {
			counts[k]++
		}
	}
	return counts
}

// expectKeysOnce waits until every token that query selects on conn (its
// secret) is on the stream exactly once, and fails at once when any key is
// on the stream twice, whichever database it came from.
func (c *cluster) expectKeysOnce(conn *pgx.Conn, query string, within time.Duration) int {
	c.t.Helper()
	rows, _ := conn.Query(c.ctx, query)
	secrets, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	if err != nil {
		c.t.Fatal(err)
	}
	tailertest.Eventually(c.t, within, func() error {
		counts := c.keyCounts()
		for k, n := range counts {
			if n > 1 {
				c.t.Fatalf("token key %s published %d times", k, n)
			}
		}
		missing := 0
		for _, s := range secrets {
			if counts[string(token.AppendKey(nil, (*[32]byte)(s)))] == 0 {
				missing++
			}
		}
		if missing > 0 {
			return fmt.Errorf("%d of %d tokens never reached the stream", missing, len(secrets))
		}
		return nil
	})
	return len(secrets)
}

// lastStreamPosition is the commit LSN of the stream's last message with
// positions.
func (c *cluster) lastStreamPosition() pglogrepl.LSN {
	c.t.Helper()
	var last pglogrepl.LSN
	for _, m := range c.messages() {
		if v := m.Header.Get(wire.HeaderPosLast); v != "" {
			lsn, err := pglogrepl.ParseLSN(strings.Split(v, ":")[0])
			if err != nil {
				c.t.Fatal(err)
			}
			last = max(last, lsn)
		}
	}
	return last
}

// A copy of the database (pg_basebackup, started as a primary: the same
// system identifier and timeline, no slot) pointed at the original's
// stream: tailer migrate and tailer run refuse it, naming tailer resync,
// both while its WAL is behind the stream's last position and after it has
// written past it; after tailer resync every one of its tokens is on the
// stream exactly once.
func TestRestoredCopyCannotSkip(t *testing.T) {
	t.Parallel()
	pg := ownServer(t)
	c := newCluster(t, pg, 10, 50*time.Millisecond)
	c.publishThenStop("orig", 20)

	cp, err := pg.Copy()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cp.Close() })
	// The original goes on, well past the copy's WAL, and publishes: the
	// stream's last position is far ahead of the tokens the copy makes
	// next.
	c.Exec(`CREATE TABLE filler (x text)`)
	c.Exec(`INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 4000)`)
	c.publishThenStop("later", 30)
	copyURL := strings.Replace(c.URL, fmt.Sprintf(":%d/", pg.Port), fmt.Sprintf(":%d/", cp.Port), 1)
	copyConn, err := pgx.Connect(c.ctx, copyURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { copyConn.Close(c.ctx) })
	onCopy := migratetest.ExistingDB(t, copyURL, copyConn)
	env := []string{"MAILROOM_DATABASE_URL=" + copyURL}

	refused := func(when string) {
		t.Helper()
		m := c.command([]string{"migrate"}, env...)
		if code := m.exit(60 * time.Second); code != exitFailure || !strings.Contains(m.out.String(), "tailer resync") || !strings.Contains(m.out.String(), "copy") {
			t.Fatalf("%s: tailer migrate on the copy: exit %d, want %d naming the copy and tailer resync:\n%s", when, code, exitFailure, m.out.String())
		}
		p := c.tailer(env...)
		p.waitLog("replication slot cannot be streamed from", 1, 30*time.Second)
		if out := p.out.String(); !strings.Contains(out, "tailer resync") || strings.Contains(out, "msg=streaming") {
			t.Fatalf("%s: tailer run on the copy:\n%s", when, out)
		}
		p.kill()
		var n int
		if err := copyConn.QueryRow(c.ctx, `SELECT count(*) FROM pg_replication_slots`).Scan(&n); err != nil || n != 0 {
			t.Fatalf("%s: the copy has %d slots (%v)", when, n, err)
		}
	}
	if cur, last := onCopy.WalLSN(), c.lastStreamPosition(); cur >= last {
		t.Fatalf("the copy's WAL %s is already past the stream's last position %s", cur, last)
	}
	refused("WAL behind the stream")

	// The copy makes tokens of its own (the ids the original used since
	// the copy, with other secrets), below the stream's last position,
	// then writes past it.
	onCopy.Exec(`INSERT INTO accounts (email, login) SELECT 'copy' || g || '@x', 'copy' || g FROM generate_series(1, 40) g`)
	if cur, last := onCopy.WalLSN(), c.lastStreamPosition(); cur >= last {
		t.Fatalf("the copy's tokens are not below the stream's last position %s (WAL at %s)", last, cur)
	}
	for onCopy.WalLSN() <= c.lastStreamPosition() {
		onCopy.Exec(`CREATE TABLE IF NOT EXISTS filler2 (x text)`)
		onCopy.Exec(`INSERT INTO filler2 SELECT repeat('x', 1000) FROM generate_series(1, 1000)`)
	}
	refused("WAL past the stream")

	r := c.command([]string{"resync"}, env...)
	if code := r.exit(60 * time.Second); code != exitOK {
		t.Fatalf("resync on the copy: exit %d:\n%s", code, r.out.String())
	}
	t.Logf("resync on the copy:\n%s", r.out.String())
	p := c.tailer(env...)
	p.waitLog("msg=streaming", 1, 30*time.Second)
	onCopy.Exec(`INSERT INTO accounts (email, login) SELECT 'copynew' || g || '@x', 'copynew' || g FROM generate_series(1, 10) g`)
	if n := c.expectKeysOnce(copyConn, `SELECT secret FROM tokens`, 60*time.Second); n != 20+40+10 {
		t.Fatalf("%d tokens on the copy", n)
	}
	// And the original's own are all still there, once.
	if n := c.expectKeysOnce(c.Conn, `SELECT secret FROM tokens`, 10*time.Second); n != 20+30 {
		t.Fatalf("%d tokens on the original", n)
	}
}

// tailer resync while tailer run streams is refused before it changes
// anything, naming the owner; tailer run goes on without a break.
func TestResyncRefusedWhileRunStreams(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pgtest.Shared(t), 10, 50*time.Millisecond)
	p := c.tailer()
	p.waitLog("msg=streaming", 1, 30*time.Second)
	w := c.startWriter(3, 10*time.Millisecond)
	before, err := replication.LoadRecord(c.ctx, replication.SchemaConn{Querier: c.Conn, Schema: "public"}, "mailroom")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		r := c.command([]string{"resync"})
		code := r.exit(30 * time.Second)
		out := r.out.String()
		if code != exitFailure || !strings.Contains(out, "owned by another process: tailer run") || !strings.Contains(out, "changed nothing") {
			t.Fatalf("resync while tailer run streams: exit %d:\n%s", code, out)
		}
	}
	after, err := replication.LoadRecord(c.ctx, replication.SchemaConn{Querier: c.Conn, Schema: "public"}, "mailroom")
	if err != nil {
		t.Fatal(err)
	}
	if after.Incarnation != before.Incarnation || after.ResyncPending {
		t.Fatalf("the refused resync changed the slot's record: %+v, was %+v", after, before)
	}
	time.Sleep(500 * time.Millisecond)
	w.halt()
	if w.err != nil {
		t.Fatal(w.err)
	}
	c.expectExactlyOnce(30 * time.Second)
	out := p.out.String()
	if n := strings.Count(out, "msg=streaming"); n != 1 || strings.Contains(out, "session ended") {
		t.Fatalf("tailer run did not stream without a break (%d sessions):\n%s", n, out)
	}
}

// Two tailer resyncs started close together (0.3 s and 1.2 s apart) on a
// lost slot, with a writer committing tokens throughout, then tailer run:
// every token exactly once. The second one either waits for the first and
// resyncs again, or is refused; it never drops the first one's slot
// while that one publishes.
func TestConcurrentResyncs(t *testing.T) {
	t.Parallel()
	for _, gap := range []time.Duration{300 * time.Millisecond, 1200 * time.Millisecond} {
		t.Run(gap.String(), func(t *testing.T) {
			c := newLosableCluster(t)
			c.Exec(`INSERT INTO accounts (email, login) SELECT 'during' || g || '@x', 'during' || g FROM generate_series(1, 3000) g`)
			c.loseSlot()
			w := c.startWriter(3, 5*time.Millisecond)
			// The first one publishes one message at a time, each 25 ms
			// late: seconds of publishing, whatever the machine.
			slow := delayProxy(t, fmt.Sprintf("127.0.0.1:%d", c.natsPort), 25*time.Millisecond)
			slow.Arm()
			a := c.command([]string{"resync"}, "MAILROOM_NATS_URL=nats://"+slow.Addr, "MAILROOM_MAX_IN_FLIGHT=1", "MAILROOM_MAX_BATCHES_PER_MESSAGE=1")
			time.Sleep(gap)
			b := c.command([]string{"resync"})
			select {
			case <-a.done:
				t.Fatalf("the first resync ended before the second started: the test did not race them:\n%s", a.out.String())
			default:
			}
			started := time.Now()
			codeA := a.exit(90 * time.Second)
			t.Logf("the first resync ended %s after the second started", time.Since(started).Round(time.Millisecond))
			codeB := b.exit(90 * time.Second)
			if codeA != exitOK {
				t.Fatalf("first resync: exit %d:\n%s", codeA, a.out.String())
			}
			if codeB != exitOK && !strings.Contains(b.out.String(), "owned by another process: tailer resync") {
				t.Fatalf("second resync: exit %d, neither done nor refused for the first:\n%s", codeB, b.out.String())
			}
			t.Logf("second resync: exit %d (%s)", codeB, lastLine(b.out.String()))
			p := c.tailer()
			p.waitLog("msg=streaming", 1, 30*time.Second)
			time.Sleep(500 * time.Millisecond)
			w.halt()
			if w.err != nil {
				t.Fatal(w.err)
			}
			n := c.expectExactlyOnce(60 * time.Second)
			t.Logf("%d tokens, each once", n)
		})
	}
}

// MAILROOM_AUTO_RESYNC on two tailers started together on a lost slot,
// under a writer: one resyncs, holding the lease, the other stands by;
// every token exactly once, and neither exits.
func TestAutoResyncOnTwoTailers(t *testing.T) {
	t.Parallel()
	c := newLosableCluster(t)
	c.Exec(`INSERT INTO accounts (email, login) SELECT 'during' || g || '@x', 'during' || g FROM generate_series(1, 2000) g`)
	c.loseSlot()
	w := c.startWriter(3, 5*time.Millisecond)
	env := []string{"MAILROOM_AUTO_RESYNC=true", "MAILROOM_MAX_IN_FLIGHT=1", "MAILROOM_MAX_BATCHES_PER_MESSAGE=1"}
	a := c.tailer(env...)
	time.Sleep(100 * time.Millisecond)
	b := c.tailer(env...)
	tailertest.Eventually(t, 60*time.Second, func() error {
		if !strings.Contains(a.out.String()+b.out.String(), "msg=streaming") {
			return fmt.Errorf("no tailer streams:\n%s\n---\n%s", a.out.String(), b.out.String())
		}
		return nil
	})
	time.Sleep(time.Second)
	w.halt()
	if w.err != nil {
		t.Fatal(w.err)
	}
	n := c.expectExactlyOnce(60 * time.Second)
	resyncs := strings.Count(a.out.String()+b.out.String(), "slot resynced")
	if resyncs != 1 {
		t.Errorf("%d resyncs, want 1", resyncs)
	}
	for _, p := range []*proc{a, b} {
		select {
		case <-p.done:
			t.Fatalf("a tailer exited:\n%s", p.out.String())
		default:
		}
	}
	t.Logf("%d tokens, each once", n)
}

// After a cutover from mailroom's collector, a resync within the tokens'
// lifetime publishes nothing the collector sent (ids up to jobs.last_seq),
// even once the jobs table is gone; tokens that reuse those ids after
// TRUNCATE ... RESTART IDENTITY are published all the same.
func TestResyncAfterCutover(t *testing.T) {
	t.Parallel()
	c := newCollectorCluster(t)
	var lastSeq int64
	if err := c.Conn.QueryRow(c.ctx, `SELECT last_seq FROM jobs`).Scan(&lastSeq); err != nil {
		t.Fatal(err)
	}
	m := c.command([]string{"migrate"})
	if code := m.exit(60 * time.Second); code != exitOK || !strings.Contains(m.out.String(), " published=20 ") {
		t.Fatalf("migrate exit %d:\n%s", code, m.out.String())
	}
	c.Exec(`DROP TABLE jobs`)
	c.Exec(`DROP TYPE job_type`)

	for i := 0; i < 2; i++ {
		r := c.command([]string{"resync"})
		if code := r.exit(60 * time.Second); code != exitOK || !strings.Contains(r.out.String(), " published=0 ") {
			t.Fatalf("resync %d after the cutover: exit %d:\n%s", i, code, r.out.String())
		}
	}
	for id := range c.tokenCounts() {
		if id <= lastSeq {
			t.Fatalf("token %d, sent by the collector, published again", id)
		}
	}
	want := `SELECT id FROM tokens WHERE id > (SELECT collector_last_seq FROM tailer_slot) ORDER BY id`
	if n := c.expectOnStream(want, 30*time.Second); n != 20 {
		t.Fatalf("%d tokens after the cursor", n)
	}

	// New tokens that reuse the collector's ids, committed while no
	// tailer runs: a resync publishes them.
	time.Sleep(1100 * time.Millisecond)
	c.Exec(`TRUNCATE tokens RESTART IDENTITY`)
	c.Exec(`INSERT INTO tokens (account, action) SELECT id, 'activation' FROM accounts ORDER BY id LIMIT 5`)
	r := c.command([]string{"resync"})
	if code := r.exit(60 * time.Second); code != exitOK || !strings.Contains(r.out.String(), " published=5 ") {
		t.Fatalf("resync after TRUNCATE ... RESTART IDENTITY: exit %d:\n%s", code, r.out.String())
	}
	if n := c.expectKeysOnce(c.Conn, `SELECT secret FROM tokens`, 30*time.Second); n != 5 {
		t.Fatalf("%d new tokens", n)
	}
}

// soakDuration is how long TestStandbyStaysUp runs: TAILER_SOAK (a Go
// duration) or a short run for make test.
func soakDuration(t *testing.T) (run, minKill, maxKill time.Duration) {
	if v := os.Getenv("TAILER_SOAK"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("TAILER_SOAK: %v", err)
		}
		return d, 30 * time.Second, 60 * time.Second
	}
	return 20 * time.Second, 2 * time.Second, 4 * time.Second
}

// holding reports whether p streams from the slot now: it logged
// streaming more often than it ended a session.
func (p *proc) holding() bool {
	out := p.out.String()
	return strings.Count(out, "msg=streaming") > strings.Count(out, `msg="session ended"`)
}

// A primary and a standby tailer run under about 300 tokens/s while the
// primary is SIGKILLed again and again (and started again, as a
// supervisor would, to become the standby): neither exits by itself, the
// standby takes over each time, and every token is on the stream exactly
// once. With TAILER_SOAK=10m it is the ten-minute run, killing every 30-60
// s; make test runs 20 s, killing every 2-4 s.
func TestStandbyStaysUp(t *testing.T) {
	t.Parallel()
	run, minKill, maxKill := soakDuration(t)
	c := newCluster(t, pgtest.Shared(t), 10, 50*time.Millisecond)
	procs := []*proc{c.tailer()}
	procs[0].waitLog("msg=streaming", 1, 30*time.Second)
	procs = append(procs, c.tailer())
	procs[1].waitLog("standing by", 1, 30*time.Second)
	w := c.startWriter(3, 8*time.Millisecond)
	rng := rand.New(rand.NewPCG(18, uint64(time.Now().UnixNano())))
	var takeovers []time.Duration
	var byStandby []time.Duration
	end := time.Now().Add(run)
	for time.Now().Before(end) {
		time.Sleep(minKill + time.Duration(rng.Int64N(int64(maxKill-minKill))))
		for _, p := range procs {
			select {
			case <-p.done:
				t.Fatalf("a tailer exited by itself (%v):\n%s", p.err, p.out.String())
			default:
			}
		}
		holder := slices.IndexFunc(procs, (*proc).holding)
		if holder < 0 {
			t.Fatalf("no tailer holds the slot:\n%s\n---\n%s", procs[0].out.String(), procs[1].out.String())
		}
		standby := procs[1-holder]
		sessions := strings.Count(standby.out.String(), "msg=streaming")
		killed := time.Now()
		procs[holder].kill()
		// Started again as a supervisor does: at once every other time
		// (then either it or the standby takes over), else after a
		// backoff of 3 s (the standby takes over).
		restart := time.Duration(len(takeovers)%2) * 3 * time.Second
		if restart == 0 {
			procs[holder] = c.tailer()
		}
		for !standby.holding() && (restart > 0 || !procs[holder].holding()) {
			if time.Since(killed) > time.Minute {
				t.Fatalf("nobody took over within a minute:\n%s", standby.out.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
		takeovers = append(takeovers, time.Since(killed))
		if strings.Count(standby.out.String(), "msg=streaming") > sessions {
			byStandby = append(byStandby, time.Since(killed))
		}
		if restart > 0 {
			time.Sleep(time.Until(killed.Add(restart)))
			procs[holder] = c.tailer()
		}
	}
	w.halt()
	if w.err != nil {
		t.Fatal(w.err)
	}
	n := c.expectExactlyOnce(60 * time.Second)
	t.Logf("%d tokens (%.0f/s) through %d SIGKILLs of the primary, each once; takeover %s; by the standby %s",
		n, float64(n)/run.Seconds(), len(takeovers), spread(takeovers), spread(byStandby))
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	return s[strings.LastIndexByte(s, '\n')+1:]
}

// spread is the min, median and max of ds.
func spread(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return fmt.Sprintf("%d times, min %s, median %s, max %s", len(ds), ds[0].Round(time.Millisecond), ds[len(ds)/2].Round(time.Millisecond), ds[len(ds)-1].Round(time.Millisecond))
}
