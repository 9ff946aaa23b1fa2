package main

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/internal/testutil/tailertest"
)

// previousRelease is the build before the durable's record had a format
// (6c8dca0): its subscriber refuses a field it does not know.
const previousRelease = "6c8dca0b3bdd57f193e85de0b4aced28bc50bb25"

// buildRelease builds tailer at commit, from this checkout's history,
// into a directory of t's.
func buildRelease(t *testing.T, commit string) string {
	t.Helper()
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Fatalf("the previous release is built from this checkout's history: git rev-parse: %v", err)
	}
	root, dir := strings.TrimSpace(string(top)), filepath.Join(t.TempDir(), "src")
	if out, err := exec.Command("git", "-C", root, "worktree", "add", "--detach", dir, commit).CombinedOutput(); err != nil {
		t.Fatalf("git worktree add %s (a clone with its history is needed): %v\n%s", commit, err, out)
	}
	t.Cleanup(func() { exec.Command("git", "-C", root, "worktree", "remove", "--force", dir).Run() })
	bin := filepath.Join(t.TempDir(), "tailer-previous")
	build := exec.Command("go", "build", "-o", bin, "./cmd/tailer")
	build.Dir = dir
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build tailer at %s: %v\n%s", commit, err, out)
	}
	return bin
}

// Subscribers of this build and of the one before, alternating on one
// durable, each stopped or killed mid-stream, deliver every token: into
// a file, each at least once; into an inbox table, each once. Neither
// refuses the other's record (a rolling upgrade or downgrade across one
// release).
func TestAlternatingReleases(t *testing.T) {
	prev := buildRelease(t, previousRelease)
	c, _ := newSingleTokenMessages(t, 100, 10)
	consumerURL := pgtest.Shared(t).CreateDB(t)
	bins := []string{tailerBin, prev}
	out := filepath.Join(t.TempDir(), "lines")
	stop := func(p *proc, run int) {
		if run%3 == 2 {
			p.kill()
			return
		}
		p.cmd.Process.Signal(syscall.SIGTERM)
		if code := p.exit(30 * time.Second); code != 0 {
			t.Fatalf("run %d: exit %d after SIGTERM:\n%s", run, code, p.out.String())
		}
	}
	conn, err := pgx.Connect(c.ctx, consumerURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	// inboxRows counts the inbox's rows and its distinct tokens.
	inboxRows := func() (rows, keys int) {
		conn.QueryRow(c.ctx, `SELECT count(*), count(DISTINCT token_key) FROM mailroom_inbox`).Scan(&rows, &keys)
		return rows, keys
	}
	lastLines, lastRows := 0, 0
	for run := range 8 {
		// New tokens for each run, after the backlog.
		c.Exec(`INSERT INTO accounts (email, login) SELECT 'r' || $1::int || '_' || g || '@x', 'r' || $1::int || '_' || g FROM generate_series(1, 100) g`, run)
		bin := bins[run%2]
		pipe := c.subscriberOf(bin, out, "--durable", "alt", "--from-start", "--ack-wait", "2s")
		inbox := c.commandOf(bin, []string{"subscribe", "--durable", "altin", "--into", "inbox", "--migrate", "--from-start", "--ack-wait", "2s"},
			"MAILROOM_INBOX_URL="+consumerURL)
		pipe.waitLog("consuming", 1, 30*time.Second)
		inbox.waitLog("consuming", 1, 30*time.Second)
		// Each run goes on from where the other release's left the
		// durable (once a killed one's pin and messages are let go):
		// it writes something.
		tailertest.Eventually(t, time.Minute, func() error {
			got, _ := outputTokens(t, out)
			if _, rows := inboxRows(); len(got) == lastLines || rows == lastRows {
				return fmt.Errorf("run %d: %d lines, %d inbox rows: nothing written yet", run, len(got), rows)
			}
			return nil
		})
		time.Sleep(time.Duration(100+50*run) * time.Millisecond)
		stop(pipe, run)
		stop(inbox, run)
		for _, p := range []*proc{pipe, inbox} {
			if s := p.out.String(); strings.Contains(s, "unknown field") || strings.Contains(s, "later release") {
				t.Fatalf("run %d (%s) refused the other release's record:\n%s", run, bin, s)
			}
		}
		got, _ := outputTokens(t, out)
		_, rows := inboxRows()
		t.Logf("run %d (%s): %d lines written (%d before), %d inbox rows (%d before)", run, filepath.Base(bin), len(got), lastLines, rows, lastRows)
		lastLines, lastRows = len(got), rows
	}
	c.expectExactlyOnce(60 * time.Second)
	want := c.signedTokens()
	c.subscriberOf(tailerBin, out, "--durable", "alt", "--from-start", "--ack-wait", "2s")
	c.commandOf(tailerBin, []string{"subscribe", "--durable", "altin", "--into", "inbox", "--from-start", "--ack-wait", "2s"},
		"MAILROOM_INBOX_URL="+consumerURL)
	awaitOutput(t, out, want)
	missing, repeats := countOutput(t, out, want)
	t.Logf("into a file: %d of %d tokens, %d repeated, over 8 alternating runs and a last one", len(want)-missing, len(want), repeats)
	tailertest.EventuallyProgressing(t, time.Minute, func() (int, error) {
		rows, keys := inboxRows()
		if rows != keys {
			t.Fatalf("the inbox holds %d rows for %d tokens", rows, keys)
		}
		if keys < len(want) {
			return keys, fmt.Errorf("%d of %d tokens in the inbox", keys, len(want))
		}
		return keys, nil
	})
}
