package join

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mailroom/tailer/decoder"
	"github.com/mailroom/tailer/decoder/action"
	"github.com/mailroom/tailer/internal/pause"
	"github.com/mailroom/tailer/internal/pgname"
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
	// SkipUnsafeField marks tokens whose email or login cannot go into a
	// collector line (a separator, NUL, or more than 254 bytes).
	SkipUnsafeField
	skipCount
)

// Reasons lists every skip reason, for metrics.
var Reasons = []Skip{SkipExpired, SkipConsumed, SkipDeleted, SkipStatus, SkipAlreadyPublished, SkipMalformed, SkipUnsafeField}

// NumSkips bounds the Skip values, for arrays indexed by them.
const NumSkips = int(skipCount)

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
	case SkipUnsafeField:
		return "unsafe_field"
	}
	return "unknown"
}

// TokenState is the joined state of one token. Email and Login point into a
// buffer of the Join that filled them, which no later Join reuses: joined
// batches wait for their message while the next ones are joined.
type TokenState struct {
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
	// Log, if set, is told (at debug level) when Join waits for
	// transactions to become visible.
	Log   *slog.Logger
	conn  Conn
	ids   []int64
	xids  []int64
	index map[int64]ref
	arena []byte
	// byIDs and byRange are the join's queries (joinQueries).
	byIDs, byRange string
	schema         pgname.Schema
}

// ref locates a token: batch b, row i.
type ref struct{ b, i int32 }

// NewJoiner returns a Joiner using conn, reading the tokens and accounts
// tables of schema.
func NewJoiner(conn Conn, schema pgname.Schema) *Joiner {
	j := &Joiner{conn: conn, index: make(map[int64]ref), schema: schema}
	j.byIDs, j.byRange = joinQueries(schema)
	return j
}

// Which tokens are mailed, as SQL over tokens t and their accounts a: the
// one definition, used by the join (which says why a token is skipped) and
// by a resync (which selects the tokens still to be mailed from a
// snapshot). Expiry is decided against the server's clock, as the mailroom
// collector does.
const (
	Expired  = `t.expires_at <= extract(epoch FROM now())::bigint`
	Consumed = `t.consumed_at IS NOT NULL`
)

// StatusFits holds for a token whose account has the status its action
// needs (action.Actions). The column and the labels are compared as text,
// so that an action the table has and the database's enum types lack yet
// makes no query fail.
func StatusFits() string {
	var b strings.Builder
	b.WriteString(`CASE t.action::text`)
	for _, spec := range action.Actions {
		fmt.Fprintf(&b, ` WHEN %s THEN a.status::text = %s`, quote(spec.Label), quote(spec.Status))
	}
	b.WriteString(` ELSE false END`)
	return b.String()
}

// Eligible holds for a token still to be mailed.
func Eligible() string {
	return `NOT (` + Expired + `) AND NOT (` + Consumed + `) AND ` + StatusFits()
}

// quote is s as an SQL string literal.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// The join returns one row per token still present, plus one marker row
// (kind 1) counting the batch's transactions that the statement's snapshot
// does not see yet. Logical decoding may deliver a transaction as soon as its
// commit record is flushed, a moment before the commit becomes visible to
// other sessions (and, under synchronous replication, until the standby
// answers); a row missing from an invisible transaction is not deleted, just
// not visible yet. Both parts run in one statement, so they share a snapshot.
//
// Integer columns are read as bigint whatever their width, so that a
// change of width (expires_at to bigint, say) just works. The 32-bit xids
// from the WAL are widened to xid8 with the epoch of the snapshot's xmax;
// tokens without one (read from a snapshot, not the WAL) have nothing to
// wait for.
//
// It comes in two forms. joinByIDs looks the tokens up one by one. Tokens
// inserted together have consecutive ids, so a batch from a backlog is
// usually one dense range, and joinByRange scans it instead, which costs the
// server less per token than a probe per id (docs/performance.md). The range may hold
// tokens of other batches; their rows are ignored. The accounts are joined
// through a LATERAL subquery that cannot be flattened, so the plan stays
// one index probe per token whatever the planner estimates for the range.
func joinSelect(schema pgname.Schema) string {
	return `
SELECT 0 AS kind,
       t.id::bigint,
       t.expires_at::bigint,
       ` + Expired + ` AS expired,
       ` + Consumed + ` AS consumed,
       ` + StatusFits() + ` AS status_ok,
       a.email::text,
       a.login::text
FROM ` + schema.Name("tokens") + ` t
CROSS JOIN LATERAL (SELECT status, email, login FROM ` + schema.Name("accounts") + ` a WHERE a.id = t.account OFFSET 0) a
`
}

const (
	joinInvisible = `
UNION ALL
SELECT 1, count(*), NULL, NULL, NULL, NULL, NULL, NULL
FROM unnest($2::bigint[]) AS x(xid),
     LATERAL (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS xmax) s
WHERE NOT pg_visible_in_snapshot(
        ((((s.xmax >> 32) - CASE WHEN x.xid > (s.xmax & 4294967295) THEN 1 ELSE 0 END) << 32) | x.xid)::text::xid8,
        pg_current_snapshot())`
)

// joinQueries are the join's two forms (see joinSelect), made once a
// Joiner.
func joinQueries(schema pgname.Schema) (byIDs, byRange string) {
	sel := joinSelect(schema)
	return sel + `WHERE t.id = ANY($1)` + joinInvisible, sel + `WHERE t.id BETWEEN $1::bigint AND $3::bigint` + joinInvisible
}

// dense reports whether the sorted ids fill most of their range, so that
// scanning the range reads few rows that are not theirs.
func dense(lo, hi int64, n int) bool {
	return hi-lo < int64(n+n/4)
}

// SessionSettings are the run-time parameters the Joiner's connection should
// be opened with. The join looks up at most a few thousand tokens by primary
// key, for which the generic plan (index probes) is right whatever the table
// statistics say; the custom plans PostgreSQL tries first can pick parallel
// sequential scans of both tables (docs/performance.md).
func SessionSettings() map[string]string {
	return map[string]string{
		"plan_cache_mode":                 "force_generic_plan",
		"max_parallel_workers_per_gather": "0",
	}
}

// Join fills rows (one per token, same order) with each token's current
// state. Tokens whose row no longer exists are SkipDeleted; rows already
// marked (Skip != Publish) are left alone and not queried. When some of the
// tokens' transactions are not visible yet, Join waits for them.
func (j *Joiner) Join(ctx context.Context, tokens []decoder.Token, rows []TokenState) error {
	return j.JoinMany(ctx, [][]decoder.Token{tokens}, [][]TokenState{rows})
}

// JoinMany is Join for several batches at once, with one query: under load,
// the batches waiting to be published share a round trip.
func (j *Joiner) JoinMany(ctx context.Context, tokens [][]decoder.Token, rows [][]TokenState) error {
	j.ids, j.xids = j.ids[:0], j.xids[:0]
	clear(j.index)
	for b := range tokens {
		for i := range tokens[b] {
			if rows[b][i].Skip != Publish {
				continue
			}
			t := &tokens[b][i]
			j.index[t.ID] = ref{int32(b), int32(i)}
			j.ids = append(j.ids, t.ID)
			// Tokens of one transaction are adjacent in a batch.
			if x := int64(t.Xid); x != 0 && (len(j.xids) == 0 || j.xids[len(j.xids)-1] != x) {
				j.xids = append(j.xids, x)
			}
		}
	}
	if len(j.ids) == 0 {
		return nil
	}
	wait := 100 * time.Microsecond
	for {
		invisible, err := j.query(ctx, rows)
		if err != nil {
			return err
		}
		if invisible == 0 {
			return nil
		}
		if j.Log != nil {
			j.Log.Debug("waiting for transactions to become visible", "invisible", invisible, "xids", len(j.xids), "wait", wait)
		}
		if err := pause.For(ctx, wait); err != nil {
			return fmt.Errorf("%w: waiting for %d transactions to become visible: %w", ErrJoin, invisible, err)
		}
		wait = min(2*wait, 100*time.Millisecond)
	}
}

// Prepare runs the join once for no tokens, so that the first batch does
// not also pay for parsing and planning the statement.
func (j *Joiner) Prepare(ctx context.Context) error {
	j.ids, j.xids = j.ids[:0], j.xids[:0]
	clear(j.index)
	_, err := j.query(ctx, nil)
	return err
}

// query runs joinSQL once and returns how many of the batch's transactions
// its snapshot did not see.
func (j *Joiner) query(ctx context.Context, rows [][]TokenState) (invisible int64, err error) {
	for _, r := range j.index {
		rows[r.b][r.i] = TokenState{Skip: SkipDeleted}
	}
	// A buffer of its own (sized as the last): rows of an earlier join may
	// still be waiting to be encoded.
	j.arena = make([]byte, 0, cap(j.arena))
	// Binary results keep the per-row cost to a few byte copies.
	args := []any{pgx.QueryResultFormats{pgx.BinaryFormatCode}, j.ids, j.xids}
	sql := j.byIDs
	if len(j.ids) > 1 {
		if lo, hi := slices.Min(j.ids), slices.Max(j.ids); dense(lo, hi, len(j.ids)) {
			sql, args = j.byRange, []any{args[0], lo, j.xids, hi}
		}
	}
	res, err := j.conn.Query(ctx, sql, args...)
	if err != nil {
		return 0, j.explain(ctx, err)
	}
	defer res.Close()
	type span struct {
		row                          ref
		emailOff, emailEnd, loginEnd int
	}
	var spans [64]span
	pending := spans[:0]
	for res.Next() {
		v := res.RawValues()
		if len(v) != 8 || len(v[0]) != 4 || len(v[1]) != 8 {
			return 0, fmt.Errorf("%w: unexpected row shape", ErrJoin)
		}
		if binary.BigEndian.Uint32(v[0]) == 1 {
			invisible = int64(binary.BigEndian.Uint64(v[1]))
			continue
		}
		if len(v[2]) != 8 || len(v[3]) != 1 || len(v[4]) != 1 || len(v[5]) != 1 {
			return 0, fmt.Errorf("%w: unexpected row shape", ErrJoin)
		}
		at, ok := j.index[int64(binary.BigEndian.Uint64(v[1]))]
		if !ok {
			continue
		}
		r := &rows[at.b][at.i]
		r.ExpiresAt = int64(binary.BigEndian.Uint64(v[2]))
		switch {
		case v[3][0] != 0:
			r.Skip = SkipExpired
		case v[4][0] != 0:
			r.Skip = SkipConsumed
		case v[5][0] == 0:
			r.Skip = SkipStatus
		default:
			r.Skip = Publish
			off := len(j.arena)
			j.arena = append(j.arena, v[6]...)
			emailEnd := len(j.arena)
			j.arena = append(j.arena, v[7]...)
			// The arena may move while it grows; slices are taken at the end.
			pending = append(pending, span{at, off, emailEnd, len(j.arena)})
		}
	}
	if err := res.Err(); err != nil {
		return 0, j.explain(ctx, err)
	}
	for _, s := range pending {
		r := &rows[s.row.b][s.row.i]
		r.Email = j.arena[s.emailOff:s.emailEnd:s.emailEnd]
		r.Login = j.arena[s.emailEnd:s.loginEnd:s.loginEnd]
	}
	return invisible, nil
}

// ErrJoin marks errors of the join query (as opposed to the caller's own).
var ErrJoin = errors.New("join accounts")
