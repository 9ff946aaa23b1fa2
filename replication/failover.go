package replication

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pglogrepl"
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
	return fmt.Sprintf("true needs PostgreSQL %d or newer, and this server is PostgreSQL %d: its logical slots live on the primary only",
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

// TimelineBranches reads the history of timeline (TIMELINE_HISTORY) on the
// replication connection conn: for each earlier timeline of this server,
// the WAL position where it ended and its successor began. A position of
// an earlier timeline up to its end is the same WAL here; one past it was
// written on a branch this server does not have.
func TimelineBranches(ctx context.Context, conn *pgconn.PgConn, timeline int32) (map[int32]pglogrepl.LSN, error) {
	if timeline <= 1 {
		return nil, nil
	}
	h, err := pglogrepl.TimelineHistory(ctx, conn, timeline)
	if err != nil {
		return nil, fmt.Errorf("timeline history of %d: %w", timeline, err)
	}
	return ParseTimelineHistory(string(h.Content))
}

// ParseTimelineHistory parses a timeline history file: one line per
// earlier timeline, "parent<TAB>switchpoint<TAB>reason", comments with #.
func ParseTimelineHistory(content string) (map[int32]pglogrepl.LSN, error) {
	branches := map[int32]pglogrepl.LSN{}
	for _, line := range strings.Split(content, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) < 2 {
			return nil, fmt.Errorf("timeline history: line %q", line)
		}
		tl, err := strconv.ParseInt(fields[0], 10, 32)
		if err != nil || tl < 1 {
			return nil, fmt.Errorf("timeline history: timeline in %q", line)
		}
		lsn, err := pglogrepl.ParseLSN(fields[1])
		if err != nil {
			return nil, fmt.Errorf("timeline history: position in %q: %w", line, err)
		}
		branches[int32(tl)] = lsn
	}
	return branches, nil
}
