package replication

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mailroom/tailer/internal/pgname"
)

// PublicationError is a publication that does not carry the tokens table's
// inserts to the tailer.
type PublicationError struct {
	Publication string
	// Table is the tokens table it should carry, schema-qualified.
	Table string
	// Problem says what is wrong with it now.
	Problem string
	// Stale: it exists and is right, but the slot's decoding cannot see it
	// (it was dropped and made again while the slot had changes to
	// decode): only a new slot can.
	Stale bool
}

// Error says what is wrong; what to do about it is the command layer's to
// say (Stale: only a new slot helps).
func (e *PublicationError) Error() string {
	if e.Stale {
		return fmt.Sprintf("publication %s was dropped and made again while the slot had changes to decode: PostgreSQL decodes each change with the catalog as it was then, "+
			"so the slot cannot go past the drop (replication stream: publication does not exist)", e.Publication)
	}
	return fmt.Sprintf("publication %s %s, so the tailer does not see tokens being inserted", e.Publication, e.Problem)
}

// CheckPublication verifies that publication exists and carries every
// insert into db's schema's tokens table with the columns the tailer reads: the tokens table is in
// it, inserts are published, and no row filter or column list leaves rows
// or columns out. Without that pgoutput leaves token inserts out of the
// stream (or sends them without the columns a token needs), and the
// tailer would confirm WAL it never saw a token in.
//
// The check is the schema's own (tailer_publication_problem, of migration
// 10), which the publication guard runs too; a database without it is
// ErrOldSchema.
func CheckPublication(ctx context.Context, db SchemaConn, publication string) error {
	var problem *string
	err := db.QueryRow(ctx, `SELECT `+db.Schema.Name("tailer_publication_problem")+`($1, $2)`, publication, string(db.Schema)).Scan(&problem)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == pgerrcode.UndefinedFunction:
		return fmt.Errorf("check publication %s: %w", publication, ErrOldSchema)
	case err != nil:
		return fmt.Errorf("read publication %s: %w", publication, err)
	case problem != nil:
		return &PublicationError{Publication: publication, Table: db.Schema.Name("tokens"), Problem: *problem}
	}
	return nil
}

// SetPublication records which publication slot's tailer reads tokens
// through, for the publication guard. The caller holds the lease.
func SetPublication(ctx context.Context, db SchemaConn, slot, publication string) error {
	_, err := db.Exec(ctx, `UPDATE `+db.slots()+` SET publication = $2 WHERE slot = $1 AND publication IS DISTINCT FROM $2`, slot, publication)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == pgerrcode.UndefinedColumn {
		return fmt.Errorf("record slot %s's publication: %w", slot, ErrOldSchema)
	}
	if err != nil {
		return fmt.Errorf("record slot %s's publication: %w", slot, err)
	}
	return nil
}

// Guard is how the publication guard of a schema (migration 10's
// tailer_publication_guard) runs in the database, as an event trigger
// that runs that schema's function: each schema needs its own.
type Guard uint8

const (
	// GuardMissing: no event trigger runs the schema's guard (or it is
	// disabled).
	GuardMissing Guard = iota
	// GuardOriginOnly: it fires in ordinary sessions alone; a session
	// with session_replication_role = replica (a restore, a replication
	// tool) changes a publication unseen.
	GuardOriginOnly
	// GuardAlways: it fires in every session.
	GuardAlways
)

// GuardOf reports how schema's publication guard runs in this database.
func GuardOf(ctx context.Context, q Querier, schema pgname.Schema) (Guard, error) {
	var on, always bool
	err := q.QueryRow(ctx, `SELECT count(*) > 0, coalesce(bool_or(evtenabled = 'A'), false) FROM pg_event_trigger
		WHERE evtfoid = to_regprocedure($1) AND evtenabled IN ('A', 'O')`, schema.Name("tailer_publication_guard")+"()").Scan(&on, &always)
	if err != nil {
		return GuardMissing, fmt.Errorf("look up the publication guard: %w", err)
	}
	switch {
	case !on:
		return GuardMissing, nil
	case always:
		return GuardAlways, nil
	}
	return GuardOriginOnly, nil
}

// IsPublicationGone reports whether err is the walsender failing to find
// the publication while decoding: it was dropped, and perhaps made again
// since. PostgreSQL 15-17 end the stream with an error (SQLSTATE 42704);
// 18 warns (55000, "skipped loading publication") and leaves the change
// out, which the receiver turns into the same stop.
func IsPublicationGone(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case pgerrcode.UndefinedObject: // 15-17: an error that ends the stream
		return strings.Contains(pgErr.Message, "publication")
	case pgerrcode.ObjectNotInPrerequisiteState: // 18: a warning, and the change left out
		return strings.HasPrefix(pgErr.Message, "skipped loading publication")
	}
	return false
}
