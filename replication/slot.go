package replication

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mailroom/tailer/internal/pgname"
)

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

// LostReason says what happened to a lost slot and what it costs; what to
// do about it is the command layer's to say.
func (s SlotInfo) LostReason() string {
	why := fmt.Sprintf("(wal_status %s): %s", s.WALStatus, invalidations["wal_removed"])
	if r := s.InvalidationReason; r != "" {
		explain, ok := invalidations[r]
		if !ok {
			explain = "the server invalidated it"
		}
		why = fmt.Sprintf("(wal_status %s, invalidation_reason %s): %s", s.WALStatus, r, explain)
	}
	return fmt.Sprintf("slot %s is lost %s, so tokens committed after %s cannot be read from it", s.Name, why, s.ConfirmedFlush)
}

// IsSlotLost reports whether err is the server refusing to stream an
// invalidated slot (SQLSTATE 55000).
func IsSlotLost(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == pgerrcode.ObjectNotInPrerequisiteState
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

// SchemaConn is a connection to the mailroom database with the schema
// (MAILROOM_SCHEMA) of the tables the tailer reads and keeps there: the
// slots' records (tailer_slot) and the functions of its migrations are
// named through it, never found by the search_path (package pgname).
type SchemaConn struct {
	Querier
	Schema pgname.Schema
}

// slots is the table of the slots' records.
func (db SchemaConn) slots() string { return db.Schema.Name("tailer_slot") }

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

// ForeignSlotError is a slot of the tailer's name that belongs to another
// database of the server: slot names are global to a server.
type ForeignSlotError struct {
	Slot, Database, Here string
}

func (e *ForeignSlotError) Error() string {
	return fmt.Sprintf("slot %s belongs to database %q, not %q: slot names are global to the server", e.Slot, e.Database, e.Here)
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
		return &ForeignSlotError{Slot: s.Name, Database: s.Database, Here: db}
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
	return errors.As(err, &pgErr) && pgErr.Code == pgerrcode.ObjectInUse
}

// TakeOver ends the walsender that streams s for a process that no longer
// holds the slot's lease (the caller holds it): a holder that froze, or
// whose host or link went silent, lost the lease when the server ended its
// lease session, but the server keeps its walsender, and with it the slot,
// until wal_sender_timeout (a minute by default) notices. Ending it is safe
// because the lease was lost: that holder stops acting on the slot when it
// runs again. TakeOver returns the walsender's pid once the slot is free,
// 0 when nothing streamed it.
func TakeOver(ctx context.Context, q Querier, s SlotInfo) (int32, error) {
	if !s.Active || s.ActivePID == 0 {
		return 0, nil
	}
	var ok bool
	if err := q.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, s.ActivePID).Scan(&ok); err != nil {
		return s.ActivePID, fmt.Errorf("end walsender %d, which streams slot %s without its lease: %w", s.ActivePID, s.Name, err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		now, err := Slot(ctx, q, s.Name)
		if err != nil {
			return s.ActivePID, err
		}
		if !now.Active || now.ActivePID != s.ActivePID {
			return s.ActivePID, nil
		}
		if time.Now().After(deadline) {
			return s.ActivePID, fmt.Errorf("walsender %d still streams slot %s 10s after it was told to end", s.ActivePID, s.Name)
		}
		select {
		case <-ctx.Done():
			return s.ActivePID, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
