// Package accounts joins a batch of tokens with the current state of their
// rows and accounts, and decides which tokens are still to be mailed.
package accounts

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/mailroom/tailer/decoder"
)

// Skip says why a token is not published. The zero value means publish.
type Skip uint8

const (
	Publish Skip = iota
	SkipExpired
	SkipConsumed
	SkipDeleted
	SkipStatus
	// SkipAlreadyPublished marks tokens the stream already holds (found
	// after a restart).
	SkipAlreadyPublished
	// SkipMalformed marks rows that could not be decoded or signed.
	SkipMalformed
)

// Reasons lists every skip reason, for metrics.
var Reasons = []Skip{SkipExpired, SkipConsumed, SkipDeleted, SkipStatus, SkipAlreadyPublished, SkipMalformed}

func (s Skip) String() string {
	switch s {
	case Publish:
		return "publish"
	case SkipExpired:
		return "expired"
	case SkipConsumed:
		return "consumed"
	case SkipDeleted:
		return "deleted"
	case SkipStatus:
		return "account_status"
	case SkipAlreadyPublished:
		return "already_published"
	case SkipMalformed:
		return "malformed"
	}
	return "unknown"
}

// Row is the joined state of one token. Email and Login point into a
// buffer reused by the next Join.
type Row struct {
	Skip      Skip
	Email     []byte
	Login     []byte
	ExpiresAt int64
}

// Conn is the part of pgx.Conn the Joiner uses.
type Conn interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Joiner looks up tokens and accounts, one query per batch. It is not safe
// for concurrent use.
type Joiner struct {
	conn  Conn
	ids   []int64
	index map[int64]int
	arena []byte
}

// NewJoiner returns a Joiner using conn.
func NewJoiner(conn Conn) *Joiner {
	return &Joiner{conn: conn, index: make(map[int64]int)}
}

// The decision is taken in SQL against the server's clock, as the mailroom
// collector does: expired means expires_at <= now.
const joinSQL = `
SELECT t.id,
       t.expires_at,
       t.expires_at <= extract(epoch FROM now())::bigint AS expired,
       t.consumed_at IS NOT NULL AS consumed,
       CASE t.action
         WHEN 'activation' THEN a.status = 'provisioned'
         WHEN 'password_recovery' THEN a.status = 'active'
         ELSE false
       END AS status_ok,
       a.email,
       a.login
FROM tokens t
JOIN accounts a ON a.id = t.account
WHERE t.id = ANY($1)`

// Join fills rows (one per token, same order) with each token's current
// state. Tokens whose row no longer exists are SkipDeleted; rows already
// marked (Skip != Publish) are left alone and not queried.
func (j *Joiner) Join(ctx context.Context, tokens []decoder.Token, rows []Row) error {
	j.ids = j.ids[:0]
	clear(j.index)
	j.arena = j.arena[:0]
	for i := range tokens {
		if rows[i].Skip != Publish {
			continue
		}
		rows[i].Skip = SkipDeleted
		j.index[tokens[i].ID] = i
		j.ids = append(j.ids, tokens[i].ID)
	}
	if len(j.ids) == 0 {
		return nil
	}
	// Binary results keep the per-row cost to a few byte copies.
	res, err := j.conn.Query(ctx, joinSQL, pgx.QueryResultFormats{pgx.BinaryFormatCode}, j.ids)
	if err != nil {
		return fmt.Errorf("join accounts: %w", err)
	}
	defer res.Close()
	type span struct{ row, emailOff, emailEnd, loginEnd int }
	var spans [64]span
	pending := spans[:0]
	for res.Next() {
		v := res.RawValues()
		if len(v) != 7 || len(v[0]) != 8 || len(v[1]) != 4 || len(v[2]) != 1 || len(v[3]) != 1 || len(v[4]) != 1 {
			return fmt.Errorf("join accounts: unexpected row shape")
		}
		id := int64(binary.BigEndian.Uint64(v[0]))
		i, ok := j.index[id]
		if !ok {
			continue
		}
		r := &rows[i]
		r.ExpiresAt = int64(int32(binary.BigEndian.Uint32(v[1])))
		switch {
		case v[2][0] != 0:
			r.Skip = SkipExpired
		case v[3][0] != 0:
			r.Skip = SkipConsumed
		case v[4][0] == 0:
			r.Skip = SkipStatus
		default:
			r.Skip = Publish
			off := len(j.arena)
			j.arena = append(j.arena, v[5]...)
			emailEnd := len(j.arena)
			j.arena = append(j.arena, v[6]...)
			// The arena may move while it grows; slices are taken at the end.
			pending = append(pending, span{i, off, emailEnd, len(j.arena)})
		}
	}
	if err := res.Err(); err != nil {
		return fmt.Errorf("join accounts: %w", err)
	}
	for _, s := range pending {
		rows[s.row].Email = j.arena[s.emailOff:s.emailEnd:s.emailEnd]
		rows[s.row].Login = j.arena[s.emailEnd:s.loginEnd:s.loginEnd]
	}
	return nil
}

var _ Conn = (*pgx.Conn)(nil)
