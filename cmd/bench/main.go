package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mailroom/tailer/internal/pgserver"
)

const key = "cafebabecafebabecafebabecafebabecafebabecafebabecafebabecafebabe"

type options struct {
	tokens, big      int
	oneTx            int
	limit            int
	liveRate         int
	liveRates        string
	liveDiscard      bool
	designs          bool
	defaults         bool
	liveSeconds      int
	liveWarmup       int
	liveConns        int
	liveLimit        int
	variants         string
	tailer, out, dir string
	keep             bool
	cpuProfile       string
	liveProfile      string
	tailerEnv        string
	natsSync         time.Duration
	natsReplicas     int
	subscribers      bool
	restart          string
	nats             string
	audit            int
	auditPairs       int
}

// Results is the JSON document.
type Results struct {
	Machine    string `json:"machine"`
	When       string `json:"when"`
	BatchLimit int    `json:"batch_limit"`
	// NATSReplicas is the stream's replicas: 1 server, or 3 nodes.
	NATSReplicas int `json:"nats_replicas"`
	// NATSSync is the NATS store's sync: "always" (before every PubAck,
	// the embedded server's default) or an interval.
	NATSSync         string  `json:"nats_sync"`
	Drains           []Drain `json:"drains"`
	ServerDecodeRate float64 `json:"server_decode_rows_per_second"`
	GrowthRatio      float64 `json:"drain_rate_big_over_small"`
	// OneTxRatio compares the drain of one huge transaction with the
	// drain of the same number of tokens in 1,000-row transactions (the
	// big backlog, or the small one when the sizes differ).
	OneTxRatio float64 `json:"drain_rate_one_tx_over_1000_row_tx"`
	// Discard is the ceiling: a bare pglogrepl client that discards the
	// same backlog's stream.
	Discard *Drain  `json:"discard_client"`
	Live    []*Live `json:"live"`
	// Designs is -designs: the group-commit designs on the server alone.
	Designs []Design `json:"designs,omitempty"`
	// Subscribers are the database subscriber's drains of the stream the
	// default drain filled.
	Subscribers []SubscriberDrain `json:"subscriber_drains,omitempty"`
	// Restarts are -restart's runs: a restart in the middle of one
	// transaction.
	Restarts []Restart `json:"restarts,omitempty"`
	// Audit is -audit's tailer audit of a drained backlog; AuditDrains
	// its drains with tailer run's audit on and off, interleaved, and
	// AuditOnOverOff their median rates' ratio.
	Audit          *AuditRun    `json:"audit,omitempty"`
	AuditDrains    []AuditDrain `json:"audit_drains,omitempty"`
	AuditOnOverOff float64      `json:"audit_on_over_off,omitempty"`
	Targets        Targets      `json:"targets"`
}

// Targets are the ratios the tailer is judged by (see docs/performance.md).
type Targets struct {
	// DefaultOverDiscard: every setting at its default (batch limit 10,
	// sync always), drain rate over the discard client's.
	DefaultOverDiscard float64 `json:"default_drain_over_discard"`
	// LimitOverDiscard: the best variant at -batch-limit (1000), drain
	// rate over the discard client's.
	LimitOverDiscard float64 `json:"limit_drain_over_discard"`
	// CPUOverWalsender: at -batch-limit, the tailer's CPU per token (its
	// process's: with -nats embedded, its server's too) over the
	// walsender's.
	CPUOverWalsender float64 `json:"tailer_cpu_over_walsender_cpu"`
	// R3OverR1: at the defaults, drain rate to an R3 stream on three nodes
	// over the rate to one server.
	R3OverR1 float64 `json:"r3_drain_over_r1"`
	// InboxOverDefault and RiverOverDefault: the database subscriber's
	// drain rate of that stream over the default drain's rate.
	InboxOverDefault float64 `json:"inbox_drain_over_default_drain"`
	RiverOverDefault float64 `json:"river_drain_over_default_drain"`
	// RiverOverAlone: --into river's drain rate over River's own insert
	// of as many jobs alone (riverAlone).
	RiverOverAlone float64 `json:"river_drain_over_river_alone"`
}

func main() {
	var o options
	flag.IntVar(&o.tokens, "tokens", 200_000, "backlog size for the drain runs")
	flag.IntVar(&o.big, "big", 1_000_000, "backlog size for the growth run (0 skips it)")
	flag.IntVar(&o.oneTx, "one-tx", 1_000_000, "tokens committed in a single transaction, drained with the default options (0 skips it)")
	flag.IntVar(&o.limit, "batch-limit", 1000, "MAILROOM_BATCH_LIMIT for the drains")
	flag.BoolVar(&o.designs, "designs", false, "also compare the group-commit designs on an embedded server alone: a message per batch, atomic batches, several batches a message")
	flag.BoolVar(&o.subscribers, "subscribers", true, "after the default drain, drain the stream it filled with tailer subscribe --into inbox and --into river (with -defaults)")
	flag.BoolVar(&o.defaults, "defaults", true, "drain the backlog with every setting at its default (batch limit 10), to one server and to an R3 stream")
	flag.StringVar(&o.liveRates, "live-rates", "2000,5000", "single-row transactions per second of each live run, comma-separated (empty skips them)")
	flag.BoolVar(&o.liveDiscard, "live-discard", true, "also time each live rate with a bare client of the slot instead of the tailer (the floor: commit to the insert's arrival)")
	flag.IntVar(&o.liveSeconds, "live-seconds", 10, "length of the live run")
	flag.IntVar(&o.liveWarmup, "live-warmup", 1, "seconds of the live run before latencies are counted")
	flag.IntVar(&o.liveConns, "live-conns", 8, "writer connections in the live run")
	flag.StringVar(&o.nats, "nats", "embedded", "the one NATS server of drains and live runs: embedded (the tailer's own, in its process, as deployed by default) or bench (one in this process, beside the writers and the reader); an R3 stream's cluster is always the bench's")
	flag.StringVar(&o.nats, "live-nats", "embedded", "-nats, by its name before drains took it too")
	flag.IntVar(&o.liveLimit, "live-batch-limit", 1, "MAILROOM_BATCH_LIMIT in the live run (1: one message per token)")
	flag.StringVar(&o.variants, "variants", "v1-text,v1-binary,v2-text,v2-binary", "pgoutput options to compare on the small backlog (proto-format)")
	flag.StringVar(&o.tailer, "tailer", "", "tailer binary (default: build ./cmd/tailer)")
	flag.StringVar(&o.out, "out", "bench-results.json", "where to write the JSON")
	flag.BoolVar(&o.keep, "keep", false, "keep the temporary directory (tailer logs)")
	flag.StringVar(&o.tailerEnv, "tailer-env", "", "extra environment for the tailer, comma-separated K=V (e.g. GOMAXPROCS=1)")
	flag.IntVar(&o.natsReplicas, "nats-replicas", 1, "1: one embedded NATS server; 3: a three-node cluster in this process and an R3 stream")
	var natsSync string
	flag.StringVar(&natsSync, "nats-sync", "always", "the NATS server's store sync: always (fsync before every PubAck, as tailer run's embedded server) or an interval such as 2m (nats-server's own default)")
	flag.StringVar(&o.restart, "restart", "", "instead of the other runs: for each size (comma-separated, e.g. 1000000,5000000), one transaction of that many tokens, the tailer SIGKILLed at 70% and started again (peak RSS of both, exactly once)")
	flag.IntVar(&o.audit, "audit", 0, "instead of the other runs: tailer audit over a drained backlog of this many tokens (time, peak RSS)")
	flag.IntVar(&o.auditPairs, "audit-pairs", 0, "instead of the other runs (after -audit's): pairs of -tokens drains with tailer run's audit on (every second) and off, interleaved")
	flag.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the tailer during the first drain to this file")
	flag.StringVar(&o.liveProfile, "live-cpuprofile", "", "write a CPU profile of the tailer during the live run (5 s, from 2 s into the writing) to this file; with several rates, the last rate's")
	flag.Parse()
	if o.nats != "embedded" && o.nats != "bench" {
		fmt.Fprintf(os.Stderr, "bench: -nats must be embedded or bench, got %q\n", o.nats)
		os.Exit(2)
	}
	if natsSync != "always" {
		d, err := time.ParseDuration(natsSync)
		if err != nil || d <= 0 {
			fmt.Fprintf(os.Stderr, "bench: -nats-sync must be always or a positive duration, got %q\n", natsSync)
			os.Exit(2)
		}
		o.natsSync = d
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "tailer-bench-")
	if err != nil {
		return err
	}
	if o.keep {
		fmt.Println("keeping", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	o.dir = dir
	if o.tailer == "" {
		o.tailer = filepath.Join(dir, "tailer")
		fmt.Println("building tailer ...")
		if out, err := exec.Command("go", "build", "-o", o.tailer, "./cmd/tailer").CombinedOutput(); err != nil {
			return fmt.Errorf("build tailer: %v\n%s", err, out)
		}
	}
	fmt.Println("starting PostgreSQL ...")
	pg, err := pgserver.Start(pgserver.Options{Settings: []string{"shared_buffers=512MB", "max_wal_size=8GB", "checkpoint_timeout=30min"}})
	if err != nil {
		return err
	}
	defer pg.Close()

	res := Results{Machine: machine(), When: time.Now().UTC().Format(time.RFC3339), BatchLimit: o.limit, NATSReplicas: max(o.natsReplicas, 1), NATSSync: "always"}
	if o.natsSync > 0 {
		res.NATSSync = o.natsSync.String()
	}

	if o.restart != "" {
		if res.Restarts, err = restarts(ctx, o, pg, o.restart); err != nil {
			return err
		}
		return writeResults(res, o.out)
	}
	if o.audit > 0 || o.auditPairs > 0 {
		run, drains, err := audits(ctx, o, pg, o.audit, o.auditPairs)
		res.AuditDrains, res.AuditOnOverOff = drains, auditCost(drains)
		if o.audit > 0 {
			res.Audit = &run
		}
		if err != nil {
			return err
		}
		fmt.Printf("drain with the audit on over off (medians): %.3f\n", res.AuditOnOverOff)
		return writeResults(res, o.out)
	}
	if o.designs {
		if res.Designs, err = compareDesigns(dir); err != nil {
			return err
		}
	}
	if err := drainAll(ctx, o, pg, &res); err != nil {
		return err
	}

	if err := liveRuns(ctx, o, pg, &res); err != nil {
		return err
	}
	res.Targets = targets(res, o)

	printSummary(res)
	return writeResults(res, o.out)
}

// liveRuns times the live runs, one a rate of o.liveRates, each beside a
// bare client of the slot (o.liveDiscard).
func liveRuns(ctx context.Context, o options, pg *pgserver.Server, res *Results) error {
	if o.liveRates == "" {
		return nil
	}
	if err := settle(ctx, pg); err != nil {
		return err
	}
	for _, r := range strings.Split(o.liveRates, ",") {
		if r == "" {
			continue
		}
		rate, err := strconv.Atoi(r)
		if err != nil || rate <= 0 {
			return fmt.Errorf("-live-rates: %q is not a positive rate", r)
		}
		o.liveRate = rate
		url, err := createDB(ctx, pg, "bench_live_"+r)
		if err != nil {
			return err
		}
		live, err := liveLatency(ctx, o, url, false)
		if err != nil {
			return fmt.Errorf("live at %s/s: %w", r, err)
		}
		res.Live = append(res.Live, live)
		if o.liveDiscard {
			url, err := createDB(ctx, pg, "bench_live_"+r+"_discard")
			if err != nil {
				return err
			}
			live, err := liveLatency(ctx, o, url, true)
			if err != nil {
				return fmt.Errorf("live at %s/s, discard client: %w", r, err)
			}
			res.Live = append(res.Live, live)
		}
	}
	return nil
}

func writeResults(res Results, path string) error {
	data, _ := json.MarshalIndent(res, "", "  ")
	if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Println("wrote", path)
	return nil
}

// settle vacuums the drains' and the subscribers' databases, checkpoints
// and has the kernel write what is dirty, so that the live runs measure
// the tailer in the steady state, not beside autovacuum working through
// the backlogs just stored (River's GIN index above all) or the disk
// writing them back.
func settle(ctx context.Context, pg *pgserver.Server) error {
	for _, db := range []string{"bench_small", "bench_big", "bench_into_inbox", "bench_into_river", "bench_river_alone"} {
		conn, err := pgx.Connect(ctx, pg.URL(db))
		if err != nil {
			continue // not made in this run
		}
		_, err = conn.Exec(ctx, "VACUUM (ANALYZE)")
		conn.Close(ctx)
		if err != nil {
			return fmt.Errorf("vacuum %s: %w", db, err)
		}
	}
	if err := checkpoint(ctx, pg); err != nil {
		return err
	}
	syscall.Sync()
	return nil
}

// checkpoint writes out what the runs before left in PostgreSQL's
// buffers, so that a timed run does not pay for the one before it.
func checkpoint(ctx context.Context, pg *pgserver.Server) error {
	conn, err := pgx.Connect(ctx, pg.URL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "CHECKPOINT")
	return err
}

func createDB(ctx context.Context, pg *pgserver.Server, name string) (string, error) {
	conn, err := pgx.Connect(ctx, pg.URL("postgres"))
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", err
	}
	return pg.URL(name), nil
}

func printSummary(r Results) {
	fmt.Printf("\n%-16s %9s %8s %10s %10s %8s %12s %10s %10s %10s %8s\n", "variant", "tokens", "seconds", "tokens/s", "walsender%", "rq wait%", "tailer µs/tk", "CPU s/100k", "RSS MiB", "ws µs/tk", "join µs")
	for _, d := range r.Drains {
		fmt.Printf("%-16s %9d %8.2f %10.0f %10.1f %8.1f %12.2f %10.2f %10.1f %10.2f %8.2f\n", d.Variant, d.Tokens, d.Seconds, d.TokensPerSecond, d.WalsenderCPUPct, d.WalsenderRunqueuePct, d.TailerMicrosPerTk, d.CPUSecondsPer100k, d.TailerPeakRSSMiB, d.WalsenderMicrosPerTk, d.JoinMicrosPerTk)
	}
	fmt.Printf("in-server decode rate: %.0f tokens/s\n", r.ServerDecodeRate)
	if r.GrowthRatio > 0 {
		fmt.Printf("drain rate, big backlog over small (mean of the small one drained just before and just after): %.3f\n", r.GrowthRatio)
	}
	if r.OneTxRatio > 0 {
		fmt.Printf("drain rate, one transaction over 1,000-row transactions: %.3f\n", r.OneTxRatio)
	}
	for _, l := range r.Live {
		if l.Client == "discard-client" {
			fmt.Printf("live, discard client: %d tokens (after %d not counted) at %.0f/s: commit to arrival p50 %.2f ms, p99 %.2f ms, max %.2f ms; steal %.1f%%; machine %.0f%% busy\n",
				l.Tokens, l.WarmupTokens, l.AchievedPerSec, l.P50Millis, l.P99Millis, l.MaxMillis, l.StealPct, l.Load.BusyPct)
			continue
		}
		fmt.Printf("live: %d tokens (after %d not counted) at %.0f/s (target %d/s), batch limit %d, NATS sync %s: commit to arrival p50 %.2f ms, p99 %.2f ms, max %.2f ms; commit to stored (PubAck) p50 %.2f ms, p99 %.2f ms; steal %.1f%%\n",
			l.Tokens, l.WarmupTokens, l.AchievedPerSec, l.TargetPerSecond, l.BatchLimit, r.NATSSync, l.P50Millis, l.P99Millis, l.MaxMillis, l.StoredP50Millis, l.StoredP99Millis, l.StealPct)
		ld := l.Load
		tailer, bench := "tailer and its NATS server", "writers+subscriber"
		if l.NATS == "bench" {
			tailer, bench = "tailer", "NATS+writers+subscriber"
		}
		fmt.Printf("      machine %.0f%% busy; CPU cores, run-queue wait s/s, timeslices/s: %s %.2f, %.2f, %.0f; %s %.2f, %.2f, %.0f; PostgreSQL %.2f, %.2f, %.0f\n",
			ld.BusyPct, tailer, ld.Tailer.Cores, ld.Tailer.Wait, ld.Tailer.Slices, bench, ld.Bench.Cores, ld.Bench.Wait, ld.Bench.Slices, ld.Postgres.Cores, ld.Postgres.Wait, ld.Postgres.Slices)
		if st := l.Stages; st != nil {
			fmt.Printf("      in the tailer (its metrics, means, warm-up included): a join %.2f ms, a message's publish to PubAck %.2f ms, a batch's cut to PubAck %.2f ms; %.2f batches and %.2f joins a message\n",
				st.JoinMillis, st.StoreMillis, st.CutToAckMillis, st.BatchesPerMessage, st.JoinsPerMessage)
		}
	}
	t := r.Targets
	fmt.Printf("targets: defaults over discard client %.3f (≥ 0.9); limit %d over discard client %.3f (≥ 0.9); tailer process CPU over walsender's %.3f (≤ 0.35); R3 over R1 at the defaults %.3f (≥ 0.8); subscribe --into inbox over the default drain %.3f (≥ 0.8); --into river over River's insert alone %.3f (≥ 0.8)\n",
		t.DefaultOverDiscard, r.BatchLimit, t.LimitOverDiscard, t.CPUOverWalsender, t.R3OverR1, t.InboxOverDefault, t.RiverOverAlone)
}

// targets computes the ratios from the drains of one run.
func targets(r Results, o options) Targets {
	var t Targets
	byVariant := map[string]Drain{}
	for _, d := range r.Drains {
		if _, ok := byVariant[d.Variant]; !ok {
			byVariant[d.Variant] = d
		}
	}
	best := byVariant[o.variants[strings.LastIndex(o.variants, ",")+1:]]
	def, r3 := byVariant["default"], byVariant["default-r3"]
	if r.Discard != nil && r.Discard.TokensPerSecond > 0 {
		t.DefaultOverDiscard = def.TokensPerSecond / r.Discard.TokensPerSecond
		t.LimitOverDiscard = best.TokensPerSecond / r.Discard.TokensPerSecond
	}
	if best.WalsenderMicrosPerTk > 0 {
		t.CPUOverWalsender = best.TailerMicrosPerTk / best.WalsenderMicrosPerTk
	}
	if def.TokensPerSecond > 0 {
		t.R3OverR1 = r3.TokensPerSecond / def.TokensPerSecond
		rates := map[string]float64{}
		for _, s := range r.Subscribers {
			rates[s.Into] = s.TokensPerSecond
		}
		t.InboxOverDefault = rates["inbox"] / def.TokensPerSecond
		t.RiverOverDefault = rates["river"] / def.TokensPerSecond
		if rates["river-alone"] > 0 {
			t.RiverOverAlone = rates["river"] / rates["river-alone"]
		}
	}
	return t
}
