package daemon

import (
	"context"
	"errors"
	"fmt"
	"maps"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"

	"github.com/mailroom/tailer/batch"
	"github.com/mailroom/tailer/batch/join"
	"github.com/mailroom/tailer/cmd/internal/resync"
	"github.com/mailroom/tailer/decoder"
	"github.com/mailroom/tailer/publish"
	"github.com/mailroom/tailer/replication"
)

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

	pub, err := publish.NewPublisher(ctx, nc, publish.Destination{Name: cfg.Stream, Subject: cfg.Subject, Replicas: cfg.Replicas, PerAction: cfg.PerAction, Origin: origin})
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
	receiver, err := replication.Start(ctx, rc, replication.Options{
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
			d.metrics.TokensSkipped(join.SkipMalformed, 1)
		},
	})
	joiner := join.NewJoiner(q)
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

	err = receiver.Run(runCtx, feeder)
	// Read before the pipeline is stopped: afterwards it reports its own
	// cancellation, which is not why the session ended.
	pipelineFailed := context.Cause(runCtx) != nil && ctx.Err() == nil
	cancelPipe()
	<-drained
	feeder.Close()
	d.log.Info("session ended", "confirmed", receiver.Sent())
	return sessionCause(ctx, err, pipeErr, pipelineFailed)
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
	maps.Copy(cfg.RuntimeParams, join.SessionSettings())
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	return conn, nil
}
