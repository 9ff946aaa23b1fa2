package accounts

import (
	"context"
	"maps"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mailroom/tailer/decoder"
	"github.com/mailroom/tailer/testutil/dbtest"
	"github.com/mailroom/tailer/testutil/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func setup(t *testing.T) (context.Context, string, *pgx.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	url, conn := dbtest.New(t, pgtest.Shared(t))
	return ctx, url, conn
}

// insertToken inserts a token for the account with login and returns it as
// the decoder would. A non-empty setOne names a column (expires_at or
// consumed_at) set to 1, a moment long past.
func insertToken(t *testing.T, ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, login, action, setOne string) decoder.Token {
	t.Helper()
	cols, vals := "account, action", "id, $2::token_action"
	if setOne != "" {
		cols, vals = cols+", "+setOne, vals+", 1"
	}
	var tok decoder.Token
	var xid int64
	err := q.QueryRow(ctx, `INSERT INTO tokens (`+cols+`) SELECT `+vals+` FROM accounts WHERE login = $1
		RETURNING id, txid_current()`, login, action).Scan(&tok.ID, &xid)
	if err != nil {
		t.Fatal(err)
	}
	tok.Xid = uint32(xid)
	tok.Action, _ = decoder.ParseAction(action)
	return tok
}

func TestJoinSkips(t *testing.T) {
	ctx, _, conn := setup(t)
	if _, err := conn.Exec(ctx, `INSERT INTO accounts (email, login, status) VALUES
		('a@x', 'active', 'active'), ('p@x', 'prov', 'provisioned'), ('s@x', 'susp', 'active')`); err != nil {
		t.Fatal(err)
	}
	conn.Exec(ctx, `UPDATE accounts SET status = 'suspended' WHERE login = 'susp'`)
	tokens := []decoder.Token{
		insertToken(t, ctx, conn, "active", "password_recovery", ""),
		insertToken(t, ctx, conn, "prov", "password_recovery", ""),
		insertToken(t, ctx, conn, "susp", "password_recovery", ""),
		insertToken(t, ctx, conn, "active", "password_recovery", "expires_at"),
		insertToken(t, ctx, conn, "active", "password_recovery", "consumed_at"),
		insertToken(t, ctx, conn, "active", "activation", ""),
		insertToken(t, ctx, conn, "prov", "activation", ""),
		insertToken(t, ctx, conn, "active", "password_recovery", ""),
	}
	if _, err := conn.Exec(ctx, `DELETE FROM tokens WHERE id = $1`, tokens[7].ID); err != nil {
		t.Fatal(err)
	}
	want := []Skip{Publish, SkipStatus, SkipStatus, SkipExpired, SkipConsumed, SkipStatus, Publish, SkipDeleted}
	rows := make([]Row, len(tokens))
	rows[6].Skip = SkipAlreadyPublished // marked rows are left alone
	want[6] = SkipAlreadyPublished
	if err := NewJoiner(conn).Join(ctx, tokens, rows); err != nil {
		t.Fatal(err)
	}
	for i, r := range rows {
		if r.Skip != want[i] {
			t.Errorf("token %d: %v, want %v", i, r.Skip, want[i])
		}
	}
	if string(rows[0].Email) != "a@x" || string(rows[0].Login) != "active" || rows[0].ExpiresAt == 0 {
		t.Errorf("joined row = %+v", rows[0])
	}
}

// A transaction the WAL already delivered may not be visible yet: Join must
// wait for it rather than call its rows deleted.
func TestJoinWaitsForInvisibleTransaction(t *testing.T) {
	ctx, url, conn := setup(t)
	conn.Exec(ctx, `INSERT INTO accounts (email, login, status) VALUES ('a@x', 'active', 'active')`)
	writer, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close(ctx)
	tx, err := writer.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tok := insertToken(t, ctx, tx, "active", "password_recovery", "")

	rows := make([]Row, 1)
	done := make(chan error, 1)
	go func() { done <- NewJoiner(conn).Join(ctx, []decoder.Token{tok}, rows) }()
	select {
	case err := <-done:
		t.Fatalf("Join returned (%v, %v) while the inserting transaction was still invisible", err, rows[0].Skip)
	case <-time.After(300 * time.Millisecond):
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if rows[0].Skip != Publish {
		t.Fatalf("after commit: %v, want publish", rows[0].Skip)
	}
}

func TestJoinRolledBackTransactionIsDeleted(t *testing.T) {
	ctx, url, conn := setup(t)
	conn.Exec(ctx, `INSERT INTO accounts (email, login, status) VALUES ('a@x', 'active', 'active')`)
	writer, _ := pgx.Connect(ctx, url)
	defer writer.Close(ctx)
	tx, _ := writer.Begin(ctx)
	tok := insertToken(t, ctx, tx, "active", "password_recovery", "")
	tx.Rollback(ctx)
	rows := make([]Row, 1)
	if err := NewJoiner(conn).Join(ctx, []decoder.Token{tok}, rows); err != nil {
		t.Fatal(err)
	}
	if rows[0].Skip != SkipDeleted {
		t.Fatalf("skip = %v", rows[0].Skip)
	}
}

// Batches joined together get the same answers as joined one by one.
func TestJoinMany(t *testing.T) {
	ctx, _, conn := setup(t)
	conn.Exec(ctx, `INSERT INTO accounts (email, login, status) VALUES ('a@x', 'active', 'active'), ('p@x', 'prov', 'provisioned')`)
	a := []decoder.Token{
		insertToken(t, ctx, conn, "active", "password_recovery", ""),
		insertToken(t, ctx, conn, "prov", "password_recovery", ""),
	}
	b := []decoder.Token{
		insertToken(t, ctx, conn, "prov", "activation", ""),
		insertToken(t, ctx, conn, "active", "password_recovery", "consumed_at"),
		insertToken(t, ctx, conn, "active", "password_recovery", ""),
	}
	rows := [][]Row{make([]Row, 2), make([]Row, 3)}
	rows[1][2].Skip = SkipAlreadyPublished
	if err := NewJoiner(conn).JoinMany(ctx, [][]decoder.Token{a, b}, rows); err != nil {
		t.Fatal(err)
	}
	want := [][]Skip{{Publish, SkipStatus}, {Publish, SkipConsumed, SkipAlreadyPublished}}
	for k := range want {
		for i, w := range want[k] {
			if rows[k][i].Skip != w {
				t.Errorf("batch %d token %d: %v, want %v", k, i, rows[k][i].Skip, w)
			}
		}
	}
	if string(rows[0][0].Login) != "active" || string(rows[1][0].Login) != "prov" {
		t.Errorf("joined rows: %q %q", rows[0][0].Login, rows[1][0].Login)
	}
}

// On a freshly loaded table (no statistics yet, as after a bulk import that
// the tailer then drains), the join must still be planned as index probes.
// PostgreSQL's custom plans for it were parallel sequential scans of both
// tables; SessionSettings makes the connection use the generic plan.
func TestJoinPlanOnUnanalyzedTables(t *testing.T) {
	ctx, url, conn := setup(t)
	if _, err := conn.Exec(ctx, `INSERT INTO accounts (email, login)
		SELECT 'u' || g || '@x', 'u' || g FROM generate_series(1, 50000) g`); err != nil {
		t.Fatal(err)
	}
	var ids string
	if err := conn.QueryRow(ctx, `SELECT array_agg(id)::text FROM (SELECT id FROM tokens ORDER BY id LIMIT 1000) t`).Scan(&ids); err != nil {
		t.Fatal(err)
	}
	plan := func(conn *pgx.Conn) string {
		t.Helper()
		if _, err := conn.Exec(ctx, `PREPARE j(bigint[], bigint[]) AS `+joinSQL); err != nil {
			t.Fatal(err)
		}
		var p string
		// EXPLAIN EXECUTE goes through the plan cache, as the Joiner's
		// prepared statement does; this is its first execution.
		if err := conn.QueryRow(ctx, `EXPLAIN (FORMAT JSON) EXECUTE j('`+ids+`', '{1}')`).Scan(&p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	maps.Copy(cfg.RuntimeParams, SessionSettings())
	tuned, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer tuned.Close(ctx)

	if p := plan(conn); !strings.Contains(p, `"Seq Scan"`) {
		t.Logf("this server plans the join well even without the settings:\n%s", p)
	}
	p := plan(tuned)
	for _, bad := range []string{`"Seq Scan"`, `"Gather"`} {
		if strings.Contains(p, bad) {
			t.Errorf("join plan with SessionSettings has a %s node:\n%s", bad, p)
		}
	}
}
