// Package replication owns the logical replication connection: it creates
// the pgoutput slot, starts streaming from the slot's confirmed position,
// answers keepalives and reports the position the caller may confirm. One
// goroutine (the one running Receiver.Run) reads and writes the connection.
package replication

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// Plugin is the output plugin the tailer decodes.
const Plugin = "pgoutput"

var identRe = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// ValidateName checks a slot or publication name. Both end up in
// replication commands that do not take parameters, so only PostgreSQL's own
// slot-name alphabet is accepted: lower-case letters, digits and underscores,
// at most 63 characters.
func ValidateName(name string) error {
	if !identRe.MatchString(name) {
		return fmt.Errorf("%q is not a valid name: use 1-63 lower-case letters, digits or underscores, not starting with a digit", name)
	}
	return nil
}

// SlotInfo describes a replication slot.
type SlotInfo struct {
	Name           string
	Plugin         string
	Database       string
	Active         bool
	ActivePID      int32 // 0 when inactive
	RestartLSN     pglogrepl.LSN
	ConfirmedFlush pglogrepl.LSN
	// CurrentLSN is pg_current_wal_lsn() at the time of the query.
	CurrentLSN pglogrepl.LSN
	// WALStatus is pg_replication_slots.wal_status: reserved, extended,
	// unreserved, or lost once the WAL the slot needs was removed.
	WALStatus string
	// InvalidationReason (PostgreSQL 17+) says why the server invalidated
	// the slot: wal_removed, rows_removed, wal_level_insufficient,
	// idle_timeout (18+); empty while it is valid.
	InvalidationReason string
	// InactiveSince (PostgreSQL 17+) is when the slot was last released;
	// zero while it is streamed, or on older servers.
	InactiveSince time.Time
	// Failover (17+): the slot is synchronized to standbys that have
	// sync_replication_slots on. Synced: this server is such a standby and
	// the slot is a copy of the primary's.
	Failover, Synced bool
}

// Lost reports whether the slot can never be streamed again: the server
// removed WAL it still needed (max_slot_wal_keep_size), or invalidated it
// for another reason.
func (s SlotInfo) Lost() bool { return s.WALStatus == "lost" || s.InvalidationReason != "" }

// invalidations explains PostgreSQL's invalidation reasons.
var invalidations = map[string]string{
	"wal_removed":            "the server removed WAL it still needed (max_slot_wal_keep_size)",
	"rows_removed":           "catalog rows it needed were removed (a standby's slot without hot_standby_feedback)",
	"wal_level_insufficient": "wal_level was set below logical",
	"idle_timeout":           "it stayed released longer than idle_replication_slot_timeout",
}

// LostMessage says what a lost slot means and how to recover, for logs,
// /readyz and tailer status.
func (s SlotInfo) LostMessage() string {
	why := fmt.Sprintf("(wal_status %s): %s", s.WALStatus, invalidations["wal_removed"])
	if r := s.InvalidationReason; r != "" {
		explain, ok := invalidations[r]
		if !ok {
			explain = "the server invalidated it"
		}
		why = fmt.Sprintf("(wal_status %s, invalidation_reason %s): %s", s.WALStatus, r, explain)
	}
	return fmt.Sprintf("slot %s is lost %s, so tokens committed after %s cannot be read from it. "+
		"The tailer will not recreate it by itself. To go on: stop every tailer run and run `tailer resync`, which recreates the slot and publishes, once, every still-eligible token the stream lacks "+
		"(or set MAILROOM_AUTO_RESYNC=true to let tailer run do it)", s.Name, why, s.ConfirmedFlush)
}

// IsSlotLost reports whether err is the server refusing to stream an
// invalidated slot (SQLSTATE 55000).
func IsSlotLost(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55000"
}

// LagBytes is how far the slot's confirmed position is behind the server's
// current WAL position.
func (s SlotInfo) LagBytes() int64 { return lsnDiff(s.CurrentLSN, s.ConfirmedFlush) }

// RetainedBytes is how much WAL the slot makes the server keep.
func (s SlotInfo) RetainedBytes() int64 { return lsnDiff(s.CurrentLSN, s.RestartLSN) }

func lsnDiff(a, b pglogrepl.LSN) int64 {
	if b == 0 || a < b {
		return 0
	}
	return int64(a - b)
}

// ErrNoSlot is returned by Slot when the slot does not exist.
var ErrNoSlot = errors.New("replication slot does not exist")

// Querier is the part of pgx.Conn (or a pool) the slot functions need.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Slot looks up a slot by name.
func Slot(ctx context.Context, q Querier, name string) (SlotInfo, error) {
	var (
		s                        SlotInfo
		pid                      *int32
		restart, confirmed, curr *string
		inactive                 *time.Time
		failover, synced         *bool
		reason                   *string
	)
	// Columns of newer servers are read through to_jsonb, NULL where the
	// server lacks them. A standby has no pg_current_wal_lsn(): its position
	// is what it replayed.
	err := q.QueryRow(ctx, `
		SELECT slot_name, plugin, database, active, active_pid,
		       restart_lsn::text, confirmed_flush_lsn::text,
		       (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END)::text,
		       coalesce(wal_status, ''),
		       to_jsonb(s)->>'invalidation_reason', (to_jsonb(s)->>'inactive_since')::timestamptz,
		       (to_jsonb(s)->>'failover')::bool, (to_jsonb(s)->>'synced')::bool
		FROM pg_replication_slots s WHERE slot_name = $1`, name).
		Scan(&s.Name, &s.Plugin, &s.Database, &s.Active, &pid, &restart, &confirmed, &curr, &s.WALStatus, &reason, &inactive, &failover, &synced)
	if reason != nil {
		s.InvalidationReason = *reason
	}
	if inactive != nil {
		s.InactiveSince = *inactive
	}
	s.Failover, s.Synced = failover != nil && *failover, synced != nil && *synced
	if errors.Is(err, pgx.ErrNoRows) {
		return s, fmt.Errorf("slot %s: %w", name, ErrNoSlot)
	}
	if err != nil {
		return s, fmt.Errorf("query slot %s: %w", name, err)
	}
	if pid != nil {
		s.ActivePID = *pid
	}
	for _, f := range []struct {
		src *string
		dst *pglogrepl.LSN
	}{{restart, &s.RestartLSN}, {confirmed, &s.ConfirmedFlush}, {curr, &s.CurrentLSN}} {
		if f.src == nil {
			continue
		}
		if *f.dst, err = pglogrepl.ParseLSN(*f.src); err != nil {
			return s, fmt.Errorf("slot %s: %w", name, err)
		}
	}
	return s, nil
}

// CheckSlot verifies that an existing slot s is one the tailer can stream
// from here. Slot names are global to the server: a slot of another
// database, or with another plugin, is an error.
func CheckSlot(ctx context.Context, q Querier, s SlotInfo) error {
	var db string
	if err := q.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		return fmt.Errorf("query current database: %w", err)
	}
	if s.Database != db {
		return fmt.Errorf("slot %s belongs to database %q, not %q: slot names are global to the server, choose another (MAILROOM_SLOT)", s.Name, s.Database, db)
	}
	if s.Plugin != Plugin {
		return fmt.Errorf("slot %s uses plugin %q, want %q", s.Name, s.Plugin, Plugin)
	}
	return nil
}

// DropSlot drops the slot if it exists.
func DropSlot(ctx context.Context, q Querier, name string) error {
	_, err := q.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, name)
	if err != nil {
		return fmt.Errorf("drop slot %s: %w", name, err)
	}
	return nil
}

// Snapshot is a slot's starting point: the transactions committed before
// ConsistentPoint are visible in the exported snapshot Name, and every later
// one is decoded from the slot.
type Snapshot struct {
	ConsistentPoint pglogrepl.LSN
	Name            string
}

var snapshotNameRe = regexp.MustCompile(`^[0-9A-F]+-[0-9A-F]+-[0-9]+$`)

// CreateSlotWithSnapshot creates the logical slot (a failover slot if
// failover) on the replication connection conn and exports the snapshot it
// starts from. The snapshot can
// be imported (SET TRANSACTION SNAPSHOT) until conn runs another command or
// closes.
func CreateSlotWithSnapshot(ctx context.Context, conn *pgconn.PgConn, name string, failover bool) (Snapshot, error) {
	if err := ValidateName(name); err != nil {
		return Snapshot{}, fmt.Errorf("slot name: %w", err)
	}
	var res pglogrepl.CreateReplicationSlotResult
	var err error
	if failover {
		// pglogrepl writes only the old syntax, which has no FAILOVER.
		res, err = pglogrepl.ParseCreateReplicationSlot(conn.Exec(ctx,
			fmt.Sprintf("CREATE_REPLICATION_SLOT %s LOGICAL %s (SNAPSHOT 'export', FAILOVER true)", name, Plugin)))
	} else {
		res, err = pglogrepl.CreateReplicationSlot(ctx, conn, name, Plugin,
			pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication, SnapshotAction: "EXPORT_SNAPSHOT"})
	}
	if err != nil {
		return Snapshot{}, fmt.Errorf("create slot %s with a snapshot: %w", name, err)
	}
	lsn, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		return Snapshot{}, fmt.Errorf("create slot %s: consistent point: %w", name, err)
	}
	// The name goes into SET TRANSACTION SNAPSHOT, which takes no
	// parameters.
	if !snapshotNameRe.MatchString(res.SnapshotName) {
		return Snapshot{}, fmt.Errorf("create slot %s: unexpected snapshot name %q", name, res.SnapshotName)
	}
	return Snapshot{ConsistentPoint: lsn, Name: res.SnapshotName}, nil
}

// IsSlotInUse reports whether err says another connection holds the slot
// (SQLSTATE 55006), which is what a standby tailer sees.
func IsSlotInUse(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55006"
}

// Connect opens a replication connection (replication=database) to the
// database named in url.
func Connect(ctx context.Context, url string) (*pgconn.PgConn, error) {
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database URL: %w", err)
	}
	cfg.RuntimeParams["replication"] = "database"
	cfg.RuntimeParams["application_name"] = "tailer"
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return newLowWaterConn(c), nil
	}
	// pgproto3 reads at most 8 KiB at a time; a large buffer lets one read
	// take everything that has piled up.
	cfg.BuildFrontend = func(r io.Reader, w io.Writer) *pgproto3.Frontend {
		return pgproto3.NewFrontend(bufio.NewReaderSize(r, readBuffer), w)
	}
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("replication connect: %w", err)
	}
	return conn, nil
}

// readBuffer is the most one read of the replication socket takes.
const readBuffer = 256 << 10

// Options choose how pgoutput encodes the stream.
type Options struct {
	Slot        string
	Publication string
	// ProtoVersion is the pgoutput protocol: 1, or 2 for streaming of large
	// in-progress transactions (PostgreSQL 14+).
	ProtoVersion int
	// Binary asks for binary column values (PostgreSQL 14+), which the
	// walsender produces more cheaply than text.
	Binary bool
	// StatusInterval is how often a standby status update is sent even when
	// nothing changed; it must stay well below wal_sender_timeout.
	StatusInterval time.Duration
	// OnStatus, if set, is told every position reported as flushed.
	OnStatus func(confirmed pglogrepl.LSN)
	// Timeout is how long the server may stay silent (no message and no
	// keepalive) while the stream is read before the connection is given
	// up as dead; after half of it the server is asked for a reply. A
	// half-open TCP connection otherwise goes unnoticed until the kernel
	// gives up retransmitting, about 15 minutes, while the slot looks held.
	// Default 60s.
	Timeout time.Duration
}

// ErrSilent is returned by Run when the server sent nothing for
// Options.Timeout, not even an answer to a status update asking for one.
var ErrSilent = errors.New("replication connection silent")

func (o Options) pluginArgs() []string {
	args := []string{
		fmt.Sprintf("proto_version '%d'", o.ProtoVersion),
		fmt.Sprintf("publication_names '%s'", o.Publication),
	}
	if o.Binary {
		args = append(args, "binary 'true'")
	}
	if o.ProtoVersion >= 2 {
		args = append(args, "streaming 'on'")
	}
	return args
}

// Handler consumes the stream. Every method is called from the goroutine
// running Receiver.Run.
type Handler interface {
	// Data handles one pgoutput message; data is only valid during the
	// call.
	Data(data []byte) error
	// ServerPosition reports a keepalive's WAL position: every change
	// before it has been sent.
	ServerPosition(lsn pglogrepl.LSN)
	// Deadline returns when Tick must next be called, or the zero time.
	Deadline() time.Time
	// Tick is called once Deadline has passed.
	Tick(now time.Time) error
	// Wait applies backpressure: it returns true when the handler can take
	// more data, or false at the latest at until, so that status updates
	// keep flowing while it cannot.
	Wait(ctx context.Context, until time.Time) (bool, error)
	// Confirmable returns the position to report as flushed.
	Confirmable() pglogrepl.LSN
	// Stop is called once, when Run's context is done, before the final
	// status update: the handler finishes what it holds (bounded in time).
	Stop()
}

// Receiver is a started replication stream.
type Receiver struct {
	conn *pgconn.PgConn
	opts Options

	received pglogrepl.LSN
	sent     pglogrepl.LSN
	lastSent time.Time
}

// Start begins streaming the slot from its confirmed position.
func Start(ctx context.Context, conn *pgconn.PgConn, opts Options) (*Receiver, error) {
	if err := ValidateName(opts.Slot); err != nil {
		return nil, fmt.Errorf("slot name: %w", err)
	}
	if err := ValidateName(opts.Publication); err != nil {
		return nil, fmt.Errorf("publication name: %w", err)
	}
	if opts.ProtoVersion == 0 {
		opts.ProtoVersion = 2
	}
	if opts.StatusInterval <= 0 {
		opts.StatusInterval = time.Second
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 60 * time.Second
	}
	// Start position 0 lets the server resume from the slot's
	// confirmed_flush_lsn.
	err := pglogrepl.StartReplication(ctx, conn, opts.Slot, 0, pglogrepl.StartReplicationOptions{
		Mode:       pglogrepl.LogicalReplication,
		PluginArgs: opts.pluginArgs(),
	})
	if err != nil {
		return nil, fmt.Errorf("start replication on slot %s: %w", opts.Slot, err)
	}
	return &Receiver{conn: conn, opts: opts}, nil
}

// minStatusGap bounds how often a moved confirmed position is reported.
const minStatusGap = 50 * time.Millisecond

// Run reads the stream until ctx is done or the connection fails. When ctx
// is done it calls h.Stop, sends a last status update and returns ctx's
// error.
func (r *Receiver) Run(ctx context.Context, h Handler) error {
	netConn := r.conn.Conn()
	// A read blocked in ReceiveMessage wakes up at its deadline; pulling the
	// deadline in is how cancellation reaches it without a context watcher
	// goroutine per message.
	stopWake := context.AfterFunc(ctx, func() { netConn.SetReadDeadline(time.Now()) })
	defer stopWake()

	var (
		nextStatus  time.Time
		curDeadline time.Time
		// heard is when the server was last heard from, or when reading
		// last resumed after backpressure (the server is not silent while
		// the tailer does not read); pinged is set once a reply was asked
		// for since then.
		heard  = time.Now()
		pinged bool
	)
	for {
		if ctx.Err() != nil {
			h.Stop()
			if err := r.sendStatus(h.Confirmable(), false); err != nil {
				return fmt.Errorf("final status update: %w", err)
			}
			return ctx.Err()
		}
		now := time.Now()
		silent := now.Sub(heard)
		if silent >= r.opts.Timeout {
			return fmt.Errorf("%w: nothing from the server for %s, not even a reply to a status update that asked for one", ErrSilent, silent.Round(time.Millisecond))
		}
		ping := !pinged && silent >= r.opts.Timeout/2
		if c := h.Confirmable(); ping || !now.Before(nextStatus) || (c > r.sent && now.Sub(r.lastSent) >= minStatusGap) {
			if err := r.sendStatus(c, ping); err != nil {
				return err
			}
			pinged = pinged || ping
			nextStatus = now.Add(r.opts.StatusInterval)
		}
		ready, err := h.Wait(ctx, nextStatus)
		if err != nil {
			return err
		}
		if !ready {
			heard, pinged = time.Now(), false
			continue
		}
		deadline := nextStatus
		if d := h.Deadline(); !d.IsZero() {
			if !now.Before(d) {
				if err := h.Tick(now); err != nil {
					return err
				}
				continue
			}
			if d.Before(deadline) {
				deadline = d
			}
		}
		if !deadline.Equal(curDeadline) {
			netConn.SetReadDeadline(deadline)
			curDeadline = deadline
		}
		msg, err := r.conn.ReceiveMessage(context.Background())
		if err != nil {
			var netErr net.Error
			if errors.As(err, &netErr) && netErr.Timeout() {
				// The wake-up above may have moved the deadline.
				curDeadline = time.Time{}
				continue
			}
			return fmt.Errorf("receive replication message: %w", err)
		}
		heard, pinged = time.Now(), false
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			if err := r.copyData(m.Data, h, &nextStatus); err != nil {
				return err
			}
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("replication stream: %w", pgconn.ErrorResponseToPgError(m))
		case *pgproto3.NoticeResponse:
			// PostgreSQL 18 decodes on past a publication that did not exist
			// at a change's point in the WAL, warning "skipped loading
			// publication" and leaving the change out, where 15-17 stop with
			// an error. The change may be a token: stop as they do, before
			// the transaction's commit is confirmed.
			if notice := pgconn.ErrorResponseToPgError((*pgproto3.ErrorResponse)(m)); IsPublicationGone(notice) {
				return fmt.Errorf("replication stream: %w", notice)
			}
		case *pgproto3.CopyDone:
			return errors.New("replication stream: server ended the stream")
		}
	}
}

func (r *Receiver) copyData(data []byte, h Handler, nextStatus *time.Time) error {
	if len(data) == 0 {
		return errors.New("replication stream: empty CopyData")
	}
	switch data[0] {
	case pglogrepl.XLogDataByteID:
		// walStart(8) walEnd(8) sendTime(8) then the pgoutput message.
		if len(data) < 25 {
			return errors.New("replication stream: short XLogData")
		}
		if start := pglogrepl.LSN(binary.BigEndian.Uint64(data[1:])); start > r.received {
			r.received = start
		}
		if err := h.Data(data[25:]); err != nil {
			return fmt.Errorf("at %s: %w", r.received, err)
		}
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		// walEnd(8) sendTime(8) replyRequested(1).
		if len(data) < 18 {
			return errors.New("replication stream: short keepalive")
		}
		walEnd := pglogrepl.LSN(binary.BigEndian.Uint64(data[1:]))
		if walEnd > r.received {
			r.received = walEnd
		}
		h.ServerPosition(walEnd)
		if data[17] != 0 {
			// The server is about to time us out: answer now.
			*nextStatus = time.Time{}
		}
	}
	return nil
}

// sendStatus reports confirmed as flushed and applied. Every position is
// given explicitly: pglogrepl fills a zero flush position with the write
// position, which would confirm data not yet published.
func (r *Receiver) sendStatus(confirmed pglogrepl.LSN, reply bool) error {
	if confirmed == 0 {
		// Nothing known yet; a zero flush would be replaced by the write
		// position, so say nothing.
		return nil
	}
	write := r.received
	if write < confirmed {
		write = confirmed
	}
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), r.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: write,
		WALFlushPosition: confirmed,
		WALApplyPosition: confirmed,
		ClientTime:       time.Now(),
		ReplyRequested:   reply,
	})
	if err != nil {
		return fmt.Errorf("send standby status: %w", err)
	}
	r.sent, r.lastSent = confirmed, time.Now()
	if r.opts.OnStatus != nil {
		r.opts.OnStatus(confirmed)
	}
	return nil
}

// Sent returns the last position reported as flushed.
func (r *Receiver) Sent() pglogrepl.LSN { return r.sent }
