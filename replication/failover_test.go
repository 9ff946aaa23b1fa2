package replication

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mailroom/tailer/testutil/pgtest"
	"github.com/mailroom/tailer/testutil/tailertest"
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
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := tailertest.NewDB(t, pgtest.Shared(t))
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
	if _, err := CreateSlot(ctx, db.Conn, "fo_made", "test", false, true); err != nil {
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
