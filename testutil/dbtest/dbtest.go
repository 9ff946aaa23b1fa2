// Package dbtest gives tests a migrated mailroom database of their own on a
// pgtest server. (It is apart from pgtest because the migrations' own tests
// use pgtest.)
package dbtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mailroom/tailer/migrations"
	"github.com/mailroom/tailer/testutil/pgtest"
)

// New creates a database on pg, applies the migrations and returns its URL
// and a connection closed when the test ends.
func New(tb testing.TB, pg *pgtest.Server) (string, *pgx.Conn) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := pg.CreateDB(tb)
	if err := migrations.Up(ctx, url); err != nil {
		tb.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { conn.Close(context.Background()) })
	return url, conn
}
