package daemon

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mailroom/tailer/cmd/internal/config"
	"github.com/mailroom/tailer/publish"
	"github.com/mailroom/tailer/publish/relay"
	"github.com/mailroom/tailer/replication"
)

// What each error that ends a session means to the relay: the mapping
// from IO errors to facts is this table, and nowhere else. A slip (a
// PubAck's "duplicate" for a batch gone taken for a reused id, a NATS
// failure taken for PostgreSQL's) changes what the relay decides: a
// restart that skips batches, or the wrong side reconnected.
func TestEndKinds(t *testing.T) {
	wrapped := func(err error) error { return fmt.Errorf("session: %w", err) }
	for _, tc := range []struct {
		name                   string
		err                    error
		stopped, startupConfig bool
		want                   relay.EndKind
	}{
		{"clean end", nil, false, false, relay.EndStopped},
		{"stopped", natsErr(errors.New("connection closed")), true, false, relay.EndStopped},
		{"stopped with tokens unpublished", &stopError{errors.New("context canceled")}, true, false, relay.EndStoppedUnpublished},
		{"a startup configuration", pgErr(errors.New("password authentication failed")), false, true, relay.EndStartupConfig},
		{"a setting", wrapped(&config.Error{Var: "MAILROOM_SLOT", Err: errors.New("bad")}), false, false, relay.EndConfig},
		{"the stream's configuration", natsErr(&publish.StreamConfigError{Stream: "MAILROOM", Err: errors.New("subjects")}), false, false, relay.EndStreamConfig},
		{"the lease held", pgErr(&replication.LeaseHeldError{Slot: "mailroom"}), false, false, relay.EndLeaseHeld},
		{"the slot in use", pgErr(&pgconn.PgError{Code: pgerrcode.ObjectInUse}), false, false, relay.EndLeaseHeld},
		{"a reused id", natsErr(wrapped(publish.ErrReusedID)), false, false, relay.EndReusedID},
		{"a batch gone", natsErr(wrapped(publish.ErrDuplicateGone)), false, false, relay.EndBatchGone},
		{"NATS", natsErr(errors.New("no responders")), false, false, relay.EndNATS},
		{"PostgreSQL", pgErr(errors.New("connection reset")), false, false, relay.EndPostgres},
		{"unclassified", errors.New("something"), false, false, relay.EndPostgres},
	} {
		if got := endKind(tc.err, tc.stopped, tc.startupConfig); got != tc.want {
			t.Errorf("%s: endKind(%v) = %d, want %d", tc.name, tc.err, got, tc.want)
		}
	}
}
