package resync

import (
	"context"
	"github.com/mailroom/tailer/replication"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/migrations/migratetest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func TestCollectorCursor(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	bare, err := pgx.Connect(ctx, pgtest.Shared(t).CreateDB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer bare.Close(ctx)
	if c, err := CollectorCursor(ctx, replication.SchemaConn{Querier: bare, Schema: "public"}); c != nil || err != nil {
		t.Fatalf("CollectorCursor without jobs = %+v, %v", c, err)
	}

	db := migratetest.NewDB(t, pgtest.Shared(t))
	db.Exec(`CREATE TYPE job_type AS ENUM ('mailroom')`)
	db.Exec(`CREATE TABLE jobs (job_type job_type PRIMARY KEY, last_seq BIGINT)`)
	if c, err := CollectorCursor(ctx, replication.SchemaConn{Querier: db.Conn, Schema: "public"}); c != nil || err != nil {
		t.Fatalf("CollectorCursor without the mailroom row = %+v, %v", c, err)
	}
	db.Exec(`INSERT INTO jobs VALUES ('mailroom', NULL)`)
	if c, err := CollectorCursor(ctx, replication.SchemaConn{Querier: db.Conn, Schema: "public"}); c == nil || c.LastSeq != 0 || err != nil {
		t.Fatalf("CollectorCursor of a NULL cursor = %+v, %v", c, err)
	}
	db.Exec(`UPDATE jobs SET last_seq = 42`)
	before := time.Now().Unix()
	c, err := CollectorCursor(ctx, replication.SchemaConn{Querier: db.Conn, Schema: "public"})
	if err != nil || c == nil || c.LastSeq != 42 || c.At < before-60 || c.At > before+60 {
		t.Fatalf("CollectorCursor = %+v, %v; want 42 at about %d", c, err, before)
	}
}
