package daemon

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/nats-io/nats.go"

	"github.com/mailroom/tailer/batch"
	"github.com/mailroom/tailer/cmd/internal/config"
	"github.com/mailroom/tailer/cmd/internal/natsconn"
	"github.com/mailroom/tailer/publish"
	"github.com/mailroom/tailer/publish/relay"
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
	nc      atomic.Pointer[nats.Conn]
	lag     atomic.Pointer[lagSample]
	// guardSaid: whether the publication guard is missing was looked at;
	// limitsSaid: the stream's limits were warned of; sharedSaid: other
	// schemas' records that cannot be read were.
	guardSaid, limitsSaid, sharedSaid atomic.Bool
	// relay is the protocol the sessions carry out; stepped on the
	// session's goroutine alone (step).
	relay *relay.Relay
	// streaming is the session that streams (nil: none).
	streaming atomic.Pointer[streaming]
	// clock measures the lag in seconds; throughSaid: a record that
	// cannot keep it was said.
	clock       lagClock
	throughSaid atomic.Bool
	// anchorSaid: a failure to keep the newest batch in the slot's record
	// was said.
	anchorSaid atomic.Bool
	// denied is the last publish the NATS server denied the tailer's
	// user; storeProblem what keeps the embedded server's store from
	// taking messages (nil: nothing). See natscause.go.
	denied       atomic.Pointer[denial]
	storeProblem atomic.Pointer[string]
	// auditState is what the audits found missing (audit.go).
	auditState atomic.Pointer[auditState]
}

// publishing is what /readyz and the metrics read of a streaming
// session's publishing.
type publishing struct {
	pipe *publish.Pipeline
	pub  *publish.Publisher
}

// New returns a Daemon for cfg.
func New(cfg *config.Config, log *slog.Logger) *Daemon {
	d := &Daemon{cfg: cfg, log: log, ready: make(chan struct{}),
		relay: relay.New(relay.Settings{Stream: cfg.Stream, AutoResync: cfg.AutoResync, MaxInFlight: cfg.MaxInFlight})}
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
	if ring := d.cfg.Keys; ring != nil {
		// A rotation is seen here and on the streaming line, not only by
		// verifying a new token.
		d.metrics.setKeys(ring.IDs(), ring.PrimaryID())
	}
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
	if d.cfg.AuditInterval > 0 {
		go d.audits(ctx, nc)
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

// sessions runs one session after another, each after the wait the
// relay asked for (with full jitter, which keeps several tailers from
// retrying in lockstep), until ctx is done or the relay says to exit.
func (d *Daemon) sessions(ctx context.Context, nc *nats.Conn) error {
	for {
		wait, exit, err := d.session(ctx, nc)
		if exit {
			return err
		}
		select {
		case <-ctx.Done():
			d.log.Info("stopped")
			return nil
		case <-time.After(wait/2 + rand.N(wait/2+1)):
		}
	}
}
