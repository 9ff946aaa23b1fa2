package inbox

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"

	"github.com/mailroom/tailer/publish/wire"
)

//go:embed stored_through.sql
var storedThroughSchema string

// StoredThroughTable is the table where the loop keeps how far each
// durable's messages are stored without a hole (stored_through.sql).
const StoredThroughTable = "mailroom_stored_through"

// MigrateStoredThrough makes StoredThroughTable in the database at pool
// if it is not there: Migrate and MigrateRiver do; a service that runs a
// Consumer with a sink of its own runs it once.
func MigrateStoredThrough(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := pool.Exec(ctx, storedThroughSchema); err != nil {
		return fmt.Errorf("make table %s: %w", StoredThroughTable, err)
	}
	return nil
}

// storedThrough is where durable's messages on stream are stored through
// (StoredThroughTable): found is false when the table holds no row of the
// durable, and the position is known (at.Seq > 0) once a message is.
func storedThrough(ctx context.Context, pool *pgxpool.Pool, stream, durable string) (at Stored, found bool, err error) {
	return position(ctx, pool, `SELECT stream_seq, batch_id, token_key FROM `+StoredThroughTable+`
		WHERE stream = $1 AND durable = $2 ORDER BY stream_seq DESC LIMIT 1`, stream, durable)
}

// adoptPosition starts durable's row in StoredThroughTable when it has
// none: at the newest message the sink holds a token of (legacy), the
// position of a database written before the table, whose commits were
// in order; at sequence 0 (none yet) otherwise. From then on the table
// alone says where the durable is: a sink's newest message need not be
// one every message before which is stored.
func adoptPosition(ctx context.Context, pool *pgxpool.Pool, stream, durable string, legacy func() (Stored, bool, error)) error {
	_, found, err := storedThrough(ctx, pool, stream, durable)
	if err != nil || found {
		return err
	}
	var at Stored
	if legacy != nil {
		if at, _, err = legacy(); err != nil {
			return err
		}
	}
	_, err = pool.Exec(ctx, `INSERT INTO `+StoredThroughTable+` (stream, durable, stream_seq, batch_id, token_key) VALUES ($1, $2, $3, $4, $5)`,
		stream, durable, int64(at.Seq), at.BatchID, at.Key)
	if err != nil {
		return fmt.Errorf("start the row of %s in %s: %w", durable, StoredThroughTable, err)
	}
	return nil
}

// writeThrough records, in tx, that r and every message delivered before
// it are stored.
func writeThrough(ctx context.Context, tx pgx.Tx, r *received) error {
	h := r.msg.Headers()
	key, _, _ := strings.Cut(h.Get(wire.HeaderTokenKeys), ",")
	_, err := tx.Exec(ctx, `INSERT INTO `+StoredThroughTable+` (stream, durable, stream_seq, batch_id, token_key) VALUES ($1, $2, $3, $4, $5)`,
		r.m.Stream, r.m.Durable, int64(r.m.Seq), h.Get(nats.MsgIdHdr), key)
	return err
}

// pruneThrough removes the rows below the newest one at or before seq:
// each says no more than it.
func pruneThrough(ctx context.Context, pool *pgxpool.Pool, stream, durable string, seq uint64) error {
	_, err := pool.Exec(ctx, `DELETE FROM `+StoredThroughTable+` WHERE stream = $1 AND durable = $2 AND stream_seq < $3`, stream, durable, int64(seq))
	if err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("prune %s: %w", StoredThroughTable, err)
	}
	return nil
}
