package main

// The live run: single-row transactions at a steady rate, timed from
// commit to arrival.

import (
	"context"
	"errors"
	"fmt"
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

	"github.com/mailroom/tailer/internal/embedded"
	"github.com/mailroom/tailer/migrations"
	"github.com/mailroom/tailer/publish/wire"
	"github.com/mailroom/tailer/replication"
)

// Live is the live-latency run.
type Live struct {
	// Client is tailer, or discard-client: a bare client of the slot,
	// the floor (its latencies end at the insert's arrival).
	Client          string  `json:"client"`
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
}

const insertToken = `INSERT INTO tokens (account, action) VALUES ($1, 'password_recovery') RETURNING id`

// liveLatency writes single-row transactions at o.liveRate and times each
// from its commit to its arrival: at a subscriber of the stream the tailer
// publishes to, or, with discard, at a bare client of the slot.
func liveLatency(ctx context.Context, o options, url string, discard bool) (*Live, error) {
	const accounts = 10_000
	if err := migrations.Up(ctx, url); err != nil {
		return nil, err
	}
	pool, err := pgxpool.New(ctx, url+"&pool_max_conns="+strconv.Itoa(o.liveConns+2))
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	// The accounts go in before the slot is made: otherwise the walsender
	// starts with their WAL to decode, and the first tokens wait behind
	// it, which measures the start, not the steady state.
	if _, err := pool.Exec(ctx, `INSERT INTO accounts (email, login, status) SELECT 'l' || g || '@x', 'l' || g, 'active' FROM generate_series(1, $1::int) g`, accounts); err != nil {
		return nil, err
	}
	slot := "live_" + strconv.Itoa(o.liveRate)
	if discard {
		slot += "_discard"
	}
	if _, err := replication.CreateSlot(ctx, pool, slot, "tailer bench", false, false); err != nil {
		return nil, err
	}
	// The first liveWarmup seconds are written at the same rate but not
	// counted: the measure is the steady state, not the first moments of
	// freshly started writers and a tailer that has been idle.
	warm := o.liveRate * o.liveWarmup
	total := warm + o.liveRate*o.liveSeconds
	var mu sync.Mutex
	committed := make(map[int64]time.Time, total)
	arrived := make(map[int64]time.Time, total)
	stored := make(map[int64]time.Time, total)
	var cnt *counter
	if discard {
		// The floor: a bare client reading the same kind of slot, each
		// token arriving when its insert does.
		cnt = &counter{done: make(chan struct{}), want: int64(total)}
		dctx, cancel := context.WithCancel(ctx)
		defer cancel()
		errc := make(chan error, 1)
		go func() {
			errc <- discardLive(dctx, url, slot, func(id int64) {
				now := time.Now()
				mu.Lock()
				arrived[id] = now
				mu.Unlock()
				if cnt.n.Add(1) >= cnt.want {
					cnt.close.Do(func() { close(cnt.done) })
				}
			})
		}()
		defer func() { cancel(); <-errc }()
	} else {
		srv, err := embedded.Start(filepath.Join(o.dir, "nats-"+slot), "127.0.0.1:0", embedded.SyncInterval(o.natsSync))
		if err != nil {
			return nil, err
		}
		defer srv.Shutdown()
		nc, err := nats.Connect(srv.ClientURL())
		if err != nil {
			return nil, err
		}
		defer nc.Close()
		t, err := startTailer(o, url, srv.ClientURL(), slot, "MAILROOM_BATCH_LIMIT="+strconv.Itoa(o.liveLimit), "MAILROOM_BATCH_TIMEOUT=1000")
		if err != nil {
			return nil, err
		}
		defer t.stop()
		var stop func()
		cnt, stop, err = subscribe(ctx, nc, "MAILROOM", total, func(m jetstream.Msg) {
			now := time.Now()
			var at time.Time
			if meta, err := m.Metadata(); err == nil {
				at = meta.Timestamp
			}
			mu.Lock()
			for _, s := range strings.Split(m.Headers().Get(wire.HeaderTokenIDs), ",") {
				id, _ := strconv.ParseInt(s, 10, 64)
				arrived[id], stored[id] = now, at
			}
			mu.Unlock()
		})
		if err != nil {
			return nil, err
		}
		defer stop()
	}
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
			return nil, err
		}
	}
	time.Sleep(500 * time.Millisecond)

	steal := stealMeter()
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
				err := conn.QueryRow(ctx, insertToken, 1+i%accounts).Scan(&id)
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
				mu.Lock()
				committed[id] = now
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	writeSecs := time.Since(start).Seconds()
	stealPct := steal()
	select {
	case err := <-errc:
		return nil, err
	default:
	}
	select {
	case <-cnt.done:
	case <-time.After(60 * time.Second):
		return nil, fmt.Errorf("%d of %d tokens arrived", cnt.n.Load(), total)
	}
	if o.keep && !discard {
		// The tailer's own view of where the time went, beside its log.
		if err := fetchProfile(filepath.Join(o.dir, slot+".metrics"), "http://127.0.0.1:19999/metrics"); err != nil {
			fmt.Println("metrics:", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	var lat, lstored []float64
	for id, c := range committed {
		if a, ok := arrived[id]; ok {
			lat = append(lat, float64(a.Sub(c).Microseconds())/1000)
			if !discard {
				lstored = append(lstored, float64(stored[id].Sub(c).Microseconds())/1000)
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
		Client:          client,
		TargetPerSecond: o.liveRate, BatchLimit: o.liveLimit, WarmupTokens: warm, Tokens: len(lat), AchievedPerSec: float64(total) / writeSecs,
		P50Millis: pct(lat, 0.50), P99Millis: pct(lat, 0.99), MaxMillis: lat[len(lat)-1],
		StoredP50Millis: pct(lstored, 0.50), StoredP99Millis: pct(lstored, 0.99),
		StealPct: stealPct,
	}, nil
}
