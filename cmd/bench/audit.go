package main

// The audit's cost (-audit): tailer audit over a window of a backlog the
// tailer drained, timed as a process with its peak RSS; and the drain of
// a backlog with tailer run's continuous audit on and off, interleaved.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mailroom/tailer/internal/pgserver"
)

// AuditRun is one tailer audit of a drained backlog.
type AuditRun struct {
	Tokens  int     `json:"tokens"`
	Seconds float64 `json:"seconds"`
	// PeakRSSMiB is the audit process's maximum resident set (VmHWM, read
	// every 10 ms while it runs).
	PeakRSSMiB float64 `json:"peak_rss_mib"`
	// Checked and Missing are what the audit reported.
	Checked    int     `json:"checked"`
	Missing    int     `json:"missing"`
	Messages   uint64  `json:"stream_messages"`
	LoadBefore float64 `json:"load_before"`
	LoadAfter  float64 `json:"load_after"`
}

// AuditDrain is one drain with the continuous audit on (its interval) or
// off (0).
type AuditDrain struct {
	IntervalMs      int     `json:"audit_interval_ms"`
	Tokens          int     `json:"tokens"`
	TokensPerSecond float64 `json:"tokens_per_second"`
	PeakRSSMiB      float64 `json:"tailer_peak_rss_mib"`
	LoadBefore      float64 `json:"load_before"`
}

// audits runs tailer audit over a drained backlog of n tokens (none: 0),
// then the interleaved drains (pairs of them, o.tokens each).
func audits(ctx context.Context, o options, pg *pgserver.Server, n, pairs int) (AuditRun, []AuditDrain, error) {
	var run AuditRun
	if n > 0 {
		var err error
		if run, err = auditBacklog(ctx, o, pg, n); err != nil {
			return run, nil, err
		}
		fmt.Printf("tailer audit of %d tokens (%d messages): %.1f s, peak RSS %.1f MiB, %d checked, %d missing; load %.2f before, %.2f after\n",
			run.Tokens, run.Messages, run.Seconds, run.PeakRSSMiB, run.Checked, run.Missing, run.LoadBefore, run.LoadAfter)
	}
	var drains []AuditDrain
	for i := range pairs * 2 {
		// Off, on, on, off, ...: neither is always first.
		interval := 0
		if i%4 == 1 || i%4 == 2 {
			interval = 1000
		}
		d, err := auditDrain(ctx, o, pg, fmt.Sprintf("bench_audit_drain_%d", i), interval)
		if err != nil {
			return run, drains, err
		}
		fmt.Printf("drain of %d tokens at the defaults, audit interval %d ms: %.0f tokens/s, peak RSS %.1f MiB (load %.2f)\n",
			d.Tokens, d.IntervalMs, d.TokensPerSecond, d.PeakRSSMiB, d.LoadBefore)
		drains = append(drains, d)
	}
	return run, drains, nil
}

// auditBacklog drains n tokens with the tailer (batch limit 10, its
// default) and times tailer audit over them.
func auditBacklog(ctx context.Context, o options, pg *pgserver.Server, n int) (AuditRun, error) {
	r := AuditRun{Tokens: n}
	url, err := createDB(ctx, pg, "bench_audit")
	if err != nil {
		return r, err
	}
	if err := prepare(ctx, url, []string{"audit"}, n, 1000); err != nil {
		return r, err
	}
	slot := slotName("audit", n)
	natsURL, stopNATS, err := startNATS(o, slot)
	if err != nil {
		return r, err
	}
	defer stopNATS()
	t, err := startTailer(o, url, natsURL, slot, "MAILROOM_AUDIT_INTERVAL=0", "MAILROOM_LAG_INTERVAL=500")
	if err != nil {
		return r, err
	}
	defer t.stop()
	nc, err := connectNATS(t, natsURL)
	if err != nil {
		return r, err
	}
	defer nc.Close()
	cnt, stop, err := subscribe(ctx, nc, "MAILROOM", n, nil)
	if err != nil {
		return r, err
	}
	defer stop()
	if err := waitTokens(cnt, t, n, 20*time.Minute); err != nil {
		return r, err
	}
	if err := confirmedPast(ctx, url, slot, time.Now().Add(2*time.Second)); err != nil {
		return r, err
	}
	r.LoadBefore = loadAverage()
	rep, secs, rss, err := runAudit(o, url, natsURL, slot)
	if err != nil {
		return r, err
	}
	r.Seconds, r.PeakRSSMiB, r.Checked, r.Missing, r.Messages = secs, rss, rep.Checked, len(rep.Missing), rep.StreamLast
	r.LoadAfter = loadAverage()
	return r, nil
}

// confirmedPast waits until the slot's record says every token committed
// before at is confirmed.
func confirmedPast(ctx context.Context, url, slot string, at time.Time) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		var through *time.Time
		if err := conn.QueryRow(ctx, `SELECT confirmed_through FROM tailer_slot WHERE slot = $1`, slot).Scan(&through); err != nil {
			return err
		}
		if through != nil && through.After(at) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("slot %s confirmed through %v, not past %v, after a minute", slot, through, at)
		}
	}
}

// auditReport is what the bench reads of tailer audit --json.
type auditReport struct {
	Checked    int
	Missing    []int64
	StreamLast uint64
	Error      string `json:"error"`
}

// runAudit runs tailer audit --json over the last hour, and returns its
// report, its wall time and its peak RSS.
func runAudit(o options, url, natsURL, slot string) (auditReport, float64, float64, error) {
	var rep auditReport
	cmd := exec.Command(o.tailer, "audit", "--json", "--since", "1h", "--grace", "1s")
	cmd.Env = append(os.Environ(), "MAILROOM_DATABASE_URL="+url, "MAILROOM_NATS_URL="+natsURL, "MAILROOM_SLOT="+slot, "MAILROOM_LOG_LEVEL="+logLevel())
	var out bytes.Buffer
	cmd.Stdout = &out
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return rep, 0, 0, err
	}
	// Read while it runs: the rusage of a child counts the parent's
	// memory at the exec (Linux keeps the larger of the two).
	var rss float64
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	for waiting := true; waiting; {
		rss = max(rss, peakRSS(cmd.Process.Pid))
		select {
		case err = <-done:
			waiting = false
		case <-time.After(10 * time.Millisecond):
		}
	}
	secs := time.Since(start).Seconds()
	if jerr := json.Unmarshal(out.Bytes(), &rep); jerr != nil || err != nil {
		return rep, secs, 0, fmt.Errorf("tailer audit: %v, %v: %s", err, jerr, out.Bytes())
	}
	return rep, secs, rss, nil
}

// auditDrain drains o.tokens with the tailer at its defaults, the
// continuous audit every interval ms (0: off).
func auditDrain(ctx context.Context, o options, pg *pgserver.Server, db string, interval int) (AuditDrain, error) {
	d := AuditDrain{IntervalMs: interval, Tokens: o.tokens, LoadBefore: loadAverage()}
	url, err := createDB(ctx, pg, db)
	if err != nil {
		return d, err
	}
	if err := prepare(ctx, url, []string{db}, o.tokens, 1000); err != nil {
		return d, err
	}
	slot := slotName(db, o.tokens)
	natsURL, stopNATS, err := startNATS(o, db)
	if err != nil {
		return d, err
	}
	defer stopNATS()
	start := time.Now()
	t, err := startTailer(o, url, natsURL, slot, "MAILROOM_AUDIT_INTERVAL="+strconv.Itoa(interval), "MAILROOM_AUDIT_GRACE=1000")
	if err != nil {
		return d, err
	}
	defer t.stop()
	nc, err := connectNATS(t, natsURL)
	if err != nil {
		return d, err
	}
	defer nc.Close()
	cnt, stop, err := subscribe(ctx, nc, "MAILROOM", o.tokens, nil)
	if err != nil {
		return d, err
	}
	defer stop()
	if err := waitTokens(cnt, t, o.tokens, 10*time.Minute); err != nil {
		return d, err
	}
	d.TokensPerSecond = float64(o.tokens) / time.Since(start).Seconds()
	d.PeakRSSMiB = peakRSS(t.cmd.Process.Pid)
	return d, nil
}

// auditCost is the drain rate with the audit on over the rate with it
// off, median over median.
func auditCost(drains []AuditDrain) float64 {
	var on, off []float64
	for _, d := range drains {
		if d.IntervalMs > 0 {
			on = append(on, d.TokensPerSecond)
		} else {
			off = append(off, d.TokensPerSecond)
		}
	}
	if len(on) == 0 || len(off) == 0 {
		return 0
	}
	return median(on) / median(off)
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
