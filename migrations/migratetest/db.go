package migratetest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/mailroom/tailer/internal/pgname"
	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/migrations"
)

// DB is a migrated mailroom database of one test's own. Its methods fail the
// test on error.
type DB struct {
	URL  string
	Conn *pgx.Conn

	tb  testing.TB
	ctx context.Context
}

// NewDB creates a migrated database on pg: a copy of a template database
// migrated once per server. The connection is closed when the test ends.
func NewDB(tb testing.TB, pg *pgtest.Server) *DB {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The migrations grant the tailer role its privileges when the role
	// exists (a cluster-wide object), so a template is made for each case.
	template := "tailer_migrated"
	if pg.RoleExists(tb, "tailer") {
		template += "_with_role"
	}
	url := pg.CreateDBFromTemplate(tb, template, migrate)

	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { conn.Close(context.Background()) })
	return &DB{URL: url, Conn: conn, tb: tb, ctx: context.Background()}
}

// migrate migrates the database at url as `tailer migrate` does as a
// superuser: the publication guard included.
func migrate(ctx context.Context, url string) error {
	if err := migrations.Up(ctx, url, pgname.Public); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = migrations.InstallGuard(ctx, conn, pgname.Public)
	return err
}

// ExistingDB is a database the test set up itself: URL is what the tailer
// is given, and conn what the test's own statements run on (the two may be
// different roles).
func ExistingDB(tb testing.TB, url string, conn *pgx.Conn) *DB {
	return &DB{URL: url, Conn: conn, tb: tb, ctx: context.Background()}
}

// Exec runs sql.
func (d *DB) Exec(sql string, args ...any) {
	d.tb.Helper()
	pgtest.Exec(d.tb, d.ctx, d.Conn, sql, args...)
}

// WalLSN returns pg_current_wal_lsn().
func (d *DB) WalLSN() pglogrepl.LSN {
	d.tb.Helper()
	return pgtest.WalLSN(d.tb, d.ctx, d.Conn)
}

// ConfirmedLSN returns the slot's confirmed_flush_lsn, read from
// pg_replication_slots directly rather than through the code under test.
func (d *DB) ConfirmedLSN(slot string) pglogrepl.LSN {
	d.tb.Helper()
	var s string
	if err := d.Conn.QueryRow(d.ctx, `SELECT coalesce(confirmed_flush_lsn, '0/0')::text FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&s); err != nil {
		d.tb.Fatalf("slot %s: %v", slot, err)
	}
	lsn, err := pglogrepl.ParseLSN(s)
	if err != nil {
		d.tb.Fatal(err)
	}
	return lsn
}

// WaitConfirmed waits until the slot is confirmed at or past lsn.
func (d *DB) WaitConfirmed(slot string, lsn pglogrepl.LSN, within time.Duration) {
	d.tb.Helper()
	deadline := time.Now().Add(within)
	for {
		got := d.ConfirmedLSN(slot)
		if got >= lsn {
			return
		}
		if time.Now().After(deadline) {
			d.tb.Fatalf("slot %s confirmed at %s, still before %s after %s", slot, got, lsn, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
