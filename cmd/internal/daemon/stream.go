package daemon

import (
	"context"
	"errors"
	"github.com/mailroom/tailer/decoder/wal"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mailroom/tailer/batch"
	"github.com/mailroom/tailer/cmd/internal/config"
	"github.com/mailroom/tailer/decoder"
	"github.com/mailroom/tailer/publish"
	"github.com/mailroom/tailer/publish/join"
	"github.com/mailroom/tailer/publish/relay"
	"github.com/mailroom/tailer/publish/token"
	"github.com/mailroom/tailer/replication"
)

// streaming is the session that streams, for what looks at it from other
// goroutines: the slot sampler's checks, NATS's asynchronous errors. They
// do not step the relay themselves: they hand what they found to the
// session's goroutine (ask, tell), the one that owns the relay, which
// steps it and carries out every command the step returns.
type streaming struct {
	x *run
	// rec is the slot's record as the session began to stream: the
	// sampler writes for its incarnation, not reading the session's own
	// copy while the session writes it.
	rec replication.Record
	// stop ends the session, with why.
	stop context.CancelCauseFunc
	// work is what the session's goroutine runs for the others while it
	// streams; ended is closed once it no longer does.
	work  chan func()
	ended chan struct{}
}

// newStreaming is x's session as others see it while it streams.
func newStreaming(x *run, stop context.CancelCauseFunc) *streaming {
	return &streaming{x: x, rec: x.rec, stop: stop, work: make(chan func(), 4), ended: make(chan struct{})}
}

// ask runs f on the session's goroutine and waits for it: true once f
// ran; false when the session stopped streaming, or ctx ended, before f
// was seen to run.
func (st *streaming) ask(ctx context.Context, f func()) bool {
	done := make(chan struct{})
	select {
	case st.work <- func() { defer close(done); f() }:
	case <-st.ended:
		return false
	case <-ctx.Done():
		return false
	}
	// Taken, f runs to its end before the session can stop streaming;
	// left in the queue as it stops, it never runs.
	select {
	case <-done:
		return true
	case <-st.ended:
		return false
	}
}

// tell has the session's goroutine run f, without waiting: from NATS's
// callbacks, which must not block. A session whose queue is full drops
// it: what it was told before stops it.
func (st *streaming) tell(f func()) {
	select {
	case st.work <- f:
	default:
	}
}

// own runs, on the session's goroutine, what the others hand it until the
// receiver ends (received), and returns the receiver's error.
func (st *streaming) own(received <-chan error) error {
	defer close(st.ended)
	for {
		select {
		case err := <-received:
			return err
		case f := <-st.work:
			f()
		}
	}
}

// refusalCause is a refusal the relay ended the streaming session with.
type refusalCause struct{ relay.Refusal }

// stream runs the data path, the receiver feeding the pipeline, until ctx
// is done or something fails, and says how the session ended.
func (x *run) stream() relay.Event {
	d, ctx, cfg := x.d, x.ctx, x.d.cfg
	d.publishingStarts(x)
	defer d.publishingEnds()
	d.log.Info("streaming", "slot", cfg.Slot, "incarnation", x.rec.Incarnation, "from", x.slot.ConfirmedFlush,
		"on_stream_messages", x.window, "on_stream_tokens", x.tokens, "markers", x.fence,
		"stream", cfg.Stream, "subject", cfg.Subject, "replicas", x.pub.Replicas(), "batch_limit", cfg.BatchLimit, "batch_timeout", cfg.BatchTimeout, "max_in_flight", x.inFlight,
		keysInUse(cfg.Keys))
	drained := make(chan struct{})
	feeder, pipeline, err := d.pipeline(ctx, x, drained)
	if err != nil {
		return x.ended(err)
	}
	d.feeder.Store(feeder)
	defer d.feeder.Store(nil)
	d.publishing.Store(&publishing{pipe: pipeline, pub: x.pub})
	defer d.publishing.Store(nil)
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
	// Without the lease another tailer may take over: stop at once. The
	// relay stops the session too when a check finds the tokens can no
	// longer be read, or the stream lost what it stored.
	go func() {
		select {
		case <-x.s.lease.Lost():
			cancelRun(x.s.lease.Err())
		case <-runCtx.Done():
		}
	}()
	st := newStreaming(x, cancelRun)
	d.streaming.Store(st)
	defer d.streaming.Store(nil)
	received := make(chan error, 1)
	go func() { received <- x.receiver.Run(runCtx, feeder) }()
	err = st.own(received)
	// Read before the pipeline is stopped: afterwards it reports its own
	// cancellation, which is not why the session ended.
	pipelineFailed := context.Cause(runCtx) != nil && ctx.Err() == nil
	cancelPipe()
	<-drained
	feeder.Close()
	d.log.Info("session ended", "confirmed", x.receiver.Sent())
	if ctx.Err() != nil && pipeErr == nil && x.s.lease.Err() == nil {
		d.recordStop(x)
	}
	ev := x.streamEnd(err, pipeErr, context.Cause(runCtx), pipelineFailed)
	if e, ok := ev.(relay.Ended); ok {
		e.Anchors = x.pub.Anchors()
		return e
	}
	return ev
}

// publishingStarts says the session streams: what waited for the
// operator is cleared, in the record too.
func (d *Daemon) publishingStarts(x *run) {
	d.held.Store(true)
	d.metrics.setHeld(true)
	select {
	case <-d.ready:
	default:
		close(d.ready)
	}
	if err := replication.SetBlocked(x.ctx, x.db(), d.cfg.Slot, ""); err != nil {
		d.log.Warn("cannot record that the tailer streams", "err", err)
	}
	d.blocked.Store(nil)
	d.metrics.setBlocked("")
}

func (d *Daemon) publishingEnds() {
	d.held.Store(false)
	d.metrics.setHeld(false)
}

// streamEnd is how a streaming session ended: the lease lost, a refusal
// the relay stopped it with, a schema, relation or publication that cannot
// carry tokens, or a failure (sessionCause).
func (x *run) streamEnd(err, pipeErr, cause error, pipelineFailed bool) relay.Event {
	d, ctx := x.d, x.ctx
	if lerr := x.s.lease.Err(); lerr != nil && ctx.Err() == nil {
		return relay.Ended{End: relay.EndLeaseLost, Err: lerr}
	}
	var (
		refused  *refusalCause
		schema   *join.SchemaError
		relation *decoder.RelationError
		action   *decoder.ActionError
	)
	found := func(f relay.Fact, err error) relay.Event {
		return relay.Ended{End: relay.EndFound, Found: f, Err: err}
	}
	switch {
	case ctx.Err() != nil:
	case errors.As(cause, &refused):
		return relay.Ended{End: relay.EndRefused, Refusal: refused.Refusal}
	case errors.As(pipeErr, &schema):
		return found(relay.SchemaUnreadable, schema)
	case errors.As(err, &action):
		return found(relay.UnknownAction, action)
	case errors.As(err, &relation):
		return found(relay.RelationIncomplete, relation)
	case replication.IsPublicationGone(err):
		// Gone for good, or made again after the changes the slot has
		// still to decode: which one says what to do.
		perr := replication.CheckPublication(ctx, x.db(), d.cfg.Publication)
		var pub *replication.PublicationError
		if errors.As(perr, &pub) {
			return found(relay.PublicationProblem, pub)
		}
		return found(relay.PublicationStale, &replication.PublicationError{Publication: d.cfg.Publication, Stale: true})
	}
	return x.ended(sessionCause(ctx, err, pipeErr, pipelineFailed))
}

// endOf is how a session that failed with err ended, for the relay: a
// stop, a setting or stream no retry changes, another process owning the
// slot, or a failure of PostgreSQL or NATS (with what keeps NATS from
// storing anything, when that is known).
func (d *Daemon) endOf(ctx context.Context, err error, start time.Time) relay.Event {
	ev := relay.Ended{Err: err, Lasted: time.Since(start)}
	startupErr := StartupConfigError(err, d.cfg)
	ev.End = endKind(err, ctx.Err() != nil, startupErr != nil)
	switch ev.End {
	case relay.EndStartupConfig:
		ev.Err = startupErr
	case relay.EndNATS:
		if cause := d.natsCause(err, start); cause != "" {
			ev.Cause = errors.New(cause)
		}
	}
	var se *sessionError
	if errors.As(err, &se) && ev.End != relay.EndLeaseHeld && ev.End != relay.EndStopped {
		d.metrics.reconnect(se.target)
	}
	return ev
}

// endKind is what the error that ended a session means to the relay
// (stopped: the daemon was asked to stop; startupConfig: the error is a
// configuration the operator must fix before a first start), the first
// case that fits, in order: the table TestEndKinds holds it to.
func endKind(err error, stopped, startupConfig bool) relay.EndKind {
	var (
		stop      *stopError
		cfgErr    *config.Error
		streamCfg *publish.StreamConfigError
		held      *replication.LeaseHeldError
		se        *sessionError
	)
	switch {
	case errors.As(err, &stop):
		return relay.EndStoppedUnpublished
	case stopped || err == nil:
		return relay.EndStopped
	case startupConfig:
		return relay.EndStartupConfig
	case errors.As(err, &cfgErr):
		return relay.EndConfig
	case errors.As(err, &streamCfg):
		return relay.EndStreamConfig
	case errors.As(err, &held) || replication.IsSlotInUse(err):
		return relay.EndLeaseHeld
	case errors.Is(err, publish.ErrReusedID):
		return relay.EndReusedID
	case errors.Is(err, publish.ErrDuplicateGone):
		return relay.EndBatchGone
	case errors.As(err, &se) && se.target == targetNATS:
		return relay.EndNATS
	}
	return relay.EndPostgres
}

// sessionCause says why a session ended, blaming the side that failed
// first: when the replication stream fails, the pipeline is stopped and
// reports the cancellation, which is not the cause.
func sessionCause(ctx context.Context, streamErr, pipeErr error, pipelineFirst bool) error {
	switch {
	case pipeErr != nil && ctx.Err() != nil:
		return &stopError{pipeErr}
	case pipelineFirst && errors.Is(pipeErr, join.ErrJoin):
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

// recordStop keeps where the stream stands after a clean stop (every
// publish of the session has its PubAck, and the lease keeps every other
// tailer out), read from the stream: a stream made again from a backup
// taken now is then known for the same (checkStream). Failing to is said,
// and costs only that.
func (d *Daemon) recordStop(x *run) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	last, seen, err := x.pub.LastMark(ctx)
	if err == nil && last.Seq != 0 {
		// A connection of its own: the session's may have been cut by the
		// cancellation of a query in flight.
		var q *pgx.Conn
		if q, err = connectQuery(ctx, d.cfg.DatabaseURL); err == nil {
			err = replication.SetStopped(ctx, d.db(q), &x.rec, last.Seq, last.Mark)
			// Every batch is stored, and none comes before the next
			// session: what the stream holds now is quiet, and its batches
			// are all the next session counts on (relay.Seen).
			seen.Quiet = true
			if err == nil {
				err = replication.SetAnchor(ctx, d.db(q), d.cfg.Slot, x.rec.Incarnation, last.Seq, last.Mark, seenOf(seen))
			}
			q.Close(context.Background())
		}
	}
	if err != nil {
		d.log.Warn("cannot record where the stream stands at this stop; a stream restored from a backup taken now would be refused", "err", err)
	}
}

// pipeline makes the session's feeder (it runs on the replication
// goroutine) and the publishing pipeline it hands batches to; drained is
// closed when the pipeline has stopped.
func (d *Daemon) pipeline(ctx context.Context, x *run, drained chan struct{}) (*batch.Feeder, *publish.Pipeline, error) {
	cfg := d.cfg
	if err := cfg.RequireKey(); err != nil {
		return nil, nil, err
	}
	feeder := batch.NewFeeder(batch.FeederConfig{
		Limit:    cfg.BatchLimit,
		Timeout:  cfg.BatchTimeout,
		ByAction: cfg.PerAction,
		Start:    x.slot.ConfirmedFlush,
		Schema:   string(cfg.Schema),
		Drained:  drained,
		OnBadRow: func(pos wal.Position, err error) {
			d.log.Warn("skipping a token row that cannot be decoded", "position", pos.String(), "err", err)
			d.metrics.TokensSkipped(join.SkipMalformed, 1)
		},
	})
	joiner := join.NewJoiner(x.s.q, d.cfg.Schema)
	joiner.Log = d.log
	if err := joiner.Prepare(ctx); err != nil {
		return nil, nil, pgErr(err)
	}
	return feeder, &publish.Pipeline{
		Publisher:   x.pub,
		Joiner:      joiner,
		Encoder:     publish.NewEncoder(cfg.Keys.Signer(), cfg.Format),
		Format:      cfg.Format,
		MaxInFlight: x.inFlight,
		MaxBatches:  cfg.MaxBatches,
		MaxBytes:    int(x.nc.MaxPayload()),
		Done:        feeder.MarkDone,
		Observer:    d.metrics,
		Log:         d.log,
		Tracer:      d.Tracer,
	}, nil
}

// keysInUse are the keys a session signs with (the primary) and verifies
// with, for its streaming line: a rotation is seen there and in
// tailer_signing_key, not only by verifying a new token.
func keysInUse(ring *token.Ring) slog.Attr {
	if ring == nil {
		return slog.Group("")
	}
	return slog.Group("", "signing_key", ring.PrimaryID(), "key_ids", strings.Join(ring.IDs(), ","))
}
