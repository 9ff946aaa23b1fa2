package decoder

import (
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/mailroom/tailer/decoder/action"
)

// Position identifies a row in the WAL: the commit LSN of its transaction
// and its index among the transaction's inserts into the tokens table. It is
// stable across replays of the same slot, which makes it usable as an
// idempotency key.
type Position struct {
	Commit pglogrepl.LSN
	Index  uint32
}

// Less reports whether p comes before q in commit order.
func (p Position) Less(q Position) bool {
	if p.Commit != q.Commit {
		return p.Commit < q.Commit
	}
	return p.Index < q.Index
}

// Compare returns -1, 0 or +1 as p comes before, at or after q in commit
// order.
func (p Position) Compare(q Position) int {
	switch {
	case p.Less(q):
		return -1
	case q.Less(p):
		return 1
	}
	return 0
}

// IsZero reports whether p is the zero position (before any row).
func (p Position) IsZero() bool { return p.Commit == 0 && p.Index == 0 }

// String formats p as LSN:index, e.g. "0/16B3748:3".
func (p Position) String() string {
	return p.Commit.String() + ":" + strconv.FormatUint(uint64(p.Index), 10)
}

// AppendText appends the String form of p to dst without allocating.
func (p Position) AppendText(dst []byte) []byte {
	dst = appendUpperHex(dst, uint64(p.Commit)>>32)
	dst = append(dst, '/')
	dst = appendUpperHex(dst, uint64(p.Commit)&0xffffffff)
	dst = append(dst, ':')
	return strconv.AppendUint(dst, uint64(p.Index), 10)
}

// appendUpperHex matches the %X formatting PostgreSQL and pglogrepl use for
// LSNs.
func appendUpperHex(dst []byte, v uint64) []byte {
	const digits = "0123456789ABCDEF"
	var buf [16]byte
	i := len(buf)
	for {
		i--
		buf[i] = digits[v&0xf]
		v >>= 4
		if v == 0 {
			break
		}
	}
	return append(dst, buf[i:]...)
}

// ParsePosition parses the String form of a Position.
func ParsePosition(s string) (Position, error) {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] != ':' {
			continue
		}
		lsn, err := pglogrepl.ParseLSN(s[:i])
		if err != nil {
			return Position{}, fmt.Errorf("parse position %q: %w", s, err)
		}
		idx, err := strconv.ParseUint(s[i+1:], 10, 32)
		if err != nil {
			return Position{}, fmt.Errorf("parse position %q: index: %w", s, err)
		}
		return Position{Commit: lsn, Index: uint32(idx)}, nil
	}
	return Position{}, fmt.Errorf("parse position %q: missing ':'", s)
}

// Token is one row inserted into the tokens table, as read from the WAL.
// Secret and Code are fixed-size so that a Token can be copied into a batch
// without a heap allocation.
type Token struct {
	Pos Position
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
