package join

import (
	"context"
	"fmt"
	"maps"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mailroom/tailer/decoder"
	"github.com/mailroom/tailer/decoder/action"
	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/migrations/migratetest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func setup(t *testing.T) (context.Context, string, *pgx.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	db := migratetest.NewDB(t, pgtest.Shared(t))
	return ctx, db.URL, db.Conn
}

// insertToken inserts a token for the account with login and returns it as
// the decoder would. A non-empty setOne names a column (expires_at or
// consumed_at) set to 1, a moment long past.
func insertToken(t *testing.T, ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, login, label, setOne string) decoder.Token {
	t.Helper()
	cols, vals := "account, action", "id, $2::token_action"
	if setOne != "" {
		cols, vals = cols+", "+setOne, vals+", 1"
	}
	var tok decoder.Token
	var xid int64
	err := q.QueryRow(ctx, `INSERT INTO tokens (`+cols+`) SELECT `+vals+` FROM accounts WHERE login = $1
		RETURNING id, txid_current()`, login, label).Scan(&tok.ID, &xid)
	if err != nil {
		t.Fatal(err)
	}
	tok.Xid = uint32(xid)
	tok.Action, _ = action.Parse(label)
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
	rows := make([]TokenState, len(tokens))
	rows[6].Skip = SkipAlreadyPublished // marked rows are left alone
	want[6] = SkipAlreadyPublished
	if err := NewJoiner(conn, "public").Join(ctx, tokens, rows); err != nil {
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

	rows := make([]TokenState, 1)
	done := make(chan error, 1)
	go func() { done <- NewJoiner(conn, "public").Join(ctx, []decoder.Token{tok}, rows) }()
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
	rows := make([]TokenState, 1)
	if err := NewJoiner(conn, "public").Join(ctx, []decoder.Token{tok}, rows); err != nil {
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
	rows := [][]TokenState{make([]TokenState, 2), make([]TokenState, 3)}
	rows[1][2].Skip = SkipAlreadyPublished
	if err := NewJoiner(conn, "public").JoinMany(ctx, [][]decoder.Token{a, b}, rows); err != nil {
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

// Joined batches wait for their message while later ones are joined (group
// commit): the email and login of a join stay what they were after the
// next join.
func TestRowsOutliveTheNextJoin(t *testing.T) {
	ctx, _, conn := setup(t)
	conn.Exec(ctx, `INSERT INTO accounts (email, login, status) VALUES ('first@x', 'first', 'active'), ('second-longer@x', 'second-longer', 'active')`)
	j := NewJoiner(conn, "public")
	a := []decoder.Token{insertToken(t, ctx, conn, "first", "password_recovery", "")}
	ra := make([]TokenState, 1)
	if err := j.Join(ctx, a, ra); err != nil {
		t.Fatal(err)
	}
	b := []decoder.Token{insertToken(t, ctx, conn, "second-longer", "password_recovery", "")}
	rb := make([]TokenState, 1)
	if err := j.Join(ctx, b, rb); err != nil {
		t.Fatal(err)
	}
	if string(ra[0].Email) != "first@x" || string(ra[0].Login) != "first" {
		t.Errorf("first join's row after the second: %q %q", ra[0].Email, ra[0].Login)
	}
	if string(rb[0].Email) != "second-longer@x" || string(rb[0].Login) != "second-longer" {
		t.Errorf("second join's row: %q %q", rb[0].Email, rb[0].Login)
	}
}

// On a freshly loaded table (no statistics yet, as after a bulk import that
// the tailer then drains), both forms of the join must still be planned as
// index probes. PostgreSQL's custom plans for them were parallel sequential
// scans of both tables; SessionSettings makes the connection use the generic
// plan.
func TestJoinPlanOnUnanalyzedTables(t *testing.T) {
	ctx, url, conn := setup(t)
	if _, err := conn.Exec(ctx, `INSERT INTO accounts (email, login)
		SELECT 'u' || g || '@x', 'u' || g FROM generate_series(1, 50000) g`); err != nil {
		t.Fatal(err)
	}
	var ids string
	var lo, hi int64
	if err := conn.QueryRow(ctx, `SELECT array_agg(id)::text, min(id), max(id) FROM (SELECT id FROM tokens ORDER BY id LIMIT 1000) t`).Scan(&ids, &lo, &hi); err != nil {
		t.Fatal(err)
	}
	joinByIDs, joinByRange := joinQueries("public")
	plans := func(conn *pgx.Conn) map[string]string {
		t.Helper()
		p := map[string]string{}
		for name, c := range map[string]struct{ sql, args string }{
			"by ids":   {joinByIDs, fmt.Sprintf(`'%s', '{1}'`, ids)},
			"by range": {joinByRange, fmt.Sprintf(`%d, '{1}', %d`, lo, hi)},
		} {
			conn.Exec(ctx, `DEALLOCATE ALL`)
			if _, err := conn.Exec(ctx, `PREPARE j AS `+c.sql); err != nil {
				t.Fatal(err)
			}
			var plan string
			// EXPLAIN EXECUTE goes through the plan cache, as the Joiner's
			// prepared statements do; this is the first execution.
			if err := conn.QueryRow(ctx, `EXPLAIN (FORMAT JSON) EXECUTE j(`+c.args+`)`).Scan(&plan); err != nil {
				t.Fatal(err)
			}
			p[name] = plan
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

	for name, p := range plans(conn) {
		if !strings.Contains(p, `"Seq Scan"`) {
			t.Logf("this server plans the join %s well even without the settings:\n%s", name, p)
		}
	}
	for name, p := range plans(tuned) {
		for _, bad := range []string{`"Seq Scan"`, `"Gather"`, `"Hash Join"`} {
			if strings.Contains(p, bad) {
				t.Errorf("join %s with SessionSettings has a %s node:\n%s", name, bad, p)
			}
		}
	}
}

// Both forms of the join give the same answers: a dense batch is joined by
// range, the same tokens spread over a wider range by id, and tokens in the
// range that are not the batch's are left alone.
func TestJoinByRangeAndByIDs(t *testing.T) {
	ctx, _, conn := setup(t)
	conn.Exec(ctx, `INSERT INTO accounts (email, login, status) VALUES ('a@x', 'active', 'active'), ('p@x', 'prov', 'provisioned')`)
	var all []decoder.Token
	for i := range 40 {
		setOne := ""
		if i%5 == 3 {
			setOne = "consumed_at"
		}
		all = append(all, insertToken(t, ctx, conn, []string{"active", "prov"}[i%2], "password_recovery", setOne))
	}
	want := func(i int) Skip {
		switch {
		case i%5 == 3:
			return SkipConsumed
		case i%2 == 1:
			return SkipStatus
		}
		return Publish
	}
	for name, pick := range map[string]func(i int) bool{
		"dense":  func(i int) bool { return i >= 10 && i < 30 && i != 20 },
		"sparse": func(i int) bool { return i%3 == 0 },
	} {
		var tokens []decoder.Token
		var idx []int
		for i, tok := range all {
			if pick(i) {
				tokens, idx = append(tokens, tok), append(idx, i)
			}
		}
		rows := make([]TokenState, len(tokens))
		if err := NewJoiner(conn, "public").Join(ctx, tokens, rows); err != nil {
			t.Fatal(err)
		}
		for k, r := range rows {
			if w := want(idx[k]); r.Skip != w {
				t.Errorf("%s: token %d: %v, want %v", name, idx[k], r.Skip, w)
			}
			if r.Skip == Publish && string(r.Login) != "active" {
				t.Errorf("%s: token %d: login %q", name, idx[k], r.Login)
			}
		}
	}
}
