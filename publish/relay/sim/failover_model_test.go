package sim

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/mailroom/tailer/decoder/wal"
	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/internal/testutil/tailertest"
	"github.com/mailroom/tailer/migrations/migratetest"
)

// The failover model (dbModel.failover) does what PostgreSQL 17+ does
// when a standby, stopped before the primary's last transactions, is
// promoted as the primary dies: the next timeline, whose history ends
// the old one between the last transaction the standby had and the first
// it lacked; a failover slot synchronized to it before replays what the
// standby has past where it was confirmed, then what is committed after
// the promotion; a slot not synchronized is not there. Four failovers of
// one cluster in a row, each promoted standby the next primary: with and
// without the slot synchronized, lacking none, one or two transactions.
// Positions are the model's own: it commits anew at the very positions
// of the transactions lost (a relay that judged by position alone would
// skip the most there), where the server commits just past the branch.
func TestFailoverModelAgreesWithPostgreSQL(t *testing.T) {
	if major, err := pgtest.Major(); err != nil || major < 17 {
		t.Skipf("PostgreSQL %d has no failover slots (%v); make test-pg-core VERSION=17 runs this", major, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	primary, err := pgtest.Start(pgtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { primary.Close() })
	db := migratetest.NewDB(t, primary)
	name := db.URL[strings.LastIndex(db.URL, "/")+1:]
	if i := strings.Index(name, "?"); i >= 0 {
		name = name[:i]
	}
	f := &failoverCheck{t: t, c: &slotCheck{ctx: ctx, conn: db.Conn, slot: "mailroom", model: newDB(new(int), new(int))}, primary: primary, db: name}
	f.makeSlot()
	for round, c := range []struct {
		lag    int
		synced bool
	}{{2, true}, {0, false}, {1, true}, {2, false}} {
		t.Logf("failover %d: the standby lacks %d transactions, the slot synchronized: %v", round+1, c.lag, c.synced)
		f.failover(round+1, c.lag, c.synced)
	}
}

// failoverCheck is a cluster failed over again and again, with the model
// beside it.
type failoverCheck struct {
	t       *testing.T
	c       *slotCheck
	primary *pgtest.Server
	db      string
}

func (f *failoverCheck) exec(sql string, args ...any) {
	f.t.Helper()
	if _, err := f.c.conn.Exec(f.c.ctx, sql, args...); err != nil {
		f.t.Fatalf("%s: %v", sql, err)
	}
}

// makeSlot makes the slot a failover slot on the primary.
func (f *failoverCheck) makeSlot() {
	f.exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)`, f.c.slot)
	f.c.model.makeSlot()
	f.c.ends = map[wal.LSN]wal.LSN{}
}

// commit commits a transaction of one token.
func (f *failoverCheck) commit() {
	f.exec(`INSERT INTO accounts (email, login) SELECT 'fo-'||gen_random_uuid()||'@x', 'fo-'||gen_random_uuid()`)
	f.c.model.commit(1)
}

func (f *failoverCheck) agree(when string) {
	f.t.Helper()
	if err := f.c.agrees(); err != nil {
		f.t.Fatalf("%s: %v", when, err)
	}
}

// failover starts a standby (the slot synchronized to it, synced),
// commits two transactions, confirms the slot at the first, stops the
// standby, commits lag more, kills the primary and promotes the standby,
// then holds the model's failover to what the promoted standby has.
func (f *failoverCheck) failover(round, lag int, synced bool) {
	t, c := f.t, f.c
	standby, err := f.primary.Standby(fmt.Sprintf("standby%d", round))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { standby.Close() })
	sconn, err := pgx.Connect(c.ctx, standby.URL(f.db))
	if err != nil {
		t.Fatal(err)
	}
	defer sconn.Close(context.Background())
	if synced {
		f.keptOn(sconn)
	}
	f.commit()
	f.commit()
	f.agree("before the failover")
	first := c.carried()[0].commit
	f.exec(`SELECT pg_replication_slot_advance($1, $2::pg_lsn)`, c.slot, c.ends[first].String())
	c.model.confirm(first)
	f.agree("confirmed")
	kept := c.ends[c.carried()[len(c.carried())-1].commit]
	f.caughtUp(sconn)
	if synced {
		f.synchronize(sconn, c.ends[first])
	}
	if err := standby.Stop("fast"); err != nil {
		t.Fatal(err)
	}
	before := pgtest.WalLSN(t, c.ctx, c.conn)
	for range lag {
		f.commit()
	}
	if err := f.primary.Stop("immediate"); err != nil {
		t.Fatal(err)
	}
	if err := standby.Start(); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(); err != nil {
		t.Fatal(err)
	}
	c.model.failover(lag, synced)
	conn, err := pgx.Connect(c.ctx, standby.URL(f.db))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	c.conn, f.primary, c.ends = conn, standby, map[wal.LSN]wal.LSN{}
	f.holdHistory(kept, wal.LSN(before))
	f.holdSlot()
}

// caughtUp waits until the standby (sconn) has received every WAL record
// the primary wrote so far.
func (f *failoverCheck) caughtUp(sconn *pgx.Conn) {
	t, c := f.t, f.c
	written := wal.LSN(pgtest.WalLSN(t, c.ctx, c.conn))
	tailertest.Eventually(t, 30*time.Second, func() error {
		var got *string
		if err := sconn.QueryRow(c.ctx, `SELECT pg_last_wal_receive_lsn()::text`).Scan(&got); err != nil {
			return err
		}
		if got != nil {
			if at, err := pglogrepl.ParseLSN(*got); err == nil && wal.LSN(at) >= written {
				return nil
			}
		}
		return fmt.Errorf("the standby has received WAL up to %v, the primary wrote %s", got, written)
	})
}

// keptOn copies the failover slot to the standby (sconn) until the copy
// is kept there: only once the slot's restart_lsn passed the WAL the
// standby reserved for it, which the slot confirmed past a running-xacts
// record (pg_log_standby_snapshot) moves.
func (f *failoverCheck) keptOn(sconn *pgx.Conn) {
	c := f.c
	tailertest.Eventually(f.t, 60*time.Second, func() error {
		f.exec(`SELECT pg_log_standby_snapshot()`)
		f.exec(`SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())`, c.slot)
		return f.synced(sconn, 0)
	})
	c.model.confirm(c.model.wal())
}

// synchronize copies the slot to the standby (sconn) again, until the
// copy is confirmed at want.
func (f *failoverCheck) synchronize(sconn *pgx.Conn, want wal.LSN) {
	tailertest.Eventually(f.t, 30*time.Second, func() error { return f.synced(sconn, want) })
}

// synced synchronizes the slot to the standby once, and says whether its
// copy is kept there, confirmed at least at want.
func (f *failoverCheck) synced(sconn *pgx.Conn, want wal.LSN) error {
	c := f.c
	if _, err := sconn.Exec(c.ctx, `SELECT pg_sync_replication_slots()`); err != nil {
		return err
	}
	var lsn *string
	err := sconn.QueryRow(c.ctx, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1 AND synced AND NOT temporary`, c.slot).Scan(&lsn)
	if err != nil || lsn == nil {
		return fmt.Errorf("slot %s not kept on the standby yet (%v)", c.slot, err)
	}
	if at, err := pglogrepl.ParseLSN(*lsn); err != nil || wal.LSN(at) < want {
		return fmt.Errorf("slot %s confirmed at %s on the standby, not yet at %s", c.slot, *lsn, want)
	}
	return nil
}

// holdHistory holds the model's timeline to the promoted server's: the
// next one, its history ending the one before at or after kept, the end
// of the last transaction the standby had, and no later than before,
// where the primary's WAL was as the standby stopped.
func (f *failoverCheck) holdHistory(kept, before wal.LSN) {
	t, c := f.t, f.c
	o := c.model.origin
	var history string
	if err := c.conn.QueryRow(c.ctx, `SELECT pg_read_file(format('pg_wal/%s.history', lpad(upper(to_hex($1::int)), 8, '0')))`, o.Timeline).Scan(&history); err != nil {
		t.Fatalf("timeline %d, as the model has it: %v", o.Timeline, err)
	}
	lines := strings.Split(strings.TrimSpace(history), "\n")
	fields := strings.Fields(lines[len(lines)-1])
	if len(fields) < 2 {
		t.Fatalf("timeline %d's history %q", o.Timeline, history)
	}
	tl, err := strconv.Atoi(fields[0])
	if err != nil || int32(tl) != o.Timeline-1 {
		t.Fatalf("timeline %d branched from timeline %s, the model from %d", o.Timeline, fields[0], o.Timeline-1)
	}
	end, err := pglogrepl.ParseLSN(fields[1])
	if err != nil || wal.LSN(end) < kept || wal.LSN(end) > before {
		t.Fatalf("timeline %d ended at %s (%v), not between the end of the last transaction the standby had (%s) and where the primary was as it stopped (%s)", tl, fields[1], err, kept, before)
	}
	if _, ok := o.History[o.Timeline-1]; !ok || len(o.History) != int(o.Timeline)-1 {
		t.Fatalf("the model's history %v on timeline %d", o.History, o.Timeline)
	}
}

// holdSlot holds the model's slot to the promoted server's: there or
// not; there, it replays what the model's does, before and after a
// commit on the new timeline. Not there, it is made again for the next
// failover.
func (f *failoverCheck) holdSlot() {
	t, c := f.t, f.c
	var there bool
	if err := c.conn.QueryRow(c.ctx, `SELECT count(*) = 1 FROM pg_replication_slots WHERE slot_name = $1`, c.slot).Scan(&there); err != nil {
		t.Fatal(err)
	}
	if there != (c.model.slot != nil) {
		t.Fatalf("the promoted standby has the slot: %v; the model: %v", there, c.model.slot != nil)
	}
	if !there {
		f.makeSlot()
		return
	}
	f.agree("after the promotion")
	f.commit()
	f.agree("a commit on the new timeline")
}
