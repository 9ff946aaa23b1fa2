package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/internal/testutil/tailertest"
)

// tailer run with the embedded server, the README's default: a second run
// on its data directory is refused at once, naming the holder; status,
// subscribe and the lost-slot runbook's tailer resync, with the same
// settings, use its server (issue 46: resync waited 15 s and failed with
// "did not become ready", status called the server unreachable, subscribe
// dialled 127.0.0.1:4222 whatever MAILROOM_NATS_LISTEN said).
func TestEmbeddedServerFoundByOtherCommands(t *testing.T) {
	t.Parallel()
	pg, err := pgtest.Start(pgtest.Options{Settings: []string{"max_slot_wal_keep_size=1MB", "wal_keep_size=0"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close() })
	c := newCluster(t, pg, 10, 100*time.Millisecond)
	c.stopNATS()
	port, _ := pgtest.FreePort()
	c.natsURLs = fmt.Sprintf("nats://127.0.0.1:%d", port)
	dir := t.TempDir()
	env := []string{"MAILROOM_NATS_URL=", "MAILROOM_DATA_DIR=" + dir, fmt.Sprintf("MAILROOM_NATS_LISTEN=127.0.0.1:%d", port)}
	p := c.watchedTailer(env...)
	p.waitLog("msg=streaming", 1, 30*time.Second)
	c.accounts("before", 5)
	c.expectExactlyOnce(30 * time.Second)

	other, _ := pgtest.FreePort()
	started := time.Now()
	second := c.tailer("MAILROOM_NATS_URL=", "MAILROOM_DATA_DIR="+dir, fmt.Sprintf("MAILROOM_NATS_LISTEN=127.0.0.1:%d", other))
	code := second.exit(10 * time.Second)
	took := time.Since(started)
	t.Logf("a second tailer run on the data directory refused in %s", took.Round(10*time.Millisecond))
	if code != exitConfig || !strings.Contains(second.out.String(), "MAILROOM_DATA_DIR: data directory "+dir+" is in use by process") || took > 3*time.Second {
		t.Fatalf("second run on the data directory: exit %d after %s:\n%s", code, took, second.out.String())
	}

	// Another data directory, the same port: said at once.
	started = time.Now()
	busy := c.tailer("MAILROOM_NATS_URL=", "MAILROOM_DATA_DIR="+t.TempDir(), fmt.Sprintf("MAILROOM_NATS_LISTEN=127.0.0.1:%d", port))
	code = busy.exit(10 * time.Second)
	if took = time.Since(started); code != exitConfig || !strings.Contains(busy.out.String(), fmt.Sprintf("MAILROOM_NATS_LISTEN: 127.0.0.1:%d cannot be listened on", port)) || took > 3*time.Second {
		t.Fatalf("a run on a port in use: exit %d after %s:\n%s", code, took, busy.out.String())
	}
	t.Logf("a tailer run on a port in use refused in %s", took.Round(10*time.Millisecond))

	st := c.command([]string{"status"}, env...)
	if code := st.exit(30 * time.Second); code != exitOK || !strings.Contains(st.out.String(), "stream          MAILROOM: ") || strings.Contains(st.out.String(), "MAILROOM_NATS_URL unset") {
		t.Fatalf("tailer status: exit %d:\n%s", code, st.out.String())
	}
	sub := c.command([]string{"subscribe", "--durable", "embedded", "--from-start"}, env...)
	tailertest.Eventually(t, 30*time.Second, func() error {
		if !strings.Contains(sub.out.String(), "before5@x") {
			return fmt.Errorf("tailer subscribe wrote no token:\n%s", sub.out.String())
		}
		return nil
	})
	dl := c.command([]string{"dead-letters", "list", "--durable", "embedded"}, env...)
	if code := dl.exit(30 * time.Second); code != exitOK || !strings.Contains(dl.out.String(), "0 dead letters of durable embedded") {
		t.Fatalf("tailer dead-letters list: exit %d:\n%s", code, dl.out.String())
	}

	// The lost-slot runbook, word by word: tailer resync with the settings
	// of tailer run, beside it.
	c.loseSlot()
	c.accounts("lost", 5)
	p.waitLog("tailer resync", 1, 60*time.Second)
	r := c.command([]string{"resync"}, env...)
	if code := r.exit(60 * time.Second); code != exitOK || !strings.Contains(r.out.String(), "using the embedded NATS server of the tailer running on MAILROOM_DATA_DIR") {
		t.Fatalf("tailer resync: exit %d:\n%s", code, r.out.String())
	}
	c.accounts("after", 5)
	if n := c.expectExactlyOnce(60 * time.Second); n != 15 {
		t.Fatalf("%d tokens on the stream, want 15", n)
	}
}
