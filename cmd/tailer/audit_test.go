package main

// tailer audit (issue 70): every eligible token of a window, by content,
// against the stream and what a durable delivered.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/internal/testutil/tailertest"
	"github.com/mailroom/tailer/publish/audit"
	"github.com/mailroom/tailer/publish/wire/wiretest"
)

// auditReport is tailer audit --json's report.
type auditReport struct {
	OK bool `json:"ok"`
	audit.Report
	Error string `json:"error"`
}

// runAudit runs tailer audit --json with args, and returns its report and
// exit code.
func (c *cluster) runAudit(args ...string) (auditReport, int) {
	c.t.Helper()
	p := c.command(append([]string{"audit", "--json", "--grace", "1s"}, args...))
	code := p.exit(2 * time.Minute)
	var rep auditReport
	out := p.out.String()
	if i := strings.Index(out, "{"); i >= 0 {
		if err := json.NewDecoder(strings.NewReader(out[i:])).Decode(&rep); err != nil {
			c.t.Fatalf("tailer audit %v: %v:\n%s", args, err, out)
		}
	}
	return rep, code
}

// confirmedPast waits until the slot's record says every token committed
// until now is confirmed, past the audit's grace.
func (c *cluster) confirmedPast() {
	c.t.Helper()
	at := time.Now().Add(2 * time.Second)
	tailertest.Eventually(c.t, 30*time.Second, func() error {
		var through *time.Time
		if err := c.Conn.QueryRow(c.ctx, `SELECT confirmed_through FROM tailer_slot WHERE slot = 'mailroom'`).Scan(&through); err != nil {
			return err
		}
		if through == nil || through.Before(at) {
			return fmt.Errorf("confirmed through %v, waiting for %v", through, at)
		}
		return nil
	})
}

// slotPastTokens waits until the slot's restart point is past every
// token's transaction (a checkpoint logs what runs, and a tailer's
// confirmations move the slot on to it): an audit then names the tokens
// the stream lacks missing even while the slot stays behind (the tailer
// refusing the stream).
func (c *cluster) slotPastTokens() {
	c.t.Helper()
	c.Exec(`CHECKPOINT`)
	tailertest.Eventually(c.t, 60*time.Second, func() error {
		var behind int
		err := c.Conn.QueryRow(c.ctx, `SELECT count(*) FROM tokens t, pg_replication_slots s WHERE s.slot_name = 'mailroom' AND NOT age(t.xmin) > age(s.catalog_xmin)`).Scan(&behind)
		if err != nil || behind > 0 {
			c.Exec(`CHECKPOINT`)
			return fmt.Errorf("%d tokens' transactions not before the slot's restart point (%v)", behind, err)
		}
		return nil
	})
}

// tokenIDs are the ids of the tokens of the accounts whose login begins
// with prefix.
func (c *cluster) tokenIDs(prefix string) []int64 {
	c.t.Helper()
	rows, err := c.Conn.Query(c.ctx, `SELECT t.id FROM tokens t JOIN accounts a ON a.id = t.account WHERE a.login LIKE $1 || '%' ORDER BY t.id`, prefix)
	if err != nil {
		c.t.Fatal(err)
	}
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		rows.Scan(&id)
		ids = append(ids, id)
	}
	return ids
}

// tailer audit on an intact stream, inbox and pipe output: exit 0,
// nothing missing; then, each made by hand: a message deleted from the
// stream, rows deleted from a durable's inbox, a pipe's output
// truncated: each missing token named by id, exit 1.
func TestAuditFindsLosses(t *testing.T) {
	t.Parallel()
	pg := pgtest.Shared(t)
	c := newCluster(t, pg, 5, 50*time.Millisecond)
	consumerURL := pg.CreateDB(t)
	p := c.tailer("MAILROOM_LAG_INTERVAL=200")
	p.waitLog("msg=streaming", 1, 30*time.Second)
	out := filepath.Join(t.TempDir(), "lines")
	pipe := c.subscriber(out, "--durable", "pipe", "--from-start")
	into := c.command([]string{"subscribe", "--durable", "inbox", "--into", "inbox", "--migrate", "--from-start"}, "MAILROOM_INBOX_URL="+consumerURL)
	c.accountsOnStream("a", 6)
	c.accounts("b", 20)
	c.expectExactlyOnce(30 * time.Second)
	waitOutput(t, out, 26)
	c.confirmedPast()
	c.slotPastTokens()
	inboxEnv := "MAILROOM_INBOX_URL=" + consumerURL
	tailertest.Eventually(t, 30*time.Second, func() error {
		rep, code := c.runAuditEnv([]string{inboxEnv}, "--since", "1h", "--durable", "inbox", "--into", "inbox")
		if code != exitOK || len(rep.Missing) != 0 || len(rep.Undelivered) != 0 || rep.Checked != 26 || rep.Delivered != 26 {
			return fmt.Errorf("audit of the inbox: exit %d, %+v", code, rep)
		}
		return nil
	})
	if rep, code := c.runAudit("--since", "1h", "--durable", "pipe", "--lines", out); code != exitOK || len(rep.Missing) != 0 || len(rep.Undelivered) != 0 || rep.Delivered != 26 {
		t.Fatalf("audit of the pipe: exit %d, %+v", code, rep)
	}
	// The same durable with no output to read: its own record says.
	tailertest.Eventually(t, 30*time.Second, func() error {
		rep, code := c.runAudit("--since", "1h", "--durable", "pipe")
		if code != exitOK || len(rep.Undelivered) != 0 || rep.Delivered != 26 {
			return fmt.Errorf("audit of the pipe by its record: exit %d, %+v", code, rep)
		}
		return nil
	})
	pipe.term(30 * time.Second)
	into.term(30 * time.Second)

	// The pipe's output loses its last lines.
	data, _ := os.ReadFile(out)
	lines := strings.SplitAfter(string(data), "\n")
	if err := os.WriteFile(out, []byte(strings.Join(lines[:2], "")), 0o644); err != nil {
		t.Fatal(err)
	}
	rep, code := c.runAudit("--since", "1h", "--durable", "pipe", "--lines", out)
	if code != exitFailure || len(rep.Undelivered) != 24 {
		t.Fatalf("audit of a truncated output: exit %d, %d undelivered, want 1 and 24: %+v", code, len(rep.Undelivered), rep)
	}

	// The inbox loses the rows of b's tokens.
	b := c.tokenIDs("b")
	consumer, err := pgx.Connect(c.ctx, consumerURL)
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close(c.ctx)
	if _, err := consumer.Exec(c.ctx, `DELETE FROM mailroom_inbox WHERE token_id = ANY($1)`, b[:5]); err != nil {
		t.Fatal(err)
	}
	rep, code = c.runAuditEnv([]string{inboxEnv}, "--since", "1h", "--durable", "inbox", "--into", "inbox")
	if code != exitFailure || !slices.Equal(rep.Undelivered, b[:5]) {
		t.Fatalf("audit of an inbox that lost rows: exit %d, undelivered %v, want %v", code, rep.Undelivered, b[:5])
	}

	// A message deleted from the stream: a's last token.
	a := c.tokenIDs("a")
	js := c.jsOf()
	s, err := js.Stream(c.ctx, "MAILROOM")
	if err != nil {
		t.Fatal(err)
	}
	seq := c.messageOf(a[len(a)-1])
	if err := s.DeleteMsg(c.ctx, seq); err != nil {
		t.Fatal(err)
	}
	rep, code = c.runAudit("--since", "1h")
	if code != exitFailure || !slices.Equal(rep.Missing, a[len(a)-1:]) {
		t.Fatalf("audit after a message was deleted: exit %d, missing %v, want %d", code, rep.Missing, a[len(a)-1])
	}

	// The batches' subject purged by hand: every token missing, by id.
	if err := s.Purge(c.ctx, jetstream.WithPurgeSubject("mailroom.batches")); err != nil {
		t.Fatal(err)
	}
	rep, code = c.runAudit("--since", "1h", "--wait", "1s")
	if all := c.tokenIDs(""); code != exitFailure || !slices.Equal(rep.Missing, all) {
		t.Fatalf("audit after a purge: exit %d, missing %v, want %v", code, rep.Missing, all)
	}
}

// messageOf is the stream sequence of the message that holds token id.
func (c *cluster) messageOf(id int64) uint64 {
	c.t.Helper()
	for _, m := range c.messages() {
		ids, _ := wiretest.TokenIDs(m)
		if slices.Contains(ids, id) {
			return m.Sequence
		}
	}
	c.t.Fatalf("token %d is on no message", id)
	return 0
}

// runAuditEnv is runAudit with env added.
func (c *cluster) runAuditEnv(env []string, args ...string) (auditReport, int) {
	c.t.Helper()
	p := c.command(append([]string{"audit", "--json", "--grace", "1s"}, args...), env...)
	code := p.exit(2 * time.Minute)
	var rep auditReport
	out := p.out.String()
	if i := strings.Index(out, "{"); i >= 0 {
		if err := json.NewDecoder(strings.NewReader(out[i:])).Decode(&rep); err != nil {
			c.t.Fatalf("tailer audit %v: %v:\n%s", args, err, out)
		}
	}
	return rep, code
}

// tailer audit that cannot finish says so, names why, and names nothing
// missing: NATS away; PostgreSQL restarting while it waits for the slot to
// confirm past its snapshot (the tailer stopped). Its exit code is 1.
func TestAuditCannotFinish(t *testing.T) {
	t.Parallel()
	pg := ownServer(t)
	c := newCluster(t, pg, 10, 50*time.Millisecond)
	p := c.tailer()
	p.waitLog("msg=streaming", 1, 30*time.Second)
	c.accounts("a", 10)
	c.expectExactlyOnce(30 * time.Second)
	c.confirmedPast()
	if rep, code := c.runAudit("--since", "1h"); code != exitOK || rep.Checked != 10 {
		t.Fatalf("audit: exit %d, %+v", code, rep)
	}

	c.stopNATS()
	rep, code := c.runAudit("--since", "1h")
	if code != exitFailure || len(rep.Missing) != 0 || !strings.Contains(rep.Error, "could not finish") || !strings.Contains(rep.Error, "NATS") {
		t.Fatalf("audit with NATS away: exit %d, %+v", code, rep)
	}
	t.Logf("NATS away: %s", rep.Error)
	c.startNATS()

	// The tailer stopped: the slot stays behind the audit's snapshot,
	// which it waits for, and PostgreSQL restarts meanwhile.
	if code := p.term(30 * time.Second); code != exitOK {
		t.Fatalf("SIGTERM: exit %d", code)
	}
	c.accounts("b", 1)
	audit := c.command([]string{"audit", "--json", "--grace", "1s", "--since", "1h"})
	time.Sleep(3 * time.Second)
	c.restartServer(pg, func() {})
	code = audit.exit(2 * time.Minute)
	out := audit.out.String()
	if code != exitFailure || !strings.Contains(out, "could not finish") || strings.Contains(out, `"Missing": [`) {
		t.Fatalf("audit with PostgreSQL restarting: exit %d:\n%s", code, out)
	}
	t.Logf("PostgreSQL restarting: %s", grepLines(out, "could not finish"))
}
