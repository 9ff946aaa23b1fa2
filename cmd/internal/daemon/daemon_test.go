package daemon

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/mailroom/tailer/decoder/wal"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	dto "github.com/prometheus/client_model/go"

	"github.com/mailroom/tailer/cmd/internal/config"
	"github.com/mailroom/tailer/decoder"
	"github.com/mailroom/tailer/decoder/action"
	"github.com/mailroom/tailer/internal/embedded"
	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/internal/testutil/tailertest"
	"github.com/mailroom/tailer/migrations/migratetest"
	"github.com/mailroom/tailer/publish/subscriber"
	"github.com/mailroom/tailer/publish/token"
	"github.com/mailroom/tailer/publish/wire"
	"github.com/mailroom/tailer/publish/wire/wiretest"
	"github.com/mailroom/tailer/replication"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

const testKeyHex = "cafebabecafebabecafebabecafebabecafebabecafebabecafebabecafebabe"

// env is one tailer under test: its own database, slot and NATS server.
type env struct {
	*migratetest.DB
	t    *testing.T
	ctx  context.Context
	cfg  *config.Config
	nc   *nats.Conn
	js   jetstream.JetStream
	d    *Daemon
	logs *tailertest.Buffer
	stop func() // stops the tailer gracefully and waits for it
	// streamCache keeps the stream's messages between polls.
	streamCache wiretest.StreamCache
}

type envOpts struct {
	limit   int
	timeout time.Duration
	format  string
	proto   string // pgoutput protocol version, default 2
	binary  string // "true" (default) or "false"
	// maxPayload, if set, is the NATS server's max_payload.
	maxPayload int32
}

func newEnv(t *testing.T, o envOpts) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	db := migratetest.NewDB(t, pgtest.Shared(t))
	if _, err := replication.CreateSlot(ctx, replication.SchemaConn{Querier: db.Conn, Schema: "public"}, "mailroom", "tailer migrate", false, false); err != nil {
		t.Fatal(err)
	}
	var srv *server.Server
	var err error
	if o.maxPayload > 0 {
		if srv, err = server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), MaxPayload: o.maxPayload, NoLog: true, NoSigs: true}); err == nil {
			srv.Start()
			if !srv.ReadyForConnections(10 * time.Second) {
				t.Fatal("NATS not ready")
			}
		}
	} else {
		srv, err = embedded.Start(t.TempDir(), "127.0.0.1:0")
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)

	format := o.format
	if format == "" {
		format = "line"
	}
	cfg, err := config.Load(config.For(config.Run), []string{"--http-addr="}, func(k string) (string, bool) {
		v, ok := map[string]string{
			"MAILROOM_DATABASE_URL":  db.URL,
			"MAILROOM_SECRET_KEY":    testKeyHex,
			"MAILROOM_BATCH_LIMIT":   strconv.Itoa(o.limit),
			"MAILROOM_BATCH_TIMEOUT": strconv.Itoa(int(o.timeout / time.Millisecond)),
			"MAILROOM_NATS_URL":      srv.ClientURL(),
			"MAILROOM_FORMAT":        format,
			"MAILROOM_LOG_LEVEL":     "debug",
			"MAILROOM_PROTO_VERSION": o.proto,
			"MAILROOM_BINARY":        o.binary,
		}[k]
		return v, ok
	})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	e := &env{DB: db, t: t, ctx: ctx, cfg: cfg, nc: nc, js: js}
	e.start()
	return e
}

// start runs the tailer in the background until stop is called.
func (e *env) start() {
	ctx, cancel := context.WithCancel(e.ctx)
	e.logs = &tailertest.Buffer{TB: e.t}
	d := New(e.cfg, NewLogger("text", e.cfg.LogLevel, e.logs))
	e.d = d
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	select {
	case <-d.Ready():
	case err := <-done:
		e.t.Fatalf("tailer exited before streaming: %v", err)
	case <-e.ctx.Done():
		e.t.Fatal("tailer did not start streaming")
	}
	var once sync.Once
	e.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				e.t.Errorf("tailer: %v", err)
			}
		})
	}
	e.t.Cleanup(e.stop)
}

// published is one message read back from the stream.
type published struct {
	seq    uint64
	header nats.Header
	body   []byte
	ids    []int64
	count  int
	// sizes are the tokens of each batch the message carries
	// (Mailroom-Batch-Sizes).
	sizes []int
}

// batchIDs returns the token ids of each batch of the message.
func (p published) batchIDs() [][]int64 {
	var out [][]int64
	at := 0
	for _, n := range p.sizes {
		out = append(out, p.ids[at:at+n])
		at += n
	}
	return out
}

// messages reads every message on the stream until it holds at least n
// tokens (by Mailroom-Count) or the deadline passes.
func (e *env) messages(n int) []published {
	e.t.Helper()
	var msgs []published
	tailertest.Eventually(e.t, 60*time.Second, func() error {
		msgs = e.readAll()
		total := 0
		for _, m := range msgs {
			total += m.count
		}
		if total < n {
			return fmt.Errorf("stream holds %d tokens, want %d", total, n)
		}
		return nil
	})
	return msgs
}

func (e *env) readAll() []published {
	e.t.Helper()
	stream, err := e.js.Stream(e.ctx, e.cfg.Stream)
	if err != nil {
		return nil
	}
	msgs, err := e.streamCache.Messages(e.ctx, stream)
	if err != nil {
		e.t.Fatal(err)
	}
	var out []published
	for _, m := range msgs {
		p := published{seq: m.Sequence, header: m.Header, body: m.Data}
		p.count, _ = strconv.Atoi(m.Header.Get(wire.HeaderCount))
		if p.ids, err = wiretest.TokenIDs(m); err != nil {
			e.t.Fatal(err)
		}
		b, err := subscriber.Decode(m.Header, m.Data)
		if err != nil {
			e.t.Fatalf("message %d: %v", m.Sequence, err)
		}
		p.sizes = b.Sizes
		out = append(out, p)
	}
	return out
}

// collectorLine is what the mailroom collector prints for the given token
// ids, computed here from the rows with the standard library alone.
func (e *env) collectorLine(ids []int64) []byte {
	e.t.Helper()
	key, _ := hex.DecodeString(testKeyHex)
	rows, err := e.Conn.Query(e.ctx, `
		SELECT t.action::text, a.email, a.login, t.secret, coalesce(t.code, '')
		FROM tokens t JOIN accounts a ON a.id = t.account
		WHERE t.id = ANY($1) ORDER BY array_position($1, t.id)`, ids)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	var fields []string
	for rows.Next() {
		var action, email, login, code string
		var secret []byte
		if err := rows.Scan(&action, &email, &login, &secret, &code); err != nil {
			e.t.Fatal(err)
		}
		mac := hmac.New(sha256.New, key)
		digit := "1"
		if action == "activation" {
			mac.Write(append([]byte("/activate"), secret...))
		} else {
			digit = "2"
			mac.Write(append(append([]byte("/recover"), secret...), code...))
		}
		tok := base64.RawURLEncoding.EncodeToString(append(append([]byte{}, secret...), mac.Sum(nil)...))
		fields = append(fields, digit, email, login, tok, code)
	}
	return []byte(strings.Join(fields, ","))
}

func TestEndToEnd(t *testing.T) {
	t.Parallel()
	const limit = 10
	e := newEnv(t, envOpts{limit: limit, timeout: 300 * time.Millisecond})

	// 1,000 accounts in 100 transactions of 10: 1,000 activation tokens.
	for tx := 0; tx < 100; tx++ {
		e.Exec(`INSERT INTO accounts (email, login)
			SELECT 'user' || g || '@example.com', 'user' || g FROM generate_series($1::int, $1::int + 9) g`, tx*10+1)
	}
	msgs := e.messages(1000)
	// Activate them (consume their activation tokens), then ask for 200
	// password recoveries, one transaction each.
	e.Exec(`UPDATE tokens SET consumed_at = extract(epoch FROM now()) WHERE action = 'activation'`)
	var recoveryAccounts []int64
	rows, _ := e.Conn.Query(e.ctx, `SELECT id FROM accounts WHERE status = 'active' ORDER BY id LIMIT 200`)
	recoveryAccounts, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil || len(recoveryAccounts) != 200 {
		t.Fatalf("active accounts: %d, %v", len(recoveryAccounts), err)
	}
	for _, id := range recoveryAccounts {
		e.Exec(`INSERT INTO tokens (account, action) VALUES ($1, 'password_recovery')`, id)
	}
	// Three more: fewer than the limit, so only the timeout can cut them.
	for _, id := range recoveryAccounts[:3] {
		e.Exec(`INSERT INTO tokens (account, action) VALUES ($1, 'password_recovery')`, id)
	}
	msgs = e.messages(1203)

	var want []int64
	rows, _ = e.Conn.Query(e.ctx, `SELECT id FROM tokens ORDER BY id`)
	want, _ = pgx.CollectRows(rows, pgx.RowTo[int64])
	if len(want) != 1203 {
		t.Fatalf("tokens in the table: %d", len(want))
	}

	var got []int64
	seen := map[int64]bool{}
	signer, _ := token.NewSigner("k", mustKey(t))
	belowLimit := 0
	for _, m := range msgs {
		if m.count != len(m.ids) || m.count == 0 {
			t.Fatalf("message %d: count %d, %d ids", m.seq, m.count, len(m.ids))
		}
		// Each batch is a line of at most the limit.
		lines := strings.Split(string(m.body), "\n")
		if len(lines) != len(m.sizes) {
			t.Fatalf("message %d: %d lines for batches %v", m.seq, len(lines), m.sizes)
		}
		for i, n := range m.sizes {
			if n > limit || len(strings.Split(lines[i], ",")) != 5*n {
				t.Fatalf("message %d: batch %d of %d tokens in a line of %d fields, limit %d", m.seq, i, n, len(strings.Split(lines[i], ",")), limit)
			}
			if n < limit {
				belowLimit++
			}
		}
		if id := m.header.Get(wire.HeaderMsgID); id != m.header.Get(wire.HeaderPosFirst)+"-"+m.header.Get(wire.HeaderPosLast) {
			t.Fatalf("message %d: Nats-Msg-Id %q is not its position range", m.seq, id)
		}
		fields := strings.Split(strings.ReplaceAll(string(m.body), "\n", ","), ",")
		if len(fields) != 5*m.count {
			t.Fatalf("message %d: %d fields for %d tokens", m.seq, len(fields), m.count)
		}
		for i, id := range m.ids {
			if seen[id] {
				t.Fatalf("token %d published twice", id)
			}
			seen[id] = true
			got = append(got, id)
			f := fields[5*i : 5*i+5]
			label := map[string]string{"1": "activation", "2": "password_recovery"}[f[0]]
			code := ""
			if label == "password_recovery" {
				code = f[4]
			}
			act, _ := action.Parse(label)
			if len(f[3]) != token.Len {
				t.Fatalf("token %d: %d characters", id, len(f[3]))
			}
			if _, err := signer.Verify(f[3], action.Action(act), code); err != nil {
				t.Fatalf("token %d does not verify: %v", id, err)
			}
		}
	}
	if belowLimit == 0 {
		t.Error("no batch below the limit: the timeout never cut one")
	}
	if len(got) != len(want) {
		t.Fatalf("published %d tokens, want %d", len(got), len(want))
	}
	// A single writer commits in id order, so commit order is id order.
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("token %d published at position %d, want token %d (commit order)", got[i], i, want[i])
		}
	}
	e.WaitConfirmed("mailroom", e.WalLSN(), 30*time.Second)
}

// batchSizes returns the sizes of every batch of msgs, in order.
func batchSizes(msgs []published) []int {
	var sizes []int
	for _, m := range msgs {
		sizes = append(sizes, m.sizes...)
	}
	return sizes
}

func mustKey(t *testing.T) []byte {
	k, err := token.ParseKey(testKeyHex)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestSkippedTokensAreNotPublishedButConfirmed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{limit: 10, timeout: 200 * time.Millisecond})
	e.Exec(`INSERT INTO accounts (email, login, status) VALUES
		('active@example.com', 'active', 'active'),
		('suspended@example.com', 'suspended', 'active')`)
	e.Exec(`UPDATE accounts SET status = 'suspended' WHERE login = 'suspended'`)

	tx, err := e.Conn.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		// suspended account
		`INSERT INTO tokens (account, action) SELECT id, 'password_recovery' FROM accounts WHERE login = 'suspended'`,
		// expired
		`INSERT INTO tokens (account, action, expires_at) SELECT id, 'password_recovery', extract(epoch FROM now())::int - 1 FROM accounts WHERE login = 'active'`,
		// consumed before the batch is cut
		`INSERT INTO tokens (account, action, code) SELECT id, 'password_recovery', '77777' FROM accounts WHERE login = 'active'`,
		`UPDATE tokens SET consumed_at = 1 WHERE code = '77777'`,
		// activation token for an account that is already active
		`INSERT INTO tokens (account, action) SELECT id, 'activation' FROM accounts WHERE login = 'active'`,
	} {
		if _, err := tx.Exec(e.ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	after := e.WalLSN()
	// Nothing in that transaction is eligible, yet the slot moves past it.
	e.WaitConfirmed("mailroom", after, 30*time.Second)
	if msgs := e.readAll(); len(msgs) != 0 {
		t.Fatalf("published %d messages for ineligible tokens: %s", len(msgs), msgs[0].body)
	}

	// A deleted token is skipped too; the eligible one behind it arrives.
	tx, _ = e.Conn.Begin(e.ctx)
	tx.Exec(e.ctx, `INSERT INTO tokens (account, action, code) SELECT id, 'password_recovery', '55555' FROM accounts WHERE login = 'active'`)
	tx.Exec(e.ctx, `DELETE FROM tokens WHERE code = '55555'`)
	tx.Exec(e.ctx, `INSERT INTO tokens (account, action, code) SELECT id, 'password_recovery', '12345' FROM accounts WHERE login = 'active'`)
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	msgs := e.messages(1)
	if len(msgs) != 1 || msgs[0].count != 1 || !bytes.HasSuffix(msgs[0].body, []byte(",12345")) {
		t.Fatalf("messages = %+v", msgs)
	}
	e.WaitConfirmed("mailroom", e.WalLSN(), 30*time.Second)
}

func TestLargeTransactionConfirmedOnlyAfterLastBatch(t *testing.T) {
	t.Parallel()
	const limit = 1000
	// No timeout cut can happen during the test: the last partial batch of
	// the big transaction waits until more tokens fill it.
	e := newEnv(t, envOpts{limit: limit, timeout: time.Hour})
	e.Exec(`INSERT INTO accounts (email, login) SELECT 'big' || g || '@example.com', 'big' || g FROM generate_series(1, 2500) g`)

	msgs := e.messages(2000)
	if sizes := batchSizes(msgs); !slices.Equal(sizes, []int{limit, limit}) {
		t.Fatalf("got batches of %v tokens, want two full batches", sizes)
	}
	first, err := decoder.ParsePosition(msgs[0].header.Get(wire.HeaderPosFirst))
	if err != nil {
		t.Fatal(err)
	}
	commitLSN := first.Commit
	// Two of three batches are acknowledged. Give a wrong implementation
	// time to confirm, then check that the slot would still replay the
	// transaction: logical decoding replays every transaction whose commit
	// LSN is at or after confirmed_flush_lsn. (Positions inside the
	// transaction, from keepalives sent while it streamed, are safe.)
	time.Sleep(2 * time.Second)
	if c := e.ConfirmedLSN("mailroom"); c > pglogrepl.LSN(commitLSN) {
		t.Fatalf("slot confirmed at %s, past the commit %s of a transaction whose last 500 tokens are unpublished", c, commitLSN)
	}

	// 500 more tokens fill the third batch.
	e.Exec(`INSERT INTO accounts (email, login) SELECT 'more' || g || '@example.com', 'more' || g FROM generate_series(1, 500) g`)
	msgs = e.messages(3000)
	if sizes := batchSizes(msgs); !slices.Equal(sizes, []int{limit, limit, limit}) {
		t.Fatalf("got batches of %v tokens, want three full batches", sizes)
	}
	e.WaitConfirmed("mailroom", e.WalLSN(), 30*time.Second)

	var streamed int64
	if err := e.Conn.QueryRow(e.ctx, `SELECT stream_txns FROM pg_stat_replication_slots WHERE slot_name = 'mailroom'`).Scan(&streamed); err != nil {
		t.Fatal(err)
	}
	if streamed == 0 {
		t.Error("the server did not stream the large transaction (protocol v2 path untested)")
	}
}

// A transaction far larger than logical_decoding_work_mem is streamed by the
// server in chunks and spilled to disk by the decoder; it must come out whole,
// in order and once.
func TestHugeStreamedTransactionExactlyOnce(t *testing.T) {
	t.Parallel()
	const n, limit = 20_000, 1000
	e := newEnv(t, envOpts{limit: limit, timeout: 200 * time.Millisecond})
	e.Exec(`INSERT INTO accounts (email, login) SELECT 'huge' || g || '@example.com', 'huge' || g FROM generate_series(1, $1) g`, n)
	var lo, hi int64
	if err := e.Conn.QueryRow(e.ctx, `SELECT min(id), max(id) FROM tokens`).Scan(&lo, &hi); err != nil {
		t.Fatal(err)
	}
	msgs := e.messages(n)
	next := lo
	for _, m := range msgs {
		for _, id := range m.ids {
			if id != next {
				t.Fatalf("token id %d, want %d: tokens out of order, lost or repeated", id, next)
			}
			next++
		}
	}
	if next != hi+1 {
		t.Fatalf("published tokens %d..%d, want %d..%d", lo, next-1, lo, hi)
	}
	e.WaitConfirmed("mailroom", e.WalLSN(), 30*time.Second)
	var streamed int64
	if err := e.Conn.QueryRow(e.ctx, `SELECT stream_txns FROM pg_stat_replication_slots WHERE slot_name = 'mailroom'`).Scan(&streamed); err != nil {
		t.Fatal(err)
	}
	if streamed == 0 {
		t.Error("the server did not stream the transaction")
	}
}

// When the replication stream fails, the session's error is PostgreSQL's,
// and the reconnect is counted against postgres: the pipeline, stopped
// because of it, only reports its own cancellation.
func counterValue(t *testing.T, c interface{ Write(*dto.Metric) error }) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func TestStreamFailureKeepsItsCause(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{limit: 10, timeout: 100 * time.Millisecond})
	e.Exec(`SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 'mailroom'`)
	tailertest.Eventually(t, 30*time.Second, func() error {
		if counterValue(t, e.d.metrics.reconnects.WithLabelValues(targetPostgres)) < 1 {
			return errors.New("no postgres reconnect counted after the walsender was terminated")
		}
		return nil
	})
	if n := counterValue(t, e.d.metrics.reconnects.WithLabelValues(targetNATS)); n != 0 {
		t.Errorf("%v NATS reconnects counted for a PostgreSQL failure", n)
	}
	logs := e.logs.String()
	if !strings.Contains(logs, "terminating connection due to administrator command") {
		t.Errorf("PostgreSQL's reason is not in the log:\n%s", logs)
	}
	if strings.Contains(logs, `session ended; retrying" err="context canceled`) {
		t.Errorf("the session's error was replaced by the pipeline's cancellation:\n%s", logs)
	}
	// And it recovers: a token after the failure is published.
	e.Exec(`INSERT INTO accounts (email, login) VALUES ('after@example.com', 'after')`)
	e.messages(1)

	// Each session publishes on a JetStream context of its own and cleans
	// it up: the connection's subscriptions do not grow with sessions.
	subs := e.d.nc.Load().NumSubscriptions()
	for i := 2; i <= 4; i++ {
		e.Exec(`SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 'mailroom'`)
		e.Exec(`INSERT INTO accounts (email, login) VALUES ($1, $2)`, fmt.Sprintf("after%d@example.com", i), fmt.Sprintf("after%d", i))
		e.messages(i)
	}
	if n := e.d.nc.Load().NumSubscriptions(); n > subs {
		t.Errorf("NATS subscriptions grew from %d to %d over 3 sessions", subs, n)
	}
}

// A batch whose tokens do not fit the server's max_payload goes out as
// several messages, each within it: nothing is refused, nothing lost.
func TestBatchesFitMaxPayload(t *testing.T) {
	t.Parallel()
	const maxPayload = 64 << 10
	for _, format := range []string{"line", "json"} {
		t.Run(format, func(t *testing.T) {
			e := newEnv(t, envOpts{limit: 1000, timeout: 200 * time.Millisecond, format: format, maxPayload: maxPayload})
			// 600-byte lines, 1,000 to a batch: ten times the limit.
			e.Exec(`INSERT INTO accounts (email, login)
				SELECT lpad(g::text, 240, 'e') || '@example.com', lpad(g::text, 250, 'l') FROM generate_series(1, 1000) g`)
			msgs := e.messages(1000)
			seen := map[int64]bool{}
			for _, m := range msgs {
				size := len(m.body)
				for k, vs := range m.header {
					for _, v := range vs {
						size += len(k) + len(v) + 4
					}
				}
				if size > maxPayload {
					t.Errorf("message %d: %d bytes, over max_payload %d", m.seq, size, maxPayload)
				}
				for _, id := range m.ids {
					if seen[id] {
						t.Fatalf("token %d published twice", id)
					}
					seen[id] = true
				}
			}
			if len(seen) != 1000 || len(msgs) < 10 {
				t.Fatalf("%d tokens in %d messages", len(seen), len(msgs))
			}
			e.WaitConfirmed("mailroom", e.WalLSN(), 30*time.Second)
		})
	}
}

func TestLineMatchesCollector(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, proto, binary string }{
		{"v2 binary", "2", "true"},
		{"v2 text", "2", "false"},
		{"v1 text", "1", "false"},
		{"v1 binary", "1", "true"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testLineMatchesCollector(t, envOpts{limit: 5, timeout: 200 * time.Millisecond, proto: tc.proto, binary: tc.binary})
		})
	}
}

func testLineMatchesCollector(t *testing.T, o envOpts) {
	e := newEnv(t, o)
	// One transaction: its six tokens arrive together, so the limit cuts
	// the first batch at five however slow the machine, and the timeout
	// the second.
	e.Exec(`INSERT INTO accounts (email, login) SELECT 'c' || g || '@fake.mail', 'login' || g FROM generate_series(1, 4) g;
		INSERT INTO accounts (email, login, status) VALUES ('r@fake.mail', 'rlogin', 'active');
		INSERT INTO tokens (account, action) SELECT id, 'password_recovery' FROM accounts WHERE login = 'rlogin';
		INSERT INTO accounts (email, login) VALUES ('last@fake.mail', 'last')`)
	msgs := e.messages(6)
	for _, m := range msgs {
		// The collector printed a line per batch.
		var want []byte
		for i, ids := range m.batchIDs() {
			if i > 0 {
				want = append(want, '\n')
			}
			want = append(want, e.collectorLine(ids)...)
		}
		if !bytes.Equal(m.body, want) {
			t.Fatalf("message %d body\n%s\nwant what the collector prints\n%s", m.seq, m.body, want)
		}
	}
	if sizes := batchSizes(msgs); !slices.Equal(sizes, []int{5, 1}) {
		t.Fatalf("batches of %v tokens, want 5 and 1", sizes)
	}
}

func TestJSONFormat(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{limit: 10, timeout: 100 * time.Millisecond, format: "json"})
	e.Exec(`INSERT INTO accounts (email, login) VALUES ('j"son@example.com', 'jl')`)
	msgs := e.messages(1)
	var body struct {
		Batch  string `json:"batch"`
		Tokens []struct {
			ID        int64   `json:"id"`
			Action    string  `json:"action"`
			Email     string  `json:"email"`
			Login     string  `json:"login"`
			Token     string  `json:"token"`
			Code      *string `json:"code"`
			ExpiresAt int64   `json:"expires_at"`
		} `json:"tokens"`
	}
	if err := json.Unmarshal(msgs[0].body, &body); err != nil {
		t.Fatalf("body %s: %v", msgs[0].body, err)
	}
	if body.Batch != msgs[0].header.Get(wire.HeaderMsgID) || len(body.Tokens) != 1 {
		t.Fatalf("body = %+v", body)
	}
	tok := body.Tokens[0]
	var expires int64
	e.Conn.QueryRow(e.ctx, `SELECT expires_at FROM tokens WHERE id = $1`, tok.ID).Scan(&expires)
	if tok.Action != "activation" || tok.Email != `j"son@example.com` || tok.Login != "jl" || tok.Code == nil || len(*tok.Code) != 5 || tok.ExpiresAt != expires {
		t.Fatalf("token = %+v", tok)
	}
	signer, _ := token.NewSigner("k", mustKey(t))
	if _, err := signer.Verify(tok.Token, action.Activation, ""); err != nil {
		t.Fatal(err)
	}
}

func TestRestartPublishesEachTokenOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{limit: 7, timeout: 100 * time.Millisecond})
	e.Exec(`INSERT INTO accounts (email, login) SELECT 'a' || g || '@x', 'a' || g FROM generate_series(1, 50) g`)
	e.messages(50)
	e.stop()
	// Written while the tailer is down: captured by the slot.
	e.Exec(`INSERT INTO accounts (email, login) SELECT 'b' || g || '@x', 'b' || g FROM generate_series(1, 50) g`)
	e.start()
	msgs := e.messages(100)
	seen := map[int64]bool{}
	for _, m := range msgs {
		for _, id := range m.ids {
			if seen[id] {
				t.Fatalf("token %d published twice", id)
			}
			seen[id] = true
		}
	}
	if len(seen) != 100 {
		t.Fatalf("published %d distinct tokens, want 100", len(seen))
	}
	e.WaitConfirmed("mailroom", e.WalLSN(), 30*time.Second)
}

func TestPoisonRowsAreSkippedAndConfirmed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{limit: 10, timeout: 100 * time.Millisecond})
	// (An action the tailer does not know is no poison row: it stops the
	// tailer, TestUnknownActionStopsTheTailer.)
	e.Exec(`INSERT INTO accounts (email, login, status) VALUES ('p@example.com', 'p', 'active')`)
	tx, err := e.Conn.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		`INSERT INTO tokens (account, action, secret) SELECT id, 'password_recovery', '\x0102'::bytea FROM accounts WHERE login = 'p'`,
		`INSERT INTO tokens (account, action, code) SELECT id, 'password_recovery', NULL FROM accounts WHERE login = 'p'`,
		`INSERT INTO tokens (account, action, code) SELECT id, 'password_recovery', '24680' FROM accounts WHERE login = 'p'`,
	} {
		if _, err := tx.Exec(e.ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	msgs := e.messages(1)
	if len(msgs) != 1 || msgs[0].count != 1 || !bytes.HasSuffix(msgs[0].body, []byte(",24680")) {
		t.Fatalf("messages = %d, first %q", len(msgs), msgs[0].body)
	}
	e.WaitConfirmed("mailroom", e.WalLSN(), 30*time.Second)
}

// A tailer whose lease is taken from it (its session ended by the server)
// stops streaming at once and takes the lease and the slot again; every
// token is published once.
func TestLostLeaseEndsTheSession(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{limit: 5, timeout: 50 * time.Millisecond})
	e.Exec(`INSERT INTO accounts (email, login) SELECT 'a' || g || '@x', 'a' || g FROM generate_series(1, 20) g`)
	e.messages(20)
	e.Exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'tailer run' AND datname = current_database()`)
	tailertest.Eventually(t, 30*time.Second, func() error {
		if strings.Count(e.logs.String(), "msg=streaming") < 2 {
			return fmt.Errorf("the tailer did not stream again after losing its lease:\n%s", e.logs.String())
		}
		return nil
	})
	if !strings.Contains(e.logs.String(), "lost the lease of slot mailroom") {
		t.Fatalf("the session's end does not say the lease was lost:\n%s", e.logs.String())
	}
	e.Exec(`INSERT INTO accounts (email, login) SELECT 'b' || g || '@x', 'b' || g FROM generate_series(1, 20) g`)
	seen := map[int64]bool{}
	for _, m := range e.messages(40) {
		for _, id := range m.ids {
			if seen[id] {
				t.Fatalf("token %d published twice", id)
			}
			seen[id] = true
		}
	}
}

// WAL positions are logged as PostgreSQL writes them, in JSON too.
func TestLoggedPositions(t *testing.T) {
	t.Parallel()
	for _, format := range []string{"json", "text"} {
		var out bytes.Buffer
		NewLogger(format, "info", &out).Info("x", "from", pglogrepl.LSN(0x45E8A0F8), "position", wal.Position{Commit: 0x45E8A0F8, Index: 3})
		if !strings.Contains(out.String(), "0/45E8A0F8") || !strings.Contains(out.String(), "0/45E8A0F8:3") || strings.Contains(out.String(), "1172873464") {
			t.Errorf("%s log: %s", format, out.String())
		}
	}
}
