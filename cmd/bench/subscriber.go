package main

// The database subscriber's drain: tailer subscribe --into inbox or river,
// from the start of a stream the default drain just filled, timed until
// the consumer's database holds every token.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/internal/pgserver"
	"github.com/mailroom/tailer/publish/subscriber"
	"github.com/mailroom/tailer/publish/subscriber/inbox"
	"github.com/mailroom/tailer/publish/wire"
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
//
// The clock starts with the process, the schema already made and
// PostgreSQL's buffers written out (checkpoint; River's insert alone gets
// both before its clock too), and stops when a count of the rows finds
// them all. A count of the whole table every 50 ms would be work of the
// bench's on the database's two cores, so the poll first waits, by an
// index, for what must be there before they all are: the stream's last
// token (the subscriber commits in stream order), n River job ids.
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
	near, nearArg, count, err := intoSchema(ctx, url, natsURL, into, n)
	if err != nil {
		return d, err
	}
	if err := checkpoint(ctx, pg); err != nil {
		return d, err
	}
	logPath := filepath.Join(o.dir, "subscribe-"+into+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return d, err
	}
	cmd := exec.Command(o.tailer, "subscribe", "--durable", "bench-"+into, "--into", into, "--from-start")
	cmd.Env = append(os.Environ(), "MAILROOM_NATS_URL="+natsURL, "MAILROOM_INBOX_URL="+url)
	cmd.Stdout, cmd.Stderr = logf, logf
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return d, err
	}
	c := &child{cmd: cmd, done: make(chan struct{}), log: logPath}
	go func() { cmd.Wait(); logf.Close(); close(c.done) }()
	defer c.stop()
	nearly := func() (bool, error) {
		var there bool
		err := conn.QueryRow(ctx, near, nearArg).Scan(&there)
		return there, err
	}
	allThere := func() (bool, error) {
		var got int
		err := conn.QueryRow(ctx, count).Scan(&got)
		return got >= n, err
	}
	for _, there := range []func() (bool, error){nearly, allThere} {
		if err := c.poll(start, there); err != nil {
			return d, err
		}
	}
	d.Seconds = time.Since(start).Seconds()
	d.TokensPerSecond = float64(n) / d.Seconds
	cpu, _ := cpuSeconds(cmd.Process.Pid)
	d.CPUMicrosPerTk = 1e6 * cpu / float64(n)
	d.PeakRSSMiB = peakRSS(cmd.Process.Pid)
	return d, nil
}

// poll asks there every 50 ms until it says yes, the child exits, or ten
// minutes from start have passed.
func (c *child) poll(start time.Time, there func() (bool, error)) error {
	for {
		ok, err := there()
		if ok || err != nil {
			return err
		}
		select {
		case <-c.done:
			log, _ := os.ReadFile(c.log)
			return fmt.Errorf("subscriber exited:\n%s", log)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Since(start) > 10*time.Minute {
			return errors.New("not all tokens stored after 10 minutes")
		}
	}
}

// intoSchema makes the schema tailer subscribe --into into stores in (what
// --migrate does), and returns the query, with its argument, that says by
// an index whether all n tokens may be stored, and the one that counts
// them. River's GIN index on args takes milliseconds to find one key
// among 200,000: the job ids, which a fresh table numbers from 1, tell as
// much for less.
func intoSchema(ctx context.Context, url, natsURL, into string, n int) (near string, arg any, count string, err error) {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return "", nil, "", err
	}
	defer pool.Close()
	if into == "river" {
		return `SELECT coalesce(max(id), 0) >= $1 FROM river_job`, n,
			`SELECT count(*) FROM river_job WHERE kind = 'mailroom_token'`, inbox.MigrateRiver(ctx, pool, "")
	}
	last, err := lastTokenKey(ctx, natsURL)
	if err != nil {
		return "", nil, "", err
	}
	return `SELECT EXISTS (SELECT 1 FROM mailroom_inbox WHERE token_key = $1)`, last,
		`SELECT count(*) FROM mailroom_inbox`, inbox.Migrate(ctx, pool, "")
}

// lastTokenKey is the key of the last token on the stream at natsURL.
func lastTokenKey(ctx context.Context, natsURL string) (string, error) {
	nc, err := nats.Connect(natsURL)
	if err != nil {
		return "", err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return "", err
	}
	s, err := js.Stream(ctx, "MAILROOM")
	if err != nil {
		return "", err
	}
	var last *jetstream.RawStreamMsg
	for _, subj := range wire.DataSubjects("mailroom.batches") {
		m, err := s.GetLastMsgForSubject(ctx, subj)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return "", err
		}
		if last == nil || m.Sequence > last.Sequence {
			last = m
		}
	}
	if last == nil {
		return "", errors.New("no batch on the stream")
	}
	b, err := subscriber.Decode(last.Header, last.Data)
	if err != nil || len(b.Tokens) == 0 {
		return "", fmt.Errorf("the stream's last batch (seq %d): %v", last.Sequence, err)
	}
	return b.Tokens[len(b.Tokens)-1].Key, nil
}

func printSubscriberDrain(d SubscriberDrain) {
	fmt.Printf("subscribe --into %-6s %8d tokens: %6.2fs  %9.0f tokens/s  subscriber %.2f µs/token, peak RSS %.1f MiB\n",
		d.Into, d.Tokens, d.Seconds, d.TokensPerSecond, d.CPUMicrosPerTk, d.PeakRSSMiB)
}
