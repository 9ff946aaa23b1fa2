package replication

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/migrations/migratetest"
)

func TestWantFailover(t *testing.T) {
	for _, tc := range []struct {
		mode  string
		major int
		want  bool
		err   bool
	}{
		{FailoverAuto, 15, false, false},
		{FailoverAuto, 16, false, false},
		{FailoverAuto, 17, true, false},
		{FailoverAuto, 18, true, false},
		{FailoverOn, 16, false, true},
		{FailoverOn, 17, true, false},
		{FailoverOff, 16, false, false},
		{FailoverOff, 18, false, false},
	} {
		got, err := WantFailover(tc.mode, tc.major)
		var fe *FailoverError
		if got != tc.want || (err != nil) != tc.err || (err != nil && (!errors.As(err, &fe) || !strings.Contains(err.Error(), "PostgreSQL 17"))) {
			t.Errorf("WantFailover(%s, %d) = %v, %v", tc.mode, tc.major, got, err)
		}
	}
}

// On the server the tests run (TAILER_PG_VERSION), a slot is made a
// failover slot, and an existing one changed, where the server has them.
func TestFailoverSlots(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := migratetest.NewDB(t, pgtest.Shared(t))
	major, err := ServerMajor(ctx, db.Conn)
	if err != nil {
		t.Fatal(err)
	}
	if major < FailoverMinVersion {
		if _, err := WantFailover(FailoverOn, major); err == nil {
			t.Fatalf("failover slots asked of PostgreSQL %d", major)
		}
		t.Skipf("PostgreSQL %d has no failover slots (make test-pg VERSION=17 runs this)", major)
	}
	if _, err := CreateSlot(ctx, SchemaConn{Querier: db.Conn, Schema: "public"}, "fo_made", "test", false, true); err != nil {
		t.Fatal(err)
	}
	defer db.Exec(`SELECT pg_drop_replication_slot('fo_made')`)
	if s, err := Slot(ctx, db.Conn, "fo_made"); err != nil || !s.Failover || s.Synced {
		t.Fatalf("slot made with failover: %+v, %v", s, err)
	}
	rc, err := Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close(context.Background())
	snap, err := CreateSlotWithSnapshot(ctx, rc, "fo_snap", true)
	if err != nil || snap.Name == "" || snap.ConsistentPoint == 0 {
		t.Fatalf("slot with a snapshot and failover: %+v, %v", snap, err)
	}
	rc.Close(ctx)
	defer db.Exec(`SELECT pg_drop_replication_slot('fo_snap')`)
	if s, err := Slot(ctx, db.Conn, "fo_snap"); err != nil || !s.Failover {
		t.Fatalf("slot with a snapshot made with failover: %+v, %v", s, err)
	}
	if rc, err = Connect(ctx, db.URL); err != nil {
		t.Fatal(err)
	}
	defer rc.Close(context.Background())
	for _, on := range []bool{false, true} {
		if err := SetFailover(ctx, rc, "fo_made", on); err != nil {
			t.Fatal(err)
		}
		if s, _ := Slot(ctx, db.Conn, "fo_made"); s.Failover != on {
			t.Fatalf("after SetFailover(%v): failover %v", on, s.Failover)
		}
	}
}

func TestIsPublicationGone(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&pgconn.PgError{Code: "42704", Message: `publication "mailroom" does not exist`}, true},
		{&pgconn.PgError{Code: "55000", Message: `skipped loading publication "mailroom"`}, true},
		{&pgconn.PgError{Code: "42704", Message: `relation "tokens" does not exist`}, false},
		{&pgconn.PgError{Code: "55000", Message: `replication slot "mailroom" is active for PID 7`}, false},
		{errors.New("publication"), false},
	} {
		if got := IsPublicationGone(fmt.Errorf("replication stream: %w", tc.err)); got != tc.want {
			t.Errorf("IsPublicationGone(%v) = %v", tc.err, got)
		}
	}
}

func TestParseTimelineHistory(t *testing.T) {
	got, err := ParseTimelineHistory("1\t0/3000158\tno recovery target specified\n\n# comment\n2\t0/5000000\tat restore point \"x\"\n")
	if err != nil || len(got) != 2 || got[1] != 0x3000158 || got[2] != 0x5000000 {
		t.Fatalf("got %v, %v", got, err)
	}
	for _, bad := range []string{"x\t0/1\treason", "1\tnot-an-lsn", "1", "0\t0/1\tr"} {
		if _, err := ParseTimelineHistory(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// FuzzParseTimelineHistory: no input panics, and what parses is a
// timeline above 0 for every entry.
func FuzzParseTimelineHistory(f *testing.F) {
	for _, s := range []string{"1\t0/3000158\tno recovery target specified\n", "# only a comment", "", "2\tFF/FFFFFFFF\tx\n1\t0/0\ty"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseTimelineHistory(s)
		if err != nil {
			return
		}
		for tl := range got {
			if tl < 1 {
				t.Fatalf("timeline %d from %q", tl, s)
			}
		}
	})
}
