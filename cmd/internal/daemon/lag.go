package daemon

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mailroom/tailer/decoder"
	"github.com/mailroom/tailer/publish/join"
	"github.com/mailroom/tailer/publish/relay"
	"github.com/mailroom/tailer/replication"
)

// lagSample is the last look at the slot.
type lagSample struct {
	at   time.Time
	slot replication.SlotInfo
	err  error
}

// sampleSlot looks at the slot every LagInterval for the lag metrics and
// /readyz, on a connection of its own. It works in standby too: the slot's
// lag is what operators care about, whoever holds it. While this tailer
// streams, it also checks that the tokens can still be read (the schema,
// the publication): a publication that no longer carries token inserts
// makes the slot's stream silently empty of them, so the session is ended
// at once rather than left to confirm WAL it saw no token in; and that the
// stream still holds what the slot published to it (a purge leaves the
// stream's sequence where it was, so the session's publishes go on).
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
		// Taken before the query: everything committed before it lies
		// before the position the query reads.
		at := time.Now()
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
		if errors.Is(err, replication.ErrNoSlot) {
			d.slotGone(ctx, conn)
		}
		if err == nil {
			d.metrics.slotSample(s)
			d.clock.saw(s.CurrentLSN, at)
			d.clock.confirmed(s.ConfirmedFlush)
			if d.held.Load() {
				d.recordConfirmedThrough(ctx, conn)
			}
			if st := d.streaming.Load(); st != nil {
				st.ask(ctx, func() { d.checkStreaming(ctx, conn, st) })
			}
		}
		// A configuration error at startup is the session loop's to
		// report, as the one line before exit.
		if err != nil && !failing && (d.streamed() || StartupConfigError(err, d.cfg) == nil) {
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

// slotGone sets tailer_slot_invalidated while the slot the record names
// is gone (dropped, or removed with its WAL): the alert TailerSlotLost
// names the runbook of both, and a slot dropped showed only as
// tailer_blocked. A slot never made (no record: tailer migrate not run
// yet) is no loss.
func (d *Daemon) slotGone(ctx context.Context, conn *pgx.Conn) {
	rec, err := replication.LoadRecord(ctx, d.db(conn), d.cfg.Slot)
	if err == nil {
		d.metrics.slotLost.Set(b2f(rec.Exists))
	}
}

// recordConfirmedThrough keeps in the slot's record how far in time the
// confirmed position reaches, for tailer status. A record table older
// than the column is said once.
func (d *Daemon) recordConfirmedThrough(ctx context.Context, conn *pgx.Conn) {
	through := d.clock.confirmedThrough()
	if through.IsZero() {
		return
	}
	err := replication.SetConfirmedThrough(ctx, d.db(conn), d.cfg.Slot, through)
	if err != nil && !d.throughSaid.Swap(true) && ctx.Err() == nil {
		d.log.Warn("cannot record how far the slot is confirmed; tailer status will not show the lag in seconds (tailer migrate adds the column)", "err", err)
	}
}

// streamConfirmed is told each position sent to the slot as flushed.
func (d *Daemon) streamConfirmed(lsn pglogrepl.LSN) {
	d.metrics.statusSent(lsn)
	d.clock.confirmed(lsn)
	d.takeStreamTime()
}

// takeStreamTime gives the lag clock the stream's own word: the newest
// commit or heartbeat time before the position the session confirmed.
func (d *Daemon) takeStreamTime() {
	if f := d.feeder.Load(); f != nil {
		d.clock.confirmedAt(f.ConfirmedAt())
	}
}

// heartbeat writes a heartbeat into the WAL every HeartbeatInterval while
// this tailer streams (decoder.HeartbeatPrefix): with no token written
// the slot's stream would otherwise say nothing of time, and the lag could
// not be told from an idle database. Where the server refuses (the role
// may not, or the server is a standby in recovery) it says so once and
// stops: the lag then rests on commit times and the slot's samples.
func (d *Daemon) heartbeat(ctx context.Context) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	ticker := time.NewTicker(d.cfg.HeartbeatInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		if !d.held.Load() {
			continue
		}
		var err error
		if conn == nil {
			if conn, err = connectQuery(ctx, d.cfg.DatabaseURL); err != nil {
				continue
			}
		}
		at := time.Now()
		lsn, err := replication.EmitMessage(ctx, conn, decoder.HeartbeatPrefix, decoder.HeartbeatContent(at))
		var pgErr *pgconn.PgError
		switch {
		case err == nil:
			d.clock.saw(lsn, at)
			d.recordConfirmedThrough(ctx, conn)
		case errors.Is(err, replication.ErrMessageDenied),
			errors.As(err, &pgErr) && (pgErr.Code == pgerrcode.ReadOnlySQLTransaction || pgErr.Code == pgerrcode.ObjectNotInPrerequisiteState):
			d.log.Warn("cannot write heartbeats into the WAL; the lag in seconds rests on commit times and the slot's samples every MAILROOM_LAG_INTERVAL (grant EXECUTE on pg_logical_emit_message, or set MAILROOM_HEARTBEAT_INTERVAL=0 to say so)", "err", err)
			return
		case ctx.Err() == nil:
			conn.Close(context.Background())
			conn = nil
		}
	}
}

// checkStreaming looks, for the relay, at what the streaming session
// reads tokens through and at its stream, and carries out what the relay
// asks then: the session stopped (the tokens can no longer be read, or
// the stream lost what it stored: a publication that no longer carries
// token inserts makes the slot's stream silently empty of them, and a
// purge leaves the stream's sequence where it was, so the session's
// publishes go on), or the newest batch found on the stream kept in the
// record. A look that fails is taken again at the next sample.
func (d *Daemon) checkStreaming(ctx context.Context, conn *pgx.Conn, st *streaming) {
	x := st.x
	cmds := d.step(relay.LookDue{Anchors: x.pub.Anchors()})
	for len(cmds) > 0 {
		cmd := cmds[0]
		cmds = cmds[1:]
		switch c := cmd.(type) {
		case relay.LookAtStream:
			// The first look, or a quiet one the relay asks for after it.
			ev, err := d.look(ctx, conn, st, c)
			if err != nil {
				return
			}
			cmds = append(cmds, d.step(ev)...)
		case relay.Stop:
			st.stop(&refusalCause{c.Refusal})
		case relay.RecordAnchor:
			_, err := d.recordAnchor(ctx, conn, st.rec, c)
			if err != nil && ctx.Err() == nil && !d.anchorSaid.Swap(true) {
				d.log.Warn("cannot record the newest batch found on the stream; a tailer started after this one is killed checks the stream by an older one", "err", err)
			}
		default:
			// The relay answers a look while streaming with these alone;
			// another would be a command nobody carries out.
			d.log.Error("internal error: a command of the relay's while streaming that the slot's sampler cannot carry out; stopping the session", "command", fmt.Sprintf("%T", c))
			st.stop(fmt.Errorf("the relay asked the slot's sampler to carry out %T", c))
			return
		}
	}
}

// look is what a check while streaming finds: the schema, the
// publication, the record's word that the stream lacks inserts, and the
// stream.
func (d *Daemon) look(ctx context.Context, conn *pgx.Conn, st *streaming, c relay.LookAtStream) (relay.LookTaken, error) {
	var ev relay.LookTaken
	// The record first: see inspect.
	rec, err := replication.LoadRecord(ctx, d.db(conn), d.cfg.Slot)
	if err != nil {
		return ev, err
	}
	if rec.Incarnation == st.rec.Incarnation {
		ev.ResyncNeeded, ev.ResyncCause, ev.Refused, ev.HealAsked = rec.ResyncNeeded, rec.ResyncCause, recordOf(rec).Refused, rec.HealAsked
	}
	err = join.CheckSchema(ctx, conn, d.cfg.Schema)
	var schema *join.SchemaError
	if errors.As(err, &schema) {
		ev.Schema = schema
	} else if err != nil {
		return ev, err
	}
	err = replication.CheckPublication(ctx, d.db(conn), d.cfg.Publication)
	var pub *replication.PublicationError
	if errors.As(err, &pub) {
		ev.Publication = pub
	} else if err != nil {
		return ev, err
	}
	ev.Stream, err = streamCheck(ctx, st.x.pub, c)
	return ev, err
}
