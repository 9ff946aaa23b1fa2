package daemon

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go"

	"github.com/mailroom/tailer/batch"
	"github.com/mailroom/tailer/cmd/internal/resync"
	"github.com/mailroom/tailer/decoder"
	"github.com/mailroom/tailer/publish"
	"github.com/mailroom/tailer/publish/join"
	"github.com/mailroom/tailer/publish/protocol"
	"github.com/mailroom/tailer/publish/wire"
	"github.com/mailroom/tailer/replication"
)

// session takes the slot's lease, claims the slot and the stream for it,
// and streams until ctx is done or something fails. Nothing is judged
// before the lease and the slot are held: a standby only learns that
// another process owns them.
func (d *Daemon) session(ctx context.Context, nc *nats.Conn) error {
	s, err := d.open(ctx, nc)
	if err != nil {
		return err
	}
	defer s.close()
	c, err := d.claim(ctx, s)
	if err == nil {
		defer c.pub.Close()
		err = d.stream(ctx, s, c)
	}
	return d.natsBlocked(ctx, s, err)
}

// natsBlocked turns a session's end on NATS into a refusal when the
// operator must act for NATS to store anything (natsCause).
func (d *Daemon) natsBlocked(ctx context.Context, s *opened, err error) error {
	var se *sessionError
	if ctx.Err() != nil || !errors.As(err, &se) || se.target != targetNATS {
		return err
	}
	if cause := d.natsCause(err, s.start); cause != "" {
		return d.blockOn(ctx, s, &blockedError{reason: blockedNATS, msg: cause})
	}
	return err
}

// opened is a session's connections: the lease's, a query connection and
// the replication connection, and what the server says it is.
type opened struct {
	nc     *nats.Conn
	lease  *replication.Lease
	q      *pgx.Conn
	rc     *pgconn.PgConn
	origin publish.Origin
	major  int
	// start is when the session began.
	start time.Time
}

func (s *opened) close() {
	s.rc.Close(context.Background())
	s.q.Close(context.Background())
	s.lease.Release()
}

// blockOn is Daemon.block with the session's connections.
func (d *Daemon) blockOn(ctx context.Context, s *opened, err error) error {
	return d.block(ctx, s.q, s.lease, s.nc, err)
}

// open takes the slot's lease and opens the session's connections.
func (d *Daemon) open(ctx context.Context, nc *nats.Conn) (*opened, error) {
	cfg := d.cfg
	lease, err := replication.AcquireLease(ctx, cfg.DatabaseURL, cfg.Slot, replication.LeaseOptions{Application: "tailer run"})
	if err != nil {
		return nil, pgErr(err)
	}
	s := &opened{nc: nc, lease: lease, start: time.Now()}
	fail := func(err error) (*opened, error) {
		if s.rc != nil {
			s.rc.Close(context.Background())
		}
		if s.q != nil {
			s.q.Close(context.Background())
		}
		lease.Release()
		return nil, err
	}
	if s.q, err = connectQuery(ctx, cfg.DatabaseURL); err != nil {
		return fail(pgErr(err))
	}
	if s.rc, err = replication.Connect(ctx, cfg.DatabaseURL); err != nil {
		return fail(pgErr(err))
	}
	ident, err := pglogrepl.IdentifySystem(ctx, s.rc)
	if err != nil {
		return fail(pgErr(fmt.Errorf("identify system: %w", err)))
	}
	history, err := replication.TimelineBranches(ctx, s.rc, ident.Timeline)
	if err != nil {
		return fail(pgErr(err))
	}
	s.origin = publish.OriginOf(ident.SystemID, ident.Timeline, ident.DBName, history)
	if s.major, err = replication.ServerMajor(ctx, s.q); err != nil {
		return fail(pgErr(err))
	}
	return s, nil
}

// claimed is what a session streams with: the slot as it started, its
// record, the receiver streaming it and the publisher resumed on the
// stream.
type claimed struct {
	slot     replication.SlotInfo
	rec      replication.Record
	receiver *replication.Receiver
	pub      *publish.Publisher
	inFlight int
	// window, tokens and fence: what Resume found (publish.Publisher.Window).
	window, tokens, fence int
}

// claim checks that tokens can be read, makes the slot what the settings
// ask, starts streaming it, and claims the stream: the publisher resumed
// past what the stream holds of the slot.
func (d *Daemon) claim(ctx context.Context, s *opened) (*claimed, error) {
	cfg := d.cfg
	failover, err := replication.WantFailover(cfg.SlotFailover, s.major)
	if err != nil {
		return nil, FailoverSettingError(err)
	}
	dest := publish.Destination{Name: cfg.Stream, Subject: cfg.Subject, Replicas: cfg.Replicas, PerAction: cfg.PerAction, PubAckTimeout: cfg.PubAckTimeout, Origin: s.origin}
	if err := d.checkReadable(ctx, s.q); err != nil {
		return nil, d.blockOn(ctx, s, err)
	}
	rec, slot, err := d.prepareSlot(ctx, s.q, s.nc, dest, failover)
	if err != nil {
		return nil, d.blockOn(ctx, s, err)
	}
	if err := replication.SetPublication(ctx, d.db(s.q), cfg.Slot, cfg.Publication); errors.Is(err, replication.ErrOldSchema) {
		return nil, d.blockOn(ctx, s, &blockedError{reason: blockedSchema, msg: err.Error()})
	} else if err != nil {
		return nil, pgErr(err)
	}
	d.sayGuard(ctx, s.q)
	// With the lease held and nothing streaming yet, the slot is made what
	// MAILROOM_SLOT_FAILOVER asks (a slot from before the upgrade to 17, or
	// made by hand). A synced copy on a standby is the primary's to change.
	if s.major >= replication.FailoverMinVersion && slot.Failover != failover && !slot.Synced && (failover || cfg.SlotFailover == replication.FailoverOff) {
		if err := replication.SetFailover(ctx, s.rc, cfg.Slot, failover); err != nil {
			return nil, pgErr(err)
		}
		slot.Failover = failover
		d.log.Info("slot failover changed", "slot", cfg.Slot, "failover", failover)
	}
	// The lease is this session's: a walsender that still streams the slot
	// serves a holder that lost it (frozen, or cut off), and would keep the
	// slot until wal_sender_timeout notices.
	if pid, err := replication.TakeOver(ctx, s.q, slot); err != nil {
		d.log.Warn("cannot end the walsender of a process that lost the slot's lease; waiting for the server to end it", "slot", cfg.Slot, "err", err)
	} else if pid != 0 {
		d.log.Warn("took the slot over from a process that lost its lease: ended the walsender that still streamed it", "slot", cfg.Slot, "walsender_pid", pid)
	}
	receiver, err := replication.Start(ctx, s.rc, replication.Options{
		Slot: cfg.Slot, Publication: cfg.Publication, ProtoVersion: cfg.ProtoVersion, Binary: cfg.Binary, Messages: cfg.HeartbeatInterval > 0,
		OnStatus: d.streamConfirmed, Timeout: cfg.ReplicationTimeout,
	})
	if replication.IsSlotLost(err) {
		return nil, d.blockOn(ctx, s, &slotLostError{slot: slot, cause: err})
	}
	if err != nil {
		return nil, pgErr(err)
	}
	// The slot is held: no other tailer publishes now, and the markers
	// Resume starts the session with keep out what an earlier one may
	// still have on its way (see publish.Publisher).
	pub, err := d.newPublisher(ctx, s.q, s.nc, dest)
	if err != nil {
		return nil, err
	}
	c := &claimed{slot: slot, rec: rec, receiver: receiver, pub: pub}
	if err := d.resume(ctx, s, c); err != nil {
		pub.Close()
		return nil, err
	}
	return c, nil
}

// resume claims the stream for the slot's incarnation and resumes the
// publisher past what the stream holds of it.
func (d *Daemon) resume(ctx context.Context, s *opened, c *claimed) error {
	cfg := d.cfg
	if err := d.claimStream(ctx, s.q, c.pub, &c.rec, s.origin); err != nil {
		return d.blockOn(ctx, s, err)
	}
	if err := d.checkStream(ctx, s.q, c.pub, &c.rec); err != nil {
		return d.blockOn(ctx, s, err)
	}
	// This session publishes from now on: where the stream stood at the
	// last clean stop says nothing once it has.
	if c.rec.StoppedSeq != 0 {
		if err := replication.SetStopped(ctx, d.db(s.q), &c.rec, 0, ""); err != nil {
			return pgErr(err)
		}
	}
	c.inFlight = cmp.Or(cfg.MaxInFlight, publish.InFlightFor(c.pub.Replicas()))
	err := c.pub.Resume(ctx, publish.Owner{Origin: s.origin, Incarnation: c.rec.Incarnation, Since: c.rec.StreamSeq, Legacy: c.rec.Legacy,
		After: protocol.LSN(c.slot.ConfirmedFlush), InFlight: c.inFlight})
	var (
		foreign *protocol.ForeignStreamError
		trimmed *protocol.WindowTrimmedError
	)
	switch {
	case errors.As(err, &foreign):
		return d.blockOn(ctx, s, err)
	case errors.As(err, &trimmed):
		return d.blockOn(ctx, s, &blockedError{reason: blockedStream, msg: WindowTrimmedMessage(trimmed), resync: true})
	case err != nil:
		return natsErr(err)
	}
	if l := c.pub.Limits(); l != "" && !d.limitsSaid.Swap(true) {
		d.log.Warn("the stream's limits remove its oldest messages, read or not: a consumer further behind loses them, and a restart whose replayed tokens they removed is refused",
			"stream", cfg.Stream, "limits", l)
	}
	var reach decoder.Position
	var strays int
	c.window, c.tokens, reach, strays, c.fence = c.pub.Window()
	current, err := currentLSN(ctx, s.q)
	if err != nil {
		return pgErr(err)
	}
	if reach.Commit > current || d.reusedIDs.Load() {
		// The database is behind what the stream holds of it (a restore):
		// its new tokens can come at positions already published, and
		// their batches must not carry those batches' ids.
		c.pub.SetUniqueIDs()
		d.log.Warn("the stream holds batches past this server's WAL, or of other tokens under the ids of this session's batches (a restored database): "+
			"the tokens the stream holds are known by key and skipped, every other one is published; batch ids carry the session",
			"stream_reaches", reach.String(), "wal", current.String())
	}
	if strays > 0 {
		d.log.Warn("the stream holds messages that are not the tailer's batches: passed over", "stream", cfg.Stream, "messages", strays)
	}
	if err := replication.SetBlocked(ctx, d.db(s.q), cfg.Slot, ""); err != nil {
		return pgErr(err)
	}
	d.blocked.Store(nil)
	d.metrics.setBlocked("")
	return nil
}

// stream runs the data path, the receiver feeding the pipeline, until ctx
// is done or something fails, and judges how the session ended.
func (d *Daemon) stream(ctx context.Context, s *opened, c *claimed) error {
	cfg := d.cfg
	d.held.Store(true)
	d.metrics.setHeld(true)
	defer func() {
		d.held.Store(false)
		d.metrics.setHeld(false)
	}()
	d.log.Info("streaming", "slot", cfg.Slot, "incarnation", c.rec.Incarnation, "from", c.slot.ConfirmedFlush,
		"on_stream_messages", c.window, "on_stream_tokens", c.tokens, "markers", c.fence,
		"stream", cfg.Stream, "subject", cfg.Subject, "replicas", c.pub.Replicas(), "batch_limit", cfg.BatchLimit, "batch_timeout", cfg.BatchTimeout, "max_in_flight", c.inFlight)
	select {
	case <-d.ready:
	default:
		close(d.ready)
	}
	drained := make(chan struct{})
	feeder, pipeline, err := d.pipeline(ctx, s, c, drained)
	if err != nil {
		return err
	}
	d.feeder.Store(feeder)
	defer d.feeder.Store(nil)
	d.publishing.Store(&publishing{pipe: pipeline, pub: c.pub})
	defer d.publishing.Store(nil)
	inc := c.rec.Incarnation
	recheck := func(ctx context.Context, q *pgx.Conn) error {
		if err := d.recheckStream(ctx, c.pub, &c.rec); err != nil {
			return err
		}
		d.recordAnchor(ctx, q, inc, c.pub.Anchors().Batch)
		return nil
	}
	d.streamCheck.Store(&recheck)
	defer d.streamCheck.Store(nil)
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
	// slot sampler stops the session too when it finds the tokens can no
	// longer be read (a schema or publication changed under it).
	go func() {
		select {
		case <-s.lease.Lost():
			cancelRun(s.lease.Err())
		case <-runCtx.Done():
		}
	}()
	d.stopSession.Store(&cancelRun)
	defer d.stopSession.Store(nil)

	err = c.receiver.Run(runCtx, feeder)
	// Read before the pipeline is stopped: afterwards it reports its own
	// cancellation, which is not why the session ended.
	pipelineFailed := context.Cause(runCtx) != nil && ctx.Err() == nil
	cancelPipe()
	<-drained
	feeder.Close()
	d.log.Info("session ended", "confirmed", c.receiver.Sent())
	d.anchored = anchored{incarnation: c.rec.Incarnation, stream: cfg.Stream, anchors: c.pub.Anchors()}
	if ctx.Err() != nil && pipeErr == nil && s.lease.Err() == nil {
		d.recordStop(s, c)
	}
	return d.judgeEnd(ctx, s, err, pipeErr, context.Cause(runCtx), pipelineFailed)
}

// recordStop keeps where the stream stands after a clean stop (every
// publish of the session has its PubAck, and the lease keeps every other
// tailer out), read from the stream: a stream made again from a backup
// taken now is then known for the same (checkStream). Failing to is said,
// and costs only that.
func (d *Daemon) recordStop(s *opened, c *claimed) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	seq, mark, err := c.pub.LastMark(ctx)
	if err == nil && seq != 0 {
		// A connection of its own: the session's may have been cut by the
		// cancellation of a query in flight.
		var q *pgx.Conn
		if q, err = connectQuery(ctx, d.cfg.DatabaseURL); err == nil {
			err = replication.SetStopped(ctx, d.db(q), &c.rec, seq, mark)
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
func (d *Daemon) pipeline(ctx context.Context, s *opened, c *claimed, drained chan struct{}) (*batch.Feeder, *publish.Pipeline, error) {
	cfg := d.cfg
	if err := cfg.RequireKey(); err != nil {
		return nil, nil, err
	}
	feeder := batch.NewFeeder(batch.FeederConfig{
		Limit:    cfg.BatchLimit,
		Timeout:  cfg.BatchTimeout,
		ByAction: cfg.PerAction,
		Start:    c.slot.ConfirmedFlush,
		Schema:   string(cfg.Schema),
		Drained:  drained,
		OnBadRow: func(pos decoder.Position, err error) {
			d.log.Warn("skipping a token row that cannot be decoded", "position", pos.String(), "err", err)
			d.metrics.TokensSkipped(join.SkipMalformed, 1)
		},
	})
	joiner := join.NewJoiner(s.q, d.cfg.Schema)
	joiner.Log = d.log
	if err := joiner.Prepare(ctx); err != nil {
		return nil, nil, pgErr(err)
	}
	return feeder, &publish.Pipeline{
		Publisher:   c.pub,
		Joiner:      joiner,
		Encoder:     publish.NewEncoder(cfg.Keys.Signer(), cfg.Format),
		Format:      cfg.Format,
		MaxInFlight: c.inFlight,
		MaxBatches:  cfg.MaxBatches,
		MaxBytes:    int(s.nc.MaxPayload()),
		Done:        feeder.MarkDone,
		Observer:    d.metrics,
		Log:         d.log,
		Tracer:      d.Tracer,
	}, nil
}

// judgeEnd says what a session's end means: the operator to wait for (a
// lost lease, a schema, relation or publication that cannot carry tokens),
// or a failure to retry (sessionCause).
func (d *Daemon) judgeEnd(ctx context.Context, s *opened, err, pipeErr, cause error, pipelineFailed bool) error {
	if lerr := s.lease.Err(); lerr != nil && ctx.Err() == nil {
		return pgErr(lerr)
	}
	var (
		blocked  *blockedError
		schema   *join.SchemaError
		relation *decoder.RelationError
		action   *decoder.ActionError
	)
	switch {
	case ctx.Err() != nil:
	case errors.As(cause, &blocked):
		return d.blockOn(ctx, s, blocked)
	case errors.As(pipeErr, &schema):
		return d.blockOn(ctx, s, &blockedError{reason: blockedSchema, msg: schema.Error()})
	case errors.As(err, &action):
		return d.blockOn(ctx, s, &blockedError{reason: blockedSchema, msg: ActionMessage(action)})
	case errors.As(err, &relation):
		return d.blockOn(ctx, s, &blockedError{reason: blockedPublication, msg: RelationMessage(relation, d.cfg.Publication)})
	case replication.IsPublicationGone(err):
		// Gone for good, or made again after the changes the slot has
		// still to decode: which one says what to do.
		perr := replication.CheckPublication(ctx, d.db(s.q), d.cfg.Publication)
		var pub *replication.PublicationError
		if !errors.As(perr, &pub) {
			pub = &replication.PublicationError{Publication: d.cfg.Publication, Stale: true}
		}
		return d.blockOn(ctx, s, &blockedError{reason: blockedPublication, msg: PublicationMessage(pub), resync: pub.Stale})
	}
	return sessionCause(ctx, err, pipeErr, pipelineFailed)
}

// checkReadable reports a schema or a publication the tailer cannot read
// tokens through, or a slot whose stream lacks inserts the publication did
// not carry (marked by the publication guard, in the transaction that
// changed it), as a *blockedError.
func (d *Daemon) checkReadable(ctx context.Context, q *pgx.Conn) error {
	err := join.CheckSchema(ctx, q, d.cfg.Schema)
	var schema *join.SchemaError
	if errors.As(err, &schema) {
		return &blockedError{reason: blockedSchema, msg: schema.Error()}
	}
	if err != nil {
		return pgErr(err)
	}
	var pubErr *replication.PublicationError
	err = replication.CheckPublication(ctx, d.db(q), d.cfg.Publication)
	switch {
	case errors.As(err, &pubErr):
		return &blockedError{reason: blockedPublication, msg: PublicationMessage(pubErr)}
	case errors.Is(err, replication.ErrOldSchema):
		return &blockedError{reason: blockedSchema, msg: err.Error()}
	case err != nil:
		return pgErr(err)
	}
	rec, err := replication.LoadRecord(ctx, d.db(q), d.cfg.Slot)
	switch {
	case errors.Is(err, replication.ErrNoRecordTable) || errors.Is(err, replication.ErrOldRecordTable):
		return &blockedError{reason: blockedSchema, msg: err.Error()}
	case err != nil:
		return pgErr(err)
	case rec.ResyncNeeded:
		return &blockedError{reason: blockedResync, msg: ResyncNeededMessage(d.cfg.Slot, d.cfg.Publication), resync: true}
	}
	return nil
}

// sayGuard warns, once a process, when the publication guard is not
// installed: what that leaves unseen.
func (d *Daemon) sayGuard(ctx context.Context, q *pgx.Conn) {
	if !d.guardSaid.CompareAndSwap(false, true) {
		return
	}
	on, err := replication.GuardInstalled(ctx, q)
	if err != nil || on {
		return
	}
	d.log.Warn("the publication guard is not installed (it takes a superuser to run `tailer migrate`): a publication changed and changed back between two checks "+
		"(every MAILROOM_LAG_INTERVAL) would leave the token inserts of that time out of the slot's stream unseen", "publication", d.cfg.Publication)
}

// block ends a session that must wait for the operator: a resync, with the
// lease the session holds, when that is the way out and
// MAILROOM_AUTO_RESYNC allows it; otherwise the reason is recorded with the
// slot for tailer status, and returned.
func (d *Daemon) block(ctx context.Context, q *pgx.Conn, lease *replication.Lease, nc *nats.Conn, err error) error {
	var foreign *protocol.ForeignStreamError
	if errors.As(err, &foreign) {
		err = &blockedError{reason: blockedStream, msg: ForeignStreamMessage(foreign)}
	}
	var blocked *blockedError
	if errors.As(err, &blocked) && blocked.reason == blockedPublication && !blocked.resync {
		// The slot's stream lacks the inserts of this time for good: once
		// the publication is fixed, streaming on would skip them. (A
		// publication made again stops the stream at the drop by itself.)
		if rerr := replication.SetResyncNeeded(ctx, d.db(q), d.cfg.Slot); rerr != nil {
			return pgErr(rerr)
		}
	}
	err = d.unblock(ctx, lease, nc, err)
	if errors.As(err, &blocked) {
		if rerr := replication.SetBlocked(ctx, d.db(q), d.cfg.Slot, blocked.msg); rerr != nil {
			d.log.Warn("cannot record why the tailer waits", "err", rerr)
		}
	}
	return err
}

// prepareSlot reads the slot and its record, with the lease held, and
// makes the slot when this is a first start (no record, an empty stream).
// Its errors say why the slot must not be streamed from yet.
func (d *Daemon) prepareSlot(ctx context.Context, q *pgx.Conn, nc *nats.Conn, dest publish.Destination, failover bool) (replication.Record, replication.SlotInfo, error) {
	cfg := d.cfg
	rec, err := replication.LoadRecord(ctx, d.db(q), cfg.Slot)
	if errors.Is(err, replication.ErrNoRecordTable) || errors.Is(err, replication.ErrOldRecordTable) {
		return rec, replication.SlotInfo{}, &blockedError{reason: blockedSchema, msg: err.Error()}
	}
	if err != nil {
		return rec, replication.SlotInfo{}, pgErr(err)
	}
	if rec.ResyncPending {
		return rec, replication.SlotInfo{}, &blockedError{reason: blockedResync, msg: PendingResyncMessage(cfg.Slot), resync: true}
	}
	if rec.ResyncNeeded {
		return rec, replication.SlotInfo{}, &blockedError{reason: blockedResync, msg: ResyncNeededMessage(cfg.Slot, cfg.Publication), resync: true}
	}
	slot, err := replication.Slot(ctx, q, cfg.Slot)
	if err == nil {
		if err := replication.CheckSlot(ctx, q, slot); err != nil {
			return rec, slot, pgErr(Advise(err))
		}
		if slot.Lost() {
			return rec, slot, &slotLostError{slot: slot}
		}
		return rec, slot, nil
	}
	if !errors.Is(err, replication.ErrNoSlot) {
		return rec, slot, pgErr(err)
	}
	// No slot: it is made here only on a first start, when nothing says
	// one existed. Otherwise the tokens committed since the old one was
	// last read are in no slot, and a new one would skip them.
	pub, err := d.newPublisher(ctx, q, nc, dest)
	if err != nil {
		return rec, slot, err
	}
	defer pub.Close()
	if err := pub.CheckOrigin(dest.Origin); err != nil {
		return rec, slot, err
	}
	switch {
	case rec.Exists:
		return rec, slot, &blockedError{reason: blockedResync, resync: true, msg: DroppedSlotMessage(cfg.Slot, rec.Describe())}
	case pub.LastSeq() > 0:
		return rec, slot, &blockedError{reason: blockedResync, resync: true, msg: UnrecordedSlotMessage(cfg.Slot, cfg.Stream, pub.LastSeq())}
	}
	if rec, err = replication.CreateSlot(ctx, d.db(q), cfg.Slot, "tailer run", true, failover); err != nil {
		return rec, slot, pgErr(err)
	}
	d.log.Warn("created replication slot: tokens committed before now were not captured (run `tailer migrate` to create it together with the schema)", "slot", cfg.Slot, "incarnation", rec.Incarnation)
	slot, err = replication.Slot(ctx, q, cfg.Slot)
	if err != nil {
		return rec, slot, pgErr(err)
	}
	return rec, slot, nil
}

// newPublisher opens the stream. A stream the tailer refuses to publish to
// ends the process; the refusal is recorded with the slot first, for
// tailer status.
func (d *Daemon) newPublisher(ctx context.Context, q *pgx.Conn, nc *nats.Conn, dest publish.Destination) (*publish.Publisher, error) {
	pub, err := publish.NewPublisher(ctx, nc, dest)
	err = Advise(err)
	var streamCfg *publish.StreamConfigError
	if errors.As(err, &streamCfg) {
		if rerr := replication.SetBlocked(ctx, d.db(q), d.cfg.Slot, err.Error()); rerr != nil {
			d.log.Warn("cannot record why the tailer stops", "err", rerr)
		}
	}
	if err != nil {
		return nil, natsErr(err)
	}
	return pub, nil
}

// claimStream ties the stream to the slot's incarnation when no tailer has
// yet (a slot made by tailer migrate, or without a record at all): only an
// empty stream can be taken over, since batches already on it were
// published from some other slot and their positions mean nothing to this
// one.
func (d *Daemon) claimStream(ctx context.Context, q *pgx.Conn, pub *publish.Publisher, rec *replication.Record, origin publish.Origin) error {
	cfg := d.cfg
	if rec.Exists && rec.Bound {
		return nil
	}
	if err := pub.CheckOrigin(origin); err != nil {
		return err
	}
	if pub.LastSeq() > 0 {
		made := "no tailer command recorded making it (made by hand, or by an older tailer)"
		if rec.Exists {
			made = "it was made after them (" + rec.Describe() + ")"
		}
		return &blockedError{reason: blockedResync, resync: true, msg: EarlierBatchesMessage(cfg.Stream, pub.LastSeq(), cfg.Slot, made)}
	}
	if !rec.Exists {
		r, err := replication.AdoptSlot(ctx, d.db(q), cfg.Slot)
		if err != nil {
			return pgErr(err)
		}
		*rec = r
		d.log.Info("adopted a slot no tailer recorded making, beside an empty stream", "slot", cfg.Slot, "incarnation", rec.Incarnation)
		return nil
	}
	if err := replication.Bind(ctx, d.db(q), rec, 0); err != nil {
		return pgErr(err)
	}
	return nil
}

// checkStream refuses a stream that lost what the slot's incarnation
// published to it, which JetStream acknowledged whether or not a consumer
// had read it: deleted and made again under its name (or made by the
// tailer now, having been deleted), or purged empty. A stream of another
// name is the operator's choice (a stream of this database's own, say):
// it is recorded.
func (d *Daemon) checkStream(ctx context.Context, q *pgx.Conn, pub *publish.Publisher, rec *replication.Record) error {
	here := replication.StreamIdentity{Name: d.cfg.Stream, Created: pub.Created()}
	if d.anchored.incarnation == rec.Incarnation && d.anchored.stream == here.Name {
		pub.KeepAnchors(d.anchored.anchors)
	}
	// A tailer killed before (this process or another) left the newest
	// batch it found on the stream.
	if rec.AnchorSeq != 0 && rec.StreamName == here.Name {
		pub.KeepAnchors(publish.Anchors{Batch: wire.Anchor{Seq: rec.AnchorSeq, Mark: rec.AnchorMark}})
	}
	if rec.StreamName == here.Name && rec.StreamCreated != here.Created {
		if err := d.sameContent(ctx, pub, rec, here); err != nil {
			return err
		}
	}
	if err := d.recheckStream(ctx, pub, rec); err != nil {
		return err
	}
	if rec.StreamName != here.Name || rec.StreamCreated != here.Created {
		if err := replication.SetStream(ctx, d.db(q), rec, here); err != nil {
			return pgErr(err)
		}
	}
	return nil
}

// recordAnchor keeps in the slot's record the newest batch the session
// found on the stream (a check just read it there), for a tailer started
// after this one is killed: it has no anchors of its own to know the
// stream by. A failure is said once; the next check writes it again.
func (d *Daemon) recordAnchor(ctx context.Context, q *pgx.Conn, incarnation string, a wire.Anchor) {
	if a.Seq == 0 || a.Seq == d.anchorRecorded.Load() {
		return
	}
	err := replication.SetAnchor(ctx, d.db(q), d.cfg.Slot, incarnation, a.Seq, a.Mark)
	switch {
	case err == nil:
		d.anchorRecorded.Store(a.Seq)
	case ctx.Err() == nil && !d.anchorSaid.Swap(true):
		d.log.Warn("cannot record the newest batch found on the stream; a tailer started after this one is killed checks the stream by an older one", "err", err)
	}
}

// sameContent judges a stream whose server reports another creation time
// than the one recorded, by what it holds. The replicas of a stream
// restored from a backup each report their own time, so a leader change
// alone shows another: what this process acknowledged last on the stream
// (its anchors, or the one a killed tailer left in the slot's record,
// checked by recheckStream) says it is the same. Without any (no session
// of the incarnation lived to a stream check), the message last on the
// stream at the last clean stop says it was made again with everything it
// held (restored from a backup taken after that stop, as a move to a
// cluster does); otherwise it is another stream.
func (d *Daemon) sameContent(ctx context.Context, pub *publish.Publisher, rec *replication.Record, here replication.StreamIdentity) error {
	if !pub.Anchors().Unanchored() {
		d.log.Info("the stream's server reports another creation time than recorded (another replica answers, or it was restored); it is judged by the messages this tailer stored last",
			"stream", here.Name, "created", here.Created, "recorded_created", rec.StreamCreated)
		return nil
	}
	restored := false
	if rec.StoppedSeq != 0 {
		var err error
		if restored, err = pub.Holds(ctx, rec.StoppedSeq, rec.StoppedMsgID, rec.StreamSeq); err != nil {
			return natsErr(err)
		}
	}
	if !restored {
		return &blockedError{reason: blockedStream, msg: StreamReplacedMessage(here, rec.StreamCreated)}
	}
	d.log.Warn("the stream was made again with every message the slot's incarnation published (restored): it holds, at the sequence where the last tailer stopped cleanly, the message that was last then; going on with it",
		"stream", here.Name, "created", here.Created, "recorded_created", rec.StreamCreated, "stopped_seq", rec.StoppedSeq)
	return nil
}

// recheckStream refuses the stream when it lost messages since the slot's
// incarnation took it over: made again under its name since pub opened it,
// or purged. The session runs it at its start and every
// MAILROOM_LAG_INTERVAL: a purge leaves the stream's sequence where it was,
// and the session's chain of publishes goes on over it.
func (d *Daemon) recheckStream(ctx context.Context, pub *publish.Publisher, rec *replication.Record) error {
	created, truncated, err := pub.Lost(ctx, rec.StreamSeq)
	if err != nil {
		return natsErr(err)
	}
	missing, err := pub.MissingAnchor(ctx)
	switch {
	case err != nil:
		return natsErr(err)
	case missing.Seq != 0:
		return &blockedError{reason: blockedStream, msg: StreamLostAnchorMessage(d.cfg.Stream, missing)}
	case created != pub.Created() && pub.Anchors().Unanchored():
		return &blockedError{reason: blockedStream, msg: StreamReplacedMessage(replication.StreamIdentity{Name: d.cfg.Stream, Created: created}, pub.Created())}
	case truncated:
		return &blockedError{reason: blockedStream, msg: StreamPurgedMessage(d.cfg.Stream, rec.StreamSeq)}
	}
	return nil
}

// unblock resyncs the slot, with the lease this session holds, when err
// says a resync is the way out and MAILROOM_AUTO_RESYNC allows it;
// otherwise it returns err.
func (d *Daemon) unblock(ctx context.Context, lease *replication.Lease, nc *nats.Conn, err error) error {
	var (
		lost    *slotLostError
		blocked *blockedError
	)
	fixes := errors.As(err, &lost) || (errors.As(err, &blocked) && blocked.resync)
	if !fixes || !d.cfg.AutoResync {
		return err
	}
	d.log.Warn("resyncing the slot (MAILROOM_AUTO_RESYNC)", "reason", err)
	opts, oerr := resync.OptionsFor(d.cfg, d.log, "tailer run (MAILROOM_AUTO_RESYNC)")
	if oerr != nil {
		return oerr
	}
	rep, rerr := resync.Run(ctx, lease, nc, opts)
	if rerr != nil {
		return &resyncFailedError{rerr}
	}
	d.blocked.Store(nil)
	rep.Log(d.log, "slot resynced")
	return errResynced
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

// connectQuery opens the tailer's ordinary connection.
func connectQuery(ctx context.Context, url string) (*pgx.Conn, error) {
	return replication.Open(ctx, url, "tailer", join.SessionSettings())
}

// db is q in the schema of the tailer's tables.
func (d *Daemon) db(q replication.Querier) replication.SchemaConn { return d.cfg.InSchema(q) }
