package replication

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/migrations/migratetest"
)

// A slot's record through its life: made by migrate (not yet on the
// stream), bound by the first run, resynced (a new incarnation, pending
// until finished, keeping the collector's cutover), and a resync that was
// superseded cannot say it finished.
func TestRecord(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	bare, err := pgx.Connect(ctx, pgtest.Shared(t).CreateDB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer bare.Close(ctx)
	if _, err := LoadRecord(ctx, SchemaConn{Querier: bare, Schema: "public"}, "s"); !errors.Is(err, ErrNoRecordTable) {
		t.Fatalf("LoadRecord without the table: %v", err)
	}
	if err := SetResyncNeeded(ctx, SchemaConn{Querier: bare, Schema: "public"}, "s"); err != nil {
		t.Fatalf("SetResyncNeeded without the table (nothing to mark): %v", err)
	}
	// The table as migration 5 made it, before resync_needed.
	if _, err := bare.Exec(ctx, `CREATE TABLE tailer_slot (slot text PRIMARY KEY, incarnation text NOT NULL, created_by text NOT NULL,
		created_at timestamptz NOT NULL DEFAULT now(), resync_pending boolean NOT NULL DEFAULT false, consistent_point pg_lsn, stream_seq bigint,
		legacy boolean NOT NULL DEFAULT false, collector_last_seq bigint, collector_cutover bigint, blocked text, blocked_at timestamptz)`); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadRecord(ctx, SchemaConn{Querier: bare, Schema: "public"}, "s"); !errors.Is(err, ErrOldRecordTable) {
		t.Fatalf("LoadRecord from a schema before resync_needed: %v", err)
	}
	if err := SetResyncNeeded(ctx, SchemaConn{Querier: bare, Schema: "public"}, "s"); !errors.Is(err, ErrOldRecordTable) {
		t.Fatalf("SetResyncNeeded on a schema before resync_needed: %v", err)
	}

	db := migratetest.NewDB(t, pgtest.Shared(t))
	if r, err := LoadRecord(ctx, SchemaConn{Querier: db.Conn, Schema: "public"}, "s"); err != nil || r.Exists {
		t.Fatalf("LoadRecord of a slot never made = %+v, %v", r, err)
	}
	made, err := CreateSlot(ctx, SchemaConn{Querier: db.Conn, Schema: "public"}, "s", "tailer migrate", false, false)
	if err != nil {
		t.Fatal(err)
	}
	r, err := LoadRecord(ctx, SchemaConn{Querier: db.Conn, Schema: "public"}, "s")
	if err != nil || !r.Exists || r.Incarnation != made.Incarnation || r.Bound || r.ResyncPending || r.CreatedBy != "tailer migrate" || r.Legacy {
		t.Fatalf("after CreateSlot: %+v, %v", r, err)
	}
	if err := Bind(ctx, SchemaConn{Querier: db.Conn, Schema: "public"}, &r, 0); err != nil || !r.Bound {
		t.Fatalf("Bind = %v", err)
	}
	if err := Bind(ctx, SchemaConn{Querier: db.Conn, Schema: "public"}, &r, 5); err == nil {
		t.Fatal("a bound record was bound again")
	}
	if err := SetResyncNeeded(ctx, SchemaConn{Querier: db.Conn, Schema: "public"}, "s"); err != nil {
		t.Fatal(err)
	}
	if r, err = LoadRecord(ctx, SchemaConn{Querier: db.Conn, Schema: "public"}, "s"); err != nil || !r.ResyncNeeded {
		t.Fatalf("after SetResyncNeeded: %+v, %v", r, err)
	}

	cut := &Cutover{LastSeq: 42, At: 1700000000}
	a, err := BeginResync(ctx, SchemaConn{Querier: db.Conn, Schema: "public"}, "s", "tailer resync", cut)
	if err != nil || a.Incarnation == made.Incarnation || !a.ResyncPending {
		t.Fatalf("BeginResync = %+v, %v", a, err)
	}
	if r, err = LoadRecord(ctx, SchemaConn{Querier: db.Conn, Schema: "public"}, "s"); err != nil || r.ResyncNeeded {
		t.Fatalf("a resync's new incarnation still needs a resync: %+v, %v", r, err)
	}
	// A second resync takes the record over; the first cannot finish.
	b, err := BeginResync(ctx, SchemaConn{Querier: db.Conn, Schema: "public"}, "s", "tailer resync", nil)
	if err != nil || b.Cutover == nil || *b.Cutover != *cut {
		t.Fatalf("BeginResync without a cutover kept %+v, %v; want the collector's", b.Cutover, err)
	}
	if err := FinishResync(ctx, SchemaConn{Querier: db.Conn, Schema: "public"}, &a, 0x1000, StreamIdentity{Name: "S", Created: "t"}, 7, "id:last", StreamSeen{First: 1, Last: 7, Deleted: 2}); err == nil {
		t.Fatal("a superseded resync finished")
	}
	if err := FinishResync(ctx, SchemaConn{Querier: db.Conn, Schema: "public"}, &b, 0x1000, StreamIdentity{Name: "S", Created: "t"}, 7, "id:last", StreamSeen{First: 1, Last: 7, Deleted: 2}); err != nil {
		t.Fatal(err)
	}
	r, err = LoadRecord(ctx, SchemaConn{Querier: db.Conn, Schema: "public"}, "s")
	if err != nil || r.Incarnation != b.Incarnation || r.ResyncPending || !r.Bound || r.StreamSeq != 7 || r.ConsistentPoint != 0x1000 ||
		r.Cutover == nil || *r.Cutover != *cut || r.StreamName != "S" || r.StreamCreated != "t" ||
		r.AnchorSeq != 7 || r.AnchorMark != "id:last" || r.Seen == nil || *r.Seen != (StreamSeen{First: 1, Last: 7, Deleted: 2}) {
		t.Fatalf("after FinishResync: %+v, %v", r, err)
	}
	if err := FinishResync(ctx, SchemaConn{Querier: db.Conn, Schema: "public"}, &b, 0x1000, StreamIdentity{Name: "S", Created: "t"}, 7, "id:last", StreamSeen{First: 1, Last: 7, Deleted: 2}); err == nil {
		t.Fatal("a finished resync finished again")
	}
	if err := SetStream(ctx, SchemaConn{Querier: db.Conn, Schema: "public"}, &b, StreamIdentity{Name: "S2", Created: "t2"}); err != nil {
		t.Fatal(err)
	}
	if r, err = LoadRecord(ctx, SchemaConn{Querier: db.Conn, Schema: "public"}, "s"); err != nil || r.StreamName != "S2" || r.StreamCreated != "t2" {
		t.Fatalf("after SetStream: %+v, %v", r, err)
	}
}

// The anchor a running tailer keeps in the record: newer ones only, of
// its own incarnation, of the stream it names, gone with a resync.
func TestRecordAnchor(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := migratetest.NewDB(t, pgtest.Shared(t))
	r, err := CreateSlot(ctx, SchemaConn{Querier: db.Conn, Schema: "public"}, "s", "tailer migrate", false, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := SetStream(ctx, SchemaConn{Querier: db.Conn, Schema: "public"}, &r, StreamIdentity{Name: "S", Created: "t"}); err != nil {
		t.Fatal(err)
	}
	anchor := func(want uint64, mark string, seen *StreamSeen) {
		t.Helper()
		got, err := LoadRecord(ctx, SchemaConn{Querier: db.Conn, Schema: "public"}, "s")
		if err != nil || got.AnchorSeq != want || got.AnchorMark != mark || (got.Seen == nil) != (seen == nil) || seen != nil && *got.Seen != *seen {
			t.Fatalf("anchor %d %q seen %+v (%v), want %d %q %+v", got.AnchorSeq, got.AnchorMark, got.Seen, err, want, mark, seen)
		}
	}
	anchor(0, "", nil)
	for _, a := range []struct {
		incarnation string
		seq         uint64
		mark        string
		seen        StreamSeen
	}{{r.Incarnation, 10, "id:a", StreamSeen{First: 1, Last: 10}}, {r.Incarnation, 5, "id:older", StreamSeen{First: 1, Last: 11, Deleted: 1, Batches: 7, Trims: true, Quiet: true}},
		{"another", 20, "id:another", StreamSeen{First: 3, Last: 20}}} {
		if err := SetAnchor(ctx, SchemaConn{Querier: db.Conn, Schema: "public"}, "s", a.incarnation, a.seq, a.mark, a.seen); err != nil {
			t.Fatal(err)
		}
	}
	// An older anchor keeps the newer, and what the stream held is the
	// latest look's.
	anchor(10, "id:a", &StreamSeen{First: 1, Last: 11, Deleted: 1, Batches: 7, Trims: true, Quiet: true})
	if err := SetStream(ctx, SchemaConn{Querier: db.Conn, Schema: "public"}, &r, StreamIdentity{Name: "S", Created: "another replica's time"}); err != nil {
		t.Fatal(err)
	}
	anchor(10, "id:a", &StreamSeen{First: 1, Last: 11, Deleted: 1, Batches: 7, Trims: true, Quiet: true})
	if err := SetStream(ctx, SchemaConn{Querier: db.Conn, Schema: "public"}, &r, StreamIdentity{Name: "OTHER", Created: "t"}); err != nil || r.AnchorSeq != 0 {
		t.Fatalf("SetStream of another name kept the anchor %d (%v)", r.AnchorSeq, err)
	}
	anchor(0, "", nil)
	if err := SetAnchor(ctx, SchemaConn{Querier: db.Conn, Schema: "public"}, "s", r.Incarnation, 12, "id:b", StreamSeen{First: 1, Last: 12}); err != nil {
		t.Fatal(err)
	}
	anchor(12, "id:b", &StreamSeen{First: 1, Last: 12})
	if _, err := BeginResync(ctx, SchemaConn{Querier: db.Conn, Schema: "public"}, "s", "tailer resync", nil); err != nil {
		t.Fatal(err)
	}
	anchor(0, "", nil)
}
