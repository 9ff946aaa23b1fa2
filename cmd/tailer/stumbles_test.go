package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/internal/testutil/tailertest"
	"github.com/mailroom/tailer/publish/wire"
)

// stumble is one of the places where a new operator tripped (issue 65):
// try does what they did and returns the exit code (running: the process
// goes on) and what it said.
type stumble struct {
	name string
	try  func(t *testing.T) (code int, said string)
	// code is the exit code wanted (running: none, the process goes
	// on); oneLine: it says so in one line; want: each in what it said.
	code    int
	oneLine bool
	want    []string
}

// running is the code of a stumble whose process goes on.
const running = -1

// The thirteen stumbles of a new operator's second hour, in the order
// they met them, each now as wanted: the exit code of the table in the
// README, one line, the variable or grant or message named. One database
// and one NATS server; the rows run in order (later ones need the tailer
// run, the dead letters and the stream the earlier ones left).
func TestSecondHourStumbles(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pgtest.Shared(t), 10, 50*time.Millisecond)
	dir := t.TempDir()
	var run *proc
	var metrics string
	for _, s := range []stumble{
		{name: "dead-letters resend with a sender that cannot start", code: exitFailure, oneLine: false,
			try: c.resendCannotStart, want: []string{"the shell cannot run", "no-such-sender-here", "exit 127", "fix --exec and run it again", "dead letters left: 1"}},
		{name: "MAILROOM_HTTP_ADDR in use", code: exitConfig, oneLine: true,
			try: c.httpAddrInUse, want: []string{"tailer run: MAILROOM_HTTP_ADDR: ", "cannot be listened on"}},
		{name: "tailer migrate with PostgreSQL down", code: exitFailure, oneLine: true,
			try: func(t *testing.T) (int, string) {
				p := c.command([]string{"migrate"}, "MAILROOM_DATABASE_URL=postgres://u@127.0.0.1:1/db")
				return p.exit(30 * time.Second), p.out.String()
			}, want: []string{"cannot connect to PostgreSQL at 127.0.0.1:1 (MAILROOM_DATABASE_URL)", "is the server up"}},
		{name: "a wrong MAILROOM_DATABASE_PASSWORD", code: exitConfig, oneLine: true,
			try: c.wrongPasswordApart, want: []string{"MAILROOM_DATABASE_PASSWORD: the server refused it for the user of MAILROOM_DATABASE_URL"}},
		{name: "a role without grants", code: exitConfig, oneLine: true,
			try: c.roleWithoutGrants, want: []string{"MAILROOM_DATABASE_URL: its user lacks a grant: permission denied for table ", "GRANT ", " TO that user"}},
		{name: "tailer subcribe --durable x", code: exitConfig, oneLine: true,
			try: func(t *testing.T) (int, string) {
				p := c.command([]string{"subcribe", "--durable", "x"})
				return p.exit(10 * time.Second), p.out.String()
			},
			want: []string{`unknown command "subcribe" for "tailer"; did you mean subscribe?`}},
		{name: "tailer dead-letters --durable x", code: exitConfig, oneLine: true,
			try: func(t *testing.T) (int, string) {
				p := c.command([]string{"dead-letters", "--durable", "x"})
				return p.exit(10 * time.Second), p.out.String()
			},
			want: []string{"give list or resend before the flags"}},
		{name: "which signing key is in use", code: running,
			try: func(t *testing.T) (int, string) {
				var said string
				run, metrics, said = c.keysNamed(t)
				return running, said
			}, want: []string{"signing_key=k-", "key_ids=k-", `tailer_signing_key{key_id="k-`, `primary="true"} 1`}},
		{name: "a token row that cannot be decoded", code: running,
			try: func(t *testing.T) (int, string) { return running, c.badRow(t, run) }, want: []string{"level=WARN", "token id ", "password_recovery token has a NULL code"}},
		{name: "a message taken from under a subscriber", code: running,
			try: func(t *testing.T) (int, string) { return running, c.messageTaken(t, dir) }, want: []string{"level=ERROR", "given to another client", "taken_stream_seq="}},
		{name: "the slot dropped", code: running,
			try: func(t *testing.T) (int, string) { return running, c.slotDropped(t, run, metrics) }, want: []string{"tailer resync", "\ntailer_slot_invalidated 1"}},
		{name: "tailer resync with tailer run waiting", code: exitOK,
			try: func(t *testing.T) (int, string) {
				r := c.command([]string{"resync"})
				return r.exit(60 * time.Second), r.out.String()
			}, want: []string{"slot resynced: the tailer run connected (backend pid ["}},
		{name: "tailer subscribe while NATS is unreachable", code: running,
			try: c.natsAway, want: []string{`level=WARN msg="NATS disconnected: nothing is delivered until it is back; reconnecting" server=nats://127.0.0.1:`, "/readyz 503: ", "NATS at nats://127.0.0.1:", "does not answer", `level=WARN msg="NATS reconnected: delivering again"`}},
	} {
		s.check(t)
	}
}

// check runs s in t (not a subtest of its own: the cluster's processes
// are t's).
func (s stumble) check(t *testing.T) {
	t.Helper()
	code, said := s.try(t)
	said = strings.TrimSpace(said)
	var wrong []string
	if s.code != running && code != s.code {
		wrong = append(wrong, fmt.Sprintf("exit %d, want %d", code, s.code))
	}
	if s.oneLine && strings.Contains(said, "\n") {
		wrong = append(wrong, fmt.Sprintf("said in %d lines, want one", strings.Count(said, "\n")+1))
	}
	for _, w := range s.want {
		if !strings.Contains(said, w) {
			wrong = append(wrong, fmt.Sprintf("does not say %q", w))
		}
	}
	if len(wrong) > 0 {
		t.Fatalf("%s: %s; said:\n%s", s.name, strings.Join(wrong, "; "), said)
	}
	t.Logf("%s: exit %d:\n%s", s.name, code, said)
}

// resendCannotStart sets a batch aside (its sender fails on it) and runs
// dead-letters resend with a sender the shell cannot run; the dead
// letters are listed after.
func (c *cluster) resendCannotStart(t *testing.T) (int, string) {
	tp := c.tailer()
	tp.waitLog("msg=streaming", 1, 30*time.Second)
	c.Exec(`INSERT INTO accounts (email, login) VALUES ('stumble@x', 'stumble')`)
	c.expectExactlyOnce(30 * time.Second)
	tp.term(30 * time.Second)
	p := c.execSubscriber(t, "stumble", "read -r l; exit 1", "--max-deliveries", "1")
	p.waitLog("dead letter: set a batch aside", 1, 30*time.Second)
	p.term(30 * time.Second)
	r := c.command([]string{"dead-letters", "resend", "--durable", "stumble", "--exec", "no-such-sender-here"})
	code := r.exit(30 * time.Second)
	if strings.Contains(r.out.String(), "NATS disconnected") {
		t.Errorf("resend says NATS disconnected as it closes its own connection:\n%s", r.out.String())
	}
	list := c.command([]string{"dead-letters", "list", "--durable", "stumble"})
	list.exit(30 * time.Second)
	return code, grepLines(r.out.String(), "cannot do its work") + "\ndead letters left: " + fmt.Sprint(strings.Count(list.out.String(), "deliveries"))
}

// httpAddrInUse runs tailer run on an HTTP address another holds.
func (c *cluster) httpAddrInUse(t *testing.T) (int, string) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	p := c.tailer("MAILROOM_HTTP_ADDR=" + held.Addr().String())
	return p.exit(30 * time.Second), p.out.String()
}

// wrongPasswordApart gives a server that asks for a password the wrong
// one in MAILROOM_DATABASE_PASSWORD.
func (c *cluster) wrongPasswordApart(t *testing.T) (int, string) {
	pg, err := pgtest.Start(pgtest.Options{Password: "right-db-pass"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close() })
	p := c.tailer(fmt.Sprintf("MAILROOM_DATABASE_URL=postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", pg.Port), "MAILROOM_DATABASE_PASSWORD=wrong/db pass@")
	code := p.exit(30 * time.Second)
	if strings.Contains(p.out.String(), "wrong/db pass@") {
		t.Error("the password is repeated")
	}
	return code, p.out.String()
}

// roleWithoutGrants runs tailer run as a role with none of the grants.
func (c *cluster) roleWithoutGrants(t *testing.T) (int, string) {
	// Roles are the server's: a name of this test's own.
	c.Exec(`DO $$ BEGIN CREATE ROLE tailer_stumble LOGIN REPLICATION; EXCEPTION WHEN duplicate_object THEN NULL; END $$`)
	p := c.tailer("MAILROOM_DATABASE_URL=" + strings.Replace(c.URL, "postgres://postgres@", "postgres://tailer_stumble@", 1))
	return p.exit(30 * time.Second), p.out.String()
}

// keysNamed starts the tailer run of the rows after, and returns it, the
// address of its metrics, and its streaming line and signing key metric.
func (c *cluster) keysNamed(t *testing.T) (*proc, string, string) {
	p, base := c.tailerWithHTTP("MAILROOM_LAG_INTERVAL=100")
	p.waitLog("msg=streaming", 1, 30*time.Second)
	page := awaitMetrics(t, base+"/metrics", "tailer_signing_key{")
	return p, base + "/metrics", grepLines(p.out.String(), "msg=streaming") + "\n" + grepLines(page, "tailer_signing_key{")
}

// badRow commits a password-recovery token without a code.
func (c *cluster) badRow(t *testing.T, run *proc) string {
	c.Exec(`INSERT INTO accounts (email, login) VALUES ('badrow@x', 'badrow')`)
	c.Exec(`INSERT INTO tokens (action, code, account) SELECT 'password_recovery', NULL, id FROM accounts WHERE login = 'badrow'`)
	run.waitLog("skipping a token row that cannot be decoded", 1, 30*time.Second)
	return grepLines(run.out.String(), "skipping a token row")
}

// messageTaken runs a subscriber on a consumer made by hand without a
// pinned group, as one made before tailer subscribe pinned: another
// client takes and acknowledges a message while the subscriber is
// stopped, and the subscriber started again is given the one after it.
func (c *cluster) messageTaken(t *testing.T, dir string) string {
	nc, err := nats.Connect(c.natsURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	cons, err := js.CreateConsumer(c.ctx, "MAILROOM", jetstream.ConsumerConfig{Durable: "handmade", AckPolicy: jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy, FilterSubjects: wire.DataSubjects("mailroom.batches")})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "handmade")
	if err := os.WriteFile(out, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	sub := c.execSubscriber(t, "handmade", "cat >> "+out)
	sub.waitLog("does not pin one subscriber", 1, 30*time.Second)
	c.awaitConsumed(t, cons)
	sub.term(30 * time.Second)

	c.Exec(`INSERT INTO accounts (email, login) VALUES ('taken@x', 'taken')`)
	msg, err := cons.Next(jetstream.FetchMaxWait(30 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := msg.DoubleAck(c.ctx); err != nil {
		t.Fatal(err)
	}
	c.Exec(`INSERT INTO accounts (email, login) VALUES ('after@x', 'after')`)
	again := c.execSubscriber(t, "handmade", "cat >> "+out)
	again.waitLog("given to another client", 1, 30*time.Second)
	return grepLines(again.out.String(), "given to another client")
}

// awaitConsumed waits until cons has delivered and had acknowledged
// every message on the stream.
func (c *cluster) awaitConsumed(t *testing.T, cons jetstream.Consumer) {
	tailertest.Eventually(t, 30*time.Second, func() error {
		info, err := cons.Info(c.ctx)
		if err != nil {
			return err
		}
		if info.NumPending != 0 || info.NumAckPending != 0 {
			return fmt.Errorf("consumer %s: %d pending, %d awaiting ack", info.Name, info.NumPending, info.NumAckPending)
		}
		return nil
	})
}

// slotDropped drops the slot under the running tailer, and returns its
// metrics once it says so.
func (c *cluster) slotDropped(t *testing.T, run *proc, metrics string) string {
	tailertest.Eventually(t, 30*time.Second, func() error {
		c.Conn.Exec(c.ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 'mailroom' AND active_pid IS NOT NULL`)
		_, err := c.Conn.Exec(c.ctx, `SELECT pg_drop_replication_slot('mailroom')`)
		return err
	})
	run.waitLog("does not exist, but this database recorded it", 1, 30*time.Second)
	v, _ := metricValue(awaitMetrics(t, metrics, "\ntailer_slot_invalidated 1\n"), "tailer_slot_invalidated")
	return fmt.Sprintf("%s\ntailer_slot_invalidated %v", grepLines(run.out.String(), "does not exist, but this database recorded it"), v)
}

// natsAwayFor is how long natsAway keeps NATS stopped.
const natsAwayFor = 90 * time.Second

// natsAway stops NATS under a running subscriber for natsAwayFor: its
// log within 10 s, and its /readyz throughout; then starts it again:
// said, and ready again.
func (c *cluster) natsAway(t *testing.T) (int, string) {
	port, _ := pgtest.FreePort()
	p := c.execSubscriber(t, "away", "cat > /dev/null", "--health-addr", fmt.Sprintf("127.0.0.1:%d", port))
	p.waitLog("consuming", 1, 30*time.Second)
	stopped := time.Now()
	c.stopNATS()
	p.waitLog("NATS disconnected", 1, 10*time.Second)
	said := time.Since(stopped)
	var ready string
	tailertest.Eventually(t, 10*time.Second, func() error {
		code, body := httpGet(fmt.Sprintf("http://127.0.0.1:%d/readyz", port))
		if ready = fmt.Sprintf("/readyz %d: %s", code, strings.TrimSpace(body)); code != 503 || !strings.Contains(body, "NATS at") {
			return fmt.Errorf("%s", ready)
		}
		return nil
	})
	// Away for 90 s, as the operator saw it: /readyz says so throughout.
	for time.Since(stopped) < natsAwayFor {
		time.Sleep(time.Second)
		if code, body := httpGet(fmt.Sprintf("http://127.0.0.1:%d/readyz", port)); code != 503 || !strings.Contains(body, "NATS at") {
			t.Fatalf("/readyz %s after NATS stopped: %d %s", time.Since(stopped).Round(time.Second), code, body)
		}
	}
	ready += fmt.Sprintf("\n(said %s after NATS stopped; /readyz 503 naming it every second for %s)", said.Round(time.Millisecond), natsAwayFor)
	c.startNATS()
	p.waitLog(`level=WARN msg="NATS reconnected: delivering again"`, 1, 30*time.Second)
	tailertest.Eventually(t, 30*time.Second, func() error {
		if code, body := httpGet(fmt.Sprintf("http://127.0.0.1:%d/readyz", port)); code != 200 {
			return fmt.Errorf("/readyz after NATS came back: %d %s", code, body)
		}
		return nil
	})
	return running, grepLines(p.out.String(), "NATS disconnected") + "\n" + ready + "\n" + grepLines(p.out.String(), "NATS reconnected")
}
