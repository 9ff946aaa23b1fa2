package replication

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mailroom/tailer/migrations"
	"github.com/mailroom/tailer/testutil/dbtest"
	"github.com/mailroom/tailer/testutil/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func TestValidateName(t *testing.T) {
	for name, ok := range map[string]bool{
		"mailroom":               true,
		"mailroom_2":             true,
		"_x":                     true,
		strings.Repeat("a", 63):  true,
		strings.Repeat("a", 64):  false,
		"":                       false,
		"Mailroom":               false,
		"2slot":                  false,
		"mail-room":              false,
		"mailroom; DROP TABLE x": false,
		"mail'room":              false,
	} {
		if err := ValidateName(name); (err == nil) != ok {
			t.Errorf("ValidateName(%q) = %v, want ok=%v", name, err, ok)
		}
	}
}

func TestSlots(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url, db := dbtest.New(t, pgtest.Shared(t))

	if _, err := EnsureSlot(ctx, db, "bad-name"); err == nil {
		t.Fatal("EnsureSlot accepted an invalid name")
	}
	for i, want := range []bool{true, false} {
		created, err := EnsureSlot(ctx, db, "s1")
		if err != nil || created != want {
			t.Fatalf("EnsureSlot #%d = %v, %v; want created=%v", i, created, err, want)
		}
	}
	if _, err := db.Exec(ctx, `SELECT pg_create_logical_replication_slot('other_plugin', 'test_decoding')`); err != nil {
		t.Fatal(err)
	}
	if _, err := EnsureSlot(ctx, db, "other_plugin"); err == nil || !strings.Contains(err.Error(), "test_decoding") {
		t.Fatalf("EnsureSlot on a test_decoding slot: %v", err)
	}
	// A slot of the same name in another database is not ours.
	otherDB, err := pgx.Connect(ctx, pgtest.Shared(t).CreateDB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer otherDB.Close(ctx)
	if _, err := EnsureSlot(ctx, otherDB, "s1"); err == nil || !strings.Contains(err.Error(), "belongs to database") {
		t.Fatalf("EnsureSlot from another database: %v", err)
	}
	s, err := Slot(ctx, db, "s1")
	if err != nil || s.Active || s.ConfirmedFlush == 0 || s.LagBytes() < 0 {
		t.Fatalf("Slot = %+v, %v", s, err)
	}
	if _, err := Slot(ctx, db, "nope"); err == nil {
		t.Fatal("Slot of a missing slot succeeded")
	}

	// A second stream on a slot in use is told so (SQLSTATE 55006).
	opts := Options{Slot: "s1", Publication: migrations.Publication}
	c1, err := Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close(ctx)
	if _, err := Start(ctx, c1, opts); err != nil {
		t.Fatal(err)
	}
	c2, err := Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close(ctx)
	_, err = Start(ctx, c2, opts)
	if !IsSlotInUse(err) {
		t.Fatalf("second Start: %v, want slot in use", err)
	}
	if err := DropSlot(ctx, db, "other_plugin"); err != nil {
		t.Fatal(err)
	}
}
