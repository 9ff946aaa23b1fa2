package daemon

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/publish/audit"
	"github.com/mailroom/tailer/publish/resync"
	"github.com/mailroom/tailer/publish/subscriber"
	"github.com/mailroom/tailer/publish/wire"
	"github.com/mailroom/tailer/replication"
)

// tokenLifetime is how long a token lives by the schema's default
// (expires_at): the first audit of a slot reaches back that far.
const tokenLifetime = 15 * time.Minute

// auditor is tailer run's continuous audit: every MAILROOM_AUDIT_INTERVAL,
// while this process streams from the slot, the tokens created since the
// last audit that the slot confirmed past a grace ago, by content,
// against the keys the stream holds (package audit). Each slice is
// audited once; the cursor is kept in the slot's record, so a restart,
// or another tailer taking over, goes on from it.
type auditor struct {
	d    *Daemon
	nc   *nats.Conn
	conn *pgx.Conn
	// cursor: the tokens created before it are audited (zero: not read
	// from the record yet); failing, the cause said of the last audit
	// that could not finish ("": the last one did).
	cursor  time.Time
	failing string
}

// auditState is what /readyz and the metrics show of the audits: how
// many tokens they found missing, not healed or acknowledged, since when,
// and the first ids.
type auditState struct {
	missing int64
	since   time.Time
	ids     string
}

// auditGrace is how long after their creation tokens are audited:
// MAILROOM_AUDIT_GRACE, and at least twice the batch timeout and the
// interval of the tailer's own checks, so that a loss those checks do not
// see (a stream restored from a backup taken after the last check) lies
// after every slice audited.
func (d *Daemon) auditGrace() time.Duration {
	return max(d.cfg.AuditGrace, 2*(d.cfg.LagInterval+d.cfg.BatchTimeout))
}

// audits runs the continuous audit until ctx is done.
func (d *Daemon) audits(ctx context.Context, nc *nats.Conn) {
	a := &auditor{d: d, nc: nc}
	defer a.close()
	t := time.NewTicker(d.cfg.AuditInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := a.once(ctx); err != nil && ctx.Err() == nil {
			a.incomplete(err)
		}
	}
}

func (a *auditor) close() {
	if a.conn != nil {
		a.conn.Close(context.Background())
	}
}

// once reads what the record says was found missing, and, while this
// process streams, audits the next slice.
func (a *auditor) once(ctx context.Context) error {
	d := a.d
	if a.conn == nil {
		conn, err := connectQuery(ctx, d.cfg.DatabaseURL)
		if err != nil {
			return err
		}
		a.conn = conn
	}
	rec, err := replication.LoadRecord(ctx, d.db(a.conn), d.cfg.Slot)
	if err != nil {
		a.conn.Close(context.Background())
		a.conn = nil
		return err
	}
	d.showAudit(rec)
	if !d.held.Load() || !rec.Exists || d.catchingUp() {
		return nil
	}
	if a.cursor.IsZero() || a.cursor.Before(rec.AuditThrough) {
		a.cursor = rec.AuditThrough
	}
	if a.cursor.IsZero() {
		a.cursor = time.Now().Add(-tokenLifetime)
	}
	rep, err := a.slice(ctx)
	if errors.Is(err, audit.ErrNothingConfirmed) || errors.Is(err, audit.ErrBehind) {
		// A first start, or a backlog to catch up with: nothing to audit
		// yet (the lag's metrics and alerts say the second).
		return nil
	}
	if err != nil {
		return err
	}
	return a.found(ctx, rep)
}

// catchingUp reports whether the last look at the slot found it more
// than a few MiB of WAL behind: a backlog is being drained, and the audit
// would wait for the slot to pass its snapshot with a transaction open.
func (d *Daemon) catchingUp() bool {
	s := d.lag.Load()
	return s != nil && s.err == nil && s.slot.LagBytes() > catchingUpBytes
}

// catchingUpBytes is how far behind the slot must be for catchingUp.
const catchingUpBytes = 16 << 20

// slice audits the tokens from the cursor on, at most ten intervals of
// them: an audit that fell behind catches up at a bounded cost a run.
func (a *auditor) slice(ctx context.Context) (audit.Report, error) {
	d := a.d
	js, err := jetstream.New(a.nc)
	if err != nil {
		return audit.Report{}, err
	}
	stream, err := js.Stream(ctx, d.cfg.Stream)
	if err != nil {
		return audit.Report{}, fmt.Errorf("%w: stream %s: %w", audit.ErrIncomplete, d.cfg.Stream, err)
	}
	rep, err := audit.Audit(ctx, a.conn, stream, audit.Options{
		Schema: d.cfg.Schema, Slot: d.cfg.Slot, Since: a.cursor, MaxSpan: 10 * d.cfg.AuditInterval,
		Grace: d.auditGrace(), CutByConfirmWait: true, Lines: d.cfg.Format == wire.FormatLine, ClockSkew: 10 * time.Second,
		Consumer: subscriber.AuditRunConsumer, ConfirmWait: min(d.cfg.AuditInterval, 30*time.Second), Settled: true,
	})
	if err != nil {
		if !errors.Is(err, audit.ErrIncomplete) || a.conn.IsClosed() {
			a.conn.Close(context.Background())
			a.conn = nil
		}
		return rep, err
	}
	return rep, nil
}

// found records what a complete audit found and moves the cursor past
// its window: missing tokens are said, kept in the slot's record, and
// healed when MAILROOM_AUDIT_HEAL asks.
func (a *auditor) found(ctx context.Context, rep audit.Report) error {
	d := a.d
	if a.failing != "" {
		d.log.Info("the audit completes again", "since", rep.Since, "until", rep.Until)
		a.failing = ""
	}
	d.metrics.audited(rep)
	db := d.db(a.conn)
	if len(rep.Twice) > 0 {
		d.log.Warn("tokens are on the stream more than once (consumers that drop a token they have by key deliver them once)",
			"count", len(rep.Twice), "token_ids", ids(rep.Twice), "created_since", rep.Since, "created_until", rep.Until)
	}
	if len(rep.Missing) > 0 {
		n, err := replication.AddAuditMissing(ctx, db, d.cfg.Slot, rep.Missing)
		if err != nil {
			return err
		}
		d.log.Error("tokens eligible when the slot confirmed past them are missing from the stream: "+a.wayOut(),
			"count", len(rep.Missing), "token_ids", ids(rep.Missing), "created_since", rep.Since, "created_until", rep.Until, "missing_in_all", n)
		if d.cfg.AuditHeal {
			a.heal(ctx, rep.Missing)
		}
	}
	if rep.Until.After(rep.Since) {
		// created_at counts whole seconds: the window's last is audited.
		a.cursor = time.Unix(rep.Until.Unix()+1, 0)
		if err := replication.SetAuditThrough(ctx, db, d.cfg.Slot, a.cursor); err != nil {
			return err
		}
	}
	rec, err := replication.LoadRecord(ctx, db, d.cfg.Slot)
	if err == nil {
		d.showAudit(rec)
	}
	return err
}

// wayOut says how what an audit found missing is healed or acknowledged.
func (a *auditor) wayOut() string {
	if a.d.cfg.AuditHeal {
		return "publishing those still eligible once (MAILROOM_AUDIT_HEAL)"
	}
	return "`tailer audit --since <window> --heal` publishes those still eligible once (or MAILROOM_AUDIT_HEAL=true); `tailer audit --acknowledge` clears this once looked into"
}

// heal publishes the tokens of ids still eligible once, as tailer audit
// --heal does: this process's session lets go of the slot's lease for it.
func (a *auditor) heal(ctx context.Context, missing []int64) {
	d := a.d
	opts, err := d.cfg.ResyncOptions(d.log, "tailer run (MAILROOM_AUDIT_HEAL)")
	if err == nil {
		var rep resync.Report
		rep, err = resync.HealAsking(ctx, a.nc, opts, missing, "tailer run heal", leaseWaitForHeal+d.cfg.LagInterval)
		if err == nil {
			d.log.Info("healed: the missing tokens still eligible are published once", "asked", len(missing), "eligible", rep.Eligible,
				"already_on_stream", rep.OnStream, "published", rep.Published, "stream_seq", rep.StreamSeq)
			return
		}
	}
	d.log.Error("cannot heal what the audit found missing: "+a.wayOut(), "err", err)
}

// leaseWaitForHeal is how long a heal waits for the session to let go of
// the slot's lease, beyond its next check.
const leaseWaitForHeal = 30 * time.Second

// incomplete says, once while it lasts, why an audit could not finish:
// it is tried again at the next interval, from the same cursor.
func (a *auditor) incomplete(err error) {
	if msg := err.Error(); msg != a.failing {
		a.failing = msg
		a.d.log.Warn("the audit could not finish; it is tried again at the next MAILROOM_AUDIT_INTERVAL", "err", err, "created_since", a.cursor)
	}
}

// showAudit keeps what rec says audits found missing, for /readyz and
// the metrics.
func (d *Daemon) showAudit(rec replication.Record) {
	s := &auditState{missing: rec.AuditMissingCount, since: rec.AuditMissingAt, ids: rec.AuditMissing}
	d.auditState.Store(s)
	d.metrics.auditMissing.Set(float64(s.missing))
}

// auditReason is /readyz's reason while audits found tokens missing.
func (d *Daemon) auditReason() string {
	s := d.auditState.Load()
	if s == nil || s.missing == 0 {
		return ""
	}
	return AuditMissingMessage(s.missing, s.since, s.ids)
}

// AuditMissingMessage says that audits found n tokens missing from the
// stream since since, the first of them listed, and the ways out.
func AuditMissingMessage(n int64, since time.Time, list string) string {
	return fmt.Sprintf("the audit found %d tokens missing from the stream since %s (token ids %s): `tailer audit --since <window> --heal` publishes those still eligible once, `tailer audit --acknowledge` clears this",
		n, since.UTC().Format(time.RFC3339), firstIDs(list, 20))
}

// ids is the first 50 of ids, as one string for the log.
func ids(list []int64) string {
	var b strings.Builder
	for i, id := range list {
		if i == 50 {
			fmt.Fprintf(&b, " and %d more", len(list)-50)
			break
		}
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(id, 10))
	}
	return b.String()
}

// firstIDs is the first n of a comma-separated list of ids.
func firstIDs(list string, n int) string {
	parts := strings.SplitN(list, ",", n+1)
	if len(parts) > n {
		return strings.Join(parts[:n], ",") + ",..."
	}
	return list
}
