package replication

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/migrations/migratetest"
)

// One holder at a time, per slot; the others are told who holds it, can
// wait for it, and get it once the holder lets go or is gone, whether it
// closed its connection, was terminated, or stopped pinging.
func TestLease(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := migratetest.NewDB(t, pgtest.Shared(t))

	if _, held, err := LeaseHolder(ctx, db.Conn, "s"); held || err != nil {
		t.Fatalf("LeaseHolder of a free lease = %v, %v", held, err)
	}
	a, err := AcquireLease(ctx, db.URL, "s", LeaseOptions{Application: "holder a", Ping: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	_, err = AcquireLease(ctx, db.URL, "s", LeaseOptions{Application: "b"})
	var held *LeaseHeldError
	if !errors.As(err, &held) || held.Holder.Application != "holder a" || held.Holder.PID == 0 {
		t.Fatalf("second lease: %v, want held by holder a", err)
	}
	h, ok, err := LeaseHolder(ctx, db.Conn, "s")
	if !ok || err != nil || h.Application != "holder a" {
		t.Fatalf("LeaseHolder = %+v, %v, %v", h, ok, err)
	}
	// Another slot's lease is another lease.
	other, err := AcquireLease(ctx, db.URL, "other", LeaseOptions{})
	if err != nil {
		t.Fatalf("the lease of another slot: %v", err)
	}
	other.Release()

	// A waiter gets it when the holder lets go.
	go func() {
		time.Sleep(300 * time.Millisecond)
		a.Release()
	}()
	b, err := AcquireLease(ctx, db.URL, "s", LeaseOptions{Application: "b", Wait: 10 * time.Second, Ping: 50 * time.Millisecond})
	if err != nil {
		t.Fatalf("waiting for a released lease: %v", err)
	}

	// A holder that lets go just as a waiter gives up (between its last
	// try and its look at who holds the lease) leaves the lease to it, not
	// a refusal that names nobody.
	e, err := AcquireLease(ctx, db.URL, "late", LeaseOptions{Application: "holder e"})
	if err != nil {
		t.Fatal(err)
	}
	f, err := AcquireLease(ctx, db.URL, "late", LeaseOptions{Application: "f", beforeLookup: e.Release})
	if err != nil {
		t.Fatalf("a lease let go of during the refusal: %v", err)
	}
	f.Release()

	// A holder whose session is ended is told, and the lease is free.
	db.Exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'b'`)
	select {
	case <-b.Lost():
		if b.Err() == nil {
			t.Fatal("a lost lease without a reason")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the holder was not told its lease was lost")
	}
	b.Release()
	c, err := AcquireLease(ctx, db.URL, "s", LeaseOptions{Application: "c", IdleTimeout: time.Second, Ping: time.Hour})
	if err != nil {
		t.Fatalf("after the holder's session ended: %v", err)
	}
	defer c.Release()

	// A holder that stops pinging (frozen) loses it to the server's
	// idle_session_timeout, and a standby takes over.
	d, err := AcquireLease(ctx, db.URL, "s", LeaseOptions{Application: "d", Wait: 15 * time.Second})
	if err != nil {
		t.Fatalf("taking over from a frozen holder: %v", err)
	}
	d.Release()
}

// A waiter does not wait for a holder that streams from the slot: such a
// holder does not let go, so the refusal comes at once.
func TestLeaseNotAwaitedFromAStreamingHolder(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := migratetest.NewDB(t, pgtest.Shared(t))
	if _, err := CreateSlot(ctx, SchemaConn{Querier: db.Conn, Schema: "public"}, "st", "test", false, false); err != nil {
		t.Fatal(err)
	}
	holder, err := AcquireLease(ctx, db.URL, "st", LeaseOptions{Application: "streamer"})
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	rc, err := Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close(context.Background())
	if _, err := Start(ctx, rc, StreamOptions{Slot: "st", Publication: "mailroom"}); err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	_, err = AcquireLease(ctx, db.URL, "st", LeaseOptions{Wait: time.Minute})
	var held *LeaseHeldError
	if !errors.As(err, &held) || held.Holder.Application != "streamer" {
		t.Fatalf("lease of a streamed slot: %v", err)
	}
	if waited := time.Since(started); waited > 30*time.Second {
		t.Fatalf("waited %s for a holder that streams", waited)
	}
}
