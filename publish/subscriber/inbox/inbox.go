package inbox

import (
	"context"
	_ "embed"
	"errors"
	"fmt"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mailroom/tailer/internal/pgname"
	"github.com/mailroom/tailer/publish/subscriber"
)

// Meta says where a message is on the stream, and which durable consumer
// stores it ("" for a service's own).
type Meta struct {
	Stream  string
	Seq     uint64
	Durable string
}

// Table is where a DB stores tokens: StoreAll stores them in tx, adding
// nothing for a token it holds already, and reports how many each unit
// added; Position says where a durable consumer got to: the last message
// it stored a token of (ok is false when it stored none); Holds, whether
// it stored a token of a message, by its place and id. Inbox (rows of
// mailroom_inbox) and Jobs (River's job table) are the two of tailer
// subscribe --into.
type Table interface {
	StoreAll(ctx context.Context, tx pgx.Tx, us []*subscriber.Unit) (added []int, err error)
	Position(ctx context.Context, pool *pgxpool.Pool, stream, durable string) (at subscriber.Stored, ok bool, err error)
	Holds(ctx context.Context, pool *pgxpool.Pool, stream, durable string, seq uint64, batchID string) (bool, error)
}

// Inbox stores tokens as rows of mailroom_inbox in Schema (Migrate makes
// it); "" is public.
type Inbox struct {
	Schema pgname.Schema
}

// table is the inbox table, by its schema.
func (i Inbox) table() pgx.Identifier {
	return pgx.Identifier{string(orPublic(i.Schema)), "mailroom_inbox"}
}

// orPublic is s, or public for "".
func orPublic(s pgname.Schema) pgname.Schema {
	if s == "" {
		return pgname.Public
	}
	return s
}

// inboxColumns are the columns Inbox fills, in its rows' order.
var inboxColumns = []string{"token_key", "token_id", "action", "email", "login", "token", "code", "expires_at", "key_id", "batch_id", "line", "stream", "stream_seq", "durable", "traceparent"}

// Store inserts b's tokens, those already there (by token key) left alone.
//
// It first copies them in (COPY) in a savepoint: in a drain that takes the
// database less than the insert that passes over rows already there,
// which COPY cannot do (a unique conflict fails it whole). A message whose
// tokens are there in part or in full (delivered again) is rolled back to
// the savepoint and takes that insert.
func (i Inbox) Store(ctx context.Context, tx pgx.Tx, m Meta, b *subscriber.Decoded) (int, error) {
	added, err := i.StoreAll(ctx, tx, b.Units(m.Stream, m.Seq, m.Durable))
	return sum(added), err
}

// StoreAll is Store for units of several messages, in one COPY when none
// of their tokens is there.
func (i Inbox) StoreAll(ctx context.Context, tx pgx.Tx, us []*subscriber.Unit) ([]int, error) {
	added := make([]int, len(us))
	err := i.copyNew(ctx, tx, us)
	if err == nil {
		for i, u := range us {
			added[i] = len(u.Tokens)
		}
		return added, nil
	}
	if !errors.Is(err, errStoredBefore) {
		return nil, err
	}
	return i.insertNew(ctx, tx, us)
}

// sum adds ns up.
func sum(ns []int) int {
	n := 0
	for _, k := range ns {
		n += k
	}
	return n
}

// copyNew copies the tokens of us into mailroom_inbox in a savepoint of
// tx, rolled back when a row of theirs is there (errStoredBefore).
func (i Inbox) copyNew(ctx context.Context, tx pgx.Tx, us []*subscriber.Unit) error {
	var rows [][]any
	for _, u := range us {
		for _, t := range u.Tokens {
			var expires any
			if t.ExpiresAt != 0 {
				expires = t.ExpiresAt
			}
			rows = append(rows, []any{t.Key, t.ID, t.Action, t.Email, t.Login, t.Token, t.Code, expires, nullIfEmpty(u.KeyID), u.ID,
				int32(u.Line), u.Stream, int64(u.Seq), nullIfEmpty(u.Durable), nullIfEmpty(t.Traceparent)})
		}
	}
	_, err := inSavepoint(ctx, tx, "mailroom_inbox_pkey", func(sp pgx.Tx) (int, error) {
		n, err := sp.CopyFrom(ctx, i.table(), inboxColumns, pgx.CopyFromRows(rows))
		return int(n), err
	})
	return err
}

// nullIfEmpty is s, or SQL NULL for "".
func nullIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// errStoredBefore: a row or job of the tokens copied is stored already.
var errStoredBefore = errors.New("a token of these is stored already")

// inSavepoint runs insert in a savepoint of tx, rolled back when it
// violates the unique constraint constraint (errStoredBefore).
func inSavepoint(ctx context.Context, tx pgx.Tx, constraint string, insert func(pgx.Tx) (int, error)) (int, error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("savepoint: %w", err)
	}
	n, err := insert(sp)
	if err == nil {
		if err := sp.Commit(ctx); err != nil {
			return 0, fmt.Errorf("release savepoint: %w", err)
		}
		return n, nil
	}
	if rerr := sp.Rollback(ctx); rerr != nil {
		return 0, fmt.Errorf("roll back to savepoint: %w (after %w)", rerr, err)
	}
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == pgerrcode.UniqueViolation && pgErr.ConstraintName == constraint {
		return 0, errStoredBefore
	}
	return 0, err
}

// insertNew inserts the tokens of us, those already there (by token key)
// left alone, and reports how many of each unit it added.
func (i Inbox) insertNew(ctx context.Context, tx pgx.Tx, us []*subscriber.Unit) ([]int, error) {
	var (
		keys, actions, emails, logins, toks, codes, traces []string
		keyIDs, batchIDs, streams, durables                []string
		ids, seqs                                          []int64
		expires                                            []*int64
		lines                                              []int32
	)
	unitOf := map[string]int{}
	for i, u := range us {
		for _, t := range u.Tokens {
			keys, ids, actions, emails, logins = append(keys, t.Key), append(ids, t.ID), append(actions, t.Action), append(emails, t.Email), append(logins, t.Login)
			toks, codes, traces = append(toks, t.Token), append(codes, t.Code), append(traces, t.Traceparent)
			var exp *int64
			if t.ExpiresAt != 0 {
				exp = &t.ExpiresAt
			}
			expires, lines = append(expires, exp), append(lines, int32(u.Line))
			keyIDs, batchIDs, streams, seqs, durables = append(keyIDs, u.KeyID), append(batchIDs, u.ID), append(streams, u.Stream), append(seqs, int64(u.Seq)), append(durables, u.Durable)
			if _, ok := unitOf[t.Key]; !ok {
				// A key twice among them: the first is stored.
				unitOf[t.Key] = i
			}
		}
	}
	rows, err := tx.Query(ctx, `
		INSERT INTO `+i.table().Sanitize()+` (token_key, token_id, action, email, login, token, code, expires_at, key_id, batch_id, line, stream, stream_seq, durable, traceparent)
		SELECT t.key, t.id, t.action, t.email, t.login, t.token, t.code, t.expires_at, nullif(t.key_id, ''), t.batch_id, t.line, t.stream, t.seq, nullif(t.durable, ''), nullif(t.trace, '')
		FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::bigint[], $9::int[], $10::text[],
			$11::text[], $12::text[], $13::text[], $14::bigint[], $15::text[])
			AS t(key, id, action, email, login, token, code, expires_at, line, trace, key_id, batch_id, stream, seq, durable)
		ON CONFLICT (token_key) DO NOTHING
		RETURNING token_key`,
		keys, ids, actions, emails, logins, toks, codes, expires, lines, traces, keyIDs, batchIDs, streams, seqs, durables)
	if err != nil {
		return nil, fmt.Errorf("insert into mailroom_inbox: %w", err)
	}
	added := make([]int, len(us))
	inserted, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("insert into mailroom_inbox: %w", err)
	}
	for _, k := range inserted {
		added[unitOf[k]]++
	}
	return added, nil
}

// Position is the message of the highest stream sequence a token of
// which durable stored in mailroom_inbox.
func (i Inbox) Position(ctx context.Context, pool *pgxpool.Pool, stream, durable string) (subscriber.Stored, bool, error) {
	return position(ctx, pool, `SELECT stream_seq, batch_id, token_key FROM `+i.table().Sanitize()+`
		WHERE stream = $1 AND durable = $2 ORDER BY stream_seq DESC LIMIT 1`, stream, durable)
}

// Holds reports whether durable stored a token of the message at seq of
// stream with id batchID in mailroom_inbox.
func (i Inbox) Holds(ctx context.Context, pool *pgxpool.Pool, stream, durable string, seq uint64, batchID string) (bool, error) {
	return holds(ctx, pool, `SELECT EXISTS (SELECT 1 FROM `+i.table().Sanitize()+`
		WHERE stream = $1 AND durable = $2 AND stream_seq = $3 AND batch_id = $4)`, stream, durable, seq, batchID)
}

// holds runs query, an EXISTS over stream, durable, seq and batchID.
func holds(ctx context.Context, pool *pgxpool.Pool, query, stream, durable string, seq uint64, batchID string) (bool, error) {
	var there bool
	if err := pool.QueryRow(ctx, query, stream, durable, int64(seq), batchID).Scan(&there); err != nil {
		return false, fmt.Errorf("whether the durable stored message %d: %w", seq, err)
	}
	return there, nil
}

func position(ctx context.Context, pool *pgxpool.Pool, query, stream, durable string) (subscriber.Stored, bool, error) {
	var (
		seq int64
		at  subscriber.Stored
	)
	err := pool.QueryRow(ctx, query, stream, durable).Scan(&seq, &at.BatchID, &at.Key)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return subscriber.Stored{}, false, nil
	case err != nil:
		return subscriber.Stored{}, false, fmt.Errorf("where the consumer got to: %w", err)
	}
	at.Seq = uint64(seq)
	return at, true, nil
}

//go:embed schema.sql
var schema string

// Migrate makes the inbox table in schema ("" is public; made if
// missing) of the database at pool, if it is not there, in one
// transaction (a process killed half way leaves nothing half made) under
// an advisory lock (subscribers started together make it once). The
// statements of schema.sql name no schema: the transaction searches the
// one it migrates alone.
func Migrate(ctx context.Context, pool *pgxpool.Pool, s pgname.Schema) error {
	s = orPublic(s)
	if err := ensureSchema(ctx, pool, s); err != nil {
		return err
	}
	var err error
	for try := 0; try < migrateTries; try++ {
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('mailroom_inbox migration ' || $1))`, string(s)); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `SELECT set_config('search_path', $1, true)`, s.Ident()+", pg_temp"); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, schema)
			return err
		})
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != pgerrcode.DeadlockDetected {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("make the inbox table: %w", err)
	}
	return nil
}

// migrateTries bounds the tries of a migration that PostgreSQL ended as a
// deadlock: its ALTER TABLE waits on the rows other subscribers of the
// durable store meanwhile, which may wait on the lock it took before (a
// subscriber restarted with --migrate beside two others exited 1 so).
const migrateTries = 5

// ensureSchema makes schema s if it does not exist. It looks first: CREATE
// SCHEMA IF NOT EXISTS needs the right to create schemas in the database
// even when there is nothing to create.
func ensureSchema(ctx context.Context, pool *pgxpool.Pool, s pgname.Schema) error {
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)`, string(s)).Scan(&exists); err != nil {
		return fmt.Errorf("look up schema %s: %w", s.Ident(), err)
	}
	if exists {
		return nil
	}
	if _, err := pool.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+s.Ident()); err != nil {
		return fmt.Errorf("create schema %s (MAILROOM_INBOX_SCHEMA): %w", s.Ident(), err)
	}
	return nil
}
