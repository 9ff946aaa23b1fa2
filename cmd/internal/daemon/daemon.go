// Package daemon wires the tailer's packages into the running service:
// replication -> batch -> publish, with the embedded NATS server, metrics and
// the retry loop around it.
package daemon

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go"

	"github.com/mailroom/tailer/batch"
	"github.com/mailroom/tailer/batch/accounts"
	"github.com/mailroom/tailer/cmd/internal/config"
	"github.com/mailroom/tailer/cmd/internal/resync"
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

// TuneRuntime sets GOMAXPROCS to 1 unless the operator set it, or the
// embedded NATS server shares the process. The tailer's work is one ordered
// pipeline of a few goroutines; with more Ps the scheduler spends its time
// spinning for work between socket reads. Measured with cmd/bench on two
// cores: 5.2 to 3.4 µs of CPU per token in a drain, and live p99 from 16 to
// 10.5 ms.
func TuneRuntime(cfg *config.Config) {
	if os.Getenv("GOMAXPROCS") == "" && cfg.NATSURL != "" {
		runtime.GOMAXPROCS(1)
	}
}

// Daemon is a configured tailer.
type Daemon struct {
	cfg     *config.Config
	log     *slog.Logger
	metrics *Metrics
	// ready is closed once the first session streams (tests wait for it).
	ready chan struct{}

	feeder atomic.Pointer[batch.Feeder]
	held   atomic.Bool
	// blocked says why the slot may not be streamed from, until it is.
	blocked atomic.Pointer[string]
	nc      atomic.Pointer[nats.Conn]
	lag     atomic.Pointer[lagSample]
}

// lagSample is the last look at the slot.
type lagSample struct {
	at   time.Time
	slot replication.SlotInfo
	err  error
}

// New returns a Daemon for cfg.
func New(cfg *config.Config, log *slog.Logger) *Daemon {
	d := &Daemon{cfg: cfg, log: log, ready: make(chan struct{})}
	d.metrics = NewMetrics(func() float64 {
		if f := d.feeder.Load(); f != nil {
			return float64(f.PendingTokens())
		}
		return 0
	})
	return d
}

// stopError is a graceful stop that could not publish every token it had
// read; they stay in the slot for the next run.
type stopError struct{ err error }

func (e *stopError) Error() string {
	return "stopped without publishing every token read (they stay in the slot for the next run): " + e.err.Error()
}
func (e *stopError) Unwrap() error { return e.err }

// slotLostError is a slot the server invalidated: retrying cannot read it,
// but the operator may recreate it while the tailer waits.
type slotLostError struct {
	slot  replication.SlotInfo
	cause error // the server's refusal, when it came at the start of streaming
}

func (e *slotLostError) Error() string {
	if e.cause != nil {
		return e.slot.LostMessage() + " (" + e.cause.Error() + ")"
	}
	return e.slot.LostMessage()
}

// resyncNeededError is a slot the tailer must not stream from until a
// resync: one started and did not finish, or the slot is gone while the
// stream says it existed.
type resyncNeededError struct{ msg string }

func (e *resyncNeededError) Error() string { return e.msg }

// What a failed session's error is blamed on, for tailer_reconnects_total.
const (
	targetPostgres = "postgres"
	targetNATS     = "nats"
)

type sessionError struct {
	target string
	err    error
}

func (e *sessionError) Error() string { return e.err.Error() }
func (e *sessionError) Unwrap() error { return e.err }

func pgErr(err error) error {
	if err == nil {
		return nil
	}
	return &sessionError{targetPostgres, err}
}

func natsErr(err error) error {
	if err == nil {
		return nil
	}
	return &sessionError{targetNATS, err}
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

// startupConfigError turns errors that only the operator can fix (a wrong
// password or user, a database that does not exist) into a configuration
// error, so that the first start fails with exit code 2 instead of retrying
// forever. Later, the same errors are retried: a password may be rotated
// while the tailer runs.
func startupConfigError(err error) error {
	var (
		unknownCA x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
	)
	var tlsErr error
	switch {
	case errors.As(err, &unknownCA):
		tlsErr = unknownCA
	case errors.As(err, &hostname):
		tlsErr = hostname
	case errors.As(err, &invalid):
		tlsErr = invalid
	}
	if tlsErr != nil {
		return &config.Error{Var: "MAILROOM_DATABASE_URL", Err: fmt.Errorf("the server's TLS certificate is not accepted (see sslrootcert and sslmode): %w", tlsErr)}
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return nil
	}
	switch pgErr.Code {
	case "28P01", "28000":
		return &config.Error{Var: "MAILROOM_DATABASE_URL", Err: fmt.Errorf("authentication failed: %s (SQLSTATE %s)", pgErr.Message, pgErr.Code)}
	case "3D000":
		return &config.Error{Var: "MAILROOM_DATABASE_URL", Err: fmt.Errorf("%s (SQLSTATE %s)", pgErr.Message, pgErr.Code)}
	}
	return nil
}

// ConnectNATS connects to MAILROOM_NATS_URL, or starts the embedded server
// (on MAILROOM_DATA_DIR) when it is unset. shutdown closes the connection
// and stops the embedded server.
func ConnectNATS(cfg *config.Config, log *slog.Logger, opts ...nats.Option) (nc *nats.Conn, shutdown func(), err error) {
	natsURL := cfg.NATSURL
	stop := func() {}
	if natsURL == "" {
		srv, err := embedded.Start(cfg.DataDir, cfg.NATSListen, embedded.SyncInterval(cfg.NATSSync))
		if err != nil {
			return nil, nil, err
		}
		stop = srv.Shutdown
		natsURL = srv.ClientURL()
		log.Info("embedded NATS JetStream started", "url", natsURL, "store", cfg.DataDir)
	}
	all := []nats.Option{nats.Timeout(5 * time.Second)}
	if cfg.NATSURL != "" {
		all = append(all, cfg.NATSOptions()...)
	}
	nc, err = nats.Connect(natsURL, append(all, opts...)...)
	if err != nil {
		stop()
		if cfg.NATSURL != "" {
			// Only a configured URL (or its credentials) can be wrong; the
			// tailer gives up at startup so that a typo does not look like
			// an outage.
			return nil, nil, &config.Error{Var: "MAILROOM_NATS_URL", Err: fmt.Errorf("cannot connect to %s: %w", config.RedactURL(cfg.NATSURL), err)}
		}
		return nil, nil, fmt.Errorf("connect to NATS: %w", err)
	}
	return nc, func() { nc.Close(); stop() }, nil
}

// ResyncOptions are the settings of a resync of cfg's slot.
func ResyncOptions(cfg *config.Config, log *slog.Logger) (resync.Options, error) {
	signer, err := publish.NewSigner(cfg.SecretKey)
	if err != nil {
		return resync.Options{}, err
	}
	return resync.Options{
		DatabaseURL: cfg.DatabaseURL,
		Slot:        cfg.Slot,
		Stream:      publish.Stream{Name: cfg.Stream, Subject: cfg.Subject, Replicas: cfg.Replicas, PerAction: cfg.PerAction},
		Signer:      signer,
		Format:      cfg.Format,
		BatchLimit:  cfg.BatchLimit,
		MaxInFlight: cfg.MaxInFlight,
		Log:         log,
	}, nil
}

// LogResync logs what a resync did.
func LogResync(log *slog.Logger, msg string, r resync.Report) {
	args := []any{"slot", r.Slot, "consistent_point", r.ConsistentPoint.String(), "eligible", r.Eligible,
		"already_on_stream", r.OnStream, "published", r.Published, "messages", r.Messages,
		"unsafe_field", r.Unsafe, "expired_unpublished", r.Expired, "stream_seq", r.StreamSeq}
	if r.AfterID != nil {
		args = append(args, "after_id", *r.AfterID)
	}
	log.Info(msg, args...)
}

// Run runs the tailer until ctx is done. Failures of PostgreSQL or NATS end
// the current session; a new one starts after a capped backoff and resumes
// from the slot. Run returns nil after a graceful stop.
func (d *Daemon) Run(ctx context.Context) error {
	nc, shutdown, err := ConnectNATS(d.cfg, d.log,
		nats.Name("tailer"),
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
	go d.sampleSlot(ctx)

	if d.cfg.HTTPAddr != "" {
		stop, err := d.serveHTTP()
		if err != nil {
			return err
		}
		defer stop()
	}

	const minDelay, maxDelay = 250 * time.Millisecond, 30 * time.Second
	delay := minDelay
	waitingForSlot, slotLost := false, false
	for {
		started := time.Now()
		err := d.session(ctx, nc)
		if ctx.Err() != nil {
			var se *stopError
			if errors.As(err, &se) {
				return se
			}
			d.log.Info("stopped")
			return nil
		}
		if cerr := startupConfigError(err); cerr != nil && !d.streamed() {
			return cerr
		}
		// Retrying cannot make a stream of another database ours, nor
		// change a stream's configuration.
		var (
			foreign   *publish.ErrForeignStream
			streamCfg *publish.StreamConfigError
		)
		if errors.As(err, &foreign) || errors.As(err, &streamCfg) {
			return err
		}
		if time.Since(started) > time.Minute {
			delay = minDelay
		}
		var se *sessionError
		if errors.As(err, &se) && !replication.IsSlotInUse(err) {
			d.metrics.reconnect(se.target)
		}
		var (
			lost *slotLostError
			need *resyncNeededError
		)
		switch {
		case (errors.As(err, &lost) || errors.As(err, &need)) && d.cfg.AutoResync:
			d.log.Warn("resyncing the slot (MAILROOM_AUTO_RESYNC)", "reason", err)
			if err := d.resync(ctx, nc); err != nil {
				d.log.Error("resync failed; retrying", "err", err)
				delay = 5 * time.Second
			} else {
				delay = minDelay
			}
			waitingForSlot, slotLost = false, false
		case errors.As(err, &lost), errors.As(err, &need):
			// Said once; the tailer waits for the operator, checking
			// every few seconds, and /readyz (and the metric, for a
			// lost slot) say why.
			if need != nil {
				d.blocked.Store(&need.msg)
			}
			if !slotLost {
				d.log.Error("replication slot cannot be streamed from", "err", err)
				slotLost = true
			}
			delay = 5 * time.Second
			waitingForSlot = false
		case replication.IsSlotInUse(err):
			if !waitingForSlot {
				d.log.Info("slot is in use by another tailer; standing by", "slot", d.cfg.Slot)
				waitingForSlot = true
			}
			delay = time.Second
		default:
			waitingForSlot, slotLost = false, false
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
	q, err := connectQuery(ctx, cfg.DatabaseURL)
	if err != nil {
		return pgErr(err)
	}
	defer q.Close(context.Background())

	state, err := resync.Load(ctx, q, cfg.Slot)
	if err != nil {
		return pgErr(err)
	}
	slot, err := replication.Slot(ctx, q, cfg.Slot)
	vanished := errors.Is(err, replication.ErrNoSlot)
	if err != nil && !vanished {
		return pgErr(err)
	}

	rc, err := replication.Connect(ctx, cfg.DatabaseURL)
	if err != nil {
		return pgErr(err)
	}
	defer rc.Close(context.Background())
	ident, err := pglogrepl.IdentifySystem(ctx, rc)
	if err != nil {
		return pgErr(fmt.Errorf("identify system: %w", err))
	}
	origin := publish.Origin{SystemID: ident.SystemID, Timeline: ident.Timeline, Database: ident.DBName}

	pub, err := publish.NewPublisher(ctx, nc, publish.Stream{Name: cfg.Stream, Subject: cfg.Subject, Replicas: cfg.Replicas, PerAction: cfg.PerAction, Origin: origin})
	if err != nil {
		return natsErr(err)
	}
	defer pub.Close()
	if state.Done {
		pub.ResumeAfter(state.StreamSeq)
	}
	current := slot.CurrentLSN
	if vanished {
		if current, err = currentLSN(ctx, q); err != nil {
			return pgErr(err)
		}
	}
	if err := pub.CheckOrigin(origin, current); err != nil {
		return err
	}
	if state.Pending() {
		return &resyncNeededError{resync.PendingMessage(cfg.Slot)}
	}
	if vanished {
		if pub.LastSeq() > 0 {
			return &resyncNeededError{fmt.Sprintf("slot %s does not exist, but stream %s holds batches published from it: it was dropped, and the tokens committed since are not in any slot. "+
				"The tailer will not recreate it by itself. To go on: run `tailer resync`, which recreates the slot and publishes, once, every still-eligible token the stream lacks "+
				"(or set MAILROOM_AUTO_RESYNC=true to let tailer run do it)", cfg.Slot, cfg.Stream)}
		}
		if _, err := replication.EnsureSlot(ctx, q, cfg.Slot); err != nil {
			return pgErr(err)
		}
		d.log.Warn("created replication slot: tokens committed before now were not captured (run `tailer migrate` to create it together with the schema)", "slot", cfg.Slot)
		if slot, err = replication.Slot(ctx, q, cfg.Slot); err != nil {
			return pgErr(err)
		}
	} else if _, err := replication.EnsureSlot(ctx, q, cfg.Slot); err != nil {
		// It exists: this checks its database and plugin.
		return pgErr(err)
	}
	if slot.Lost() {
		return &slotLostError{slot: slot}
	}
	stream, err := replication.Start(ctx, rc, replication.Options{
		Slot: cfg.Slot, Publication: cfg.Publication, ProtoVersion: cfg.ProtoVersion, Binary: cfg.Binary,
		OnStatus: d.metrics.statusSent, Timeout: cfg.ReplicationTimeout,
	})
	if replication.IsSlotLost(err) {
		return &slotLostError{slot: slot, cause: err}
	}
	if err != nil {
		return pgErr(err)
	}
	// A resync that started after the check above may have recreated the
	// slot this session now holds; its snapshot is not all published yet.
	if state, err := resync.Load(ctx, q, cfg.Slot); err != nil || state.Pending() {
		if err != nil {
			return pgErr(err)
		}
		return &resyncNeededError{resync.PendingMessage(cfg.Slot)}
	}
	d.blocked.Store(nil)
	d.held.Store(true)
	d.metrics.setHeld(true)
	defer func() {
		d.held.Store(false)
		d.metrics.setHeld(false)
	}()
	d.log.Info("streaming", "slot", cfg.Slot, "from", slot.ConfirmedFlush, "resume_after", pub.LastPosition(0).String(),
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
		Limit:    cfg.BatchLimit,
		Timeout:  cfg.BatchTimeout,
		ByAction: cfg.PerAction,
		Start:    slot.ConfirmedFlush,
		Drained:  drained,
		OnBadRow: func(pos decoder.Position, err error) {
			d.log.Warn("skipping a token row that cannot be decoded", "position", pos.String(), "err", err)
			d.metrics.TokensSkipped(accounts.SkipMalformed, 1)
		},
	})
	joiner := accounts.NewJoiner(q)
	joiner.Log = d.log
	if err := joiner.Prepare(ctx); err != nil {
		return pgErr(err)
	}
	pipeline := &publish.Pipeline{
		Publisher:   pub,
		Joiner:      joiner,
		Encoder:     publish.NewEncoder(signer, cfg.Format),
		Format:      cfg.Format,
		MaxInFlight: cfg.MaxInFlight,
		MaxBytes:    int(nc.MaxPayload()),
		Done: func(b *batch.Batch) {
			d.metrics.done(b)
			feeder.MarkDone(b)
		},
		Observer: d.metrics,
		Log:      d.log,
	}

	d.feeder.Store(feeder)
	defer d.feeder.Store(nil)
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
	// Read before the pipeline is stopped: afterwards it reports its own
	// cancellation, which is not why the session ended.
	pipelineFailed := context.Cause(runCtx) != nil && ctx.Err() == nil
	cancelPipe()
	<-drained
	feeder.Close()
	d.log.Info("session ended", "confirmed", stream.Sent())
	return sessionCause(ctx, err, pipeErr, pipelineFailed)
}

// sessionCause says why a session ended, blaming the side that failed
// first: when the replication stream fails, the pipeline is stopped and
// reports the cancellation, which is not the cause.
func sessionCause(ctx context.Context, streamErr, pipeErr error, pipelineFirst bool) error {
	switch {
	case pipeErr != nil && ctx.Err() != nil:
		return &stopError{pipeErr}
	case pipelineFirst && errors.Is(pipeErr, accounts.ErrJoin):
		return pgErr(pipeErr)
	case pipelineFirst:
		return natsErr(pipeErr)
	case errors.Is(streamErr, context.Canceled) && ctx.Err() != nil:
		return nil
	case streamErr != nil:
		return pgErr(streamErr)
	case pipeErr != nil:
		return natsErr(pipeErr)
	}
	return nil
}

func currentLSN(ctx context.Context, q *pgx.Conn) (pglogrepl.LSN, error) {
	var s string
	if err := q.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&s); err != nil {
		return 0, fmt.Errorf("query current WAL position: %w", err)
	}
	return pglogrepl.ParseLSN(s)
}

// resync runs a resync of the slot for MAILROOM_AUTO_RESYNC.
func (d *Daemon) resync(ctx context.Context, nc *nats.Conn) error {
	opts, err := ResyncOptions(d.cfg, d.log)
	if err != nil {
		return err
	}
	rep, err := resync.Run(ctx, nc, opts)
	if err != nil {
		return err
	}
	d.blocked.Store(nil)
	LogResync(d.log, "slot resynced", rep)
	return nil
}

// connectQuery opens the tailer's ordinary connection, named so that
// operators (and pg_terminate_backend) can tell it apart in pg_stat_activity.
func connectQuery(ctx context.Context, url string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database URL: %w", err)
	}
	cfg.RuntimeParams["application_name"] = "tailer"
	maps.Copy(cfg.RuntimeParams, accounts.SessionSettings())
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	return conn, nil
}

// sampleSlot looks at the slot every LagInterval for the lag metrics and
// /readyz, on a connection of its own. It works in standby too: the slot's
// lag is what operators care about, whoever holds it.
func (d *Daemon) sampleSlot(ctx context.Context) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	ticker := time.NewTicker(d.cfg.LagInterval)
	defer ticker.Stop()
	failing := false
	for {
		var err error
		if conn == nil {
			conn, err = connectQuery(ctx, d.cfg.DatabaseURL)
		}
		var s replication.SlotInfo
		if err == nil {
			s, err = replication.Slot(ctx, conn, d.cfg.Slot)
			if err != nil && !errors.Is(err, replication.ErrNoSlot) {
				conn.Close(context.Background())
				conn = nil
			}
		}
		if ctx.Err() != nil {
			return
		}
		d.lag.Store(&lagSample{at: time.Now(), slot: s, err: err})
		if err == nil {
			d.metrics.slotSample(s)
		}
		// A configuration error at startup is the session loop's to
		// report, as the one line before exit.
		if err != nil && !failing && (d.streamed() || startupConfigError(err) == nil) {
			d.log.Warn("cannot sample the slot's lag", "err", err)
		}
		failing = err != nil
		d.metrics.setReady(d.readiness().Ready)
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// Readiness is the body of /readyz.
type Readiness struct {
	Ready         bool     `json:"ready"`
	Reasons       []string `json:"reasons,omitempty"`
	SlotHeld      bool     `json:"slot_held"`
	NATSConnected bool     `json:"nats_connected"`
	LagBytes      *int64   `json:"lag_bytes"`
	MaxLagBytes   int64    `json:"max_lag_bytes"`
}

func (d *Daemon) readiness() Readiness {
	r := Readiness{SlotHeld: d.held.Load(), MaxLagBytes: d.cfg.MaxLag}
	if nc := d.nc.Load(); nc != nil {
		r.NATSConnected = nc.IsConnected()
	}
	if b := d.blocked.Load(); b != nil {
		r.Reasons = append(r.Reasons, *b)
	} else if !r.SlotHeld {
		r.Reasons = append(r.Reasons, "not streaming from the slot (standing by or reconnecting)")
	}
	if !r.NATSConnected {
		r.Reasons = append(r.Reasons, "not connected to NATS")
	}
	switch s := d.lag.Load(); {
	case s == nil:
		r.Reasons = append(r.Reasons, "slot lag not sampled yet")
	case s.err != nil:
		r.Reasons = append(r.Reasons, "slot lag unknown: "+s.err.Error())
	case s.slot.Lost():
		r.Reasons = append(r.Reasons, s.slot.LostMessage())
	default:
		lag := s.slot.LagBytes()
		r.LagBytes = &lag
		if lag > d.cfg.MaxLag {
			r.Reasons = append(r.Reasons, fmt.Sprintf("slot lag %d bytes exceeds %d", lag, d.cfg.MaxLag))
		}
	}
	r.Ready = len(r.Reasons) == 0
	return r
}

func (d *Daemon) serveHTTP() (stop func(), err error) {
	ln, err := net.Listen("tcp", d.cfg.HTTPAddr)
	if err != nil {
		return nil, fmt.Errorf("listen on MAILROOM_HTTP_ADDR %s: %w", d.cfg.HTTPAddr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", d.metrics.Handler())
	if d.cfg.Pprof {
		// Off by default: the metrics address is often reachable by more
		// than the operator, and a profile is cheap to ask for and costly
		// to serve.
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	}
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"status":"ok"}`+"\n")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		r := d.readiness()
		d.metrics.setReady(r.Ready)
		w.Header().Set("Content-Type", "application/json")
		if !r.Ready {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		json.NewEncoder(w).Encode(r)
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
