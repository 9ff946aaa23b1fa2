// Package daemon wires the tailer's packages into the running service:
// replication -> batch -> publish, with the embedded NATS server, metrics and
// the retry loop around it.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"

	"github.com/mailroom/tailer/batch"
	"github.com/mailroom/tailer/batch/accounts"
	"github.com/mailroom/tailer/cmd/internal/config"
	"github.com/mailroom/tailer/decoder"
	"github.com/mailroom/tailer/publish"
	"github.com/mailroom/tailer/publish/embedded"
	"github.com/mailroom/tailer/replication"
)

// NewLogger builds the slog logger the settings ask for.
func NewLogger(format, level string, w io.Writer) *slog.Logger {
	var lv slog.Level
	lv.UnmarshalText([]byte(level))
	opts := &slog.HandlerOptions{Level: lv}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// Daemon is a configured tailer.
type Daemon struct {
	cfg     *config.Config
	log     *slog.Logger
	metrics *Metrics
	// Ready is closed once the first session streams (tests and the demo
	// wait for it).
	ready chan struct{}
}

// New returns a Daemon for cfg.
func New(cfg *config.Config, log *slog.Logger) *Daemon {
	return &Daemon{cfg: cfg, log: log, metrics: NewMetrics(), ready: make(chan struct{})}
}

// Ready is closed once the tailer streams from its slot for the first time.
func (d *Daemon) Ready() <-chan struct{} { return d.ready }

// Run runs the tailer until ctx is done. Failures of PostgreSQL or NATS end
// the current session; a new one starts after a capped backoff and resumes
// from the slot. Run returns nil after a graceful stop.
func (d *Daemon) Run(ctx context.Context) error {
	natsURL := d.cfg.NATSURL
	if natsURL == "" {
		srv, err := embedded.Start(d.cfg.DataDir, d.cfg.NATSListen)
		if err != nil {
			return err
		}
		defer srv.Shutdown()
		natsURL = srv.ClientURL()
		d.log.Info("embedded NATS JetStream started", "url", natsURL, "store", d.cfg.DataDir)
	}
	nc, err := nats.Connect(natsURL,
		nats.Name("tailer"),
		nats.Timeout(5*time.Second),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(500*time.Millisecond),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				d.log.Warn("NATS disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) { d.log.Info("NATS reconnected", "url", c.ConnectedUrlRedacted()) }),
	)
	if err != nil {
		if d.cfg.NATSURL != "" {
			// Only a configured URL can be wrong; the tailer gives up at
			// startup so that a typo does not look like an outage.
			return &config.Error{Var: "MAILROOM_NATS_URL", Err: fmt.Errorf("cannot connect to %s: %w", d.cfg.NATSURL, err)}
		}
		return fmt.Errorf("connect to NATS: %w", err)
	}
	defer nc.Close()

	if d.cfg.HTTPAddr != "" {
		stop, err := d.serveHTTP()
		if err != nil {
			return err
		}
		defer stop()
	}

	const minDelay, maxDelay = 250 * time.Millisecond, 30 * time.Second
	delay := minDelay
	waitingForSlot := false
	for {
		started := time.Now()
		err := d.session(ctx, nc)
		if ctx.Err() != nil {
			d.log.Info("stopped")
			return nil
		}
		if time.Since(started) > time.Minute {
			delay = minDelay
		}
		switch {
		case replication.IsSlotInUse(err):
			if !waitingForSlot {
				d.log.Info("slot is in use by another tailer; standing by", "slot", d.cfg.Slot)
				waitingForSlot = true
			}
			delay = time.Second
		default:
			waitingForSlot = false
			d.log.Error("session ended; retrying", "err", err, "retry_in", delay.Round(time.Millisecond))
		}
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

// session streams from the slot until ctx is done or something fails.
func (d *Daemon) session(ctx context.Context, nc *nats.Conn) error {
	cfg := d.cfg
	qcfg, err := pgx.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("parse database URL: %w", err)
	}
	qcfg.RuntimeParams["application_name"] = "tailer"
	q, err := pgx.ConnectConfig(ctx, qcfg)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer q.Close(context.Background())

	created, err := replication.EnsureSlot(ctx, q, cfg.Slot)
	if err != nil {
		return err
	}
	if created {
		d.log.Warn("created replication slot: tokens committed before now were not captured (run `tailer migrate` to create it together with the schema)", "slot", cfg.Slot)
	}
	slot, err := replication.Slot(ctx, q, cfg.Slot)
	if err != nil {
		return err
	}

	pub, err := publish.NewPublisher(ctx, nc, publish.Stream{Name: cfg.Stream, Subject: cfg.Subject})
	if err != nil {
		return err
	}

	rc, err := replication.Connect(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer rc.Close(context.Background())
	stream, err := replication.Start(ctx, rc, replication.Options{
		Slot: cfg.Slot, Publication: cfg.Publication, ProtoVersion: cfg.ProtoVersion, Binary: cfg.Binary,
	})
	if err != nil {
		return err
	}
	d.log.Info("streaming", "slot", cfg.Slot, "from", slot.ConfirmedFlush, "resume_after", pub.LastPosition(),
		"stream", cfg.Stream, "subject", cfg.Subject, "batch_limit", cfg.BatchLimit, "batch_timeout", cfg.BatchTimeout)
	select {
	case <-d.ready:
	default:
		close(d.ready)
	}

	signer, err := publish.NewSigner(cfg.SecretKey)
	if err != nil {
		return err
	}
	drained := make(chan struct{})
	feeder := batch.NewFeeder(batch.FeederConfig{
		Limit:   cfg.BatchLimit,
		Timeout: cfg.BatchTimeout,
		Start:   slot.ConfirmedFlush,
		Drained: drained,
		OnBadRow: func(pos decoder.Position, err error) {
			d.log.Warn("skipping a token row that cannot be decoded", "position", pos.String(), "err", err)
			d.metrics.TokensSkipped(accounts.SkipMalformed, 1)
		},
	})
	pipeline := &publish.Pipeline{
		Publisher:   pub,
		Joiner:      accounts.NewJoiner(q),
		Encoder:     publish.NewEncoder(signer, cfg.Format),
		Format:      cfg.Format,
		MaxInFlight: cfg.MaxInFlight,
		Done: func(b *batch.Batch) {
			d.metrics.Confirmed(b)
			feeder.MarkDone(b)
		},
		Observer: d.metrics,
		Log:      d.log,
	}

	runCtx, cancelRun := context.WithCancelCause(ctx)
	defer cancelRun(nil)
	pipeCtx, cancelPipe := context.WithCancel(context.Background())
	defer cancelPipe()
	var pipeErr error
	go func() {
		defer close(drained)
		if pipeErr = pipeline.Run(pipeCtx, feeder.Batches()); pipeErr != nil {
			cancelRun(pipeErr)
		}
	}()

	err = stream.Run(runCtx, feeder)
	cancelPipe()
	<-drained
	d.log.Info("session ended", "confirmed", stream.Sent())
	if pipeErr != nil {
		return pipeErr
	}
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return nil
	}
	return err
}

func (d *Daemon) serveHTTP() (stop func(), err error) {
	ln, err := net.Listen("tcp", d.cfg.HTTPAddr)
	if err != nil {
		return nil, fmt.Errorf("listen on MAILROOM_HTTP_ADDR %s: %w", d.cfg.HTTPAddr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", d.metrics.Handler())
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"status":"ok"}`+"\n")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	d.log.Info("http listening", "addr", ln.Addr().String())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}, nil
}
