package main

// Backlog drains: a backlog committed while no tailer runs, then timed
// from the tailer's start to the last batch's arrival.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/internal/pgname"
	"github.com/mailroom/tailer/internal/pgserver"
	"github.com/mailroom/tailer/migrations"
	"github.com/mailroom/tailer/publish/wire"
	"github.com/mailroom/tailer/replication"
)

// Drain is one backlog drain.
type Drain struct {
	Variant           string  `json:"variant"`
	Tokens            int     `json:"tokens"`
	Seconds           float64 `json:"seconds"`
	TokensPerSecond   float64 `json:"tokens_per_second"`
	WalsenderCPUPct   float64 `json:"walsender_cpu_percent_of_one_core"`
	TailerCPUSeconds  float64 `json:"tailer_cpu_seconds"`
	TailerMicrosPerTk float64 `json:"tailer_cpu_microseconds_per_token"`
	TailerPeakRSSMiB  float64 `json:"tailer_peak_rss_mib"`
	CPUSecondsPer100k float64 `json:"tailer_cpu_seconds_per_100k_tokens"`
	// NATS is where the stream's server ran: embedded (in the tailer's
	// process, as deployed: the tailer's CPU is its too) or bench (in this
	// process).
	NATS string `json:"nats"`
	// Where the rest of the machine's CPU went, per token: the walsender,
	// the tailer's query backend (the account join), and this process
	// (the counting subscriber, and the NATS server when it is the
	// bench's).
	WalsenderMicrosPerTk float64 `json:"walsender_cpu_microseconds_per_token"`
	JoinMicrosPerTk      float64 `json:"join_backend_cpu_microseconds_per_token"`
	NATSMicrosPerTk      float64 `json:"nats_and_bench_cpu_microseconds_per_token"`
	// WalsenderRunqueuePct is the time the walsender was ready to run but
	// waited for a CPU, as % of the drain: it was crowded out, not idle.
	WalsenderRunqueuePct float64 `json:"walsender_runqueue_wait_percent"`
	// TailerReads is the number of read(2) calls the tailer made.
	TailerReads int64 `json:"tailer_read_syscalls"`
	// StealPct is the CPU time the hypervisor gave to other guests during
	// the drain, as % of this machine's CPU time: noise to read the other
	// figures by.
	StealPct float64 `json:"steal_percent"`
}

// drainAll runs the drains: the small backlog once per pgoutput variant,
// then (when asked) the growth run and the one-transaction run.
func drainAll(ctx context.Context, o options, pg *pgserver.Server, res *Results) error {
	// The small backlog, drained once per pgoutput variant, each on a slot
	// of its own made before the inserts.
	variants := strings.Split(o.variants, ",")
	url, err := createDB(ctx, pg, "bench_small")
	if err != nil {
		return err
	}
	best := variants[len(variants)-1]
	// The best variant's small backlog is drained again just before and
	// just after the big one, and the growth ratio compares the big drain
	// with the mean of those two: this machine's speed drifts by more than
	// the 15% the ratio is judged by, and bracketing cancels a steady drift.
	slots := append([]string{"peek", best + "-before", best + "-after", "discard", "default", "default-r3"}, variants...)
	if err := prepare(ctx, url, slots, o.tokens, 1000); err != nil {
		return err
	}
	if res.ServerDecodeRate, err = peekRate(ctx, url, o.tokens); err != nil {
		return err
	}
	// The ceiling, then every setting at its default, then each variant.
	disc, err := discardDrain(ctx, url, slotName("discard", o.tokens), o.tokens)
	if err != nil {
		return err
	}
	res.Discard = &disc
	printDrain(disc)
	if o.defaults {
		if err := drainDefaults(ctx, o, pg, url, res); err != nil {
			return err
		}
	}
	for i, v := range variants {
		if i > 0 {
			o.cpuProfile = ""
		}
		d, err := drain(ctx, o, url, v, slotName(v, o.tokens), o.tokens, nil)
		if err != nil {
			return fmt.Errorf("drain %s: %w", v, err)
		}
		res.Drains = append(res.Drains, d)
		printDrain(d)
	}
	if o.big > 0 {
		if err := drainGrowth(ctx, o, pg, url, best, res); err != nil {
			return err
		}
	}
	if o.oneTx > 0 {
		return drainOneTx(ctx, o, pg, best, res)
	}
	return nil
}

// drainDefaults drains the small backlog with every setting at its default
// (batch limit 10, the embedded server syncing before every PubAck), on
// one server and on an R3 stream of three; after the first, the stream it
// filled is drained in turn by the database subscriber (o.subscribers).
func drainDefaults(ctx context.Context, o options, pg *pgserver.Server, url string, res *Results) error {
	for _, run := range []struct {
		label    string
		replicas int
	}{{"default", 1}, {"default-r3", 3}} {
		od := o
		od.limit, od.natsReplicas, od.cpuProfile = 10, run.replicas, ""
		var after func(natsURL string) error
		if run.replicas == 1 && o.subscribers {
			// Into an inbox and into River jobs.
			after = func(natsURL string) error {
				for _, into := range []string{"inbox", "river"} {
					sd, err := subscriberDrain(ctx, o, pg, natsURL, into, o.tokens)
					if err != nil {
						return fmt.Errorf("subscribe --into %s: %w", into, err)
					}
					res.Subscribers = append(res.Subscribers, sd)
					printSubscriberDrain(sd)
				}
				// River's insert alone, the --into river ceiling.
				sd, err := riverAlone(ctx, pg, natsURL, o.tokens)
				if err != nil {
					return err
				}
				res.Subscribers = append(res.Subscribers, sd)
				printSubscriberDrain(sd)
				return nil
			}
		}
		d, err := drain(ctx, od, url, "v2-binary", slotName(run.label, o.tokens), o.tokens, after)
		if err != nil {
			return fmt.Errorf("drain %s: %w", run.label, err)
		}
		d.Variant = run.label
		res.Drains = append(res.Drains, d)
		printDrain(d)
	}
	return nil
}

// drainGrowth drains the big backlog with the best variant, bracketed by
// drains of the small one (see drainAll), and sets the growth ratio.
func drainGrowth(ctx context.Context, o options, pg *pgserver.Server, url, best string, res *Results) error {
	bigURL, err := createDB(ctx, pg, "bench_big")
	if err != nil {
		return err
	}
	if err := prepare(ctx, bigURL, []string{best}, o.big, 1000); err != nil {
		return err
	}
	var rates [2]float64
	for i, run := range []struct {
		label, url string
		n          int
	}{{best + "-before", url, o.tokens}, {best, bigURL, o.big}, {best + "-after", url, o.tokens}} {
		d, err := drain(ctx, o, run.url, best, slotName(run.label, run.n), run.n, nil)
		if err != nil {
			return fmt.Errorf("drain %s, %d tokens: %w", run.label, run.n, err)
		}
		d.Variant = run.label
		res.Drains = append(res.Drains, d)
		printDrain(d)
		if i == 1 {
			rates[0] = d.TokensPerSecond
		} else {
			rates[1] += d.TokensPerSecond / 2
		}
	}
	res.GrowthRatio = rates[0] / rates[1]
	return nil
}

// drainOneTx drains one INSERT of o.oneTx rows: the server streams it in
// chunks (protocol v2) and the tailer buffers it until its commit.
func drainOneTx(ctx context.Context, o options, pg *pgserver.Server, best string, res *Results) error {
	oneURL, err := createDB(ctx, pg, "bench_one_tx")
	if err != nil {
		return err
	}
	label := best + "-one-tx"
	if err := prepare(ctx, oneURL, []string{label}, o.oneTx, o.oneTx); err != nil {
		return err
	}
	d, err := drain(ctx, o, oneURL, best, slotName(label, o.oneTx), o.oneTx, nil)
	if err != nil {
		return fmt.Errorf("drain one transaction of %d tokens: %w", o.oneTx, err)
	}
	d.Variant = label
	res.Drains = append(res.Drains, d)
	printDrain(d)
	// The reference is the same number of tokens in 1,000-row
	// transactions when the big backlog has that size, else the small
	// backlog.
	var ref Drain
	for _, r := range res.Drains {
		if r.Variant == best && (ref.Tokens == 0 || r.Tokens == o.oneTx) {
			ref = r
		}
	}
	if ref.TokensPerSecond > 0 {
		res.OneTxRatio = d.TokensPerSecond / ref.TokensPerSecond
	}
	return nil
}

// prepare migrates, creates the slots and commits n tokens, one INSERT per
// perTx accounts (each gets a token from the trigger).
func prepare(ctx context.Context, url string, slots []string, n, perTx int) error {
	if err := migrations.Up(ctx, url, pgname.Public); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for _, s := range slots {
		if _, err := replication.CreateSlot(ctx, replication.SchemaConn{Querier: conn, Schema: pgname.Public}, slotName(s, n), "tailer bench", false, false); err != nil {
			return err
		}
	}
	start := time.Now()
	for i := 0; i < n; i += perTx {
		if _, err := conn.Exec(ctx, `INSERT INTO accounts (email, login)
			SELECT 'user' || g || '@example.com', 'user' || g FROM generate_series($1::int, $2::int) g`, i+1, min(i+perTx, n)); err != nil {
			return err
		}
	}
	fmt.Printf("committed %d tokens in transactions of %d in %s\n", n, min(perTx, n), time.Since(start).Round(time.Millisecond))
	return nil
}

// slotName is per variant and backlog size: slot names are global to the
// server, and each backlog has its own database.
func slotName(variant string, n int) string {
	return fmt.Sprintf("s%d_%s", n, strings.ReplaceAll(variant, "-", "_"))
}

// peekRate decodes the backlog inside the server, for context: how fast
// pgoutput itself turns this WAL into messages.
func peekRate(ctx context.Context, url string, n int) (float64, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	start := time.Now()
	var rows int64
	err = conn.QueryRow(ctx, `SELECT count(*) FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL,
		'proto_version', '1', 'publication_names', 'mailroom')`, slotName("peek", n)).Scan(&rows)
	if err != nil {
		return 0, err
	}
	el := time.Since(start).Seconds()
	if err := replication.DropSlot(ctx, conn, slotName("peek", n)); err != nil {
		return 0, err
	}
	rate := float64(n) / el
	fmt.Printf("in-server decode (pg_logical_slot_peek_binary_changes): %d messages for %d tokens in %.2fs = %.0f tokens/s\n", rows, n, el, rate)
	return rate, nil
}

// counter counts tokens arriving on the stream.
type counter struct {
	n     atomic.Int64
	done  chan struct{}
	want  int64
	close sync.Once
}

func subscribe(ctx context.Context, nc *nats.Conn, stream string, want int, onMsg func(jetstream.Msg)) (*counter, func(), error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, nil, err
	}
	// The tailer creates the stream; wait for it.
	var s jetstream.Stream
	for i := 0; ; i++ {
		if s, err = js.Stream(ctx, stream); err == nil {
			break
		}
		if i > 600 {
			return nil, nil, fmt.Errorf("stream %s never appeared: %w", stream, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Headers carry all the bench needs; bodies would only add delivery
	// work to the machine being measured.
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{HeadersOnly: true})
	if err != nil {
		return nil, nil, err
	}
	c := &counter{done: make(chan struct{}), want: int64(want)}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		if wire.IsMarker(m.Headers()) {
			return
		}
		if onMsg != nil {
			onMsg(m)
		}
		n, _ := strconv.Atoi(m.Headers().Get(wire.HeaderCount))
		if c.n.Add(int64(n)) >= c.want {
			c.close.Do(func() { close(c.done) })
		}
	})
	if err != nil {
		return nil, nil, err
	}
	return c, cc.Stop, nil
}

func variantEnv(v string) []string {
	proto, format, _ := strings.Cut(v, "-")
	return []string{
		"MAILROOM_PROTO_VERSION=" + strings.TrimPrefix(proto, "v"),
		"MAILROOM_BINARY=" + strconv.FormatBool(format == "binary"),
	}
}

// drain times the tailer draining the backlog behind slot; after, if set,
// runs once it is drained, with the stream's server still up.
func drain(ctx context.Context, o options, url, variant, slot string, n int, after func(natsURL string) error) (Drain, error) {
	d := Drain{Variant: variant, Tokens: n, NATS: "bench"}
	natsEnv, external, natsURL, stopNATS, err := tailerNATS(o, slot)
	if err != nil {
		return d, err
	}
	defer stopNATS()
	if external == "" {
		d.NATS = "embedded"
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return d, err
	}
	defer conn.Close(ctx)

	env := append(variantEnv(variant), "MAILROOM_BATCH_LIMIT="+strconv.Itoa(o.limit), "MAILROOM_BATCH_TIMEOUT=1000",
		"MAILROOM_NATS_REPLICAS="+strconv.Itoa(max(o.natsReplicas, 1)))
	start := time.Now()
	t, err := startTailer(o, url, external, slot, append(env, natsEnv...)...)
	if err != nil {
		return d, err
	}
	defer t.stop()
	nc, err := connectNATS(t, natsURL)
	if err != nil {
		return d, err
	}
	defer nc.Close()
	cnt, stop, err := subscribe(ctx, nc, "MAILROOM", n, nil)
	if err != nil {
		return d, err
	}
	defer stop()
	defer profileDrain(o.cpuProfile, t.http)()
	selfCPU0, _ := cpuSeconds(os.Getpid())
	steal := stealMeter()
	walPID, err := walsenderPID(ctx, conn, slot, start.Add(30*time.Second))
	if err != nil {
		return d, err
	}
	select {
	case <-cnt.done:
	case <-t.done:
		log, _ := os.ReadFile(t.log)
		return d, fmt.Errorf("tailer exited:\n%s", log)
	case <-time.After(10 * time.Minute):
		return d, fmt.Errorf("only %d of %d tokens after 10 minutes", cnt.n.Load(), n)
	}
	d.Seconds = time.Since(start).Seconds()
	if o.keep {
		// The tailer's own view (batches a message, join and commit
		// times), beside its log.
		if err := fetchProfile(filepath.Join(o.dir, slot+".metrics"), t.http+"/metrics"); err != nil {
			fmt.Println("metrics:", err)
		}
	}
	if err := measured(ctx, &d, conn, walPID, t.cmd.Process.Pid, selfCPU0); err != nil {
		return d, err
	}
	d.StealPct = steal()
	if after == nil {
		return d, nil
	}
	if external != "" {
		// The server is the bench's: the tailer has nothing left to do.
		// Its own server serves what comes after as the tailer idles, as
		// it would beside its subscribers.
		t.stop()
	}
	return d, after(natsURL)
}

// profileDrain writes a CPU profile of the tailer, from 200 ms into the
// drain, to path (none when empty); the function it returns waits for it.
func profileDrain(path, base string) (wait func()) {
	if path == "" {
		return func() {}
	}
	profiled := make(chan struct{})
	go func() {
		defer close(profiled)
		time.Sleep(200 * time.Millisecond)
		if err := fetchProfile(path, base+"/debug/pprof/profile?seconds=2"); err != nil {
			fmt.Fprintln(os.Stderr, "cpu profile:", err)
		}
	}()
	return func() { <-profiled }
}

// measured fills d's CPU, memory and scheduling figures once the drain of
// d.Tokens ended: the walsender's (walPID), the tailer's (tailerPID), its
// join backends' and this process's since selfCPU0.
func measured(ctx context.Context, d *Drain, conn *pgx.Conn, walPID, tailerPID int, selfCPU0 float64) error {
	n := d.Tokens
	walCPU, _ := cpuSeconds(walPID)
	tailerCPU, _ := cpuSeconds(tailerPID)
	selfCPU, _ := cpuSeconds(os.Getpid())
	var joinCPU float64
	rows, err := conn.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = 'tailer' AND backend_type = 'client backend'`)
	if err != nil {
		return err
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return err
	}
	for _, pid := range pids {
		c, _ := cpuSeconds(int(pid))
		joinCPU += c
	}
	d.WalsenderMicrosPerTk = 1e6 * walCPU / float64(n)
	d.JoinMicrosPerTk = 1e6 * joinCPU / float64(n)
	d.NATSMicrosPerTk = 1e6 * (selfCPU - selfCPU0) / float64(n)
	d.WalsenderRunqueuePct = 100 * runqueueSeconds(walPID) / d.Seconds
	d.TailerReads = readSyscalls(tailerPID)
	d.TokensPerSecond = float64(n) / d.Seconds
	d.WalsenderCPUPct = 100 * walCPU / d.Seconds
	d.TailerCPUSeconds = tailerCPU
	d.TailerMicrosPerTk = 1e6 * tailerCPU / float64(n)
	d.CPUSecondsPer100k = tailerCPU * 100_000 / float64(n)
	d.TailerPeakRSSMiB = peakRSS(tailerPID)
	return nil
}

// walsenderPID is the process streaming slot, once it runs (until
// deadline).
func walsenderPID(ctx context.Context, conn *pgx.Conn, slot string, deadline time.Time) (int, error) {
	for time.Now().Before(deadline) {
		var pid *int32
		conn.QueryRow(ctx, `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&pid)
		if pid != nil {
			return int(*pid), nil
		}
		time.Sleep(2 * time.Millisecond)
	}
	return 0, errors.New("the walsender never started")
}

func printDrain(d Drain) {
	fmt.Printf("drain %-15s %8d tokens: %6.2fs  %9.0f tokens/s  walsender %5.1f%% of a core  tailer %.2f µs/token, %.2f CPU s/100k, peak RSS %.1f MiB\n",
		d.Variant, d.Tokens, d.Seconds, d.TokensPerSecond, d.WalsenderCPUPct, d.TailerMicrosPerTk, d.CPUSecondsPer100k, d.TailerPeakRSSMiB)
	bench := "NATS+bench"
	if d.NATS == "embedded" {
		bench = "bench (NATS in the tailer)"
	}
	fmt.Printf("      CPU µs/token: walsender %.2f, join backend %.2f, %s %.2f; walsender waited for a CPU %.1f%% of the drain; tailer read(2) calls %d; steal %.1f%%\n",
		d.WalsenderMicrosPerTk, d.JoinMicrosPerTk, bench, d.NATSMicrosPerTk, d.WalsenderRunqueuePct, d.TailerReads, d.StealPct)
}
