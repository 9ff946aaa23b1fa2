package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"

	"github.com/mailroom/tailer/batch"
	"github.com/mailroom/tailer/cmd/internal/config"
	"github.com/mailroom/tailer/cmd/internal/natsconn"
	"github.com/mailroom/tailer/publish"
	"github.com/mailroom/tailer/replication"
)

// NewLogger builds the slog logger the settings ask for. Values with a
// String method are logged as that string in both formats: the JSON
// handler would otherwise print a WAL position (pglogrepl.LSN, a uint64)
// as a bare integer instead of as PostgreSQL writes it (0/45E8A0F8).
func NewLogger(format, level string, w io.Writer) *slog.Logger {
	var lv slog.Level
	lv.UnmarshalText([]byte(level))
	opts := &slog.HandlerOptions{Level: lv, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Value.Kind() == slog.KindAny {
			if s, ok := a.Value.Any().(fmt.Stringer); ok {
				a.Value = slog.StringValue(s.String())
			}
		}
		return a
	}}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// TuneRuntime sets GOMAXPROCS to 1 unless the operator set it: the
// tailer's work is one ordered pipeline of a few goroutines, and with more
// Ps the scheduler spends its time spinning for work between socket reads.
// The embedded NATS server in the process does not change that on two
// cores: one P drained with less CPU and held a shorter live tail than two
// (docs/performance.md).
func TuneRuntime() {
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(1)
	}
}

// Daemon is a configured tailer.
type Daemon struct {
	cfg     *config.Config
	log     *slog.Logger
	metrics *Metrics
	// Tracer, when set, records the spans of traced tokens (NewTracing).
	Tracer trace.Tracer
	// ready is closed once the first session streams (tests wait for it).
	ready chan struct{}

	feeder atomic.Pointer[batch.Feeder]
	// publishing is the streaming session's pipeline and publisher.
	publishing atomic.Pointer[publishing]
	held       atomic.Bool
	// blocked says why the slot may not be streamed from, until it is;
	// standby, that another process owns it.
	blocked atomic.Pointer[string]
	standby atomic.Pointer[string]
	// stopSession ends the streaming session, when there is one, with the
	// cause it is given.
	stopSession atomic.Pointer[context.CancelCauseFunc]
	nc          atomic.Pointer[nats.Conn]
	lag         atomic.Pointer[lagSample]
	// reusedIDs: a session met publish.ErrReusedID, so the next ones
	// name their batches apart (publish.Publisher.SetUniqueIDs).
	reusedIDs atomic.Bool
	// guardSaid: whether the publication guard is missing was looked at;
	// limitsSaid: the stream's limits were warned of.
	guardSaid, limitsSaid atomic.Bool
	// streamCheck, while a session streams, refuses a stream that lost
	// what the session's slot published to it (the slot sampler runs it).
	streamCheck atomic.Pointer[func(context.Context, *pgx.Conn) error]
	// clock measures the lag in seconds; throughSaid: a record that
	// cannot keep it was said.
	clock       lagClock
	throughSaid atomic.Bool
	// anchorRecorded is the batch sequence last kept in the slot's record
	// (recordAnchor); anchorSaid: a failure to keep it was said.
	anchorRecorded atomic.Uint64
	anchorSaid     atomic.Bool
	// denied is the last publish the NATS server denied the tailer's
	// user; storeProblem what keeps the embedded server's store from
	// taking messages (nil: nothing). See natscause.go.
	denied       atomic.Pointer[denial]
	storeProblem atomic.Pointer[string]
	// anchored is what the last session acknowledged on the stream, for
	// the next session of the same incarnation and stream to judge the
	// stream by (publish.Anchors). Sessions run one after the other.
	anchored anchored
}

// publishing is what /readyz and the metrics read of a streaming
// session's publishing.
type publishing struct {
	pipe *publish.Pipeline
	pub  *publish.Publisher
}

// anchored is a session's publish.Anchors, with the slot incarnation and
// stream they were stored on.
type anchored struct {
	incarnation, stream string
	anchors             publish.Anchors
}

// New returns a Daemon for cfg.
func New(cfg *config.Config, log *slog.Logger) *Daemon {
	d := &Daemon{cfg: cfg, log: log, ready: make(chan struct{})}
	d.metrics = NewMetrics(func() float64 {
		if f := d.feeder.Load(); f != nil {
			return float64(f.PendingTokens())
		}
		return 0
	}, func() float64 {
		d.takeStreamTime()
		lag, _ := d.clock.lag(time.Now())
		return lag.Seconds()
	}, func() float64 {
		if p := d.publishing.Load(); p != nil {
			return p.pipe.PubAckWait().Seconds()
		}
		return 0
	})
	return d
}

// Ready is closed once the tailer streams from its slot for the first time.
func (d *Daemon) Ready() <-chan struct{} { return d.ready }

func (d *Daemon) streamed() bool {
	select {
	case <-d.ready:
		return true
	default:
		return false
	}
}

// Run runs the tailer until ctx is done. Failures of PostgreSQL or NATS end
// the current session; a new one starts after a capped backoff and resumes
// from the slot. Run returns nil after a graceful stop.
func (d *Daemon) Run(ctx context.Context) error {
	nc, store, shutdown, err := natsconn.Connect(d.cfg, d.log, natsconn.Own,
		nats.Name("tailer"),
		nats.ErrorHandler(d.natsError),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(500*time.Millisecond),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				d.log.Warn("NATS disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			d.metrics.reconnect(targetNATS)
			d.log.Info("NATS reconnected", "url", c.ConnectedUrlRedacted())
		}),
	)
	if err != nil {
		return err
	}
	defer shutdown()
	d.nc.Store(nc)
	go d.watchStore(ctx, store)
	go d.sampleSlot(ctx)
	if d.cfg.HeartbeatInterval > 0 {
		go d.heartbeat(ctx)
	}

	if d.cfg.HTTPAddr != "" {
		stop, err := d.serveHTTP()
		if err != nil {
			return err
		}
		defer stop()
	}

	return d.sessions(ctx, nc)
}

// retry is what the session loop remembers between sessions: whether it
// said it stands by, and the refusal it said last, so that each is said
// once.
type retry struct {
	standingBy  bool
	blockedSaid string
}

// sessions runs one session after another, with a capped backoff between
// them, until ctx is done or an error retrying cannot change.
func (d *Daemon) sessions(ctx context.Context, nc *nats.Conn) error {
	const minDelay, maxDelay, natsMaxDelay = 250 * time.Millisecond, 30 * time.Second, 2 * time.Second
	delay := minDelay
	var r retry
	natsFailed := 0
	for {
		started := time.Now()
		err := d.session(ctx, nc)
		if final, ferr := d.final(ctx, err); final {
			return ferr
		}
		natsFailed = d.elsewhere(nc, err, natsFailed)
		if time.Since(started) > time.Minute {
			delay = minDelay
		}
		var se *sessionError
		if errors.As(err, &se) && se.target == targetNATS {
			// A cluster heals a lost node or leader by itself within
			// seconds: a wait grown over consecutive faults would outlast
			// the fault.
			delay = min(delay, natsMaxDelay)
		}
		delay = d.judgeRetry(err, delay, minDelay, &r)
		// Full jitter keeps several tailers from retrying in lockstep.
		sleep := delay/2 + rand.N(delay/2+1)
		select {
		case <-ctx.Done():
			d.log.Info("stopped")
			return nil
		case <-time.After(sleep):
		}
		delay = min(delay*2, maxDelay)
	}
}

// elsewhere moves the NATS connection to another server of the URL list
// once two sessions in a row ended on a NATS error: a node cut off from
// its cluster still answers pings, so the client stays with it, and every
// session would fail there until the partition heals (issue 49: 60 s of
// "JetStream system temporarily unavailable", and before that of "wrong
// last sequence" from the old leader, while the other two nodes had
// elected a new one). Another node of the same cluster costs nothing to
// try. It returns how many such sessions there were in a row since.
func (d *Daemon) elsewhere(nc *nats.Conn, err error, failed int) int {
	var se *sessionError
	if !errors.As(err, &se) || se.target != targetNATS {
		return 0
	}
	if failed++; failed < 2 || len(nc.Servers()) < 2 {
		return failed
	}
	d.log.Warn("two sessions in a row ended on the NATS server this tailer is connected to (cut off from its cluster, or the stream's leader away): connecting to another",
		"server", nc.ConnectedServerName(), "err", err)
	if ferr := nc.ForceReconnect(); ferr != nil {
		d.log.Warn("cannot reconnect to another NATS server", "err", ferr)
	}
	return 0
}

// final reports whether a session's end ends Run, and with what: a stop
// (ctx done), or an error no retry can change (a setting at startup the
// server refuses, a stream configuration the tailer cannot publish to).
func (d *Daemon) final(ctx context.Context, err error) (bool, error) {
	if ctx.Err() != nil {
		var se *stopError
		if errors.As(err, &se) {
			return true, se
		}
		d.log.Info("stopped")
		return true, nil
	}
	if cerr := StartupConfigError(err); cerr != nil && !d.streamed() {
		return true, cerr
	}
	// A setting the server cannot honour (MAILROOM_SLOT_FAILOVER=true
	// before PostgreSQL 17) stays so.
	var cfgErr *config.Error
	if errors.As(err, &cfgErr) {
		return true, err
	}
	// Retrying cannot change a stream's configuration. Only a tailer that
	// holds the slot gets this: a standby judges nothing.
	var streamCfg *publish.StreamConfigError
	if errors.As(err, &streamCfg) {
		return true, err
	}
	return false, nil
}

// judgeRetry says (once) why the session ended, keeps what /readyz and the
// metrics show up to date, and returns how long to wait before the next.
func (d *Daemon) judgeRetry(err error, delay, minDelay time.Duration, r *retry) time.Duration {
	if errors.Is(err, publish.ErrReusedID) {
		d.reusedIDs.Store(true)
	}
	var (
		se      *sessionError
		held    *replication.LeaseHeldError
		lost    *slotLostError
		blocked *blockedError
		failed  *resyncFailedError
	)
	inUse := errors.As(err, &held) || replication.IsSlotInUse(err)
	if errors.As(err, &se) && !inUse {
		d.metrics.reconnect(se.target)
	}
	if !inUse {
		d.standby.Store(nil)
	}
	switch {
	case errors.Is(err, errResynced):
		r.standingBy, r.blockedSaid = false, ""
		return minDelay
	case errors.As(err, &failed):
		d.log.Error("resync failed; retrying", "err", failed.err)
		return 5 * time.Second
	case errors.As(err, &lost), errors.As(err, &blocked):
		// Said once; the tailer waits for the operator, checking every
		// few seconds, and /readyz (and the metric, for a lost slot) say
		// why.
		if blocked != nil {
			d.blocked.Store(&blocked.msg)
			d.metrics.setBlocked(blocked.reason)
		}
		if msg := err.Error(); msg != r.blockedSaid {
			if blocked != nil && blocked.reason == blockedNATS {
				d.log.Error("NATS stores no batches: the tailer confirms nothing and goes on by itself once it does", "err", err)
			} else {
				d.log.Error("replication slot cannot be streamed from", "err", err)
			}
			r.blockedSaid = msg
		}
		r.standingBy = false
		return 5 * time.Second
	case inUse:
		why := "slot " + d.cfg.Slot + " is in use by another process (pg_stat_replication)"
		if held != nil {
			why = held.Error()
		}
		why = "standing by: " + why
		d.standby.Store(&why)
		if !r.standingBy {
			d.log.Info("standing by: another process owns the slot; taking over when it lets go", "slot", d.cfg.Slot, "owner", ownerOf(held))
			r.standingBy = true
		}
		return time.Second
	default:
		r.standingBy, r.blockedSaid = false, ""
		d.log.Error("session ended; retrying", "err", err, "retry_in", delay.Round(time.Millisecond))
		return delay
	}
}

// ownerOf names the holder of the lease for the standby's log line.
func ownerOf(held *replication.LeaseHeldError) string {
	if held == nil {
		return "a replication connection that does not hold the lease"
	}
	return held.Holder.String()
}
