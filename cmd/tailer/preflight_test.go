package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mailroom/tailer/internal/testutil/pgtest"
)

// tailer migrate on a server at wal_level=replica changes nothing and
// names the fix (issue 46: it made the tables and the publication, then
// failed at the slot with PostgreSQL's words).
func TestMigratePreflight(t *testing.T) {
	t.Parallel()
	pg, err := pgtest.Start(pgtest.Options{Settings: []string{"wal_level=replica"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close() })
	url := pg.CreateDB(t)
	cmd := exec.Command(tailerBin, "migrate")
	cmd.Env = append(os.Environ(), "MAILROOM_DATABASE_URL="+url, "MAILROOM_NATS_URL=nats://127.0.0.1:1")
	out, _ := cmd.CombinedOutput()
	if code := cmd.ProcessState.ExitCode(); code != exitConfig || !strings.Contains(string(out), "nothing was changed: wal_level is replica") || !strings.Contains(string(out), "ALTER SYSTEM SET wal_level = logical") {
		t.Fatalf("migrate at wal_level=replica: exit %d:\n%s", code, out)
	}
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var tables int
	if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_tables WHERE schemaname = 'public'`).Scan(&tables); err != nil || tables != 0 {
		t.Fatalf("%d tables after a refused migrate (%v)", tables, err)
	}
}

// tailer subscribe --into without --migrate on a database without the
// table: exit 2 naming --migrate (issue 46: "relation mailroom_inbox does
// not exist", retried forever).
func TestSubscribeIntoNeedsTheTable(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pgtest.Shared(t), 10, 50*time.Millisecond)
	url := pgtest.Shared(t).CreateDB(t)
	for _, into := range []string{"inbox", "river"} {
		p := c.command([]string{"subscribe", "--durable", "d", "--into", into}, "MAILROOM_INBOX_URL="+url)
		if code := p.exit(30 * time.Second); code != exitConfig || !strings.Contains(p.out.String(), "start the subscriber once with --migrate") {
			t.Fatalf("--into %s without its table: exit %d:\n%s", into, code, p.out.String())
		}
	}
}

// A wrong password is the operator's to fix: migrate and status exit 2
// with one line, as run does (issue 46: exit 1 with the driver's raw error
// and TLS noise); status --json is JSON.
func TestWrongPasswordIsConfiguration(t *testing.T) {
	t.Parallel()
	pg, err := pgtest.Start(pgtest.Options{Password: "right-one"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close() })
	url := fmt.Sprintf("postgres://postgres:wrong-one@127.0.0.1:%d/postgres?sslmode=disable", pg.Port)
	for _, args := range [][]string{{"migrate"}, {"status"}, {"status", "--json"}} {
		cmd := exec.Command(tailerBin, args...)
		cmd.Env = append(os.Environ(), "MAILROOM_DATABASE_URL="+url)
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		cmd.Run()
		msg := strings.TrimSpace(stderr.String())
		if code := cmd.ProcessState.ExitCode(); code != exitConfig || strings.Count(msg, "\n") != 0 || !strings.Contains(msg, "MAILROOM_DATABASE_URL: authentication failed") || strings.Contains(msg, "wrong-one") {
			t.Errorf("tailer %s with a wrong password: exit %d:\n%s", strings.Join(args, " "), code, msg)
		}
		if len(args) == 2 && !strings.Contains(stdout.String(), `"ok":false`) {
			t.Errorf("status --json with a wrong password: %q", stdout.String())
		}
	}
}
