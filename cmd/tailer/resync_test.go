package main

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/internal/testutil/tailertest"
	"github.com/mailroom/tailer/publish/wire"
	"github.com/mailroom/tailer/publish/wire/wiretest"
	"github.com/mailroom/tailer/replication"
)

// streamMsgs is the number of batches on the stream (0 before it exists).
func (c *cluster) streamMsgs() uint64 {
	c.t.Helper()
	return uint64(len(c.messages()))
}

// expectOnStream waits until the stream holds exactly the tokens that
// query selects, each once, and fails on any other token or a duplicate.
func (c *cluster) expectOnStream(query string, within time.Duration) int {
	c.t.Helper()
	rows, _ := c.Conn.Query(c.ctx, query)
	want, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		c.t.Fatal(err)
	}
	wanted := make(map[int64]bool, len(want))
	for _, id := range want {
		wanted[id] = true
	}
	tailertest.Eventually(c.t, within, func() error {
		counts := c.tokenCounts()
		for id, n := range counts {
			if n > 1 {
				c.t.Fatalf("token %d published %d times", id, n)
			}
			if !wanted[id] {
				c.t.Fatalf("token %d published, but it should not be", id)
			}
		}
		if len(counts) < len(want) {
			return fmt.Errorf("%d of %d tokens never reached the stream", len(want)-len(counts), len(want))
		}
		return nil
	})
	return len(want)
}

func (c *cluster) resyncDone() bool {
	c.t.Helper()
	var done bool
	if err := c.Conn.QueryRow(c.ctx, `SELECT NOT resync_pending FROM tailer_slot WHERE slot = 'mailroom'`).Scan(&done); err != nil {
		c.t.Fatal(err)
	}
	return done
}

// newLosableCluster is a cluster on a server of its own whose slot may
// keep only 1 MB of WAL (see loseSlot), after a tailer published 5 tokens
// (emails before1@x...) and stopped.
func newLosableCluster(t *testing.T) *cluster {
	t.Helper()
	pg, err := pgtest.Start(pgtest.Options{Settings: []string{"max_slot_wal_keep_size=1MB", "wal_keep_size=0"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close() })
	c := newCluster(t, pg, 10, 100*time.Millisecond)
	c.publishThenStop("before", 5)
	return c
}

// loseSlot writes more WAL than max_slot_wal_keep_size lets the slot keep,
// so that the next checkpoint invalidates it.
func (c *cluster) loseSlot() {
	c.t.Helper()
	// A checkpoint removes the WAL past the slot's keep size only if the
	// slot is still behind it; a running tailer that advanced the slot
	// meanwhile (faster on a loaded machine than the filler) needs another
	// round.
	var s replication.SlotInfo
	for round := 0; round < 5; round++ {
		for i := 0; i < 4; i++ {
			c.Exec(`CREATE TABLE IF NOT EXISTS filler (x text)`)
			c.Exec(`INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 2000)`)
			c.Exec(`SELECT pg_switch_wal()`)
		}
		c.Exec(`CHECKPOINT`)
		if s = c.slot(); s.Lost() {
			return
		}
	}
	c.t.Fatalf("slot not invalidated: wal_status %q", s.WALStatus)
}

// The slot is invalidated for real while tokens are committed; tailer
// resync, killed half way and run again, then tailer run: every token that
// is still eligible reaches the stream exactly once, the ones that expired
// meanwhile are counted, and tailer run refuses the slot while the resync
// is unfinished.
func TestResyncAfterLostSlot(t *testing.T) {
	t.Parallel()
	c := newLosableCluster(t)

	// While no tailer runs: many tokens, some that expire or are used
	// before anyone could mail them, then the slot is lost.
	c.Exec(`INSERT INTO accounts (email, login) SELECT 'during' || g || '@x', 'during' || g FROM generate_series(1, 3000) g`)
	c.Exec(`INSERT INTO accounts (email, login) SELECT 'gone' || g || '@x', 'gone' || g FROM generate_series(1, 7) g`)
	c.Exec(`UPDATE tokens SET expires_at = extract(epoch FROM now())::int - 1 WHERE account IN (SELECT id FROM accounts WHERE email LIKE 'gone%')`)
	c.Exec(`INSERT INTO accounts (email, login) VALUES ('used@x', 'used')`)
	c.Exec(`UPDATE tokens SET consumed_at = extract(epoch FROM now()) WHERE account = (SELECT id FROM accounts WHERE email = 'used@x')`)
	c.loseSlot()
	c.Exec(`INSERT INTO accounts (email, login) SELECT 'lost' || g || '@x', 'lost' || g FROM generate_series(1, 5) g`)

	// One message per token, one at a time: slow enough to be killed half
	// way.
	slow := []string{"MAILROOM_BATCH_LIMIT=1", "MAILROOM_MAX_IN_FLIGHT=1", "MAILROOM_MAX_BATCHES_PER_MESSAGE=1"}
	before := c.streamMsgs()
	r := c.command([]string{"resync"}, slow...)
	deadline := time.Now().Add(60 * time.Second)
	for c.streamMsgs() < before+300 {
		if time.Now().After(deadline) {
			t.Fatalf("resync published %d messages in 60s:\n%s", c.streamMsgs()-before, r.out.String())
		}
		time.Sleep(2 * time.Millisecond)
	}
	r.kill()
	if c.resyncDone() {
		t.Fatal("the resync finished before it was killed: the test did not kill it half way")
	}
	halfway := c.streamMsgs()

	// Until the resync is finished, tailer run must not stream.
	p := c.tailer()
	p.waitLog("did not finish", 1, 20*time.Second)
	c.Exec(`INSERT INTO accounts (email, login) VALUES ('waiting@x', 'waiting')`)
	time.Sleep(time.Second)
	if n := c.streamMsgs(); n != halfway {
		t.Fatalf("tailer run published %d messages while the resync was unfinished", n-halfway)
	}

	// Run beside the waiting tailer: the resync says it goes on by itself
	// (it said "start tailer run"), and it does.
	r = c.command([]string{"resync"})
	if code := r.exit(60 * time.Second); code != exitOK {
		t.Fatalf("resync exit %d:\n%s", code, r.out.String())
	}
	out := r.out.String()
	t.Logf("resync:\n%s", out)
	if !strings.Contains(out, "expired_unpublished=7") || !strings.Contains(out, "slot resynced: the tailer run connected (backend pid [") {
		t.Errorf("resync does not report the 7 expired tokens, or the tailer run beside it:\n%s", out)
	}
	if c.slot().Lost() {
		t.Fatal("slot still lost after resync")
	}
	p.waitLog("streaming", 1, 60*time.Second)
	c.Exec(`INSERT INTO accounts (email, login) SELECT 'after' || g || '@x', 'after' || g FROM generate_series(1, 5) g`)
	n := c.expectOnStream(`SELECT t.id FROM tokens t JOIN accounts a ON a.id = t.account WHERE a.email NOT LIKE 'gone%' AND a.email <> 'used@x' ORDER BY t.id`, 60*time.Second)
	if n != 5+3000+5+1+5 {
		t.Fatalf("%d tokens expected on the stream", n)
	}
	if code := p.term(15 * time.Second); code != 0 {
		t.Fatalf("tailer exit %d", code)
	}
}

// A dropped slot is not recreated silently when the stream says it
// existed: tailer run refuses and names tailer resync, and with
// MAILROOM_AUTO_RESYNC it resyncs by itself, exactly once.
func TestVanishedSlot(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pgtest.Shared(t), 10, 100*time.Millisecond)
	c.publishThenStop("v", 5)
	c.Exec(`SELECT pg_drop_replication_slot('mailroom')`)
	c.Exec(`INSERT INTO accounts (email, login) SELECT 'dropped' || g || '@x', 'dropped' || g FROM generate_series(1, 5) g`)

	p := c.tailer()
	p.waitLog("does not exist, but this database recorded it", 1, 20*time.Second)
	if !strings.Contains(p.out.String(), "tailer resync") {
		t.Errorf("the refusal does not name tailer resync:\n%s", p.out.String())
	}
	p.kill()
	if _, err := c.Conn.Exec(c.ctx, `SELECT 1 FROM pg_replication_slots WHERE slot_name = 'mailroom'`); err != nil {
		t.Fatal(err)
	}
	var n int
	c.Conn.QueryRow(c.ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'mailroom'`).Scan(&n)
	if n != 0 {
		t.Fatal("tailer run recreated the slot")
	}

	p = c.tailer("MAILROOM_AUTO_RESYNC=true")
	p.waitLog("slot resynced", 1, 30*time.Second)
	p.waitLog("streaming", 1, 20*time.Second)
	c.Exec(`INSERT INTO accounts (email, login) SELECT 'later' || g || '@x', 'later' || g FROM generate_series(1, 5) g`)
	if n := c.expectExactlyOnce(30 * time.Second); n != 15 {
		t.Fatalf("%d tokens", n)
	}
}

// newCollectorCluster is a database that ran mailroom's collector, before
// tailer migrate made a slot: 30 activation tokens, the collector's cursor
// (jobs.last_seq) at the tenth.
func newCollectorCluster(t *testing.T) *cluster {
	t.Helper()
	c := newClusterWithoutSlot(t, pgtest.Shared(t), 10, 100*time.Millisecond)
	c.Exec(`CREATE TYPE job_type AS ENUM ('mailroom')`)
	c.Exec(`CREATE TABLE jobs (job_type job_type PRIMARY KEY, last_seq BIGINT)`)
	c.Exec(`INSERT INTO accounts (email, login) SELECT 'c' || g || '@x', 'c' || g FROM generate_series(1, 30) g`)
	c.Exec(`INSERT INTO jobs VALUES ('mailroom', (SELECT id FROM tokens ORDER BY id OFFSET 9 LIMIT 1))`)
	return c
}

// A database that ran mailroom's collector: tailer migrate publishes the
// eligible tokens after the collector's cursor exactly once (also when run
// again), nothing before it, and tailer run goes on from the slot.
func TestMigrateAdoptsCollector(t *testing.T) {
	t.Parallel()
	c := newCollectorCluster(t)
	c.Exec(`UPDATE tokens SET consumed_at = extract(epoch FROM now()) WHERE id = (SELECT last_seq + 5 FROM jobs)`)
	c.Exec(`UPDATE tokens SET expires_at = extract(epoch FROM now())::int - 1 WHERE id = (SELECT last_seq + 10 FROM jobs)`)

	for i := 0; i < 2; i++ {
		m := c.command([]string{"migrate"})
		if code := m.exit(60 * time.Second); code != exitOK {
			t.Fatalf("migrate exit %d:\n%s", code, m.out.String())
		}
		if out := m.out.String(); i == 0 && (!strings.Contains(out, " published=18 ") || !strings.Contains(out, "expired_unpublished=1")) {
			t.Errorf("migrate does not say it published 18 tokens and 1 expired:\n%s", out)
		}
	}
	want := `SELECT id FROM tokens WHERE id > (SELECT last_seq FROM jobs) AND id NOT IN ((SELECT last_seq + 5 FROM jobs), (SELECT last_seq + 10 FROM jobs)) ORDER BY id`
	if n := c.expectOnStream(want, 30*time.Second); n != 18 {
		t.Fatalf("%d tokens after the cursor", n)
	}

	p := c.tailer()
	p.waitLog("streaming", 1, 20*time.Second)
	c.Exec(`INSERT INTO accounts (email, login) SELECT 'n' || g || '@x', 'n' || g FROM generate_series(1, 5) g`)
	if n := c.expectOnStream(want, 30*time.Second); n != 23 {
		t.Fatalf("%d tokens after the cursor", n)
	}
}

// collect copies every message stored on the stream from now on, as it
// arrives, so that tokens a stream discards soon after are still seen.
func (c *cluster) collect() (stop func() map[int64]int) {
	c.t.Helper()
	s, done, err := c.stream()
	if err != nil {
		c.t.Fatal(err)
	}
	var (
		mu     sync.Mutex
		counts = map[int64]int{}
		bad    error
	)
	cons, err := s.OrderedConsumer(c.ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		c.t.Fatal(err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		mu.Lock()
		defer mu.Unlock()
		if wire.IsMarker(m.Headers()) {
			return
		}
		for _, s := range strings.Split(m.Headers().Get(wire.HeaderTokenIDs), ",") {
			id, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				bad = fmt.Errorf("token ids %q", m.Headers().Get(wire.HeaderTokenIDs))
			}
			counts[id]++
		}
	})
	if err != nil {
		c.t.Fatal(err)
	}
	return func() map[int64]int {
		// The last message was stored before stop is called; give the
		// consumer a moment to deliver it.
		time.Sleep(200 * time.Millisecond)
		cc.Stop()
		done()
		mu.Lock()
		defer mu.Unlock()
		if bad != nil {
			c.t.Fatal(bad)
		}
		return maps.Clone(counts)
	}
}

// Whatever the stream's configuration, no token is lost or published
// twice across SIGKILLs: configurations that can remove the resume point
// are refused at start, naming the setting; the others go through a kill
// loop (30 SIGKILLs on max_msgs=5, issue 45: 17 and 28 tokens on the
// stream twice, 4 and 16 never reached a live subscriber) exactly once,
// or refused where a limit trimmed the replay; a live subscriber has every
// token, or says a gap for those a limit removed before it read them.
func TestStreamConfigurations(t *testing.T) {
	t.Parallel()
	subjects := []string{"mailroom.batches", "mailroom.batches.>"}
	for _, tc := range []struct {
		name    string
		cfg     jetstream.StreamConfig
		refused string
		kills   int
	}{
		{"max_age", jetstream.StreamConfig{Subjects: subjects, MaxAge: time.Hour}, "max_age 1h0m0s removes the last message", 0},
		{"work queue", jetstream.StreamConfig{Subjects: subjects, Retention: jetstream.WorkQueuePolicy}, "retention WorkQueue removes messages", 0},
		{"interest", jetstream.StreamConfig{Subjects: subjects, Retention: jetstream.InterestPolicy}, "retention Interest removes messages", 0},
		{"max_msgs discard old", jetstream.StreamConfig{Subjects: subjects, MaxMsgs: 5, Discard: jetstream.DiscardOld}, "", 30},
		{"max_msgs discard new", jetstream.StreamConfig{Subjects: subjects, MaxMsgs: 100000, Discard: jetstream.DiscardNew}, "", 5},
		{"wildcard subjects", jetstream.StreamConfig{Subjects: []string{"mailroom.>"}}, "", 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, pgtest.Shared(t), 10, 100*time.Millisecond)
			nc, err := nats.Connect(c.natsURL())
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			js, _ := jetstream.New(nc)
			tc.cfg.Name = "MAILROOM"
			if _, err := js.CreateStream(c.ctx, tc.cfg); err != nil {
				t.Fatal(err)
			}
			if tc.refused != "" {
				p := c.tailer()
				if code := p.exit(30 * time.Second); code != exitFailure || !strings.Contains(p.out.String(), tc.refused) {
					t.Fatalf("exit %d, want %d and %q:\n%s", code, exitFailure, tc.refused, p.out.String())
				}
				return
			}
			stop := c.collect()
			out := filepath.Join(t.TempDir(), "lines")
			sub := c.subscriber(out, "--durable", "live", "--from-start", "--dedup-window", "100000")
			w := c.startWriter(3, 10*time.Millisecond)
			rng := rand.New(rand.NewPCG(3, 4))
			const limitsSaid = "the stream's limits remove its oldest messages"
			for i := 0; i < tc.kills; i++ {
				p := c.tailer()
				if i == 0 && tc.cfg.MaxMsgs > 0 && tc.cfg.Discard == jetstream.DiscardOld {
					p.waitLog(limitsSaid, 1, 30*time.Second)
				}
				time.Sleep(time.Duration(100+rng.IntN(500)) * time.Millisecond)
				p.kill()
			}
			w.halt()
			if w.err != nil {
				t.Fatal(w.err)
			}
			p := c.tailer()
			rows, _ := c.Conn.Query(c.ctx, `SELECT id FROM tokens ORDER BY id`)
			want, err := pgx.CollectRows(rows, pgx.RowTo[int64])
			if err != nil {
				t.Fatal(err)
			}
			// A limit that trimmed a killed session's replay is refused,
			// never published again (issue 45: tokens twice on the stream,
			// and some never reached a subscriber).
			const trimmed = "limits (max_msgs=5) removed message"
			tailertest.Eventually(t, 30*time.Second, func() error {
				if strings.Contains(p.out.String(), trimmed) || strings.Contains(p.out.String(), "msg=streaming") && c.lastTokenOnStream() == want[len(want)-1] {
					return nil
				}
				return fmt.Errorf("token %d never reached the stream, and no refusal:\n%s", want[len(want)-1], p.out.String())
			})
			if strings.Contains(p.out.String(), trimmed) {
				counts := stop()
				for id, n := range counts {
					if n > 1 {
						t.Fatalf("token %d published %d times", id, n)
					}
				}
				liveSubscriberHasEveryToken(t, c, sub, out, counts)
				t.Logf("%d tokens through %d SIGKILLs: the stream's limits trimmed a replay, refused, none published twice", len(want), tc.kills)
				return
			}
			if code := p.term(15 * time.Second); code != 0 {
				t.Fatalf("exit %d", code)
			}
			counts := stop()
			for _, id := range want {
				if counts[id] != 1 {
					t.Fatalf("token %d published %d times (of %d tokens)", id, counts[id], len(want))
				}
			}
			if len(counts) != len(want) {
				t.Fatalf("%d token ids published, %d in the table", len(counts), len(want))
			}
			liveSubscriberHasEveryToken(t, c, sub, out, counts)
			t.Logf("%d tokens through %d SIGKILLs, each published once", len(want), tc.kills)
		})
	}
}

// liveSubscriberHasEveryToken checks that sub, a subscriber into out that
// ran throughout, wrote every token published (counts, as a collector saw
// the stream), or said a gap: a limit removed messages before it read
// them. A token never published (the tailer refused a trimmed replay) is
// the tailer's refusal to say.
func liveSubscriberHasEveryToken(t *testing.T, c *cluster, sub *proc, out string, counts map[int64]int) {
	t.Helper()
	const gap = "messages missing: removed from the stream before this durable read them"
	all := c.signedTokens()
	var missing, unpublished int
	tailertest.EventuallyProgressing(t, 30*time.Second, func() (int, error) {
		got, _ := outputTokens(t, out)
		seen := map[string]int{}
		for _, tok := range got {
			seen[tok.Token]++
		}
		missing, unpublished = 0, 0
		for id, tok := range all {
			switch n := seen[tok]; {
			case n > 1:
				t.Fatalf("token %d written %d times by a subscriber with a dedup window", id, n)
			case n == 0 && counts[id] > 0:
				missing++
			case n == 0:
				unpublished++
			}
		}
		if missing > 0 && !strings.Contains(sub.out.String(), gap) {
			return len(got), fmt.Errorf("%d published tokens never written and no gap said", missing)
		}
		return len(got), nil
	})
	t.Logf("live subscriber: %d tokens written, %d published but removed before it read them (gap said), %d never published",
		len(all)-missing-unpublished, missing, unpublished)
}

// lastSeq is the stream's last sequence (0 before it exists).
func (c *cluster) lastSeq() uint64 {
	c.t.Helper()
	s, done, err := c.stream()
	if err != nil {
		return 0
	}
	defer done()
	info, err := s.Info(c.ctx)
	if err != nil {
		c.t.Fatal(err)
	}
	return info.State.LastSeq
}

// lastTokenOnStream is the highest token id of the stream's last batch.
func (c *cluster) lastTokenOnStream() int64 {
	c.t.Helper()
	msgs := c.messages()
	if len(msgs) == 0 {
		return 0
	}
	ids, _ := wiretest.TokenIDs(msgs[len(msgs)-1])
	var last int64
	for _, id := range ids {
		last = max(last, id)
	}
	return last
}

// A standby takes over while the stream is still empty (the first tailer
// killed before, at or just after its first PubAck): the first publish of
// each session expects the stream's last sequence, so the two cannot both
// start the stream, and every token is on it exactly once.
func TestStandbyTakeoverOntoEmptyStream(t *testing.T) {
	t.Parallel()
	for _, killAfter := range []int{0, 1, 2} {
		t.Run(fmt.Sprintf("killed after %d messages", killAfter), func(t *testing.T) {
			c := newCluster(t, pgtest.Shared(t), 10, 50*time.Millisecond)
			a := c.tailer()
			a.waitLog("msg=streaming", 1, 30*time.Second)
			b := c.tailer()
			b.waitLog("standing by", 1, 30*time.Second)
			w := c.startWriter(3, 5*time.Millisecond)
			deadline := time.Now().Add(30 * time.Second)
			for c.streamMsgs() < uint64(killAfter) {
				if time.Now().After(deadline) {
					t.Fatalf("no message on the stream:\n%s", a.out.String())
				}
				time.Sleep(time.Millisecond)
			}
			a.kill()
			b.waitLog("msg=streaming", 1, 15*time.Second)
			time.Sleep(300 * time.Millisecond)
			w.halt()
			if w.err != nil {
				t.Fatal(w.err)
			}
			c.expectExactlyOnce(30 * time.Second)
		})
	}
}

// slowProxy forwards TCP connections to a NATS server. Once armed, what
// a client sends is delivered delay late (in order, also after the client
// is gone, unless lossy); replies pass at once. A killed tailer's last
// publishes then land after the standby has read the stream.
type slowProxy struct {
	Addr  string
	armed atomic.Bool
	// held counts the chunks with a batch publish taken from a client
	// while armed; orphaned those delivered after their client was gone,
	// the last of them at lastOrphan (Unix nanoseconds).
	held, orphaned, lastOrphan atomic.Int64
	// gate, while set, holds batch publishes (see Close); gated counts the
	// batch publishes it held, released those delivered since.
	gate            atomic.Pointer[chan struct{}]
	gated, released atomic.Int64
	// replies counts the replies (PubAcks and API responses) the server
	// sent its clients, gone or not.
	replies atomic.Int64

	mu      sync.Mutex
	clients []net.Conn
	gates   []chan struct{}
}

// Close holds every batch publish a client sends from now on, and all it
// sends after one on that connection, until the returned function or Open
// is called; what it held is delivered then even if its client is gone.
// Closing again starts a new hold, released apart from the earlier ones.
func (p *slowProxy) Close() (open func()) {
	g := make(chan struct{})
	p.gate.Store(&g)
	p.mu.Lock()
	p.gates = append(p.gates, g)
	p.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { close(g) }) }
}

// Open delivers everything held, in order, and holds nothing more.
func (p *slowProxy) Open() {
	p.gate.Store(nil)
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, g := range p.gates {
		select {
		case <-g:
		default:
			close(g)
		}
	}
	p.gates = nil
}

// Arm starts delaying.
func (p *slowProxy) Arm() { p.armed.Store(true) }

// Reset stops delaying and closes the client side of every connection so
// far, as a connection reset does: the clients reconnect (through the
// proxy, without delay, held only by a Close still in force), while what
// they sent before is still delivered late on the old connections.
func (p *slowProxy) Reset() {
	p.armed.Store(false)
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.clients {
		c.Close()
	}
	p.clients = nil
}

// batchPublish tells a chunk that holds a publish of a batch (HPUB
// mailroom.batches ...), not a JetStream API request or a session marker.
func batchPublish(data []byte) bool { return batchPub.Match(data) }

var batchPub = regexp.MustCompile(`PUB mailroom\.batches(\.activation|\.password_recovery)? `)

func delayProxy(t *testing.T, target string, delay time.Duration) *slowProxy {
	t.Helper()
	return proxy(t, target, delay, false)
}

// lossyDelayProxy is delayProxy, except that what a client sent and the
// proxy still holds when the client goes is dropped: a tailer killed with
// publishes on their way loses them, as if the network had.
func lossyDelayProxy(t *testing.T, target string, delay time.Duration) *slowProxy {
	t.Helper()
	return proxy(t, target, delay, true)
}

func proxy(t *testing.T, target string, delay time.Duration, lossy bool) *slowProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	p := &slowProxy{Addr: ln.Addr().String()}
	armed := &p.armed
	t.Cleanup(p.Reset)
	type chunk struct {
		at   time.Time
		data []byte
		gate *chan struct{}
	}
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			p.clients = append(p.clients, client)
			p.mu.Unlock()
			server, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				continue
			}
			go func() {
				buf := make([]byte, 32<<10)
				for {
					n, err := server.Read(buf)
					if n > 0 {
						p.replies.Add(int64(bytes.Count(buf[:n], []byte("MSG _INBOX."))))
						client.Write(buf[:n])
					}
					if err != nil {
						break
					}
				}
				client.Close()
			}()
			chunks := make(chan chunk, 1024)
			var gone atomic.Bool
			go func() {
				defer close(chunks)
				defer gone.Store(true)
				for {
					buf := make([]byte, 32<<10)
					n, err := client.Read(buf)
					if n > 0 {
						at := time.Now().Add(-delay)
						if armed.Load() {
							at = time.Now()
							if batchPublish(buf[:n]) {
								p.held.Add(1)
							}
						}
						g := p.gate.Load()
						if g != nil {
							p.gated.Add(int64(len(batchPub.FindAllIndex(buf[:n], -1))))
						}
						chunks <- chunk{at, buf[:n], g}
					}
					if err != nil {
						return
					}
				}
			}()
			go func() {
				defer server.Close()
				var behind *chan struct{}
				for c := range chunks {
					var gated int64
					if g := c.gate; g != nil && (behind == g || batchPublish(c.data)) {
						gated = int64(len(batchPub.FindAllIndex(c.data, -1)))
						behind = g
						<-*g
					}
					time.Sleep(time.Until(c.at.Add(delay)))
					if lossy && gone.Load() {
						return
					}
					if _, err := server.Write(c.data); err != nil {
						return
					}
					p.released.Add(gated)
					if gone.Load() && batchPublish(c.data) {
						p.lastOrphan.Store(time.Now().UnixNano())
						p.orphaned.Add(1)
					}
				}
				// What the client sent last needs a moment to be answered.
				time.Sleep(time.Second)
			}()
		}
	}()
	return p
}

// The killed tailer's first batch reaches NATS only after the standby took
// over the slot and found the stream empty: the standby's first publish
// and the late one both expect an empty stream, so only one is stored, and
// no token is on the stream twice.
func TestLatePublishAfterTakeover(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pgtest.Shared(t), 10, 50*time.Millisecond)
	slow := delayProxy(t, fmt.Sprintf("127.0.0.1:%d", c.natsPort), 3*time.Second)
	a := c.tailer("MAILROOM_NATS_URL=nats://"+slow.Addr, "MAILROOM_LOG_LEVEL=debug")
	a.waitLog("msg=streaming", 1, 30*time.Second)
	b := c.tailer()
	b.waitLog("standing by", 1, 30*time.Second)
	// Seven tokens: a batch cut by the timeout, published into the proxy.
	slow.Arm()
	c.Exec(`INSERT INTO accounts (email, login) SELECT 'late' || g || '@x', 'late' || g FROM generate_series(1, 7) g`)
	tailertest.Eventually(t, 10*time.Second, func() error {
		if slow.held.Load() == 0 {
			return errors.New("no publish held by the proxy yet")
		}
		return nil
	})
	a.kill()
	// The standby replays thirteen: its first batch (ten, cut by the
	// limit) has another id than the late one, so JetStream's duplicate
	// window does not tell them apart.
	c.Exec(`INSERT INTO accounts (email, login) SELECT 'next' || g || '@x', 'next' || g FROM generate_series(1, 6) g`)
	b.waitLog("msg=streaming", 1, 15*time.Second)
	tookOver := time.Now().UnixNano()
	// The race this is about: the late publish reaches the server after
	// the standby took over (and read the stream, before it said
	// streaming).
	tailertest.Eventually(t, 10*time.Second, func() error {
		if slow.lastOrphan.Load() <= tookOver {
			return fmt.Errorf("the killed tailer's late publish not delivered after the standby took over (%d orphaned publishes)", slow.orphaned.Load())
		}
		return nil
	})
	if n := c.expectExactlyOnce(30 * time.Second); n != 13 {
		t.Fatalf("%d tokens", n)
	}
}
