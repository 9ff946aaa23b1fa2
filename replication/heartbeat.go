package replication

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrMessageDenied is the role not allowed to write logical messages
// (pg_logical_emit_message).
var ErrMessageDenied = errors.New("the role may not write logical messages (pg_logical_emit_message)")

// EmitMessage writes a logical message, not transactional, into the WAL of
// the database q is connected to (the tailer's heartbeats: see
// decoder.HeartbeatPrefix). Every slot of the database decodes it at once,
// whatever transaction is open; it returns the position the message ends
// at.
func EmitMessage(ctx context.Context, q Querier, prefix, content string) (pglogrepl.LSN, error) {
	var s string
	err := q.QueryRow(ctx, `SELECT pg_logical_emit_message(false, $1, $2::text)::text`, prefix, content).Scan(&s)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == pgerrcode.InsufficientPrivilege {
		return 0, fmt.Errorf("write a logical message: %w: %s", ErrMessageDenied, pgErr.Message)
	}
	if err != nil {
		return 0, fmt.Errorf("write a logical message: %w", err)
	}
	lsn, err := pglogrepl.ParseLSN(s)
	if err != nil {
		return 0, fmt.Errorf("write a logical message: position %q: %w", s, err)
	}
	return lsn, nil
}

// SetConfirmedThrough records that every token of slot committed before at
// is confirmed (tailer status shows the lag from it). The caller holds the
// lease. A record table older than the column (tailer migrate not run) is
// ErrOldRecordTable.
func SetConfirmedThrough(ctx context.Context, db SchemaConn, slot string, at time.Time) error {
	_, err := db.Exec(ctx, `UPDATE `+db.slots()+` SET confirmed_through = $2
		WHERE slot = $1 AND (confirmed_through IS NULL OR confirmed_through < $2)`, slot, at)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == pgerrcode.UndefinedColumn:
		return fmt.Errorf("record how far slot %s is confirmed: %w", slot, ErrOldRecordTable)
	case err != nil:
		return fmt.Errorf("record how far slot %s is confirmed: %w", slot, err)
	}
	return nil
}

// ConfirmedThrough is what SetConfirmedThrough last recorded for slot
// (false when nothing is).
func ConfirmedThrough(ctx context.Context, db SchemaConn, slot string) (time.Time, bool, error) {
	var at *time.Time
	err := db.QueryRow(ctx, `SELECT confirmed_through FROM `+db.slots()+` WHERE slot = $1`, slot).Scan(&at)
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows), errors.As(err, &pgErr) && (pgErr.Code == pgerrcode.UndefinedColumn || pgErr.Code == pgerrcode.UndefinedTable):
		return time.Time{}, false, nil
	case err != nil:
		return time.Time{}, false, fmt.Errorf("read how far slot %s is confirmed: %w", slot, err)
	}
	if at == nil {
		return time.Time{}, false, nil
	}
	return *at, true, nil
}
