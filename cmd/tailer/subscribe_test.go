package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/decoder/action"
	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/internal/testutil/tailertest"
	"github.com/mailroom/tailer/publish/subscriber"
	"github.com/mailroom/tailer/publish/token"
	"github.com/mailroom/tailer/publish/wire"
	"github.com/mailroom/tailer/publish/wire/wiretest"
)

// subscriber runs tailer subscribe with stdout appended to out.
func (c *cluster) subscriber(out string, args ...string) *proc {
	c.t.Helper()
	return c.subscriberOf(tailerBin, out, args...)
}

// subscriberOf is subscriber with the tailer binary bin.
func (c *cluster) subscriberOf(bin, out string, args ...string) *proc {
	c.t.Helper()
	f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(bin, append([]string{"subscribe"}, args...)...)
	cmd.Env = append(os.Environ(), "MAILROOM_NATS_URL="+c.natsURL())
	p := &proc{t: c.t, cmd: cmd, out: &tailertest.Buffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = f, p.out
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	c.t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.done
		noRace(c.t, p)
		if c.t.Failed() {
			c.t.Logf("subscriber pid %d output:\n%s", cmd.Process.Pid, p.out.String())
		}
	})
	return p
}

// awaitOutput waits until the file out holds every token of want; it
// fails when none is added for a minute.
func awaitOutput(t *testing.T, out string, want map[int64]string) {
	t.Helper()
	tailertest.EventuallyProgressing(t, time.Minute, func() (int, error) {
		if missing, _ := countOutput(t, out, want); missing > 0 {
			return len(want) - missing, fmt.Errorf("%d of %d tokens never delivered", missing, len(want))
		}
		return len(want), nil
	})
}

// waitOutput waits until the file out holds at least n tokens, and returns
// them; it fails when no token has been added for 30 s.
func waitOutput(t *testing.T, out string, n int) []subscriber.SignedToken {
	t.Helper()
	var got []subscriber.SignedToken
	tailertest.EventuallyProgressing(t, 30*time.Second, func() (int, error) {
		if got, _ = outputTokens(t, out); len(got) < n {
			return len(got), fmt.Errorf("%d tokens written, want %d", len(got), n)
		}
		return len(got), nil
	})
	return got
}

// signedTokens returns the signed token of every row in tokens, by id.
func (c *cluster) signedTokens() map[int64]string {
	c.t.Helper()
	key, _ := token.ParseKey(goodKey)
	signer, _ := token.NewSigner("k", key)
	rows, err := c.Conn.Query(c.ctx, `SELECT id, action::text, secret, coalesce(code, '') FROM tokens`)
	if err != nil {
		c.t.Fatal(err)
	}
	out := map[int64]string{}
	for rows.Next() {
		var id int64
		var label, code string
		var secret []byte
		if err := rows.Scan(&id, &label, &secret, &code); err != nil {
			c.t.Fatal(err)
		}
		var s [32]byte
		copy(s[:], secret)
		a, _ := action.Parse(label)
		tok, err := signer.Token(a, &s, []byte(code))
		if err != nil {
			c.t.Fatal(err)
		}
		out[id] = tok
	}
	return out
}

// firstMessage returns the stream's first batch.
func (c *cluster) firstMessage() *jetstream.RawStreamMsg {
	c.t.Helper()
	msgs := c.messages()
	if len(msgs) == 0 {
		c.t.Fatal("no batch on the stream")
	}
	return msgs[0]
}

// readOutput is the whole lines of the file at path and of its readers'
// files, path.<pid>. A line without its newline yet is one a reader is
// still writing, or one it was killed writing: not delivered.
func readOutput(path string) []byte {
	files, _ := filepath.Glob(path + ".*")
	var all []byte
	for _, f := range append([]string{path}, files...) {
		data, _ := os.ReadFile(f)
		all = append(all, data[:bytes.LastIndexByte(data, '\n')+1]...)
	}
	return all
}

// outputTokens reads the lines a subscriber wrote, in order (a file a
// reader of readers wrote after the file it appended to).
func outputTokens(t *testing.T, path string) (tokens []subscriber.SignedToken, lines [][]subscriber.SignedToken) {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		t.Fatal(err)
	}
	data := readOutput(path)
	for _, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
		if line == "" {
			continue
		}
		toks, err := subscriber.DecodeLine(line)
		if err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		lines = append(lines, toks)
		tokens = append(tokens, toks...)
	}
	return tokens, lines
}

// newSingleTokenMessages is a cluster whose tailer has published txs
// transactions of perTx tokens, one token a message, and the tokens as
// signed, by id.
func newSingleTokenMessages(t *testing.T, txs, perTx int) (*cluster, map[int64]string) {
	t.Helper()
	c := newCluster(t, pgtest.Shared(t), 1, 50*time.Millisecond)
	// Batches ready together would share a message.
	c.tailer("MAILROOM_MAX_BATCHES_PER_MESSAGE=1")
	for i := 0; i < txs; i++ {
		c.Exec(`INSERT INTO accounts (email, login) SELECT 's' || $1::int || '_' || g || '@x', 's' || $1::int || '_' || g FROM generate_series(1, $2::int) g`, i, perTx)
	}
	c.expectExactlyOnce(60 * time.Second)
	want := c.signedTokens()
	if len(want) != txs*perTx {
		t.Fatalf("%d tokens", len(want))
	}
	return c, want
}

func TestSubscribeSurvivesKills(t *testing.T) {
	t.Parallel()
	// One token a batch: 1,000 messages keep the subscriber busy long
	// enough to be killed mid-stream.
	c, want := newSingleTokenMessages(t, 100, 10)

	// The first batch's line, as a run killed after writing it but before
	// acknowledging it would have left it.
	first := c.firstMessage()
	b, err := subscriber.Decode(first.Header, first.Data)
	if err != nil {
		t.Fatal(err)
	}
	unacked := string(subscriber.AppendLine(nil, b.Tokens)) + "\n"

	for _, tc := range []struct {
		name  string
		args  []string
		exact bool
	}{
		{"at least once", []string{"--durable", "plain", "--from-start", "--ack-wait", "2s"}, false},
		{"exactly once with a dedup window", []string{"--durable", "dedup", "--from-start", "--ack-wait", "2s", "--dedup-window", "5000"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "lines")
			if err := os.WriteFile(out, []byte(unacked), 0o644); err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(3, 4))
			// Kill it at random moments until four kills hit it mid-stream
			// (some output, not all of it).
			midStream, runs := 0, 0
			for midStream < 4 {
				if runs++; runs > 40 {
					t.Fatalf("only %d of 40 kills landed mid-stream", midStream)
				}
				p := c.subscriber(out, tc.args...)
				p.waitLog("consuming", 1, 10*time.Second)
				time.Sleep(time.Duration(5+rng.IntN(60)) * time.Millisecond)
				p.kill()
				got, _ := outputTokens(t, out)
				if len(got) > 0 && len(got) < len(want) {
					midStream++
				}
			}
			p := c.subscriber(out, tc.args...)
			p.waitLog("consuming", 1, 10*time.Second)
			var got []subscriber.SignedToken
			seen := map[string]int{}
			tailertest.EventuallyProgressing(t, 30*time.Second, func() (int, error) {
				got, _ = outputTokens(t, out)
				clear(seen)
				for _, tok := range got {
					seen[tok.Token]++
				}
				missing := 0
				for _, tok := range want {
					if seen[tok] == 0 {
						missing++
					}
				}
				if missing > 0 {
					return len(want) - missing, fmt.Errorf("%d of %d tokens never written", missing, len(want))
				}
				return len(want), nil
			})
			dups := 0
			for _, n := range seen {
				if n > 1 {
					dups += n - 1
				}
			}
			t.Logf("%d tokens written for %d over %d runs (%d killed mid-stream), %d repeated", len(got), len(want), runs+1, midStream, dups)
			if tc.exact && dups > 0 {
				t.Fatalf("%d tokens written more than once with --dedup-window", dups)
			}
			if !tc.exact && dups == 0 {
				t.Fatal("the unacknowledged first batch was not written again: the test does not exercise redelivery")
			}
			if len(seen) != len(want) {
				t.Fatalf("%d distinct tokens written, want %d", len(seen), len(want))
			}
			p.cmd.Process.Signal(syscall.SIGTERM)
			<-p.done
			if code := p.cmd.ProcessState.ExitCode(); code != 0 {
				t.Fatalf("exit %d after SIGTERM:\n%s", code, p.out.String())
			}
		})
	}
}

func TestSubscribeMaxTokensPerLine(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pgtest.Shared(t), 25, 100*time.Millisecond)
	c.tailer()
	c.Exec(`INSERT INTO accounts (email, login) SELECT 'm' || g || '@x', 'm' || g FROM generate_series(1, 60) g`)
	c.expectExactlyOnce(30 * time.Second)
	// The tokens in stream order.
	var streamOrder []int64
	rows, _ := c.Conn.Query(c.ctx, `SELECT id FROM tokens ORDER BY id`)
	streamOrder, _ = pgx.CollectRows(rows, pgx.RowTo[int64])
	signed := c.signedTokens()

	out := filepath.Join(t.TempDir(), "lines")
	p := c.subscriber(out, "--durable", "split", "--from-start", "--max-tokens-per-line", "10")
	p.waitLog("consuming", 1, 10*time.Second)
	waitOutput(t, out, 60)
	p.cmd.Process.Signal(syscall.SIGTERM)
	<-p.done
	got, lines := outputTokens(t, out)
	for i, l := range lines {
		if len(l) > 10 {
			t.Fatalf("line %d holds %d tokens", i, len(l))
		}
	}
	if len(lines) != 7 { // 25+25+10 tokens: 3+3+1 lines
		t.Errorf("%d lines, want 7", len(lines))
	}
	if len(got) != len(streamOrder) {
		t.Fatalf("%d tokens, want %d", len(got), len(streamOrder))
	}
	for i, id := range streamOrder {
		if got[i].Token != signed[id] {
			t.Fatalf("token %d of the output is not token %d of the stream", i, id)
		}
	}
}

func TestSubscribeBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--durable"},
		{[]string{"--durable", "a.b"}, "--durable"},
		{[]string{"--durable", "x", "--format", "xml"}, "--format"},
		{[]string{"--durable", "x", "--filter-action", "login"}, "--filter-action"},
		{[]string{"--durable", "x", "--max-tokens-per-line", "-1"}, "--max-tokens-per-line"},
		{[]string{"--durable", "x", "--nats-url", "localhost"}, "MAILROOM_NATS_URL"},
		{[]string{"--durable", "x", "--into", "kafka"}, "--into: must be inbox or river"},
		{[]string{"--durable", "x", "--into", "inbox"}, "MAILROOM_INBOX_URL"},
		{[]string{"--durable", "x", "--into", "inbox", "--inbox-url", "postgres://u@h/db", "--exec", "cat"}, "--into stores tokens in a database"},
		{[]string{"--durable", "x", "--migrate"}, "--migrate: only with --into"},
		{[]string{"--durable", "x", "--inbox-password", "pw"}, "MAILROOM_INBOX_PASSWORD: set without MAILROOM_INBOX_URL"},
	} {
		var stdout, stderr strings.Builder
		code := run(append([]string{"subscribe"}, tc.args...), lookup(func(string) string { return "" }), &stdout, &stderr)
		if code != exitConfig || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("subscribe %v: exit %d, %q; want exit 2 naming %s", tc.args, code, stderr.String(), tc.want)
		}
	}
}

func TestSubjectPerAction(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pgtest.Shared(t), 10, 100*time.Millisecond)
	c.tailer("MAILROOM_SUBJECT_PER_ACTION=true")
	c.Exec(`INSERT INTO accounts (email, login) SELECT 'p' || g || '@x', 'p' || g FROM generate_series(1, 40) g`)
	c.expectExactlyOnce(30 * time.Second)
	// Half of them activate, then ask for recoveries, interleaved with new
	// accounts' activation tokens.
	c.Exec(`UPDATE tokens SET consumed_at = 1 WHERE account % 2 = 0`)
	for i := 0; i < 10; i++ {
		c.Exec(`INSERT INTO tokens (account, action) SELECT id, 'password_recovery' FROM accounts WHERE status = 'active' AND id % 10 = $1 % 5 * 2`, i)
		c.Exec(`INSERT INTO accounts (email, login) VALUES ('q' || $1::int || '@x', 'q' || $1::int)`, i)
	}
	total := c.expectExactlyOnce(30 * time.Second)
	var recoveries int
	c.Conn.QueryRow(c.ctx, `SELECT count(*) FROM tokens WHERE action = 'password_recovery'`).Scan(&recoveries)
	if recoveries == 0 || recoveries == total {
		t.Fatalf("%d recoveries of %d tokens: the test needs both actions", recoveries, total)
	}

	// Every batch is on its action's subject and holds only that action.
	stream, done, err := c.stream()
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	msgs, err := wiretest.StoredMessages(c.ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		b, err := subscriber.Decode(m.Header, m.Data)
		if err != nil {
			t.Fatal(err)
		}
		for _, tok := range b.Tokens {
			if m.Subject != "mailroom.batches."+tok.Action {
				t.Fatalf("message %d on %s holds a %s token", m.Sequence, m.Subject, tok.Action)
			}
		}
	}

	// A consumer of password recovery alone gets exactly those.
	out := filepath.Join(t.TempDir(), "lines")
	p := c.subscriber(out, "--durable", "recovery", "--from-start", "--filter-action", "password_recovery")
	p.waitLog("consuming", 1, 10*time.Second)
	got := waitOutput(t, out, recoveries)
	for _, tok := range got {
		if tok.Action != "password_recovery" {
			t.Fatalf("recovery consumer got a %s token", tok.Action)
		}
	}
	if len(got) != recoveries {
		t.Fatalf("recovery consumer wrote %d tokens, want %d", len(got), recoveries)
	}
}

// checkLines checks that every line is what the mailroom sender parses: rows
// of 5 comma-separated fields, action 1 or 2, each field at most 254 bytes,
// at most maxPerAction rows of each action; it returns the signed tokens.
func checkLines(t *testing.T, data string, maxPerAction int) []string {
	t.Helper()
	var tokens []string
	for n, line := range strings.Split(strings.TrimSuffix(data, "\n"), "\n") {
		if line == "" {
			continue
		}
		fields := strings.Split(line, ",")
		if len(fields)%5 != 0 {
			t.Fatalf("line %d has %d fields, not 5 a row: %q", n, len(fields), line)
		}
		perAction := map[string]int{}
		for r := 0; r < len(fields); r += 5 {
			row := fields[r : r+5]
			if row[0] != "1" && row[0] != "2" {
				t.Fatalf("line %d row %d: action %q", n, r/5, row[0])
			}
			for _, f := range row {
				if len(f) > wire.MaxLineField {
					t.Fatalf("line %d row %d: a field of %d bytes", n, r/5, len(f))
				}
			}
			if perAction[row[0]]++; perAction[row[0]] > maxPerAction {
				t.Fatalf("line %d: more than %d rows of action %s", n, maxPerAction, row[0])
			}
			tokens = append(tokens, row[3])
		}
	}
	return tokens
}

// hostileFields are emails and logins that would break a collector line,
// or a reader of it: a comma, a forged row, CR, a field too long, every
// other C0 control PostgreSQL can store (all but NUL), DEL, NEL, U+2028
// and U+2029; each a pair of (email, login) with %[1]d for a number.
func hostileFields() [][2]string {
	forged := "\n2,victim@example.com,victim," + strings.Repeat("A", 86) + ",12345"
	h := [][2]string{
		{"h%[1]d,comma@evil.example", "h%[1]d"},
		{"h%[1]d@evil.example", "h%[1]d" + forged},
		{"h%[1]d\r@evil.example", "h%[1]d_cr"},
		{"h%[1]d" + strings.Repeat("é", 240), "h%[1]d_long"}, // 254 characters, 480+ bytes
	}
	controls := []string{"\x7f", "\u0085", "\u2028", "\u2029"}
	for c := 1; c < 0x20; c++ {
		controls = append(controls, string(rune(c)))
	}
	for i, c := range controls {
		name := fmt.Sprintf("h%%[1]d_%d", i)
		if i%2 == 0 {
			h = append(h, [2]string{name + c + "@evil.example", name})
		} else {
			h = append(h, [2]string{name + "@evil.example", name + c})
		}
	}
	return h
}

// Accounts whose email or login would break a collector line sit in the
// same transactions as normal ones: every normal token arrives, none of
// theirs is put into a line, each is counted and said once by token id,
// and every line parses.
func TestHostileFieldsDoNotBreakLines(t *testing.T) {
	t.Parallel()
	hostile := hostileFields()
	for _, format := range []string{"line", "json"} {
		t.Run(format, func(t *testing.T) {
			c := newCluster(t, pgtest.Shared(t), 25, 100*time.Millisecond)
			tp, base := c.tailerWithHTTP("MAILROOM_FORMAT=" + format)
			tp.waitLog("streaming", 1, 20*time.Second)
			for tx := 0; tx < 10; tx++ {
				values, args := []string{}, []any{}
				add := func(email, login string) {
					values = append(values, fmt.Sprintf("($%d, $%d)", len(args)+1, len(args)+2))
					args = append(args, email, login)
				}
				for i := 0; i < 8; i++ {
					add(fmt.Sprintf("ok%d_%d@example.com", tx, i), fmt.Sprintf("ok%d_%d", tx, i))
				}
				for j := tx; j < len(hostile); j += 10 {
					add(fmt.Sprintf(hostile[j][0], j), fmt.Sprintf(hostile[j][1], j))
				}
				c.Exec(`INSERT INTO accounts (email, login) VALUES `+strings.Join(values, ","), args...)
			}
			signed := c.signedTokens()
			rows, _ := c.Conn.Query(c.ctx, `SELECT t.id FROM tokens t JOIN accounts a ON a.id = t.account WHERE a.email LIKE 'ok%'`)
			normal, err := pgx.CollectRows(rows, pgx.RowTo[int64])
			if err != nil || len(normal) != 80 || len(signed) != 80+len(hostile) {
				t.Fatalf("%d normal of %d tokens: %v", len(normal), len(signed), err)
			}

			out := filepath.Join(t.TempDir(), "lines")
			p := c.subscriber(out, "--durable", "sender", "--from-start", "--max-tokens-per-line", "10")
			p.waitLog("consuming", 1, 10*time.Second)
			var got []string
			tailertest.Eventually(t, 30*time.Second, func() error {
				data, _ := os.ReadFile(out)
				if got = checkLines(t, string(data), 10); len(got) < len(normal) {
					return fmt.Errorf("%d tokens written, want the %d normal ones", len(got), len(normal))
				}
				return nil
			})
			seen := map[string]int{}
			for _, tok := range got {
				seen[tok]++
			}
			for _, id := range normal {
				if seen[signed[id]] != 1 {
					t.Errorf("normal token %d written %d times", id, seen[signed[id]])
				}
			}
			if len(got) != len(normal) {
				t.Errorf("%d tokens written, want the %d normal ones", len(got), len(normal))
			}
			if format == "line" {
				// The stream itself: every body parses, and the skips
				// were counted, and logged once each by token id without
				// the field.
				c.expectStreamHolds(len(normal))
				if n := strings.Count(tp.out.String(), "reason=unsafe_field"); n != len(hostile) {
					t.Errorf("tailer logged %d unsafe_field skips, want %d", n, len(hostile))
				}
				_, page := httpGet(base + "/metrics")
				if v := grepLines(page, `tailer_tokens_skipped_total{reason="unsafe_field"}`); !strings.HasSuffix(v, fmt.Sprintf(" %d", len(hostile))) {
					t.Errorf("skips counted: %q, want %d", v, len(hostile))
				}
				if strings.Contains(tp.out.String(), "victim@example.com") || strings.Contains(tp.out.String(), "evil.example") {
					t.Error("a hostile field reached the log")
				}
			} else {
				// The skips of the last message may be logged a moment
				// after its lines are written.
				tailertest.Eventually(t, 10*time.Second, func() error {
					if n := strings.Count(p.out.String(), "reason=unsafe_field"); n != len(hostile) {
						return fmt.Errorf("subscriber logged %d unsafe_field skips, want %d:\n%s", n, len(hostile), p.out.String())
					}
					return nil
				})
			}
		})
	}
}

// expectStreamHolds waits for n tokens on the stream and checks every line
// body.
func (c *cluster) expectStreamHolds(n int) {
	c.t.Helper()
	tailertest.Eventually(c.t, 30*time.Second, func() error {
		s, done, err := c.stream()
		if err != nil {
			c.t.Fatal(err)
		}
		msgs, err := c.streamCache.Messages(c.ctx, s)
		done()
		if err != nil {
			c.t.Fatal(err)
		}
		total := 0
		for _, m := range msgs {
			total += len(checkLines(c.t, string(m.Data), 1<<30))
		}
		if total > n {
			c.t.Fatalf("stream holds %d tokens, want %d", total, n)
		}
		if total < n {
			return fmt.Errorf("stream holds %d tokens, want %d", total, n)
		}
		return nil
	})
}

// After TRUNCATE tokens RESTART IDENTITY, new tokens reuse old ids; the
// subscriber's dedup must not take them for ones it has written.
func TestDedupSurvivesReusedIDs(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pgtest.Shared(t), 10, 100*time.Millisecond)
	c.tailer().waitLog("streaming", 1, 20*time.Second)
	out := filepath.Join(t.TempDir(), "lines")
	p := c.subscriber(out, "--durable", "sender", "--from-start", "--dedup-window", "1000")
	p.waitLog("consuming", 1, 10*time.Second)
	waitTokens := func(n int) []subscriber.SignedToken {
		t.Helper()
		return waitOutput(t, out, n)
	}
	c.Exec(`INSERT INTO accounts (email, login) SELECT 'first' || g || '@x', 'first' || g FROM generate_series(1, 50) g`)
	waitTokens(50)
	c.Exec(`TRUNCATE tokens RESTART IDENTITY`)
	c.Exec(`INSERT INTO accounts (email, login) SELECT 'second' || g || '@x', 'second' || g FROM generate_series(1, 50) g`)
	var maxID int64
	if err := c.Conn.QueryRow(c.ctx, `SELECT max(id) FROM tokens`).Scan(&maxID); err != nil || maxID != 50 {
		t.Fatalf("ids after RESTART IDENTITY go up to %d (%v): the test needs reused ids", maxID, err)
	}
	got := waitTokens(100)
	seen := map[string]bool{}
	for _, tok := range got {
		seen[tok.Token] = true
	}
	if len(seen) != 100 || len(got) != 100 {
		t.Fatalf("%d tokens written, %d distinct, want 100", len(got), len(seen))
	}
}

// countOutput counts how often each wanted token is in the output file:
// missing ones, and the repeats.
func countOutput(t *testing.T, path string, want map[int64]string) (missing, repeats int) {
	t.Helper()
	got, _ := outputTokens(t, path)
	seen := map[string]int{}
	for _, tok := range got {
		seen[tok.Token]++
	}
	for _, tok := range want {
		switch n := seen[tok]; {
		case n == 0:
			missing++
		case n > 1:
			repeats += n - 1
		}
	}
	return missing, repeats
}

// execSubscriber starts tailer subscribe --from-start on durable with
// --exec sender, for t.
func (c *cluster) execSubscriber(t *testing.T, durable, sender string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(tailerBin, append([]string{"subscribe", "--durable", durable, "--from-start", "--exec", sender}, args...)...)
	cmd.Env = append(os.Environ(), "MAILROOM_NATS_URL="+c.natsURL())
	p := &proc{t: t, cmd: cmd, out: &tailertest.Buffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-p.done; noRace(t, p) })
	return p
}

// The sender of the lines dies again and again while tailer subscribe
// writes into its pipe: a real head -n K (K random, 1-60, so that twenty
// readers cannot run out of the 1,500 lines), which reads a block
// of lines and exits after K of them, throwing the rest of its block away.
// A message is acknowledged only once the reader has taken the next one,
// so nothing the dying reader held is lost; what it held is delivered
// again, a bounded number of repeats. Both through a shell pipe (the
// subscriber exits with the reader) and with --exec (the subscriber starts
// the sender again itself).
func TestSubscribeSenderDies(t *testing.T) {
	t.Parallel()
	c, want := newSingleTokenMessages(t, 60, 25)
	const deaths = 20
	env := append(os.Environ(), "MAILROOM_NATS_URL="+c.natsURL())

	t.Run("pipe", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "lines")
		rng := rand.New(rand.NewPCG(19, 1))
		for i := 0; i < deaths; i++ {
			// head reads ahead a block at a time; the other reader takes a
			// line at a time and is slower than the subscriber, so that
			// lines queue in the pipe.
			reader := fmt.Sprintf("head -n %d", 1+rng.IntN(60))
			if i%2 == 1 {
				reader = fmt.Sprintf(`sh -c 'i=0; while [ $i -lt %d ] && IFS= read -r l; do printf "%%s\n" "$l"; i=$((i+1)); sleep 0.005; done'`, 1+rng.IntN(60))
			}
			ctx, cancel := context.WithTimeout(c.ctx, 60*time.Second)
			sh := exec.CommandContext(ctx, "sh", "-c", fmt.Sprintf("exec %s subscribe --durable pipe --from-start --ack-wait 5s | %s >> %s", tailerBin, reader, out))
			sh.Env = env
			// The whole pipeline is stopped on timeout, not just the shell.
			sh.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			sh.Cancel = func() error { return syscall.Kill(-sh.Process.Pid, syscall.SIGKILL) }
			var errOut tailertest.Buffer
			sh.Stderr = &errOut
			err := sh.Run()
			timedOut := ctx.Err() != nil
			cancel()
			if timedOut {
				t.Fatalf("run %d did not end within a minute of its reader:\n%s", i, errOut.String())
			}
			if err != nil {
				t.Fatalf("run %d: %v", i, err)
			}
			if strings.Contains(errOut.String(), "WARNING: DATA RACE") {
				t.Fatalf("run %d: the race detector reported:\n%s", i, errOut.String())
			}
			if !strings.Contains(errOut.String(), "the reader of the lines is gone") {
				t.Fatalf("run %d: the subscriber did not notice its reader go:\n%s", i, errOut.String())
			}
		}
		p := c.subscriber(out, "--durable", "pipe", "--ack-wait", "5s")
		var repeats int
		tailertest.EventuallyProgressing(t, 30*time.Second, func() (int, error) {
			var missing int
			if missing, repeats = countOutput(t, out, want); missing > 0 {
				return len(want) - missing, fmt.Errorf("%d of %d tokens never reached a reader", missing, len(want))
			}
			return len(want), nil
		})
		t.Logf("%d tokens through %d dead readers: none lost, %d repeated", len(want), deaths, repeats)
		// In doubt when a reader dies: the message it took last and the one
		// being handed over; nearly always only the first was written.
		if repeats > 2*deaths {
			t.Fatalf("%d repeats, more than the two messages in doubt per dead reader", repeats)
		}
		p.cmd.Process.Signal(syscall.SIGTERM)
		<-p.done
	})

	t.Run("exec", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "lines")
		p := c.execSubscriber(t, "exec", "head -n $(shuf -i 1-60 -n 1) >> "+out, "--ack-wait", "5s")
		p.waitLog("the sender exited", deaths, 2*time.Minute)
		// Everything delivered, at most the two in doubt unacknowledged: then
		// stop. The last sender gets the end of its input, writes out what
		// it holds (head buffers its output) and exits 0.
		s, done, err := c.stream()
		if err != nil {
			t.Fatal(err)
		}
		defer done()
		tailertest.EventuallyProgressing(t, 30*time.Second, func() (int, error) {
			cons, err := s.Consumer(c.ctx, "exec")
			if err != nil {
				t.Fatal(err)
			}
			info, err := cons.Info(c.ctx)
			if err != nil {
				t.Fatal(err)
			}
			if info.NumPending > 0 || info.NumAckPending > 2 {
				return int(info.AckFloor.Stream), fmt.Errorf("consumer: %d not delivered, %d unacknowledged:\n%s", info.NumPending, info.NumAckPending, p.out.String())
			}
			return 0, nil
		})
		if code := p.term(40 * time.Second); code != 0 {
			t.Fatalf("exit %d after SIGTERM:\n%s", code, p.out.String())
		}
		restarts := strings.Count(p.out.String(), "the sender exited")
		if strings.Contains(p.out.String(), "stopping: the server awaits acks for messages it will deliver to the next subscriber") {
			// The last sender exited on its own as the subscriber stopped,
			// or the stop came before a sender was started again: what it
			// did not read is on the consumer still, for the next
			// subscriber (TestSubscribeSenderExitsOnItsOwnWhileStopping,
			// TestSubscribeStoppedBetweenSenders).
			restarts++
			f := c.subscriber(out, "--durable", "exec", "--ack-wait", "5s")
			// The last sender may have written every line before it
			// exited, leaving only repeats to come: the SIGTERM below must
			// not reach the subscriber before it handles signals.
			f.waitLog("consuming", 1, 30*time.Second)
			tailertest.EventuallyProgressing(t, 30*time.Second, func() (int, error) {
				if missing, _ := countOutput(t, out, want); missing > 0 {
					return len(want) - missing, fmt.Errorf("%d of %d tokens never reached a sender", missing, len(want))
				}
				return len(want), nil
			})
			if code := f.term(30 * time.Second); code != 0 {
				t.Fatalf("the subscriber after the last sender: exit %d:\n%s", code, f.out.String())
			}
		} else {
			cons, err := s.Consumer(c.ctx, "exec")
			if err != nil {
				t.Fatal(err)
			}
			if info, err := cons.Info(c.ctx); err != nil || info.NumAckPending != 0 {
				t.Fatalf("stopped without saying that lines come again, yet %d unacknowledged (%v):\n%s", info.NumAckPending, err, p.out.String())
			}
		}
		missing, repeats := countOutput(t, out, want)
		t.Logf("%d tokens through %d sender exits: %d lost, %d repeated", len(want), restarts, missing, repeats)
		if missing > 0 {
			t.Fatalf("%d of %d tokens never reached a sender:\n%s", missing, len(want), p.out.String())
		}
		if repeats > 2*restarts {
			t.Fatalf("%d repeats, more than the two messages in doubt per exit", repeats)
		}
	})
}

// A sender that exits 0 on its own, before the end of its input, while the
// subscriber stops: the message it never read was not done with, whatever
// its exit code says. The sender reads one line, leaves the next in its
// pipe, and exits 0 a second later; the subscriber is stopped in that
// second. Before the fix the stopping subscriber took the exit 0 for "done
// with all it was given" and acknowledged the unread message: lost.
func TestSubscribeSenderExitsOnItsOwnWhileStopping(t *testing.T) {
	t.Parallel()
	c, want := newSingleTokenMessages(t, 2, 1)
	out := filepath.Join(t.TempDir(), "lines")
	if err := os.WriteFile(out, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	p := c.execSubscriber(t, "early", `IFS= read -r l; printf '%s\n' "$l" >> `+out+`; sleep 1; exit 0`)
	s, done, err := c.stream()
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	info := func() *jetstream.ConsumerInfo {
		cons, err := s.Consumer(c.ctx, "early")
		if err != nil {
			t.Fatal(err)
		}
		ci, err := cons.Info(c.ctx)
		if err != nil {
			t.Fatal(err)
		}
		return ci
	}
	// The first line is out and the second message handed to the
	// subscriber, which writes it into the pipe the sender no longer reads.
	waitOutput(t, out, 1)
	tailertest.Eventually(t, 10*time.Second, func() error {
		if ci := info(); ci.NumAckPending != 2 {
			return fmt.Errorf("%d messages delivered and not acknowledged, want 2", ci.NumAckPending)
		}
		return nil
	})
	if code := p.term(30 * time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM:\n%s", code, p.out.String())
	}
	if missing, _ := countOutput(t, out, want); missing != 1 {
		t.Fatalf("%d of 2 tokens not written, want 1 (the sender reads one line):\n%s", missing, p.out.String())
	}
	if !strings.Contains(p.out.String(), "stopping: the sender did not read to the end of its input") ||
		!strings.Contains(p.out.String(), "stopping: the server awaits acks for messages it will deliver to the next subscriber") {
		t.Fatalf("the subscriber does not say the unread lines come again:\n%s", p.out.String())
	}
	// The stream holds the two messages alone (after the tailer's session
	// marker): the ack floor stays below the second.
	msgs := c.messages()
	if len(msgs) != 2 {
		t.Fatalf("%d batches on the stream, want 2", len(msgs))
	}
	if ci := info(); ci.AckFloor.Stream >= msgs[1].Sequence {
		t.Fatalf("the unread message was acknowledged (ack floor at stream sequence %d): lost\n%s", ci.AckFloor.Stream, p.out.String())
	}
}

// A stop that comes while the subscriber waits to start its sender again
// (a sender that fails is started again after a growing delay): the lines
// that sender did not finish were handed back, and the subscriber says, as
// it stops, that they come again. Before, it exited 0 saying nothing, and
// the consumer held them unacknowledged (TestSubscribeSenderDies/exec in a
// clean-clone CI run).
func TestSubscribeStoppedBetweenSenders(t *testing.T) {
	t.Parallel()
	c, want := newSingleTokenMessages(t, 2, 1)
	out := filepath.Join(t.TempDir(), "lines")
	if err := os.WriteFile(out, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// Reads one line, then fails: nothing is ever acknowledged, and each
	// start comes later than the one before.
	p := c.execSubscriber(t, "between", `IFS= read -r l; printf '%s\n' "$l" >> `+out+`; exit 1`)
	// Logged just before the subscriber waits a second to start it again.
	p.waitLog("in=1s", 1, 30*time.Second)
	if code := p.term(30 * time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM:\n%s", code, p.out.String())
	}
	if !strings.Contains(p.out.String(), "stopping: the server awaits acks for messages it will deliver to the next subscriber") ||
		!strings.Contains(p.out.String(), "messages=2") {
		t.Fatalf("the subscriber does not say that the two lines come again:\n%s", p.out.String())
	}
	s, done, err := c.stream()
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	cons, err := s.Consumer(c.ctx, "between")
	if err != nil {
		t.Fatal(err)
	}
	if ci, err := cons.Info(c.ctx); err != nil || ci.NumAckPending+int(ci.NumPending) != 2 || ci.AckFloor.Stream >= c.firstMessage().Sequence {
		t.Fatalf("consumer after the stop: %+v (%v), want both messages still to do", ci, err)
	}
	// The next subscriber writes both.
	if err := os.WriteFile(out, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	f := c.subscriber(out, "--durable", "between", "--ack-wait", "5s")
	waitOutput(t, out, len(want))
	if missing, _ := countOutput(t, out, want); missing != 0 {
		t.Fatalf("%d of %d tokens not written by the next subscriber", missing, len(want))
	}
	f.term(30 * time.Second)
}

// Into PostgreSQL, the short form of TestSubscribeIntoPostgres: the tokens
// of two messages become inbox rows and River jobs, once each, also when a
// subscriber of the same durable starts again from the start of the
// stream.
func TestSubscribeInto(t *testing.T) {
	t.Parallel()
	c, want := newSingleTokenMessages(t, 4, 5)
	consumerURL := pgtest.Shared(t).CreateDB(t)
	conn, err := pgx.Connect(c.ctx, consumerURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	s, done, err := c.stream()
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	for _, tc := range []struct{ into, count string }{
		{"inbox", `SELECT count(*), count(DISTINCT token_key) FROM mailroom_inbox`},
		{"river", `SELECT count(*), count(DISTINCT args->>'token_key') FROM river_job WHERE kind = 'mailroom_token'`},
	} {
		for run := range 2 {
			p := c.command([]string{"subscribe", "--durable", tc.into + strconv.Itoa(run), "--into", tc.into, "--migrate", "--from-start"}, "MAILROOM_INBOX_URL="+consumerURL)
			tailertest.Eventually(t, 30*time.Second, func() error {
				var rows, keys int
				conn.QueryRow(c.ctx, tc.count).Scan(&rows, &keys)
				if rows != len(want) || keys != len(want) {
					return fmt.Errorf("%s: %d rows of %d keys, want %d", tc.into, rows, keys, len(want))
				}
				if !strings.Contains(p.out.String(), "sink=*inbox.DB") {
					return errors.New("not consuming yet")
				}
				// The rows of the first run are there already: a run is
				// done when its consumer has every message acknowledged.
				cons, err := s.Consumer(c.ctx, tc.into+strconv.Itoa(run))
				if err != nil {
					return err
				}
				info, err := cons.Info(c.ctx)
				if err != nil {
					return err
				}
				if info.NumPending != 0 || info.NumAckPending != 0 {
					return fmt.Errorf("%s: %d pending, %d unacknowledged", tc.into, info.NumPending, info.NumAckPending)
				}
				return nil
			})
			if code := p.term(30 * time.Second); code != exitOK {
				t.Fatalf("%s: SIGTERM: exit %d:\n%s", tc.into, code, p.out.String())
			}
			var rows, keys int
			if err := conn.QueryRow(c.ctx, tc.count).Scan(&rows, &keys); err != nil || rows != len(want) || keys != len(want) {
				t.Fatalf("%s after run %d: %d rows of %d keys (%v), want %d", tc.into, run, rows, keys, err, len(want))
			}
			if run == 1 && !strings.Contains(p.out.String(), "message stored before") {
				t.Fatalf("%s: a second durable from the start stored nothing twice, and said so: %s", tc.into, p.out.String())
			}
		}
	}
}

// The database subscriber's consumer lost while it runs: made again at
// the last message the database holds a token of, and the tokens after it
// stored, once.
func TestSubscribeIntoConsumerLost(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pgtest.Shared(t), 5, 50*time.Millisecond)
	c.tailer()
	consumerURL := pgtest.Shared(t).CreateDB(t)
	conn, err := pgx.Connect(c.ctx, consumerURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var rows func(int)
	// 20 tokens in four transactions, each stored before the next: four
	// messages, so that a consumer made again too early shows as more
	// than one coming again.
	insert := func(prefix string, before int) {
		for i := range 4 {
			c.Exec(`INSERT INTO accounts (email, login) SELECT $1 || $2::int || '_' || g || '@x', $1 || $2::int || '_' || g FROM generate_series(1, 5) g`, prefix, i)
			rows(before + 5*(i+1))
		}
	}
	rows = func(n int) {
		t.Helper()
		tailertest.Eventually(t, 30*time.Second, func() error {
			var rows, keys int
			conn.QueryRow(c.ctx, `SELECT count(*), count(DISTINCT token_key) FROM mailroom_inbox`).Scan(&rows, &keys)
			if rows != n || keys != n {
				return fmt.Errorf("%d rows of %d keys, want %d", rows, keys, n)
			}
			return nil
		})
	}
	p := c.command([]string{"subscribe", "--durable", "lost", "--into", "inbox", "--migrate", "--from-start"}, "MAILROOM_INBOX_URL="+consumerURL)
	insert("a", 0)
	var seqs int
	if err := conn.QueryRow(c.ctx, `SELECT count(DISTINCT stream_seq) FROM mailroom_inbox`).Scan(&seqs); err != nil || seqs < 2 {
		t.Fatalf("the first 20 tokens came in %d messages (%v): want several", seqs, err)
	}
	s, done, err := c.stream()
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	if err := s.DeleteConsumer(c.ctx, "lost"); err != nil {
		t.Fatal(err)
	}
	p.waitLog("made again at the last message the sink holds a token of", 1, 30*time.Second)
	insert("b", 20)
	if code := p.term(30 * time.Second); code != exitOK {
		t.Fatalf("exit %d:\n%s", code, p.out.String())
	}
	// Made again at the last message stored (it may have been cut short
	// between parts): that one comes again, the ones before it do not.
	if n := strings.Count(p.out.String(), "message stored before"); n > 1 {
		t.Fatalf("made again before the last message stored: %d messages came again:\n%s", n, p.out.String())
	}
}
