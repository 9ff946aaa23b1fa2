package replication

import (
	"context"
	"errors"
	"net"
	neturl "net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/migrations"
	"github.com/mailroom/tailer/migrations/migratetest"
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
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tdb := migratetest.NewDB(t, pgtest.Shared(t))
	url, db := tdb.URL, tdb.Conn

	if _, err := CreateSlot(ctx, SchemaConn{Querier: db, Schema: "public"}, "bad-name", "test", false, false); err == nil {
		t.Fatal("CreateSlot accepted an invalid name")
	}
	rec, err := CreateSlot(ctx, SchemaConn{Querier: db, Schema: "public"}, "s1", "test", false, false)
	if err != nil || !rec.Exists || rec.Incarnation == "" || rec.Bound {
		t.Fatalf("CreateSlot = %+v, %v", rec, err)
	}
	if _, err := CreateSlot(ctx, SchemaConn{Querier: db, Schema: "public"}, "s1", "test", false, false); err == nil {
		t.Fatal("CreateSlot made an existing slot again")
	}
	if _, err := db.Exec(ctx, `SELECT pg_create_logical_replication_slot('other_plugin', 'test_decoding')`); err != nil {
		t.Fatal(err)
	}
	other, err := Slot(ctx, db, "other_plugin")
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckSlot(ctx, db, other); err == nil || !strings.Contains(err.Error(), "test_decoding") {
		t.Fatalf("CheckSlot of a test_decoding slot: %v", err)
	}
	// A slot of the same name in another database is not ours.
	otherDB, err := pgx.Connect(ctx, pgtest.Shared(t).CreateDB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer otherDB.Close(ctx)
	s1, err := Slot(ctx, otherDB, "s1")
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckSlot(ctx, otherDB, s1); err == nil || !strings.Contains(err.Error(), "belongs to database") {
		t.Fatalf("CheckSlot from another database: %v", err)
	}
	if err := CheckSlot(ctx, db, s1); err != nil {
		t.Fatalf("CheckSlot of its own slot: %v", err)
	}
	s, err := Slot(ctx, db, "s1")
	if err != nil || s.Active || s.ConfirmedFlush == 0 || s.LagBytes() < 0 {
		t.Fatalf("Slot = %+v, %v", s, err)
	}
	if _, err := Slot(ctx, db, "nope"); err == nil {
		t.Fatal("Slot of a missing slot succeeded")
	}

	// A second stream on a slot in use is told so (SQLSTATE 55006).
	opts := StreamOptions{Slot: "s1", Publication: migrations.Publication}
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

// freezeProxy forwards TCP connections to a server until freeze is called;
// from then on it keeps every connection open but passes nothing either way,
// as a half-open connection (a peer gone without a FIN or RST) looks.
type freezeProxy struct {
	ln     net.Listener
	frozen atomic.Bool
	// upDelay holds back what the client sends, as a slow network would.
	upDelay atomic.Int64
}

func newFreezeProxy(t *testing.T, target string) *freezeProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &freezeProxy{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			t.Cleanup(func() { c.Close(); s.Close() })
			go p.pipe(c, s, nil)
			go p.pipe(s, c, &p.upDelay)
		}
	}()
	return p
}

func (p *freezeProxy) pipe(dst, src net.Conn, delay *atomic.Int64) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		if delay != nil {
			time.Sleep(time.Duration(delay.Load()))
		}
		if p.frozen.Load() {
			continue // swallowed: the peer never sees it
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}

func (p *freezeProxy) url(t *testing.T, dbURL string) string {
	u, err := neturl.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = p.ln.Addr().String()
	return u.String()
}

// idle is a Handler for a stream with nothing to do.
type idle struct{ at pglogrepl.LSN }

func (h *idle) Data([]byte) error                             { return nil }
func (h *idle) ServerPosition(lsn pglogrepl.LSN)              { h.at = max(h.at, lsn) }
func (h *idle) Deadline() time.Time                           { return time.Time{} }
func (h *idle) Tick(time.Time) error                          { return nil }
func (h *idle) Wait(context.Context, time.Time) (bool, error) { return true, nil }
func (h *idle) Confirmable() pglogrepl.LSN                    { return h.at }
func (h *idle) Stop()                                         {}

func TestSilentConnectionIsGivenUp(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tdb := migratetest.NewDB(t, pgtest.Shared(t))
	url, db := tdb.URL, tdb.Conn
	if _, err := CreateSlot(ctx, SchemaConn{Querier: db, Schema: "public"}, "silent", "test", false, false); err != nil {
		t.Fatal(err)
	}
	slot, err := Slot(ctx, db, "silent")
	if err != nil {
		t.Fatal(err)
	}
	proxy := newFreezeProxy(t, "127.0.0.1:"+strconv.Itoa(pgtest.Shared(t).Port))
	conn, err := Connect(ctx, proxy.url(t, url))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	const timeout = 4 * time.Second
	stream, err := Start(ctx, conn, StreamOptions{Slot: "silent", Publication: migrations.Publication, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}

	// An idle but healthy server answers the status update that asks for a
	// reply, so the stream outlives its timeout.
	healthy, stop := context.WithTimeout(ctx, timeout+2*time.Second)
	defer stop()
	if err := stream.Run(healthy, &idle{at: slot.ConfirmedFlush}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("healthy idle stream ended with %v, want it to run until its context ends", err)
	}
	conn.Close(ctx)

	conn2, err := Connect(ctx, proxy.url(t, url))
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close(context.Background())
	waitInactive(t, ctx, db, "silent")
	stream, err = Start(ctx, conn2, StreamOptions{Slot: "silent", Publication: migrations.Publication, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	proxy.frozen.Store(true)
	if err := stream.Run(ctx, &idle{at: slot.ConfirmedFlush}); !errors.Is(err, ErrSilent) {
		t.Fatalf("stream over a frozen connection ended with %v, want ErrSilent", err)
	}
}

// stopping is a Handler with nothing to confirm until it is stopped, and
// then its position: only the final status update reports it.
type stopping struct {
	idle
	final pglogrepl.LSN
}

func (h *stopping) Confirmable() pglogrepl.LSN { return h.at }
func (h *stopping) Stop()                      { h.at = h.final }

// A stopped stream's last position is on the slot when Run returns, not in
// flight to the server: over a link that holds the client's bytes back,
// the slot read at once after Run shows the final status update.
func TestStoppedStreamLeavesItsPositionOnTheSlot(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tdb := migratetest.NewDB(t, pgtest.Shared(t))
	if _, err := CreateSlot(ctx, SchemaConn{Querier: tdb.Conn, Schema: "public"}, "stopping", "test", false, false); err != nil {
		t.Fatal(err)
	}
	tdb.Exec(`INSERT INTO accounts (email, login) VALUES ('stop@x', 'stop')`)
	end := tdb.WalLSN()
	proxy := newFreezeProxy(t, "127.0.0.1:"+strconv.Itoa(pgtest.Shared(t).Port))
	conn, err := Connect(ctx, proxy.url(t, tdb.URL))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	stream, err := Start(ctx, conn, StreamOptions{Slot: "stopping", Publication: migrations.Publication, Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- stream.Run(runCtx, &stopping{final: end}) }()
	proxy.upDelay.Store(int64(300 * time.Millisecond))
	stop()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v", err)
	}
	if got := tdb.ConfirmedLSN("stopping"); got < end {
		t.Fatalf("slot confirmed at %s when Run returned, before the final status update's %s", got, end)
	}
}

func waitInactive(t *testing.T, ctx context.Context, db *pgx.Conn, slot string) {
	t.Helper()
	for {
		s, err := Slot(ctx, db, slot)
		if err != nil {
			t.Fatal(err)
		}
		if !s.Active {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatal("slot still active")
		case <-time.After(50 * time.Millisecond):
		}
	}
}
