// Command bench measures the tailer the way its users judge it, against a
// throwaway PostgreSQL and an embedded JetStream server it starts itself:
// backlog drain rate and CPU (tailer and walsender), drain rate as the
// backlog grows, live commit-to-delivery latency, and memory. It prints a
// table and writes the figures as JSON.
//
//	go run ./cmd/bench [-tokens 200000] [-big 1000000] [-out bench-results.json]
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/migrations"
	"github.com/mailroom/tailer/publish/embedded"
	"github.com/mailroom/tailer/publish/wire"
	"github.com/mailroom/tailer/replication"
	"github.com/mailroom/tailer/testutil/pgtest"
)

const key = "cafebabecafebabecafebabecafebabecafebabecafebabecafebabecafebabe"

// clkTck is the unit of utime and stime in /proc/<pid>/stat on Linux.
const clkTck = 100

type options struct {
	tokens, big      int
	oneTx            int
	limit            int
	liveRate         int
	liveSeconds      int
	liveWarmup       int
	liveConns        int
	liveLimit        int
	variants         string
	tailer, out, dir string
	keep             bool
	cpuProfile       string
	tailerEnv        string
	natsSync         time.Duration
	natsReplicas     int
}

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
	// Where the rest of the machine's CPU went, per token: the walsender,
	// the tailer's query backend (the account join), and this process
	// (the embedded NATS server and the counting subscriber).
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
	Live       *Live   `json:"live"`
}

// Live is the live-latency run.
type Live struct {
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

func main() {
	var o options
	flag.IntVar(&o.tokens, "tokens", 200_000, "backlog size for the drain runs")
	flag.IntVar(&o.big, "big", 1_000_000, "backlog size for the growth run (0 skips it)")
	flag.IntVar(&o.oneTx, "one-tx", 1_000_000, "tokens committed in a single transaction, drained with the default options (0 skips it)")
	flag.IntVar(&o.limit, "batch-limit", 1000, "MAILROOM_BATCH_LIMIT for the drains")
	flag.IntVar(&o.liveRate, "live-rate", 2000, "single-row transactions per second in the live run (0 skips it)")
	flag.IntVar(&o.liveSeconds, "live-seconds", 10, "length of the live run")
	flag.IntVar(&o.liveWarmup, "live-warmup", 1, "seconds of the live run before latencies are counted")
	flag.IntVar(&o.liveConns, "live-conns", 8, "writer connections in the live run")
	flag.IntVar(&o.liveLimit, "live-batch-limit", 1, "MAILROOM_BATCH_LIMIT in the live run (1: one message per token)")
	flag.StringVar(&o.variants, "variants", "v1-text,v1-binary,v2-text,v2-binary", "pgoutput options to compare on the small backlog (proto-format)")
	flag.StringVar(&o.tailer, "tailer", "", "tailer binary (default: build ./cmd/tailer)")
	flag.StringVar(&o.out, "out", "bench-results.json", "where to write the JSON")
	flag.BoolVar(&o.keep, "keep", false, "keep the temporary directory (tailer logs)")
	flag.StringVar(&o.tailerEnv, "tailer-env", "", "extra environment for the tailer, comma-separated K=V (e.g. GOMAXPROCS=1)")
	flag.IntVar(&o.natsReplicas, "nats-replicas", 1, "1: one embedded NATS server; 3: a three-node cluster in this process and an R3 stream")
	var natsSync string
	flag.StringVar(&natsSync, "nats-sync", "always", "the NATS server's store sync: always (fsync before every PubAck, as tailer run's embedded server) or an interval such as 2m (nats-server's own default)")
	flag.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the tailer during the first drain to this file")
	flag.Parse()
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
	pg, err := pgtest.Start(pgtest.Options{Settings: []string{"shared_buffers=512MB", "max_wal_size=8GB", "checkpoint_timeout=30min"}})
	if err != nil {
		return err
	}
	defer pg.Close()

	res := Results{Machine: machine(), When: time.Now().UTC().Format(time.RFC3339), BatchLimit: o.limit, NATSReplicas: max(o.natsReplicas, 1), NATSSync: "always"}
	if o.natsSync > 0 {
		res.NATSSync = o.natsSync.String()
	}

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
	before, after := best+"-before", best+"-after"
	slots := append([]string{"peek", before, after}, variants...)
	if err := prepare(ctx, url, slots, o.tokens, 1000); err != nil {
		return err
	}
	if res.ServerDecodeRate, err = peekRate(ctx, url, o.tokens); err != nil {
		return err
	}
	for i, v := range variants {
		if i > 0 {
			o.cpuProfile = ""
		}
		d, err := drain(ctx, o, url, v, slotName(v, o.tokens), o.tokens)
		if err != nil {
			return fmt.Errorf("drain %s: %w", v, err)
		}
		res.Drains = append(res.Drains, d)
		printDrain(d)
	}

	if o.big > 0 {
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
		}{{before, url, o.tokens}, {best, bigURL, o.big}, {after, url, o.tokens}} {
			d, err := drain(ctx, o, run.url, best, slotName(run.label, run.n), run.n)
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
	}

	if o.oneTx > 0 {
		// One INSERT of o.oneTx rows: the server streams it in chunks
		// (protocol v2) and the tailer buffers it until its commit.
		oneURL, err := createDB(ctx, pg, "bench_one_tx")
		if err != nil {
			return err
		}
		label := best + "-one-tx"
		if err := prepare(ctx, oneURL, []string{label}, o.oneTx, o.oneTx); err != nil {
			return err
		}
		d, err := drain(ctx, o, oneURL, best, slotName(label, o.oneTx), o.oneTx)
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
	}

	if o.liveRate > 0 {
		url, err := createDB(ctx, pg, "bench_live")
		if err != nil {
			return err
		}
		live, err := liveLatency(ctx, o, url)
		if err != nil {
			return fmt.Errorf("live: %w", err)
		}
		res.Live = live
	}

	printSummary(res)
	data, _ := json.MarshalIndent(res, "", "  ")
	if err := os.WriteFile(o.out, append(data, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Println("wrote", o.out)
	return nil
}

func machine() string {
	host, _ := os.Hostname()
	cpus := 0
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		cpus = strings.Count(string(data), "processor\t:")
	}
	return fmt.Sprintf("%s, %d CPUs", host, cpus)
}

func createDB(ctx context.Context, pg *pgtest.Server, name string) (string, error) {
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

// prepare migrates, creates the slots and commits n tokens, one INSERT per
// perTx accounts (each gets an activation token from the trigger).
func prepare(ctx context.Context, url string, slots []string, n, perTx int) error {
	if err := migrations.Up(ctx, url); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for _, s := range slots {
		if _, err := replication.EnsureSlot(ctx, conn, slotName(s, n)); err != nil {
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

// child is a running tailer.
type child struct {
	cmd  *exec.Cmd
	done chan struct{}
	log  string
}

func startTailer(o options, url, natsURL, slot string, env ...string) (*child, error) {
	logPath := filepath.Join(o.dir, slot+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	httpAddr := ""
	if o.cpuProfile != "" {
		httpAddr = "127.0.0.1:19999"
	}
	cmd := exec.Command(o.tailer, "run", "--http-addr="+httpAddr, "--pprof="+strconv.FormatBool(o.cpuProfile != ""))
	cmd.Env = append(os.Environ(),
		"MAILROOM_DATABASE_URL="+url,
		"MAILROOM_SECRET_KEY="+key,
		"MAILROOM_NATS_URL="+natsURL,
		"MAILROOM_SLOT="+slot,
		"MAILROOM_LOG_LEVEL="+logLevel(),
	)
	cmd.Env = append(cmd.Env, env...)
	if o.tailerEnv != "" {
		cmd.Env = append(cmd.Env, strings.Split(o.tailerEnv, ",")...)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, done: make(chan struct{}), log: logPath}
	go func() { cmd.Wait(); logf.Close(); close(c.done) }()
	return c, nil
}

func (c *child) stop() {
	c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(20 * time.Second):
		c.cmd.Process.Kill()
		<-c.done
	}
}

// cpuSeconds reads utime+stime of pid from /proc.
func cpuSeconds(pid int) (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name, which is in parentheses.
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / clkTck, nil
}

// runqueueSeconds reads how long pid has waited for a CPU while runnable,
// from /proc/<pid>/schedstat.
func runqueueSeconds(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(data))
	if len(f) < 2 {
		return 0
	}
	ns, _ := strconv.ParseFloat(f[1], 64)
	return ns / 1e9
}

// stealMeter starts measuring steal time; the function it returns gives
// the steal since then as % of all CPU time, from /proc/stat.
func stealMeter() func() float64 {
	read := func() (steal, total float64) {
		data, _ := os.ReadFile("/proc/stat")
		line, _, _ := strings.Cut(string(data), "\n")
		f := strings.Fields(line)
		for i, v := range f[1:] {
			x, _ := strconv.ParseFloat(v, 64)
			// guest and guest_nice (10th and 11th) are already in user.
			if i < 8 {
				total += x
			}
			if i == 7 {
				steal = x
			}
		}
		return steal, total
	}
	s0, t0 := read()
	return func() float64 {
		s1, t1 := read()
		if t1 == t0 {
			return 0
		}
		return 100 * (s1 - s0) / (t1 - t0)
	}
}

// readSyscalls reads syscr, the number of read-like system calls of pid.
func readSyscalls(pid int) int64 {
	data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "syscr:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// peakRSS reads VmHWM of pid in MiB.
func peakRSS(pid int) float64 {
	data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
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

func drain(ctx context.Context, o options, url, variant, slot string, n int) (Drain, error) {
	d := Drain{Variant: variant, Tokens: n}
	natsURL, stopNATS, err := startNATS(o, slot)
	if err != nil {
		return d, err
	}
	defer stopNATS()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		return d, err
	}
	defer nc.Close()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return d, err
	}
	defer conn.Close(ctx)

	env := append(variantEnv(variant), "MAILROOM_BATCH_LIMIT="+strconv.Itoa(o.limit), "MAILROOM_BATCH_TIMEOUT=1000",
		"MAILROOM_NATS_REPLICAS="+strconv.Itoa(max(o.natsReplicas, 1)))
	start := time.Now()
	t, err := startTailer(o, url, natsURL, slot, env...)
	if err != nil {
		return d, err
	}
	defer t.stop()
	cnt, stop, err := subscribe(ctx, nc, "MAILROOM", n, nil)
	if err != nil {
		return d, err
	}
	defer stop()
	profiled := make(chan struct{})
	if path := o.cpuProfile; path != "" {
		go func() {
			defer close(profiled)
			time.Sleep(200 * time.Millisecond)
			if err := fetchProfile(path, "http://127.0.0.1:19999/debug/pprof/profile?seconds=2"); err != nil {
				fmt.Fprintln(os.Stderr, "cpu profile:", err)
			}
		}()
		defer func() { <-profiled }()
	}
	selfCPU0, _ := cpuSeconds(os.Getpid())
	steal := stealMeter()
	walPID := 0
	for walPID == 0 && time.Since(start) < 30*time.Second {
		var pid *int32
		conn.QueryRow(ctx, `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&pid)
		if pid != nil {
			walPID = int(*pid)
		} else {
			time.Sleep(2 * time.Millisecond)
		}
	}
	if walPID == 0 {
		return d, errors.New("the walsender never started")
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
	walCPU, _ := cpuSeconds(walPID)
	tailerCPU, _ := cpuSeconds(t.cmd.Process.Pid)
	selfCPU, _ := cpuSeconds(os.Getpid())
	var joinCPU float64
	rows, err := conn.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = 'tailer' AND backend_type = 'client backend'`)
	if err != nil {
		return d, err
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return d, err
	}
	for _, pid := range pids {
		c, _ := cpuSeconds(int(pid))
		joinCPU += c
	}
	d.WalsenderMicrosPerTk = 1e6 * walCPU / float64(n)
	d.JoinMicrosPerTk = 1e6 * joinCPU / float64(n)
	d.NATSMicrosPerTk = 1e6 * (selfCPU - selfCPU0) / float64(n)
	d.WalsenderRunqueuePct = 100 * runqueueSeconds(walPID) / d.Seconds
	d.TailerReads = readSyscalls(t.cmd.Process.Pid)
	d.StealPct = steal()
	d.TokensPerSecond = float64(n) / d.Seconds
	d.WalsenderCPUPct = 100 * walCPU / d.Seconds
	d.TailerCPUSeconds = tailerCPU
	d.TailerMicrosPerTk = 1e6 * tailerCPU / float64(n)
	d.CPUSecondsPer100k = tailerCPU * 100_000 / float64(n)
	d.TailerPeakRSSMiB = peakRSS(t.cmd.Process.Pid)
	return d, nil
}

const insertToken = `INSERT INTO tokens (account, action) VALUES ($1, 'password_recovery') RETURNING id`

func liveLatency(ctx context.Context, o options, url string) (*Live, error) {
	const accounts = 10_000
	if err := migrations.Up(ctx, url); err != nil {
		return nil, err
	}
	pool, err := pgxpool.New(ctx, url+"&pool_max_conns="+strconv.Itoa(o.liveConns+2))
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if _, err := replication.EnsureSlot(ctx, pool, "live"); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, `INSERT INTO accounts (email, login, status) SELECT 'l' || g || '@x', 'l' || g, 'active' FROM generate_series(1, $1::int) g`, accounts); err != nil {
		return nil, err
	}
	srv, err := embedded.Start(filepath.Join(o.dir, "nats-live"), "127.0.0.1:0", embedded.SyncInterval(o.natsSync))
	if err != nil {
		return nil, err
	}
	defer srv.Shutdown()
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	t, err := startTailer(o, url, srv.ClientURL(), "live", "MAILROOM_BATCH_LIMIT="+strconv.Itoa(o.liveLimit), "MAILROOM_BATCH_TIMEOUT=1000")
	if err != nil {
		return nil, err
	}
	defer t.stop()

	// The first liveWarmup seconds are written at the same rate but not
	// counted: the measure is the steady state, not the first moments of
	// freshly started writers and a tailer that has been idle.
	warm := o.liveRate * o.liveWarmup
	total := warm + o.liveRate*o.liveSeconds
	var mu sync.Mutex
	committed := make(map[int64]time.Time, total)
	arrived := make(map[int64]time.Time, total)
	stored := make(map[int64]time.Time, total)
	cnt, stop, err := subscribe(ctx, nc, "MAILROOM", total, func(m jetstream.Msg) {
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
	mu.Lock()
	defer mu.Unlock()
	var lat, lstored []float64
	for id, c := range committed {
		if a, ok := arrived[id]; ok {
			lat = append(lat, float64(a.Sub(c).Microseconds())/1000)
			lstored = append(lstored, float64(stored[id].Sub(c).Microseconds())/1000)
		}
	}
	slices.Sort(lat)
	slices.Sort(lstored)
	if len(lat) == 0 {
		return nil, errors.New("no latencies")
	}
	pct := func(l []float64, p float64) float64 { return l[min(len(l)-1, int(p*float64(len(l))))] }
	return &Live{
		TargetPerSecond: o.liveRate, BatchLimit: o.liveLimit, WarmupTokens: warm, Tokens: len(lat), AchievedPerSec: float64(total) / writeSecs,
		P50Millis: pct(lat, 0.50), P99Millis: pct(lat, 0.99), MaxMillis: lat[len(lat)-1],
		StoredP50Millis: pct(lstored, 0.50), StoredP99Millis: pct(lstored, 0.99),
		StealPct: stealPct,
	}, nil
}

func printDrain(d Drain) {
	fmt.Printf("drain %-15s %8d tokens: %6.2fs  %9.0f tokens/s  walsender %5.1f%% of a core  tailer %.2f µs/token, %.2f CPU s/100k, peak RSS %.1f MiB\n",
		d.Variant, d.Tokens, d.Seconds, d.TokensPerSecond, d.WalsenderCPUPct, d.TailerMicrosPerTk, d.CPUSecondsPer100k, d.TailerPeakRSSMiB)
	fmt.Printf("      CPU µs/token: walsender %.2f, join backend %.2f, NATS+bench %.2f; walsender waited for a CPU %.1f%% of the drain; tailer read(2) calls %d; steal %.1f%%\n",
		d.WalsenderMicrosPerTk, d.JoinMicrosPerTk, d.NATSMicrosPerTk, d.WalsenderRunqueuePct, d.TailerReads, d.StealPct)
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
	if r.Live != nil {
		fmt.Printf("live: %d tokens (after %d not counted) at %.0f/s (target %d/s), batch limit %d, NATS sync %s: commit to arrival p50 %.2f ms, p99 %.2f ms, max %.2f ms; commit to stored (PubAck) p50 %.2f ms, p99 %.2f ms; steal %.1f%%\n",
			r.Live.Tokens, r.Live.WarmupTokens, r.Live.AchievedPerSec, r.Live.TargetPerSecond, r.Live.BatchLimit, r.NATSSync, r.Live.P50Millis, r.Live.P99Millis, r.Live.MaxMillis, r.Live.StoredP50Millis, r.Live.StoredP99Millis, r.Live.StealPct)
	}
}

func fetchProfile(path, url string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
}

// logLevel lets a developer see the tailer's debug logs in the bench's
// temporary directory (BENCH_LOG_LEVEL=debug, with -keep).
func logLevel() string {
	if l := os.Getenv("BENCH_LOG_LEVEL"); l != "" {
		return l
	}
	return "warn"
}
