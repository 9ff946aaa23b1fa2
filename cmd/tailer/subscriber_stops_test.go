package main

// tailer subscribe whatever its sender or its NATS user does (issue 69):
// it stops within its stop timeout, a sender that exits 0 after a line is
// done with it, and a denied ack is named.

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/internal/testutil/tailertest"
)

// groupAlive reports whether a process whose command line holds marker
// is still running.
func groupAlive(t *testing.T, marker string) bool {
	t.Helper()
	dirs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, d := range dirs {
		b, err := os.ReadFile(d)
		if err == nil && strings.Contains(strings.ReplaceAll(string(b), "\x00", " "), marker) {
			return true
		}
	}
	return false
}

// A sender that closes its input and lives on: the subscriber stops it
// (its process group) once it has not exited within the stop timeout,
// and starts it again; SIGTERM ends the subscriber within its stop
// timeout and the sender's grace, exit 0, the sender's group stopped.
func TestSubscriberStopsWhateverTheSender(t *testing.T) {
	t.Parallel()
	c, _ := newSingleTokenMessages(t, 3, 2)
	out := filepath.Join(t.TempDir(), "lines")
	marker := fmt.Sprintf("sleep 6%05d", time.Now().UnixNano()%100000)
	s := c.subscriber(out, "--durable", "closer", "--from-start", "--stop-timeout", "2s", "--exec", "exec 0<&-; "+marker)
	tailertest.Eventually(t, 30*time.Second, func() error {
		if !strings.Contains(s.out.String(), "stopped reading its input and did not exit within the stop timeout") {
			return fmt.Errorf("the subscriber has not stopped the sender that closed its input:\n%s", s.out.String())
		}
		return nil
	})
	start := time.Now()
	if code := s.term(20 * time.Second); code != exitOK {
		t.Fatalf("SIGTERM: exit %d:\n%s", code, s.out.String())
	}
	t.Logf("stopped %s after SIGTERM (stop timeout 2s)", time.Since(start).Round(100*time.Millisecond))
	if groupAlive(t, marker) {
		t.Fatalf("the sender's process (%s) outlived the subscriber", marker)
	}
}

// head -n 1 as the sender: it takes one line, writes it and exits 0,
// which says it is done with that line. Each line is written once, and
// every message acknowledged.
func TestSenderThatExitsAfterALine(t *testing.T) {
	t.Parallel()
	c, want := newSingleTokenMessages(t, 4, 2)
	out := filepath.Join(t.TempDir(), "lines")
	s := c.subscriber(out, "--durable", "head", "--from-start", "--exec", "head -n 1")
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(out)
			t.Logf("output:\n%s", b)
		}
	})
	got := waitOutput(t, out, len(want))
	seen := map[string]int{}
	for _, tok := range got {
		seen[tok.Token]++
	}
	time.Sleep(2 * time.Second)
	if got, _ = outputTokens(t, out); len(got) != len(want) {
		t.Fatalf("%d tokens written, want %d, each once:\n%s", len(got), len(want), s.out.String())
	}
	for tok, n := range seen {
		if n != 1 {
			t.Fatalf("token %s written %d times", tok, n)
		}
	}
	if code := s.term(30 * time.Second); code != exitOK {
		t.Fatalf("SIGTERM: exit %d", code)
	}
	again := c.subscriber(out, "--durable", "head", "--exec", "head -n 1")
	time.Sleep(2 * time.Second)
	if got, _ := outputTokens(t, out); len(got) != len(want) {
		t.Fatalf("started again, the subscriber wrote %d tokens, want %d (all were done)", len(got), len(want))
	}
	again.term(30 * time.Second)
}

// The subscriber's NATS user may not publish acknowledgements: it says
// so in the log (once) and on /readyz, naming the subject and the
// permission it needs, instead of a timeout.
func TestAckDeniedIsNamed(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pgtest.Shared(t), 1, 50*time.Millisecond)
	conf := filepath.Join(t.TempDir(), "nats.conf")
	body := `jetstream {}
accounts { MR { jetstream: enabled, users: [
  { user: pub, password: pub },
  { user: sub, password: sub, permissions: { publish: { allow: [">"], deny: ["$JS.ACK.>"] } } }
] } }
`
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	c.startNATSConfig(conf)
	c.natsURLs = fmt.Sprintf("nats://pub:pub@127.0.0.1:%d", c.natsPort)
	c.tailer()
	c.accounts("denied", 3)
	c.expectExactlyOnce(30 * time.Second)
	port, err := pgtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	out := filepath.Join(t.TempDir(), "lines")
	s := c.subscriber(out, "--durable", "denied", "--from-start", "--ack-wait", "2s", "--health-addr", addr,
		"--nats-url", fmt.Sprintf("nats://sub:sub@127.0.0.1:%d", c.natsPort))
	const want = "denies this subscriber's user publishing acknowledgements"
	tailertest.Eventually(t, 30*time.Second, func() error {
		code, body := httpGet("http://" + addr + "/readyz")
		if code != 503 || !strings.Contains(body, want) || !strings.Contains(body, "$JS.ACK.MAILROOM.>") {
			return fmt.Errorf("/readyz %d %s", code, body)
		}
		if !strings.Contains(s.out.String(), want) {
			return fmt.Errorf("the log does not say it:\n%s", s.out.String())
		}
		return nil
	})
	time.Sleep(5 * time.Second)
	if n := strings.Count(s.out.String(), "denies this subscriber's user a publish"); n != 1 {
		t.Errorf("the denial said %d times, want once:\n%s", n, s.out.String())
	}
}

// The durable's record cannot be saved: its bucket full (made small by an
// operator). The subscriber names it, once in the log and on /readyz,
// with the server's words and the way out, and goes on once the bucket
// is grown: every token written.
func TestProgressBucketFullIsNamed(t *testing.T) {
	t.Parallel()
	c, want := newSingleTokenMessages(t, 4, 2)
	js := c.jsOf()
	if _, err := js.CreateKeyValue(c.ctx, jetstream.KeyValueConfig{Bucket: "MAILROOM_subscribers", History: 1, MaxBytes: 64}); err != nil {
		t.Fatal(err)
	}
	port, err := pgtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	out := filepath.Join(t.TempDir(), "lines")
	s := c.subscriber(out, "--durable", "full", "--from-start", "--health-addr", addr)
	const words = "the server has no room for the durable's record of which batches are done (maximum bytes exceeded)"
	tailertest.Eventually(t, 30*time.Second, func() error {
		code, body := httpGet("http://" + addr + "/readyz")
		if code != 503 || !strings.Contains(body, words) {
			return fmt.Errorf("/readyz %d %s", code, body)
		}
		if !strings.Contains(s.out.String(), words) {
			return fmt.Errorf("the log does not say it:\n%s", s.out.String())
		}
		return nil
	})
	if n := strings.Count(s.out.String(), "cannot save which batches are done"); n != 1 {
		t.Errorf("said %d times, want once:\n%s", n, s.out.String())
	}
	if _, err := js.UpdateKeyValue(c.ctx, jetstream.KeyValueConfig{Bucket: "MAILROOM_subscribers", History: 1, MaxBytes: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, out, len(want))
	tailertest.Eventually(t, 30*time.Second, func() error {
		if code, body := httpGet("http://" + addr + "/readyz"); code != 200 {
			return fmt.Errorf("/readyz %d %s", code, body)
		}
		return nil
	})
}
