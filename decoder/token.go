package decoder

import (
	"fmt"
	"github.com/mailroom/tailer/decoder/wal"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/mailroom/tailer/decoder/action"
)

// ParsePosition parses the String form of a Position.
func ParsePosition(s string) (wal.Position, error) {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] != ':' {
			continue
		}
		lsn, err := pglogrepl.ParseLSN(s[:i])
		if err != nil {
			return wal.Position{}, fmt.Errorf("parse position %q: %w", s, err)
		}
		idx, err := strconv.ParseUint(s[i+1:], 10, 32)
		if err != nil {
			return wal.Position{}, fmt.Errorf("parse position %q: index: %w", s, err)
		}
		return wal.Position{Commit: wal.LSN(lsn), Index: uint32(idx)}, nil
	}
	return wal.Position{}, fmt.Errorf("parse position %q: missing ':'", s)
}

// Token is one row inserted into the tokens table, as read from the WAL.
// Secret and Code are fixed-size so that a Token can be copied into a batch
// without a heap allocation.
type Token struct {
	Pos wal.Position
	// Xid is the top-level transaction that inserted the row. Logical
	// decoding can deliver a transaction before its commit is visible to
	// other sessions, so readers of the row check this xid's visibility.
	Xid uint32
	// CommitTime is the transaction's commit time in microseconds since
	// 2000-01-01 UTC, as PostgreSQL sends it; see Committed.
	CommitTime int64
	ID         int64
	Account    int64
	Action     action.Action
	// Secret is the token's 32 random bytes.
	Secret [32]byte
	// Code holds CodeLen bytes of the short code (the column is VARCHAR(5)).
	Code    [action.MaxCodeLen]byte
	CodeLen uint8
	// CodeNull is set when the code column was NULL.
	CodeNull bool
	// Trace is the W3C traceparent the application wrote into the
	// transaction before the row (see TraceparentPrefix), or empty.
	Trace string
}

// pgEpoch is PostgreSQL's timestamp epoch.
var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// Committed returns when the token's transaction committed.
func (t *Token) Committed() time.Time {
	return pgTime(t.CommitTime)
}

// CodeString returns the code as a string (allocates).
func (t *Token) CodeString() string { return string(t.Code[:t.CodeLen]) }

// pgTime is a PostgreSQL timestamp (microseconds since pgEpoch).
func pgTime(us int64) time.Time { return pgEpoch.Add(time.Duration(us) * time.Microsecond) }
