package main

// Restarts in the middle of one large transaction: the tailer SIGKILLed
// once 70% of its tokens are on the stream, then started again; what the
// second process needs to resume (issue 47: its memory grew with what the
// first had published).

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/internal/pgserver"
	"github.com/mailroom/tailer/publish/wire"
)

// Restart is one restart run.
type Restart struct {
	Tokens int `json:"tokens"`
	// KilledAt is how many tokens the stream held when the first tailer
	// was killed.
	KilledAt int `json:"killed_at_tokens"`
	// DrainPeakRSSMiB is the first tailer's peak RSS, draining until
	// killed; RestartPeakRSSMiB the second's, resuming and draining the
	// rest.
	DrainPeakRSSMiB   float64 `json:"drain_peak_rss_mib"`
	RestartPeakRSSMiB float64 `json:"restart_peak_rss_mib"`
	// FirstMessageSeconds is from the second tailer's start to its first
	// message on the stream; RestartSeconds to the last token.
	FirstMessageSeconds float64 `json:"first_message_seconds"`
	RestartSeconds      float64 `json:"restart_seconds"`
	// Missing and Repeated count tokens (by id) that never reached the
	// stream and that reached it more than once.
	Missing  int `json:"missing"`
	Repeated int `json:"repeated"`
	// LoadBefore and LoadAfter are /proc/loadavg's 1-minute average.
	LoadBefore float64 `json:"load_before"`
	LoadAfter  float64 `json:"load_after"`
}

// restarts runs one restart per size in sizes (comma-separated).
func restarts(ctx context.Context, o options, pg *pgserver.Server, sizes string) ([]Restart, error) {
	var out []Restart
	for _, s := range strings.Split(sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("-restart: %q is not a positive token count", s)
		}
		r, err := restart(ctx, o, pg, n)
		if err != nil {
			return nil, fmt.Errorf("restart at %d tokens: %w", n, err)
		}
		printRestart(r)
		out = append(out, r)
	}
	return out, nil
}

// restart commits one transaction of n tokens, drains it with the tailer
// at its defaults, SIGKILLs it at 70% and starts it again.
func restart(ctx context.Context, o options, pg *pgserver.Server, n int) (Restart, error) {
	r := Restart{Tokens: n}
	label := "restart"
	url, err := createDB(ctx, pg, fmt.Sprintf("bench_restart_%d", n))
	if err != nil {
		return r, err
	}
	if err := prepare(ctx, url, []string{label}, n, n); err != nil {
		return r, err
	}
	slot := slotName(label, n)
	natsURL, stopNATS, err := startNATS(o, slot)
	if err != nil {
		return r, err
	}
	defer stopNATS()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		return r, err
	}
	defer nc.Close()
	ids := newIDCount(n)
	r.LoadBefore = loadAverage()
	first, err := startTailer(o, url, natsURL, slot)
	if err != nil {
		return r, err
	}
	cnt, stop, err := subscribe(ctx, nc, "MAILROOM", n, ids.note)
	if err != nil {
		first.stop()
		return r, err
	}
	defer stop()
	if err := waitTokens(cnt, first, n*7/10, 10*time.Minute); err != nil {
		first.stop()
		return r, err
	}
	r.DrainPeakRSSMiB = peakRSS(first.cmd.Process.Pid)
	first.cmd.Process.Kill()
	<-first.done
	// Publishes the killed process had on their way land, or not, now.
	time.Sleep(time.Second)
	r.KilledAt = int(cnt.n.Load())
	start := time.Now()
	second, err := startTailer(o, url, natsURL, slot)
	if err != nil {
		return r, err
	}
	defer second.stop()
	for at := r.KilledAt; int(cnt.n.Load()) == at; time.Sleep(5 * time.Millisecond) {
		if time.Since(start) > 10*time.Minute {
			return r, fmt.Errorf("nothing published in the 10 minutes after the restart")
		}
	}
	r.FirstMessageSeconds = time.Since(start).Seconds()
	if err := ids.waitAll(second, 10*time.Minute); err != nil {
		return r, err
	}
	r.RestartSeconds = time.Since(start).Seconds()
	// Anything published twice would be on its way now.
	time.Sleep(2 * time.Second)
	r.RestartPeakRSSMiB = peakRSS(second.cmd.Process.Pid)
	r.Missing, r.Repeated = ids.counts()
	r.LoadAfter = loadAverage()
	return r, nil
}

// waitTokens waits until cnt counts at least want tokens, while t runs.
func waitTokens(cnt *counter, t *child, want int, within time.Duration) error {
	deadline := time.Now().Add(within)
	for int(cnt.n.Load()) < want {
		select {
		case <-t.done:
			log, _ := os.ReadFile(t.log)
			return fmt.Errorf("tailer exited:\n%s", log)
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d tokens after %s", cnt.n.Load(), want, within)
		}
	}
	return nil
}

// idCount counts, by token id (1 to n, as a fresh database numbers
// them), how many times each token reached the stream.
type idCount struct {
	mu     sync.Mutex
	times  []uint8
	unique int
	other  int
}

func newIDCount(n int) *idCount { return &idCount{times: make([]uint8, n+1)} }

func (c *idCount) note(m jetstream.Msg) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id := range strings.SplitSeq(m.Headers().Get(wire.HeaderTokenIDs), ",") {
		i, err := strconv.Atoi(id)
		if err != nil || i <= 0 || i >= len(c.times) {
			c.other++
			continue
		}
		if c.times[i]++; c.times[i] == 1 {
			c.unique++
		}
	}
}

// waitAll waits until every token reached the stream, while t runs.
func (c *idCount) waitAll(t *child, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		c.mu.Lock()
		unique := c.unique
		c.mu.Unlock()
		if unique == len(c.times)-1 {
			return nil
		}
		select {
		case <-t.done:
			log, _ := os.ReadFile(t.log)
			return fmt.Errorf("tailer exited with %d of %d tokens on the stream:\n%s", unique, len(c.times)-1, log)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d tokens after %s", unique, len(c.times)-1, within)
		}
	}
}

// counts returns the tokens that never reached the stream and those that
// reached it more than once (ids outside 1..n count as repeated).
func (c *idCount) counts() (missing, repeated int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range c.times[1:] {
		switch {
		case t == 0:
			missing++
		case t > 1:
			repeated++
		}
	}
	return missing, repeated + c.other
}

// loadAverage is /proc/loadavg's 1-minute average.
func loadAverage() float64 {
	data, _ := os.ReadFile("/proc/loadavg")
	f, _, _ := strings.Cut(string(data), " ")
	v, _ := strconv.ParseFloat(f, 64)
	return v
}

func printRestart(r Restart) {
	fmt.Printf("restart of one transaction of %d tokens, killed at %d: peak RSS drain %.1f MiB, restart %.1f MiB (%+.1f); first message %.2f s after the restart, the last %.2f s; %d missing, %d repeated; load %.2f before, %.2f after\n",
		r.Tokens, r.KilledAt, r.DrainPeakRSSMiB, r.RestartPeakRSSMiB, r.RestartPeakRSSMiB-r.DrainPeakRSSMiB,
		r.FirstMessageSeconds, r.RestartSeconds, r.Missing, r.Repeated, r.LoadBefore, r.LoadAfter)
}
