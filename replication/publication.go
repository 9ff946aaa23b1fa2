package replication

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// PublicationError is a publication that does not carry the tokens table's
// inserts to the tailer.
type PublicationError struct {
	Publication string
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

// CheckPublication verifies that publication exists and publishes inserts
// into tokens (the table the search path finds, as the tailer's queries
// do). Without them pgoutput leaves token inserts out of the stream, and
// the tailer would confirm WAL it never saw a token in.
//
// It reads the publication catalogs themselves, in the statement's one
// snapshot, rather than pg_publication_tables: that view looks each
// publication up again by name in the catalog snapshot of the moment, so a
// check running as a publication is dropped and made again in one
// transaction found the old row and no tables for it, and reported a
// problem that never was. The rules are pg_publication_tables': a partition
// is published under its own name, through a table or schema it or an
// ancestor is in, unless the publication publishes through the root.
func CheckPublication(ctx context.Context, q Querier, publication string) error {
	var insert, tokens bool
	err := q.QueryRow(ctx, `
		SELECT p.pubinsert, coalesce(t.oid IS NOT NULL AND NOT (p.pubviaroot AND t.relispartition) AND (
			p.puballtables
			OR EXISTS (SELECT FROM pg_publication_rel r
				WHERE r.prpubid = p.oid AND r.prrelid IN (SELECT t.oid UNION SELECT relid FROM pg_partition_ancestors(t.oid)))
			OR EXISTS (SELECT FROM pg_publication_namespace n JOIN pg_class c ON c.relnamespace = n.pnnspid
				WHERE n.pnpubid = p.oid AND c.oid IN (SELECT t.oid UNION SELECT relid FROM pg_partition_ancestors(t.oid)))), false)
		FROM pg_publication p LEFT JOIN pg_class t ON t.oid = to_regclass('tokens')
		WHERE p.pubname = $1`, publication).Scan(&insert, &tokens)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return &PublicationError{Publication: publication, Problem: "does not exist"}
	case err != nil:
		return fmt.Errorf("read publication %s: %w", publication, err)
	case !tokens:
		return &PublicationError{Publication: publication, Problem: "does not include the tokens table"}
	case !insert:
		return &PublicationError{Publication: publication, Problem: "does not publish inserts (publish = 'insert')"}
	}
	return nil
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
