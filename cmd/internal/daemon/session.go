package daemon

import (
	"context"
	"errors"
	"fmt"
	"github.com/mailroom/tailer/decoder/wal"
	"github.com/mailroom/tailer/publish/wire"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go"

	"github.com/mailroom/tailer/publish"
	"github.com/mailroom/tailer/publish/join"
	"github.com/mailroom/tailer/publish/relay"
	"github.com/mailroom/tailer/publish/resync"
	"github.com/mailroom/tailer/replication"
)

// session runs one of the relay's sessions: it carries out what the
// relay (publish/relay) asks, and steps it with what each command
// found, until the relay says how long to wait before the next session,
// or that the process exits. Every judgement is the relay's; a session
// only takes the lease, reads, writes and streams.
func (d *Daemon) session(ctx context.Context, nc *nats.Conn) (wait time.Duration, exit bool, err error) {
	x := &run{d: d, ctx: ctx, nc: nc, start: time.Now()}
	defer x.close()
	cmds := d.step(relay.Start{})
	for len(cmds) > 0 {
		cmd := cmds[0]
		cmds = cmds[1:]
		switch c := cmd.(type) {
		case relay.Wait:
			d.waiting(c)
			return c.Delay, false, nil
		case relay.Exit:
			if c.Err == nil {
				d.log.Info("stopped")
			}
			return 0, true, c.Err
		}
		if ev := x.do(cmd); ev != nil {
			cmds = append(cmds, d.step(ev)...)
		}
	}
	return time.Second, false, nil
}

// step steps the relay. Only the session's goroutine calls it: the
// others hand what they find to it (streaming.ask, tell), so no two steps
// interleave and no lock guards a decision.
func (d *Daemon) step(ev relay.Event) []relay.Command { return d.relay.Step(ev) }

// run is a session as its commands found it.
type run struct {
	d     *Daemon
	ctx   context.Context
	nc    *nats.Conn
	start time.Time
	s     *opened
	rec   replication.Record
	slot  replication.SlotInfo
	head  relay.StreamHead
	pub   *publish.Publisher
	// receiver streams the slot (Claim); inFlight is the session's bound
	// on messages awaiting their PubAck (Resume).
	receiver *replication.Receiver
	inFlight int
	// window, tokens and fence: what Resume found (publish.Publisher.Window).
	window, tokens, fence int
}

func (x *run) close() {
	if x.pub != nil {
		x.pub.Close()
	}
	if x.s != nil {
		x.s.close()
	}
}

// do carries cmd out, and returns what it found (nil: nothing to step).
func (x *run) do(cmd relay.Command) relay.Event {
	switch c := cmd.(type) {
	case relay.Open:
		return x.open()
	case relay.Inspect:
		return x.inspect()
	case relay.ReadHead:
		return x.readHead()
	case relay.MakeSlot:
		return x.makeSlot()
	case relay.Claim:
		return x.claim()
	case relay.Adopt, relay.Bind:
		return x.bind(c)
	case relay.LookAtStream:
		return x.checkStream(c)
	case relay.Resume:
		return x.resume(c)
	case relay.Publish:
		return x.stream()
	}
	return x.write(cmd)
}

// write carries out a command that finds nothing: a write, or a word.
func (x *run) write(cmd relay.Command) relay.Event {
	d := x.d
	var err error
	switch c := cmd.(type) {
	case relay.ClearStopped:
		err = replication.SetStopped(x.ctx, x.db(), &x.rec, 0, "")
	case relay.UniqueIDs:
		x.pub.SetUniqueIDs()
		d.log.Warn("the stream holds batches past this server's WAL, or of other tokens under the ids of this session's batches (a restored database): " +
			"the tokens the stream holds are known by key and skipped, every other one is published; batch ids carry the session")
	case relay.RecordAnchor:
		err = x.recordAnchor(c)
	case relay.MarkResyncNeeded:
		err = replication.SetResyncNeeded(x.ctx, x.db(), d.cfg.Slot)
	case relay.Refuse:
		d.refused(x, c)
	case relay.Resync:
		return x.resync(c)
	case relay.StandBy:
		d.standBy(c)
	case relay.Reconnect:
		d.reconnect(x.nc)
	}
	if err != nil {
		return x.ended(pgErr(err))
	}
	return nil
}

// recordAnchor keeps the anchor, and the stream with it when asked, in
// one transaction.
func (x *run) recordAnchor(c relay.RecordAnchor) error {
	rec, err := x.d.recordAnchor(x.ctx, x.s.q, x.rec, c)
	if err == nil {
		x.rec = rec
	}
	return err
}

// recordAnchor carries out c on conn for the record rec of the session's
// incarnation: the anchor, and the stream with it in one transaction when
// c names one. It returns the record as written.
func (d *Daemon) recordAnchor(ctx context.Context, conn *pgx.Conn, rec replication.Record, c relay.RecordAnchor) (replication.Record, error) {
	set := func(db replication.SchemaConn) error {
		return replication.SetAnchor(ctx, db, d.cfg.Slot, rec.Incarnation, c.Anchor.Seq, c.Anchor.Mark, seenOf(c.Seen))
	}
	if c.Stream.Name == "" {
		return rec, set(d.db(conn))
	}
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		db := d.db(tx)
		if err := replication.SetStream(ctx, db, &rec, replication.StreamIdentity{Name: c.Stream.Name, Created: c.Stream.Created}); err != nil {
			return err
		}
		return set(db)
	})
	return rec, err
}

// db is the session's query connection in the tailer's schema.
func (x *run) db() replication.SchemaConn { return x.d.db(x.s.q) }

// ended is how a session that failed ended, for the relay.
func (x *run) ended(err error) relay.Event {
	return x.d.endOf(x.ctx, err, x.start)
}

// opened is a session's connections: the lease's, a query connection and
// the replication connection, and what the server says it is.
type opened struct {
	nc     *nats.Conn
	lease  *replication.Lease
	q      *pgx.Conn
	rc     *pgconn.PgConn
	origin relay.Origin
	major  int
}

func (s *opened) close() {
	s.rc.Close(context.Background())
	s.q.Close(context.Background())
	s.lease.Release()
}

// open takes the slot's lease and opens the session's connections.
func (x *run) open() relay.Event {
	cfg, ctx := x.d.cfg, x.ctx
	lease, err := replication.AcquireLease(ctx, cfg.DatabaseURL, cfg.Slot, replication.LeaseOptions{Application: "tailer run"})
	if err != nil {
		return x.ended(pgErr(err))
	}
	s := &opened{nc: x.nc, lease: lease}
	fail := func(err error) relay.Event {
		if s.rc != nil {
			s.rc.Close(context.Background())
		}
		if s.q != nil {
			s.q.Close(context.Background())
		}
		lease.Release()
		return x.ended(pgErr(err))
	}
	if s.q, err = connectQuery(ctx, cfg.DatabaseURL); err != nil {
		return fail(err)
	}
	if s.rc, err = replication.Connect(ctx, cfg.DatabaseURL); err != nil {
		return fail(err)
	}
	ident, err := pglogrepl.IdentifySystem(ctx, s.rc)
	if err != nil {
		return fail(fmt.Errorf("identify system: %w", err))
	}
	history, err := replication.TimelineBranches(ctx, s.rc, ident.Timeline)
	if err != nil {
		return fail(err)
	}
	s.origin = publish.OriginOf(ident.SystemID, ident.Timeline, ident.DBName, history)
	if s.major, err = replication.ServerMajor(ctx, s.q); err != nil {
		return fail(err)
	}
	x.s = s
	return relay.Opened{}
}

// inspect reads what the relay judges before the session streams: the
// schema, the publication, the slot's record and the slot.
func (x *run) inspect() relay.Event {
	d, ctx := x.d, x.ctx
	ev := relay.Inspected{}
	// The record first: the publication guard marks it in the transaction
	// that changes the publication, so a change the record shows is one
	// the publication's check below sees too.
	var err error
	x.rec, err = replication.LoadRecord(ctx, x.db(), d.cfg.Slot)
	switch {
	case errors.Is(err, replication.ErrNoRecordTable) || errors.Is(err, replication.ErrOldRecordTable):
		ev.Schema = err
	case err != nil:
		return x.ended(pgErr(err))
	}
	ev.Record = recordOf(x.rec)
	err = join.CheckSchema(ctx, x.s.q, d.cfg.Schema)
	var schema *join.SchemaError
	if errors.As(err, &schema) {
		ev.Schema = schema
	} else if err != nil {
		return x.ended(pgErr(err))
	}
	err = replication.CheckPublication(ctx, x.db(), d.cfg.Publication)
	var pub *replication.PublicationError
	switch {
	case errors.As(err, &pub):
		ev.Publication = pub
	case errors.Is(err, replication.ErrOldSchema):
		ev.Schema = err
	case err != nil:
		return x.ended(pgErr(err))
	}
	shared, unreadable, err := replication.SharedWith(ctx, x.db(), d.cfg.Slot)
	if err != nil {
		return x.ended(pgErr(err))
	}
	ev.Shared = shared
	if len(unreadable) > 0 && !d.sharedSaid.Swap(true) {
		d.log.Warn("the records of other mailroom schemas of this database cannot be read by this tailer's role: whether one names this slot too is not checked "+
			"(a slot another schema's tailer advanced is still refused, by its confirm limit)", "slot", d.cfg.Slot, "schemas", unreadable)
	}
	x.slot, err = replication.Slot(ctx, x.s.q, d.cfg.Slot)
	switch {
	case errors.Is(err, replication.ErrNoSlot):
	case err != nil:
		return x.ended(pgErr(err))
	default:
		ev.Slot = relay.Slot{Present: true, Lost: x.slot.Lost(), Confirmed: wal.LSN(x.slot.ConfirmedFlush),
			Foreign: Advise(replication.CheckSlot(ctx, x.s.q, x.slot))}
	}
	return ev
}

// recordOf is the record as the relay judges it.
func recordOf(r replication.Record) relay.SlotRecord {
	p := relay.SlotRecord{Exists: r.Exists, Incarnation: r.Incarnation, Bound: r.Bound, StreamSeq: r.StreamSeq, Legacy: r.Legacy,
		ResyncPending: r.ResyncPending, ResyncNeeded: r.ResyncNeeded, ResyncCause: r.ResyncCause, StreamName: r.StreamName, StreamCreated: r.StreamCreated,
		Anchor: wire.Anchor{Seq: r.AnchorSeq, Mark: r.AnchorMark}, Stopped: wire.Anchor{Seq: r.StoppedSeq, Mark: r.StoppedMsgID},
		ConfirmLimit: wal.LSN(r.ConfirmLimit), HealAsked: r.HealAsked}
	if r.Seen != nil {
		p.Seen = relay.Seen{Known: true, First: r.Seen.First, Last: r.Seen.Last, Deleted: r.Seen.Deleted, Batches: r.Seen.Batches, Trims: r.Seen.Trims, Quiet: r.Seen.Quiet, Keeps: r.Seen.Keeps}
	}
	if f := relay.ParseFact(r.RefusedFact); f != relay.NoFact {
		p.Refused = relay.Refusal{Fact: f, Err: &relay.RecordedRefusal{Said: r.Refused}}
	}
	return p
}

// seenOf is what the relay asks to record the stream held, as the record
// keeps it.
func seenOf(s relay.Seen) replication.StreamSeen {
	return replication.StreamSeen{First: s.First, Last: s.Last, Deleted: s.Deleted, Batches: s.Batches, Trims: s.Trims, Quiet: s.Quiet, Keeps: s.Keeps}
}

// destination is where the session publishes.
func (x *run) destination() publish.Destination {
	cfg := x.d.cfg
	return publish.Destination{Name: cfg.Stream, Subject: cfg.Subject, Replicas: cfg.Replicas, PerAction: cfg.PerAction, PubAckTimeout: cfg.PubAckTimeout, Origin: x.s.origin}
}

// readHead opens the stream to read its head, for a slot that is missing.
func (x *run) readHead() relay.Event {
	pub, err := x.d.newPublisher(x.ctx, x.s.q, x.nc, x.destination())
	if err != nil {
		return x.ended(err)
	}
	defer pub.Close()
	x.head = relay.StreamHead{Name: x.d.cfg.Stream, LastSeq: pub.LastSeq(), Foreign: pub.CheckOrigin(x.s.origin)}
	return relay.HeadRead{Head: x.head}
}

// makeSlot makes the slot, on a first start.
func (x *run) makeSlot() relay.Event {
	d, ctx := x.d, x.ctx
	failover, err := replication.WantFailover(d.cfg.SlotFailover, x.s.major)
	if err != nil {
		return x.ended(FailoverSettingError(err))
	}
	if x.rec, err = replication.CreateSlot(ctx, x.db(), d.cfg.Slot, "tailer run", true, failover); err != nil {
		return x.ended(pgErr(err))
	}
	d.log.Warn("created replication slot: tokens committed before now were not captured (run `tailer migrate` to create it together with the schema)", "slot", d.cfg.Slot, "incarnation", x.rec.Incarnation)
	if x.slot, err = replication.Slot(ctx, x.s.q, d.cfg.Slot); err != nil {
		return x.ended(pgErr(err))
	}
	return relay.SlotMade{Record: recordOf(x.rec), Slot: relay.Slot{Present: true, Confirmed: wal.LSN(x.slot.ConfirmedFlush)}}
}

// resync recreates the slot with the session's lease
// (MAILROOM_AUTO_RESYNC).
func (x *run) resync(c relay.Resync) relay.Event {
	d := x.d
	d.log.Warn("resyncing the slot (MAILROOM_AUTO_RESYNC)", "reason", d.words(x, c.Refusal))
	opts, err := d.cfg.ResyncOptions(d.log, "tailer run (MAILROOM_AUTO_RESYNC)")
	if err != nil {
		return relay.Resynced{Err: err}
	}
	rep, err := resync.Run(x.ctx, x.s.lease, x.nc, opts)
	if err != nil {
		return relay.Resynced{Err: fmt.Errorf("resync: %w", err)}
	}
	d.blocked.Store(nil)
	rep.Log(d.log, "slot resynced")
	return relay.Resynced{}
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

// sayGuard warns, once a process, when the schema's publication guard is
// not installed, or fires in ordinary sessions alone: what that leaves
// unseen.
func (d *Daemon) sayGuard(ctx context.Context, q *pgx.Conn) {
	if !d.guardSaid.CompareAndSwap(false, true) {
		return
	}
	guard, err := replication.GuardOf(ctx, q, d.cfg.Schema)
	switch {
	case err != nil || guard == replication.GuardAlways:
	case guard == replication.GuardOriginOnly:
		d.log.Warn("the publication guard does not fire in sessions with session_replication_role = replica (a restore, a replication tool): a publication changed and changed back there between two checks "+
			"(every MAILROOM_LAG_INTERVAL) would leave the token inserts of that time out of the slot's stream unseen. A superuser's `tailer migrate` enables it always", "publication", d.cfg.Publication, "schema", d.cfg.Schema)
	default:
		d.log.Warn("the publication guard of this schema is not installed (it takes a superuser to run `tailer migrate`): a publication changed and changed back between two checks "+
			"(every MAILROOM_LAG_INTERVAL) would leave the token inserts of that time out of the slot's stream unseen", "publication", d.cfg.Publication, "schema", d.cfg.Schema)
	}
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
