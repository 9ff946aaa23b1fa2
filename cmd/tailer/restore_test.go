package main

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mailroom/tailer/internal/testutil/pgtest"
)

// A filesystem snapshot of the database put back with its slot: the data
// directory copied while the server was stopped, 500 more tokens published,
// the copy put back (the same system, timeline, slot, record and
// incarnation). The stream holds positions the restored WAL reaches again
// with other tokens. Whether the tailer runs through it or is stopped while
// the database writes past the stream's last position, no token the
// restored database makes is skipped, and none is published twice (issue
// 34: 490 of 1,500 skipped, in both runs).
func TestRestoredSnapshotWithItsSlot(t *testing.T) {
	t.Parallel()
	for _, running := range []bool{true, false} {
		name := "tailer running"
		if !running {
			name = "tailer stopped while the WAL passes the stream"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pg := ownServer(t)
			c := newCluster(t, pg, 10, 50*time.Millisecond)
			p := c.tailer()
			p.waitLog("msg=streaming", 1, 30*time.Second)
			c.accounts("before", 20)
			c.expectExactlyOnce(30 * time.Second)

			snapshot := filepath.Join(filepath.Dir(pg.Dir), "snapshot")
			c.restartServer(pg, func() {
				if out, err := exec.Command("cp", "-a", pg.Dir, snapshot).CombinedOutput(); err != nil {
					t.Fatalf("copy the data directory: %v: %s", err, out)
				}
			})
			c.accountsInTx("lost", 50, 10)
			c.expectExactlyOnce(60 * time.Second)
			lost := c.keyCounts()
			if !running {
				if code := p.term(30 * time.Second); code != exitOK {
					t.Fatalf("SIGTERM: exit %d", code)
				}
			}
			c.restartServer(pg, func() {
				if out, err := exec.Command("sh", "-c", fmt.Sprintf("rm -rf %q && cp -a %q %q", pg.Dir, snapshot, pg.Dir)).CombinedOutput(); err != nil {
					t.Fatalf("put the copy back: %v: %s", err, out)
				}
			})
			if cur, last := c.WalLSN(), c.lastStreamPosition(); cur >= last {
				t.Fatalf("the restored WAL %s is already past the stream's last position %s", cur, last)
			}
			// The restored database makes tokens at the positions the lost
			// ones were published from, and past them.
			c.accountsInTx("after", 10, 10)
			if cur, last := c.WalLSN(), c.lastStreamPosition(); cur >= last {
				t.Fatalf("the restored database's first tokens are not below the stream's last position %s (WAL at %s)", last, cur)
			}
			c.accountsInTx("after2", 90, 10)
			if !running {
				for last := c.lastStreamPosition(); c.WalLSN() <= last; {
					c.Exec(`CREATE TABLE IF NOT EXISTS filler (x text)`)
					c.Exec(`INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 1000)`)
				}
				c.accounts("past", 100)
				p = c.tailer()
			}
			n := c.expectKeysOnce(c.Conn, `SELECT secret FROM tokens`, 90*time.Second)
			if want := 20 + 1000 + map[bool]int{true: 0, false: 100}[running]; n != want {
				t.Fatalf("%d tokens in the restored database, want %d", n, want)
			}
			t.Log(p.out.String())
			for k := range lost {
				if c.keyCounts()[k] != 1 {
					t.Fatalf("a token published before the restore is no longer on the stream once")
				}
			}
		})
	}
}

// accountsInTx makes txs transactions of per accounts (and so activation
// tokens) each.
func (c *cluster) accountsInTx(prefix string, txs, per int) {
	c.t.Helper()
	for i := range txs {
		c.accounts(fmt.Sprintf("%s%d_", prefix, i), per)
	}
}

// restartServer stops pg, runs do while it is down, starts it again and
// reconnects the test's connection.
func (c *cluster) restartServer(pg *pgtest.Server, do func()) {
	c.t.Helper()
	if err := pg.Stop("fast"); err != nil {
		c.t.Fatal(err)
	}
	do()
	if err := pg.Start(); err != nil {
		c.t.Fatal(err)
	}
	conn, err := pgx.Connect(c.ctx, c.URL)
	if err != nil {
		c.t.Fatal(err)
	}
	old := c.Conn
	c.Conn = conn
	old.Close(c.ctx)
	c.t.Cleanup(func() { conn.Close(c.ctx) })
}
