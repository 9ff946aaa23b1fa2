package main

// The stream's configuration as operators set it (issue 69): limits that
// refuse new messages remove none, so a purge or a deletion on such a
// stream is refused as on one without limits; a limit the tailer accepted
// stays accepted when taken off or set again; the session markers'
// subject purged alone loses no batch; a full stream is named.

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/internal/testutil/tailertest"
)

// jsOf is a JetStream context on c's NATS server, closed with the test.
func (c *cluster) jsOf() jetstream.JetStream {
	c.t.Helper()
	nc, err := nats.Connect(c.natsURL(), c.natsOpts...)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		c.t.Fatal(err)
	}
	return js
}

// makeStream makes the MAILROOM stream as an operator would, before the
// tailer does: cfg with the tailer's name and subjects.
func (c *cluster) makeStream(js jetstream.JetStream, cfg jetstream.StreamConfig) {
	c.t.Helper()
	cfg.Name, cfg.Subjects, cfg.Storage = "MAILROOM", []string{"mailroom.batches", "mailroom.batches.>"}, jetstream.FileStorage
	if _, err := js.CreateStream(c.ctx, cfg); err != nil {
		c.t.Fatal(err)
	}
}

// editStream changes the MAILROOM stream's configuration with edit.
func (c *cluster) editStream(js jetstream.JetStream, edit func(*jetstream.StreamConfig)) {
	c.t.Helper()
	s, err := js.Stream(c.ctx, "MAILROOM")
	if err != nil {
		c.t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	edit(&cfg)
	if _, err := js.UpdateStream(c.ctx, cfg); err != nil {
		c.t.Fatal(err)
	}
}

// A stream whose limits refuse new messages (max_bytes or max_msgs with
// discard new) removes none: a purge under the tailer, a purge while it
// is stopped, one message deleted, each is refused until a resync, across
// restarts, and after the resync every token is once on the stream. The
// tailer does not say such limits remove its oldest messages.
func TestDiscardNewStreamIsJudged(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, want string
		cfg        jetstream.StreamConfig
		stopped    bool
		lose       func(c *cluster, js jetstream.JetStream, p *watched) error
	}{
		{"max_bytes, purged under the tailer", "purged", jetstream.StreamConfig{MaxBytes: 1 << 30, Discard: jetstream.DiscardNew}, false, purgeAll},
		{"max_msgs, purged while it is stopped", "purged", jetstream.StreamConfig{MaxMsgs: 100000, Discard: jetstream.DiscardNew}, true, purgeAll},
		{"max_bytes, a message deleted", "no longer holds message", jetstream.StreamConfig{MaxBytes: 1 << 30, Discard: jetstream.DiscardNew}, false, deleteLastBatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := newCluster(t, pgtest.Shared(t), 10, 50*time.Millisecond)
			js := c.jsOf()
			c.makeStream(js, tc.cfg)
			p := c.watchedTailer()
			p.waitLog("msg=streaming", 1, 30*time.Second)
			c.accounts("before", 50)
			c.expectExactlyOnce(30 * time.Second)
			if tc.stopped {
				if code := p.term(30 * time.Second); code != exitOK {
					t.Fatalf("SIGTERM: exit %d", code)
				}
			}
			if err := tc.lose(c, js, p); err != nil {
				t.Fatal(err)
			}
			if tc.stopped {
				p = c.watchedTailer()
			}
			c.accounts("during", 5)
			p.blocked(c, "stream", tc.want)
			p = c.refusedUntilResync(p, tc.want, 2)
			if strings.Contains(p.out.String(), "limits remove its oldest messages") {
				t.Errorf("said that limits with discard new remove the oldest messages:\n%s", p.out.String())
			}
			r := c.command([]string{"resync"})
			if code := r.exit(60 * time.Second); code != exitOK {
				t.Fatalf("resync: exit %d:\n%s", code, r.out.String())
			}
			p.ready(c)
			if n := c.expectExactlyOnce(60 * time.Second); n != 55 {
				t.Fatalf("%d tokens once, want 55", n)
			}
		})
	}
}

// purgeAll purges the whole stream (nats stream purge).
func purgeAll(c *cluster, js jetstream.JetStream, _ *watched) error {
	s, err := js.Stream(c.ctx, "MAILROOM")
	if err != nil {
		return err
	}
	return s.Purge(c.ctx)
}

// A max_msgs limit that removed old messages (discard old), then taken
// off: the tailer, stopped cleanly or killed meanwhile, streams on; set
// again, it streams on; a limit set while it streams is no purge either.
// Every token published since is once on the stream.
func TestLimitsChangedAreNoPurge(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"stopped", "killed", "set while streaming"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			c := newCluster(t, pgtest.Shared(t), 10, 50*time.Millisecond)
			js := c.jsOf()
			if how != "set while streaming" {
				c.makeStream(js, jetstream.StreamConfig{MaxMsgs: 5, Discard: jetstream.DiscardOld})
			}
			p := c.watchedTailer()
			p.waitLog("msg=streaming", 1, 30*time.Second)
			if how == "set while streaming" {
				c.accountsOnStream("first", 4)
				c.editStream(js, func(cfg *jetstream.StreamConfig) { cfg.MaxMsgs = 3 })
			}
			c.accountsOnStream("trimmed", 6)
			switch how {
			case "stopped":
				if code := p.term(30 * time.Second); code != exitOK {
					t.Fatalf("SIGTERM: exit %d", code)
				}
			case "killed":
				c.anchorRecorded()
				p.kill()
			}
			c.editStream(js, func(cfg *jetstream.StreamConfig) { cfg.MaxMsgs = -1 })
			if how != "set while streaming" {
				p = c.watchedTailer()
				p.waitLog("msg=streaming", 1, 30*time.Second)
			}
			c.accountsApart("off", 3)
			c.waitTokens("off", 3)
			c.editStream(js, func(cfg *jetstream.StreamConfig) { cfg.MaxMsgs = 1000 })
			c.accountsApart("again", 3)
			c.waitTokens("again", 3)
			time.Sleep(time.Second)
			p.ready(c)
			if strings.Contains(p.out.String(), "purged") || strings.Contains(p.out.String(), "level=ERROR") {
				t.Fatalf("a limit changed was taken for a loss:\n%s", p.out.String())
			}
			if rep, code := c.status(1 << 40); code != 0 || rep.Refused != "" || rep.Blocked != "" {
				t.Fatalf("tailer status: exit %d, %+v", code, rep)
			}
		})
	}
}

// accountsApart inserts n accounts of prefix, one a transaction, each in
// a batch of its own (the batch timeout apart), so that each is a message.
func (c *cluster) accountsApart(prefix string, n int) {
	c.t.Helper()
	for i := range n {
		c.accounts(fmt.Sprintf("%s%d_", prefix, i), 1)
		time.Sleep(c.timeout + 30*time.Millisecond)
	}
}

// accountsOnStream inserts n accounts of prefix, one a transaction, each
// once its predecessor's token is on the stream: each is a message of its
// own however slow the machine.
func (c *cluster) accountsOnStream(prefix string, n int) {
	c.t.Helper()
	for i := range n {
		name := fmt.Sprintf("%s%d_", prefix, i)
		c.accounts(name, 1)
		c.waitTokens(name, 1)
	}
}

// waitTokens waits until the stream holds the n tokens of the accounts
// whose logins begin with prefix, each once.
func (c *cluster) waitTokens(prefix string, n int) {
	c.t.Helper()
	rows, err := c.Conn.Query(c.ctx, `SELECT t.id FROM tokens t JOIN accounts a ON a.id = t.account WHERE a.login LIKE $1 || '%'`, prefix)
	if err != nil {
		c.t.Fatal(err)
	}
	var ids []int64
	for rows.Next() {
		var id int64
		rows.Scan(&id)
		ids = append(ids, id)
	}
	if rows.Err() != nil || len(ids) != n {
		c.t.Fatalf("%d tokens of %s (%v), want %d", len(ids), prefix, rows.Err(), n)
	}
	tailertest.Eventually(c.t, 30*time.Second, func() error {
		counts := c.tokenCounts()
		for _, id := range ids {
			if counts[id] != 1 {
				return errTokenCount(id, counts[id])
			}
		}
		return nil
	})
}

// Only the session markers' subject purged, under the tailer and while it
// was stopped cleanly: every batch is still there, and the tailer streams
// on, every token once.
func TestMarkersPurgedLoseNoBatch(t *testing.T) {
	t.Parallel()
	for _, stopped := range []bool{false, true} {
		name := "under the tailer"
		if stopped {
			name = "while it was stopped"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := newCluster(t, pgtest.Shared(t), 10, 50*time.Millisecond)
			js := c.jsOf()
			p := c.watchedTailer()
			p.waitLog("msg=streaming", 1, 30*time.Second)
			c.accounts("before", 30)
			c.expectExactlyOnce(30 * time.Second)
			if stopped {
				if code := p.term(30 * time.Second); code != exitOK {
					t.Fatalf("SIGTERM: exit %d", code)
				}
			}
			s, err := js.Stream(c.ctx, "MAILROOM")
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Purge(c.ctx, jetstream.WithPurgeSubject("mailroom.batches._session")); err != nil {
				t.Fatal(err)
			}
			if stopped {
				p = c.watchedTailer()
				p.waitLog("msg=streaming", 1, 30*time.Second)
			}
			c.accounts("after", 20)
			if n := c.expectExactlyOnce(30 * time.Second); n != 50 {
				t.Fatalf("%d tokens once, want 50", n)
			}
			// A few checks later, still streaming.
			time.Sleep(2 * time.Second)
			p.ready(c)
			if strings.Contains(p.out.String(), "level=ERROR") {
				t.Fatalf("the markers purged were taken for a loss:\n%s", p.out.String())
			}
		})
	}
}

// A stream full under its discard new limit: the tailer names it (the
// stream, its limit, the way out) in the log, /readyz, tailer_blocked and
// tailer status, which does not say to start tailer run; raised, the
// stream takes the tokens that waited, each once, without a restart.
func TestFullStreamIsNamed(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pgtest.Shared(t), 10, 50*time.Millisecond)
	js := c.jsOf()
	c.makeStream(js, jetstream.StreamConfig{MaxMsgs: 4, Discard: jetstream.DiscardNew})
	p := c.watchedTailer()
	p.waitLog("msg=streaming", 1, 30*time.Second)
	c.accountsApart("full", 8)
	const want = "stream MAILROOM is full (maximum messages exceeded)"
	p.blocked(c, "nats", want)
	if rep, _ := c.status(1 << 40); strings.Contains(strings.Join(rep.Problems, " "), "start tailer run") {
		t.Errorf("tailer status says to start tailer run while one waits: %+v", rep.Problems)
	}
	c.editStream(js, func(cfg *jetstream.StreamConfig) { cfg.MaxMsgs = 100000 })
	if n := c.expectExactlyOnce(60 * time.Second); n != 8 {
		t.Fatalf("%d tokens once, want 8", n)
	}
	p.ready(c)
}

func errTokenCount(id int64, n int) error {
	return fmt.Errorf("token %d is %d times on the stream, waiting for once", id, n)
}

// The account's JetStream storage limit reached (max_file): the tailer
// names it (no room for the stream's batches, the account's max_storage)
// on /readyz, tailer_blocked and tailer status, never "start tailer run";
// the limit raised (the server restarted with it), the tokens that waited
// are published, each once.
func TestAccountStorageLimitIsNamed(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pgtest.Shared(t), 10, 50*time.Millisecond)
	store := t.TempDir()
	conf := func(maxFile int) string {
		path := filepath.Join(t.TempDir(), "nats.conf")
		body := fmt.Sprintf("jetstream {}\naccounts { MR { jetstream { max_file: %d, max_mem: 0 }, users: [ { user: t, password: t } ] } }\nno_auth_user: t\n", maxFile)
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	c.startNATSConfigIn(conf(16384), store)
	p := c.watchedTailer()
	p.waitLog("msg=streaming", 1, 30*time.Second)
	for i := range 12 {
		c.accounts(fmt.Sprintf("room%d_", i), 10)
		time.Sleep(c.timeout + 30*time.Millisecond)
	}
	const want = "has no room for stream MAILROOM's batches (resource limits exceeded for account)"
	p.blocked(c, "nats", want)
	if rep, _ := c.status(1 << 40); strings.Contains(strings.Join(rep.Problems, " "), "start tailer run") {
		t.Errorf("tailer status says to start tailer run while one waits: %+v", rep.Problems)
	}
	c.startNATSConfigIn(conf(1<<30), store)
	if n := c.expectExactlyOnce(60 * time.Second); n != 120 {
		t.Fatalf("%d tokens once, want 120", n)
	}
	p.ready(c)
}
