package daemon

import (
	"context"
	"errors"
	"github.com/mailroom/tailer/decoder/wal"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/mailroom/tailer/publish"
	"github.com/mailroom/tailer/publish/relay"
	"github.com/mailroom/tailer/replication"
)

// claim records the publication the slot is read through, makes the slot
// what MAILROOM_SLOT_FAILOVER asks, ends the walsender of a holder that
// lost the lease, starts streaming the slot and opens the stream.
func (x *run) claim() relay.Event {
	d, ctx, cfg := x.d, x.ctx, x.d.cfg
	failover, err := replication.WantFailover(cfg.SlotFailover, x.s.major)
	if err != nil {
		return x.ended(FailoverSettingError(err))
	}
	if err := replication.SetPublication(ctx, x.db(), cfg.Slot, cfg.Publication); errors.Is(err, replication.ErrOldSchema) {
		return relay.Ended{End: relay.EndFound, Found: relay.SchemaUnreadable, Err: err}
	} else if err != nil {
		return x.ended(pgErr(err))
	}
	d.sayGuard(ctx, x.s.q)
	// With the lease held and nothing streaming yet, the slot is made what
	// MAILROOM_SLOT_FAILOVER asks (a slot from before the upgrade to 17, or
	// made by hand). A synced copy on a standby is the primary's to change.
	if x.s.major >= replication.FailoverMinVersion && x.slot.Failover != failover && !x.slot.Synced && (failover || cfg.SlotFailover == replication.FailoverOff) {
		if err := replication.SetFailover(ctx, x.s.rc, cfg.Slot, failover); err != nil {
			return x.ended(pgErr(err))
		}
		x.slot.Failover = failover
		d.log.Info("slot failover changed", "slot", cfg.Slot, "failover", failover)
	}
	// The lease is this session's: a walsender that still streams the slot
	// serves a holder that lost it (frozen, or cut off), and would keep the
	// slot until wal_sender_timeout notices.
	if pid, err := replication.TakeOver(ctx, x.s.q, x.slot); err != nil {
		d.log.Warn("cannot end the walsender of a process that lost the slot's lease; waiting for the server to end it", "slot", cfg.Slot, "err", err)
	} else if pid != 0 {
		d.log.Warn("took the slot over from a process that lost its lease: ended the walsender that still streamed it", "slot", cfg.Slot, "walsender_pid", pid)
	}
	x.receiver, err = replication.Start(ctx, x.s.rc, replication.StreamOptions{
		Slot: cfg.Slot, Publication: cfg.Publication, ProtoVersion: cfg.ProtoVersion, Binary: cfg.Binary, Messages: cfg.HeartbeatInterval > 0,
		OnStatus: d.streamConfirmed, Timeout: cfg.ReplicationTimeout,
		Confirmed: x.slot.ConfirmedFlush, BeforeConfirm: x.beforeConfirm,
	})
	if replication.IsSlotLost(err) {
		return relay.Ended{End: relay.EndFound, Found: relay.SlotLost, Err: err}
	}
	if err != nil {
		return x.ended(pgErr(err))
	}
	// The slot is held: no other tailer publishes now, and the markers
	// Resume starts the session with keep out what an earlier one may
	// still have on its way (see publish.Publisher).
	if x.pub, err = d.newPublisher(ctx, x.s.q, x.nc, x.destination()); err != nil {
		return x.ended(err)
	}
	// Read again now that the slot streams to this session: a process
	// frozen since it read the record finds another incarnation there.
	rec, err := replication.LoadRecord(ctx, x.db(), cfg.Slot)
	if err != nil {
		return x.ended(pgErr(err))
	}
	// Where the slot's stream starts: no other process can move it now.
	slot, err := replication.Slot(ctx, x.s.q, cfg.Slot)
	if err != nil {
		return x.ended(pgErr(err))
	}
	x.head = relay.StreamHead{Name: cfg.Stream, Created: x.pub.Created(), LastSeq: x.pub.LastSeq(), Last: x.pub.LastAnchor(), Replicas: x.pub.Replicas(),
		Seen: x.pub.Seen(), Foreign: x.pub.CheckOrigin(x.s.origin)}
	return relay.Claimed{Head: x.head, Record: recordOf(rec), Confirmed: wal.LSN(slot.ConfirmedFlush)}
}

// beforeConfirm writes down, under the lease, how far the slot may be
// confirmed before the stream confirms it there: a slot found confirmed
// further was advanced by another process (relay.SlotAdvanced).
// Failing costs only the confirmation, which the next status asks again.
func (x *run) beforeConfirm(ctx context.Context, at pglogrepl.LSN) (pglogrepl.LSN, error) {
	limit := at + confirmAhead
	err := x.s.lease.SetConfirmLimit(ctx, x.d.cfg.Schema, limit)
	if err != nil {
		x.d.log.Warn("cannot record how far the slot may be confirmed; it is confirmed no further until this can be", "slot", x.d.cfg.Slot, "err", err)
		return 0, err
	}
	return limit, nil
}

// confirmAhead is how far past the position being confirmed the confirm
// limit is written: the write is itself WAL (an UPDATE and its commit,
// a few hundred bytes) that the slot must then be confirmed past, so a
// limit written at the position alone was written again at every status
// of an idle tailer, each write a transaction of its own; a failover
// slot whose catalog xmin moved on with each of them was never
// synchronized to a standby by pg_sync_replication_slots ("could lead to
// data loss", PostgreSQL 17). The price: another process that advanced
// the slot less than this past the last limit (a transaction or two of
// tokens) goes unseen by this check; the audit still names every token
// that skipped the stream.
const confirmAhead = 4 << 10

// bind ties the stream to the slot's incarnation: a new incarnation for a
// slot no tailer recorded making (Adopt), or the record's (Bind).
func (x *run) bind(cmd relay.Command) relay.Event {
	d := x.d
	var err error
	if _, adopt := cmd.(relay.Adopt); adopt {
		if x.rec, err = replication.AdoptSlot(x.ctx, x.db(), d.cfg.Slot); err != nil {
			return x.ended(pgErr(err))
		}
		d.log.Info("adopted a slot no tailer recorded making, beside an empty stream", "slot", d.cfg.Slot, "incarnation", x.rec.Incarnation)
	} else if err := replication.Bind(x.ctx, x.db(), &x.rec, 0); err != nil {
		return x.ended(pgErr(err))
	}
	return relay.Bound{Record: recordOf(x.rec)}
}

// checkStream looks at the stream: whether it holds the anchors, and lost
// nothing since the incarnation took it over. Nothing is published yet:
// the look is quiet.
func (x *run) checkStream(c relay.LookAtStream) relay.Event {
	c.Quiet = true
	ev, err := streamCheck(x.ctx, x.pub, c)
	if err != nil {
		return x.ended(natsErr(err))
	}
	if x.rec.StreamName == x.head.Name && x.rec.StreamCreated != x.head.Created && len(c.Anchors) > 0 {
		x.d.log.Info("the stream's server reports another creation time than recorded (another replica answers, or it was restored); it is judged by the messages this tailer stored last",
			"stream", x.head.Name, "created", x.head.Created, "recorded_created", x.rec.StreamCreated)
	}
	return ev
}

// quietWait bounds how long a quiet look holds publishing for the PubAcks
// of what was sent before.
const quietWait = 5 * time.Second

// streamCheck is pub's stream as LookAtStream asks to look at it: quietly
// (publishing held until what was sent is stored) when it asks. The
// anchors are looked up before the stream's state and configuration are
// read: one a limit set in between removed then lies below the first
// sequence of a stream seen to trim, not beside a configuration that
// removes nothing.
func streamCheck(ctx context.Context, pub *publish.Publisher, c relay.LookAtStream) (relay.StreamLook, error) {
	var ev relay.StreamLook
	var err error
	if ev.Missing, err = pub.MissingAnchors(ctx, c.Anchors); err != nil {
		return relay.StreamLook{}, err
	}
	if c.Quiet {
		qctx, cancel := context.WithTimeout(ctx, quietWait)
		ev.Created, ev.Seen, ev.Stored, err = pub.LookQuietly(qctx)
		cancel()
	} else {
		ev.Stored = pub.StoredBatches()
		ev.Created, ev.Seen, err = pub.Look(ctx)
	}
	if err != nil {
		return relay.StreamLook{}, err
	}
	return ev, nil
}

// resume resumes the publisher past what the stream holds of the slot.
func (x *run) resume(c relay.Resume) relay.Event {
	d, ctx := x.d, x.ctx
	o := c.Owner
	o.Origin = x.s.origin
	x.inFlight = o.InFlight
	err := x.pub.Resume(ctx, o)
	var (
		foreign *relay.ForeignStreamError
		trimmed *relay.WindowTrimmedError
	)
	switch {
	case errors.As(err, &foreign), errors.As(err, &trimmed):
		return relay.Resumed{Err: err}
	case err != nil:
		return x.ended(natsErr(err))
	}
	if l := x.pub.Limits(); l != "" && !d.limitsSaid.Swap(true) {
		d.log.Warn("the stream's limits remove its oldest messages, read or not: a consumer further behind loses them, and a restart whose replayed tokens they removed is refused",
			"stream", d.cfg.Stream, "limits", l)
	}
	var reach wal.Position
	var strays int
	x.window, x.tokens, reach, strays, x.fence = x.pub.Window()
	if strays > 0 {
		d.log.Warn("the stream holds messages that are not the tailer's batches: passed over", "stream", d.cfg.Stream, "messages", strays)
	}
	current, err := currentLSN(ctx, x.s.q)
	if err != nil {
		return x.ended(pgErr(err))
	}
	return relay.Resumed{Reach: reach, WAL: wal.LSN(current), Anchors: x.pub.Anchors()}
}
