package resync

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mailroom/tailer/testutil/pgtest"
	"github.com/mailroom/tailer/testutil/tailertest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func TestLoadAndCollectorCursor(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// Before the migrations that made tailer_resync: no resync, no
	// collector.
	bare, err := pgx.Connect(ctx, pgtest.Shared(t).CreateDB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer bare.Close(ctx)
	if st, err := Load(ctx, bare, "mailroom"); err != nil || st.Exists {
		t.Fatalf("Load without the table = %+v, %v", st, err)
	}
	if _, ok, err := CollectorCursor(ctx, bare); ok || err != nil {
		t.Fatalf("CollectorCursor without jobs = %v, %v", ok, err)
	}

	db := tailertest.NewDB(t, pgtest.Shared(t))
	db.Exec(`CREATE TYPE job_type AS ENUM ('mailroom')`)
	db.Exec(`CREATE TABLE jobs (job_type job_type PRIMARY KEY, last_seq BIGINT)`)
	if _, ok, err := CollectorCursor(ctx, db.Conn); ok || err != nil {
		t.Fatalf("CollectorCursor without the mailroom row = %v, %v", ok, err)
	}
	db.Exec(`INSERT INTO jobs VALUES ('mailroom', NULL)`)
	if seq, ok, err := CollectorCursor(ctx, db.Conn); seq != 0 || !ok || err != nil {
		t.Fatalf("CollectorCursor of a NULL cursor = %d, %v, %v", seq, ok, err)
	}
	db.Exec(`UPDATE jobs SET last_seq = 42`)
	if seq, ok, err := CollectorCursor(ctx, db.Conn); seq != 42 || !ok || err != nil {
		t.Fatalf("CollectorCursor = %d, %v, %v", seq, ok, err)
	}

	for _, tc := range []struct {
		sql           string
		pending, done bool
		afterID, seq  int64
	}{
		{`INSERT INTO tailer_resync (slot, after_id) VALUES ('mailroom', 42)`, true, false, 42, 0},
		{`UPDATE tailer_resync SET done_at = now(), stream_seq = 7`, false, true, 42, 7},
	} {
		db.Exec(tc.sql)
		st, err := Load(ctx, db.Conn, "mailroom")
		if err != nil || st.Pending() != tc.pending || st.Done != tc.done || st.AfterID == nil || *st.AfterID != tc.afterID || st.StreamSeq != uint64(tc.seq) {
			t.Fatalf("after %s: Load = %+v, %v", tc.sql, st, err)
		}
	}
	if st, err := Load(ctx, db.Conn, "other"); err != nil || st.Exists {
		t.Fatalf("Load of another slot = %+v, %v", st, err)
	}
}
