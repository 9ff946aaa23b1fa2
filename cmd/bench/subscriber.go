package main

// The database subscriber's drain: tailer subscribe --into inbox or river,
// from the start of a stream the default drain just filled, timed until
// the consumer's database holds every token.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mailroom/tailer/internal/pgserver"
)

// SubscriberDrain is one database subscriber's drain of the stream.
type SubscriberDrain struct {
	Into            string  `json:"into"`
	Tokens          int     `json:"tokens"`
	Seconds         float64 `json:"seconds"`
	TokensPerSecond float64 `json:"tokens_per_second"`
	// CPUMicrosPerTk is the subscriber process's CPU per token; the
	// database's own work is not in it.
	CPUMicrosPerTk float64 `json:"subscriber_cpu_microseconds_per_token"`
	PeakRSSMiB     float64 `json:"subscriber_peak_rss_mib"`
}

// subscriberDrain runs tailer subscribe --into into from the start of the
// stream at natsURL, which holds n tokens, into a database of its own.
func subscriberDrain(ctx context.Context, o options, pg *pgserver.Server, natsURL, into string, n int) (SubscriberDrain, error) {
	d := SubscriberDrain{Into: into, Tokens: n}
	url, err := createDB(ctx, pg, "bench_into_"+into)
	if err != nil {
		return d, err
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return d, err
	}
	defer conn.Close(ctx)
	count := `SELECT count(*) FROM mailroom_inbox`
	if into == "river" {
		count = `SELECT count(*) FROM river_job WHERE kind = 'mailroom_token'`
	}
	logPath := filepath.Join(o.dir, "subscribe-"+into+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return d, err
	}
	cmd := exec.Command(o.tailer, "subscribe", "--durable", "bench-"+into, "--into", into, "--migrate", "--from-start")
	cmd.Env = append(os.Environ(), "MAILROOM_NATS_URL="+natsURL, "MAILROOM_INBOX_URL="+url)
	cmd.Stdout, cmd.Stderr = logf, logf
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return d, err
	}
	c := &child{cmd: cmd, done: make(chan struct{}), log: logPath}
	go func() { cmd.Wait(); logf.Close(); close(c.done) }()
	defer c.stop()
	for got := 0; got < n; {
		select {
		case <-c.done:
			log, _ := os.ReadFile(logPath)
			return d, fmt.Errorf("subscriber exited:\n%s", log)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Since(start) > 10*time.Minute {
			return d, fmt.Errorf("only %d of %d tokens after 10 minutes", got, n)
		}
		// Before --migrate made the table the count fails: not yet.
		conn.QueryRow(ctx, count).Scan(&got)
	}
	d.Seconds = time.Since(start).Seconds()
	d.TokensPerSecond = float64(n) / d.Seconds
	cpu, _ := cpuSeconds(cmd.Process.Pid)
	d.CPUMicrosPerTk = 1e6 * cpu / float64(n)
	d.PeakRSSMiB = peakRSS(cmd.Process.Pid)
	return d, nil
}

func printSubscriberDrain(d SubscriberDrain) {
	fmt.Printf("subscribe --into %-6s %8d tokens: %6.2fs  %9.0f tokens/s  subscriber %.2f µs/token, peak RSS %.1f MiB\n",
		d.Into, d.Tokens, d.Seconds, d.TokensPerSecond, d.CPUMicrosPerTk, d.PeakRSSMiB)
}
