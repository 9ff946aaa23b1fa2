package audit

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/internal/embedded"
	"github.com/mailroom/tailer/internal/pgname"
	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/internal/testutil/tailertest"
	"github.com/mailroom/tailer/migrations/migratetest"
	"github.com/mailroom/tailer/publish/token"
	"github.com/mailroom/tailer/publish/wire"
	"github.com/mailroom/tailer/replication"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// fixture is a database of 20 tokens whose slot is confirmed past them,
// each on the stream in a message of its own, as the tailer publishes.
type fixture struct {
	ctx    context.Context
	db     *migratetest.DB
	srv    interface{ Shutdown() }
	js     jetstream.JetStream
	stream jetstream.Stream
	ids    []int64
	seqs   map[int64]uint64
	// settled: the slot is advanced past every new WAL position.
	stopAdvance context.CancelFunc
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := context.Background()
	f := &fixture{ctx: ctx, db: migratetest.NewDB(t, pgtest.Shared(t)), seqs: map[int64]uint64{}}
	if _, err := replication.CreateSlot(ctx, replication.SchemaConn{Querier: f.db.Conn, Schema: pgname.Public}, "mailroom", "tailer migrate", true, false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.db.Exec(`SELECT pg_drop_replication_slot('mailroom')`) })
	f.db.Exec(`INSERT INTO accounts (email, login) SELECT 'a' || g || '@example.com', 'a' || g FROM generate_series(1, 20) g`)
	f.db.Exec(`UPDATE tailer_slot SET confirmed_through = now() + interval '2 minutes'`)
	srv, err := embedded.Start(t.TempDir(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	f.srv = srv
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	f.js, _ = jetstream.New(nc)
	if f.stream, err = f.js.CreateStream(ctx, jetstream.StreamConfig{Name: "MAILROOM", Subjects: []string{"mailroom.batches"}}); err != nil {
		t.Fatal(err)
	}
	rows, _ := f.db.Conn.Query(ctx, `SELECT id, secret FROM tokens ORDER BY id`)
	type tok struct {
		ID     int64
		Secret []byte
	}
	toks, err := pgx.CollectRows(rows, pgx.RowToStructByPos[tok])
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range toks {
		m := nats.NewMsg("mailroom.batches")
		m.Header.Set(wire.HeaderCount, "1")
		m.Header.Set(wire.HeaderTokenKeys, string(token.AppendKey(nil, (*[token.SecretSize]byte)(tk.Secret))))
		m.Header.Set(wire.HeaderTokenIDs, strconv.FormatInt(tk.ID, 10))
		ack, err := f.js.PublishMsg(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		f.ids, f.seqs[tk.ID] = append(f.ids, tk.ID), ack.Sequence
	}
	f.advance(t)
	return f
}

// advance confirms the slot past every WAL position as it comes, as a
// tailer streaming from it does, until the test ends or stopAdvance.
// stopAdvance returns once the advancing session's backend is gone: an
// advance the server was running as the client gave up completes all
// the same, and under load it did so after the test's next insert (the
// slot then confirmed past it, the audit settled where the test wanted
// it pending).
func (f *fixture) advance(t *testing.T) {
	ctx, cancel := context.WithCancel(f.ctx)
	conn, err := pgx.Connect(ctx, f.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	pid := conn.PgConn().PID()
	done := make(chan struct{})
	f.stopAdvance = func() {
		cancel()
		<-done
		for deadline := time.Now().Add(30 * time.Second); ; {
			var n int
			if err := f.db.Conn.QueryRow(f.ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the advancing session (pid %d) still there 30 s after it was stopped", pid)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	go func() {
		defer close(done)
		defer conn.Close(context.Background())
		for ctx.Err() == nil {
			conn.Exec(ctx, `SELECT pg_replication_slot_advance('mailroom', pg_current_wal_insert_lsn())`)
			time.Sleep(50 * time.Millisecond)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
}

// audit audits the last hour with opts' read hook.
func (f *fixture) audit(t *testing.T, read func(seq uint64)) (Report, error) {
	t.Helper()
	conn, err := pgx.Connect(f.ctx, f.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	stream, err := f.js.Stream(f.ctx, "MAILROOM")
	if err != nil {
		t.Fatal(err)
	}
	return Audit(f.ctx, conn, stream, Options{Schema: pgname.Public, Slot: "mailroom", Since: time.Now().Add(-time.Hour), Grace: time.Second,
		Consumer: "tailer_audit", ConfirmWait: 5 * time.Second, read: read})
}

// An intact stream: every token checked, none missing; a message
// deleted: its token named missing, once the slot is confirmed past the
// audit's snapshot, and pending until then.
func TestAuditNamesWhatTheStreamLacks(t *testing.T) {
	f := newFixture(t)
	rep, err := f.audit(t, nil)
	if err != nil || rep.Checked != 20 || len(rep.Missing) != 0 || !rep.Settled {
		t.Fatalf("intact: %+v, %v", rep, err)
	}
	lost := f.ids[7]
	if err := f.stream.DeleteMsg(f.ctx, f.seqs[lost]); err != nil {
		t.Fatal(err)
	}
	rep, err = f.audit(t, nil)
	if err != nil || !slices.Equal(rep.Missing, []int64{lost}) || rep.Checked != 19 {
		t.Fatalf("a message deleted: %+v, %v", rep, err)
	}
	f.stopAdvance()
	f.db.Exec(`INSERT INTO accounts (email, login) VALUES ('late@example.com', 'late')`)
	rep, err = f.audit(t, nil)
	if err != nil || rep.Settled || len(rep.Missing) != 0 || !slices.Contains(rep.Pending, lost) {
		t.Fatalf("the slot not confirmed past the snapshot: %+v, %v", rep, err)
	}

	// The slot's restart point past the lost and the late token's
	// transactions (a checkpoint logs what runs, and the slot moves on to
	// it): missing, though the slot is behind the snapshot (no tailer
	// published them); a later token pending.
	f.advance(t)
	f.db.Exec(`CHECKPOINT`)
	tailertest.Eventually(t, 30*time.Second, func() error {
		var past bool
		f.db.Conn.QueryRow(f.ctx, `SELECT age(t.xmin) > age(s.catalog_xmin) FROM tokens t, pg_replication_slots s WHERE t.id = $1 AND s.slot_name = 'mailroom'`, lost).Scan(&past)
		if !past {
			return errors.New("the slot's catalog_xmin is not past the lost token's transaction")
		}
		return nil
	})
	f.stopAdvance()
	f.db.Exec(`INSERT INTO accounts (email, login) VALUES ('later@example.com', 'later')`)
	rep, err = f.audit(t, nil)
	late, later := f.tokenOf(t, "late"), f.tokenOf(t, "later")
	if err != nil || rep.Settled || !slices.Equal(rep.Missing, []int64{lost, late}) || !slices.Equal(rep.Pending, []int64{later}) {
		t.Fatalf("the slot behind the snapshot, past the lost token: %+v, %v", rep, err)
	}
}

// tokenOf is the id of login's token.
func (f *fixture) tokenOf(t *testing.T, login string) int64 {
	var id int64
	if err := f.db.Conn.QueryRow(f.ctx, `SELECT t.id FROM tokens t JOIN accounts a ON a.id = t.account WHERE a.login = $1`, login).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// An audit that cannot read all it needs says so, and names nothing
// missing: the stream purged or made again while it is read, PostgreSQL's
// connection lost, NATS away, a resync under way.
func TestAuditIncomplete(t *testing.T) {
	for _, tc := range []struct {
		name string
		hit  func(t *testing.T, f *fixture)
	}{
		{"stream purged", func(t *testing.T, f *fixture) {
			if err := f.stream.Purge(f.ctx); err != nil {
				t.Error(err)
			}
		}},
		{"stream made again", func(t *testing.T, f *fixture) {
			if err := f.js.DeleteStream(f.ctx, "MAILROOM"); err != nil {
				t.Error(err)
			}
			time.Sleep(10 * time.Millisecond)
			if _, err := f.js.CreateStream(f.ctx, jetstream.StreamConfig{Name: "MAILROOM", Subjects: []string{"mailroom.batches"}}); err != nil {
				t.Error(err)
			}
		}},
		{"postgres connection lost", func(t *testing.T, f *fixture) {
			f.db.Exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE backend_type = 'client backend' AND state LIKE 'idle in transaction%'`)
		}},
		{"nats away", func(t *testing.T, f *fixture) { f.srv.Shutdown() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			hit := false
			rep, err := f.audit(t, func(seq uint64) {
				if !hit && seq >= 5 {
					hit = true
					tc.hit(t, f)
				}
			})
			if !errors.Is(err, ErrIncomplete) || len(rep.Missing) != 0 {
				t.Fatalf("%+v, %v", rep, err)
			}
			t.Logf("%v", err)
		})
	}
	t.Run("resync under way", func(t *testing.T) {
		f := newFixture(t)
		f.db.Exec(`UPDATE tailer_slot SET resync_pending = true`)
		rep, err := f.audit(t, nil)
		if !errors.Is(err, ErrIncomplete) || len(rep.Missing) != 0 {
			t.Fatalf("%+v, %v", rep, err)
		}
		t.Logf("%v", err)
	})
}
