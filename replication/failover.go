package replication

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
)

// FailoverMinVersion is the first PostgreSQL with failover slots: logical
// slots that standbys with sync_replication_slots keep in step, so that a
// consumer goes on from a promoted standby.
const FailoverMinVersion = 17

// Failover settings (MAILROOM_SLOT_FAILOVER).
const (
	FailoverAuto = "auto" // on where the server has failover slots
	FailoverOn   = "true"
	FailoverOff  = "false"
)

// FailoverError is MAILROOM_SLOT_FAILOVER=true on a server without
// failover slots.
type FailoverError struct{ Major int }

func (e *FailoverError) Error() string {
	return fmt.Sprintf("true needs PostgreSQL %d or newer, and this server is PostgreSQL %d: its logical slots live on the primary only (after a failover, run tailer resync); set it to auto or false",
		FailoverMinVersion, e.Major)
}

// WantFailover says whether the tailer's slot should be a failover slot on
// a server of major version, under mode.
func WantFailover(mode string, major int) (bool, error) {
	switch {
	case mode == FailoverOff:
		return false, nil
	case major >= FailoverMinVersion:
		return true, nil
	case mode == FailoverOn:
		return false, &FailoverError{Major: major}
	}
	return false, nil
}

// ServerMajor is the server's major version.
func ServerMajor(ctx context.Context, q Querier) (int, error) {
	var n int
	if err := q.QueryRow(ctx, `SELECT current_setting('server_version_num')::int / 10000`).Scan(&n); err != nil {
		return 0, fmt.Errorf("query server version: %w", err)
	}
	return n, nil
}

// SetFailover makes slot a failover slot, or not, on the replication
// connection conn. The slot must not be streamed meanwhile: the caller
// holds its lease and has not started streaming on conn.
func SetFailover(ctx context.Context, conn *pgconn.PgConn, slot string, on bool) error {
	if err := ValidateName(slot); err != nil {
		return fmt.Errorf("slot name: %w", err)
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf("ALTER_REPLICATION_SLOT %s (FAILOVER %t)", slot, on)).ReadAll(); err != nil {
		return fmt.Errorf("alter slot %s (failover %t): %w", slot, on, err)
	}
	return nil
}
