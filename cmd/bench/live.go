package main

// The live run: single-row transactions at a steady rate, timed from
// commit to arrival.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/decoder/action"
	"github.com/mailroom/tailer/internal/pgname"
	"github.com/mailroom/tailer/migrations"
	"github.com/mailroom/tailer/publish/wire"
	"github.com/mailroom/tailer/replication"
)

// Live is the live-latency run.
type Live struct {
	// Client is tailer, or discard-client: a bare client of the slot,
	// the floor (its latencies end at the insert's arrival).
	Client string `json:"client"`
	// NATS is where the tailer's server ran: embedded (in the tailer's
	// process, as deployed) or bench (in the bench's, beside the writers
	// and the reader).
	NATS            string  `json:"nats,omitempty"`
	TargetPerSecond int     `json:"target_tokens_per_second"`
	BatchLimit      int     `json:"batch_limit"`
	WarmupTokens    int     `json:"warmup_tokens_not_counted"`
	Tokens          int     `json:"tokens"`
	AchievedPerSec  float64 `json:"achieved_tokens_per_second"`
	P50Millis       float64 `json:"p50_ms"`
	P99Millis       float64 `json:"p99_ms"`
	MaxMillis       float64 `json:"max_ms"`
	// Stored*: commit to the message's JetStream timestamp (when it was
	// stored, which is when the PubAck leaves the server).
	StoredP50Millis float64 `json:"commit_to_stored_p50_ms"`
	StoredP99Millis float64 `json:"commit_to_stored_p99_ms"`
	StealPct        float64 `json:"steal_percent"`
	// Load is where the CPU went while the writers wrote.
	Load Load `json:"load"`
	// Stages is where the tailer says the time went (not for the bare
	// client).
	Stages *Stages `json:"tailer_stages,omitempty"`
}

// Stages are means from the tailer's own histograms at the end of a live
// run, its warm-up included: what an operator's dashboard shows.
type Stages struct {
	// JoinMillis is a join with the accounts (tailer_join_seconds).
	JoinMillis float64 `json:"join_mean_ms"`
	// StoreMillis is a message's publish to its PubAck: the stream's
	// commit, its sync included (tailer_message_publish_seconds).
	StoreMillis float64 `json:"message_publish_to_puback_mean_ms"`
	// CutToAckMillis is a batch's cut to its PubAck: its wait for a
	// place in a message, its join and its store
	// (tailer_publish_latency_seconds).
	CutToAckMillis float64 `json:"batch_cut_to_puback_mean_ms"`
	// Per message: batches carried, and joins made.
	BatchesPerMessage float64 `json:"batches_per_message"`
	JoinsPerMessage   float64 `json:"joins_per_message"`
}

// insertToken is a password recovery of an account: a token of its own
// transaction.
var insertToken = `INSERT INTO tokens (account, action) VALUES ($1, '` + action.PasswordRecovery.String() + `') RETURNING id`

// liveLatency writes single-row transactions at o.liveRate and times each
// from its commit to its arrival: at a subscriber of the stream the tailer
// publishes to, or, with discard, at a bare client of the slot.
func liveLatency(ctx context.Context, o options, url string, discard bool) (*Live, error) {
	pool, slot, err := liveSetup(ctx, o, url, discard)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	// The first liveWarmup seconds are written at the same rate but not
	// counted: the measure is the steady state, not the first moments of
	// freshly started writers and a tailer that has been idle.
	warm := o.liveRate * o.liveWarmup
	total := warm + o.liveRate*o.liveSeconds
	times := newLiveTimes(total)
	cnt, t, stop, err := liveReceiver(ctx, o, url, slot, discard, total, times)
	if err != nil {
		return nil, err
	}
	defer stop()
	tailerPID := 0
	if t != nil {
		tailerPID = t.cmd.Process.Pid
	}
	if o.liveProfile != "" && !discard {
		profiled := make(chan struct{})
		go func() {
			defer close(profiled)
			time.Sleep(2 * time.Second)
			if err := fetchProfile(o.liveProfile, t.http+"/debug/pprof/profile?seconds=5"); err != nil {
				fmt.Fprintln(os.Stderr, "cpu profile:", err)
			}
		}()
		defer func() { <-profiled }()
	}
	writeSecs, stealPct, loaded, err := writeLive(ctx, o, pool, total, warm, times, tailerPID)
	if err != nil {
		return nil, err
	}
	select {
	case <-cnt.done:
	case <-time.After(60 * time.Second):
		return nil, fmt.Errorf("%d of %d tokens arrived", cnt.n.Load(), total)
	}
	live, err := times.result(discard)
	if err != nil {
		return nil, err
	}
	if t != nil {
		// The tailer's own view of where the time went.
		metrics := filepath.Join(o.dir, slot+".metrics")
		if err := fetchProfile(metrics, t.http+"/metrics"); err != nil {
			return nil, fmt.Errorf("the tailer's metrics: %w", err)
		}
		if live.Stages, err = readStages(metrics); err != nil {
			return nil, err
		}
	}
	live.TargetPerSecond, live.BatchLimit, live.WarmupTokens = o.liveRate, o.liveLimit, warm
	if !discard {
		live.NATS = o.nats
	}
	live.AchievedPerSec, live.StealPct, live.Load = float64(total)/writeSecs, stealPct, loaded
	return live, nil
}

// liveAccounts is how many accounts the live run's tokens are spread over.
const liveAccounts = 10_000

// liveSetup makes the schema, the accounts and the run's slot.
func liveSetup(ctx context.Context, o options, url string, discard bool) (*pgxpool.Pool, string, error) {
	if err := migrations.Up(ctx, url, pgname.Public); err != nil {
		return nil, "", err
	}
	pool, err := pgxpool.New(ctx, url+"&pool_max_conns="+strconv.Itoa(o.liveConns+2))
	if err != nil {
		return nil, "", err
	}
	// The accounts go in before the slot is made: otherwise the walsender
	// starts with their WAL to decode, and the first tokens wait behind
	// it, which measures the start, not the steady state.
	if _, err := pool.Exec(ctx, `INSERT INTO accounts (email, login, status) SELECT 'l' || g || '@x', 'l' || g, 'active' FROM generate_series(1, $1::int) g`, liveAccounts); err != nil {
		pool.Close()
		return nil, "", err
	}
	slot := "live_" + strconv.Itoa(o.liveRate)
	if discard {
		slot += "_discard"
	}
	if _, err := replication.CreateSlot(ctx, replication.SchemaConn{Querier: pool, Schema: pgname.Public}, slot, "tailer bench", false, false); err != nil {
		pool.Close()
		return nil, "", err
	}
	return pool, slot, nil
}

// liveTimes are the run's times by token id: committed as the writer saw
// it, arrived at the reader, stored as JetStream stamped it.
type liveTimes struct {
	mu                         sync.Mutex
	committed, arrived, stored map[int64]time.Time
}

func newLiveTimes(n int) *liveTimes {
	return &liveTimes{committed: make(map[int64]time.Time, n), arrived: make(map[int64]time.Time, n), stored: make(map[int64]time.Time, n)}
}

// liveReceiver starts what reads the tokens: a bare client of the slot
// (discard), or the tailer (which it returns) and a subscriber of its
// stream. The counter says when all total have arrived; stop ends them.
func liveReceiver(ctx context.Context, o options, url, slot string, discard bool, total int, times *liveTimes) (*counter, *child, func(), error) {
	if discard {
		// The floor: a bare client reading the same kind of slot, each
		// token arriving when its insert does.
		cnt := &counter{done: make(chan struct{}), want: int64(total)}
		dctx, cancel := context.WithCancel(ctx)
		errc := make(chan error, 1)
		go func() {
			errc <- discardLive(dctx, url, slot, func(id int64) {
				now := time.Now()
				times.mu.Lock()
				times.arrived[id] = now
				times.mu.Unlock()
				if cnt.n.Add(1) >= cnt.want {
					cnt.close.Do(func() { close(cnt.done) })
				}
			})
		}()
		return cnt, nil, func() { cancel(); <-errc }, nil
	}
	var stops []func()
	stopAll := func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	t, nc, stopTailer, err := liveTailer(o, url, slot)
	if err != nil {
		return nil, nil, nil, err
	}
	stops = append(stops, stopTailer)
	cnt, stop, err := subscribe(ctx, nc, "MAILROOM", total, func(m jetstream.Msg) {
		now := time.Now()
		var at time.Time
		if meta, err := m.Metadata(); err == nil {
			at = meta.Timestamp
		}
		times.mu.Lock()
		for _, s := range strings.Split(m.Headers().Get(wire.HeaderTokenIDs), ",") {
			id, _ := strconv.ParseInt(s, 10, 64)
			times.arrived[id], times.stored[id] = now, at
		}
		times.mu.Unlock()
	})
	if err != nil {
		stopAll()
		return nil, nil, nil, err
	}
	stops = append(stops, stop)
	return cnt, t, stopAll, nil
}

// liveTailer starts the tailer of a live run and connects to the server it
// publishes to (tailerNATS): as deployed, its own embedded server in its
// process; with -nats bench, one in this process, beside the writers and
// the reader, as the runs before 2026-11-27 measured.
func liveTailer(o options, url, slot string) (*child, *nats.Conn, func(), error) {
	env, external, natsURL, stopServer, err := tailerNATS(o, slot)
	if err != nil {
		return nil, nil, nil, err
	}
	env = append(env, "MAILROOM_BATCH_LIMIT="+strconv.Itoa(o.liveLimit), "MAILROOM_BATCH_TIMEOUT=1000")
	t, err := startTailer(o, url, external, slot, env...)
	if err != nil {
		stopServer()
		return nil, nil, nil, err
	}
	nc, err := connectNATS(t, natsURL)
	if err != nil {
		t.stop()
		stopServer()
		return nil, nil, nil, err
	}
	return t, nc, func() { nc.Close(); t.stop(); stopServer() }, nil
}

// writeLive inserts total tokens, each in a transaction of its own, on
// o.liveConns connections paced to o.liveRate, and records the commit
// times of all but the first warm. It returns how long the writing took,
// the CPU time stolen from this machine meanwhile (percent), and where the
// CPU went meanwhile (tailerPID: the tailer's process, or 0).
func writeLive(ctx context.Context, o options, pool *pgxpool.Pool, total, warm int, times *liveTimes, tailerPID int) (float64, float64, Load, error) {
	// Open and prepare the writers' connections before the clock starts:
	// eight backends starting at once would measure PostgreSQL's
	// connection start-up, not the tailer.
	conns := make([]*pgxpool.Conn, 0, o.liveConns)
	for range o.liveConns {
		c, err := pool.Acquire(ctx)
		if err == nil {
			conns = append(conns, c)
			_, err = c.Conn().Prepare(ctx, insertToken, insertToken)
		}
		if err != nil {
			for _, c := range conns {
				c.Release()
			}
			return 0, 0, Load{}, err
		}
	}
	time.Sleep(500 * time.Millisecond)

	steal, load := stealMeter(), loadMeter(tailerPID)
	// Writers share a paced schedule: token i is due at start + i/rate.
	var next atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	errc := make(chan error, o.liveConns)
	for _, conn := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Release()
			for {
				i := next.Add(1) - 1
				if i >= int64(total) {
					return
				}
				if d := time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(o.liveRate))); d > 0 {
					time.Sleep(d)
				}
				var id int64
				err := conn.QueryRow(ctx, insertToken, 1+i%liveAccounts).Scan(&id)
				if err != nil {
					errc <- err
					return
				}
				// QueryRow returns after the COMMIT of the implicit
				// transaction: this is the commit time the writer sees.
				now := time.Now()
				if i < int64(warm) {
					continue
				}
				times.mu.Lock()
				times.committed[id] = now
				times.mu.Unlock()
			}
		}()
	}
	wg.Wait()
	writeSecs := time.Since(start).Seconds()
	stealPct, loaded := steal(), load()
	select {
	case err := <-errc:
		return 0, 0, Load{}, err
	default:
	}
	return writeSecs, stealPct, loaded, nil
}

// result is the run's latencies: commit to arrival, and (not for the bare
// client) commit to stored.
func (t *liveTimes) result(discard bool) (*Live, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var lat, lstored []float64
	for id, c := range t.committed {
		if a, ok := t.arrived[id]; ok {
			lat = append(lat, float64(a.Sub(c).Microseconds())/1000)
			if !discard {
				lstored = append(lstored, float64(t.stored[id].Sub(c).Microseconds())/1000)
			}
		}
	}
	slices.Sort(lat)
	slices.Sort(lstored)
	if len(lat) == 0 {
		return nil, errors.New("no latencies")
	}
	pct := func(l []float64, p float64) float64 {
		if len(l) == 0 {
			return 0
		}
		return l[min(len(l)-1, int(p*float64(len(l))))]
	}
	client := "tailer"
	if discard {
		client = "discard-client"
	}
	return &Live{
		Client: client, Tokens: len(lat),
		P50Millis: pct(lat, 0.50), P99Millis: pct(lat, 0.99), MaxMillis: lat[len(lat)-1],
		StoredP50Millis: pct(lstored, 0.50), StoredP99Millis: pct(lstored, 0.99),
	}, nil
}

// readStages reads the means of Stages from a /metrics page the tailer
// served.
func readStages(path string) (*Stages, error) {
	page, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	sum := func(name string) float64 {
		for _, line := range strings.Split(string(page), "\n") {
			if v, ok := strings.CutPrefix(line, name+" "); ok {
				f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
				return f
			}
		}
		return 0
	}
	mean := func(hist string) float64 {
		if n := sum(hist + "_count"); n > 0 {
			return sum(hist+"_sum") / n
		}
		return 0
	}
	messages := sum("tailer_message_publish_seconds_count")
	if messages == 0 {
		return nil, fmt.Errorf("%s: the tailer published no message", path)
	}
	return &Stages{
		JoinMillis:        1000 * mean("tailer_join_seconds"),
		StoreMillis:       1000 * mean("tailer_message_publish_seconds"),
		CutToAckMillis:    1000 * mean("tailer_publish_latency_seconds"),
		BatchesPerMessage: mean("tailer_message_batches"),
		JoinsPerMessage:   sum("tailer_join_seconds_count") / messages,
	}, nil
}
