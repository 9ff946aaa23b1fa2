package join

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/mailroom/tailer/decoder"
	"github.com/mailroom/tailer/internal/pgname"
)

// A change of integer width (expires_at to bigint and back, on a Joiner
// that already prepared its query) just works; a change the tailer cannot
// read is a *SchemaError naming the table, the column and both types, from
// CheckSchema and from the join itself; fixed, the join works again.
func TestSchemaChanges(t *testing.T) {
	ctx, _, conn := setup(t)
	exec := func(sql string) {
		t.Helper()
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	if err := CheckSchema(ctx, conn, "public"); err != nil {
		t.Fatalf("the migrated schema: %v", err)
	}
	exec(`INSERT INTO accounts (email, login, status) VALUES ('a@x', 'a', 'active')`)
	j := NewJoiner(conn, "public")
	join := func() ([]TokenState, error) {
		t.Helper()
		tok := insertToken(t, ctx, conn, "a", "password_recovery", "")
		rows := make([]TokenState, 1)
		return rows, j.Join(ctx, []decoder.Token{tok}, rows)
	}
	if _, err := join(); err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		`ALTER TABLE tokens ALTER COLUMN expires_at TYPE bigint`,
		`ALTER TABLE tokens ALTER COLUMN code TYPE varchar(10)`,
		`ALTER TABLE accounts ALTER COLUMN email TYPE text`,
		`ALTER TABLE tokens ADD COLUMN note text`,
		`ALTER TABLE tokens ALTER COLUMN expires_at TYPE integer`,
	} {
		exec(sql)
		if err := CheckSchema(ctx, conn, "public"); err != nil {
			t.Fatalf("after %s: CheckSchema: %v", sql, err)
		}
		rows, err := join()
		if err != nil || rows[0].Skip != Publish || rows[0].ExpiresAt < 1700000000 {
			t.Fatalf("after %s: join = %+v, %v", sql, rows, err)
		}
	}

	exec(`ALTER TABLE tokens ALTER COLUMN expires_at DROP DEFAULT`)
	exec(`ALTER TABLE tokens ALTER COLUMN expires_at TYPE timestamptz USING to_timestamp(expires_at)`)
	exec(`ALTER TABLE accounts DROP COLUMN login CASCADE`)
	want := []string{"table tokens, column expires_at is timestamp with time zone, the tailer reads smallint, integer or bigint", "table accounts has no column login"}
	var schema *SchemaError
	if err := CheckSchema(ctx, conn, "public"); !errors.As(err, &schema) || !containsAll(err.Error(), want) {
		t.Fatalf("CheckSchema = %v, want it to name %q", err, want)
	}
	rows := make([]TokenState, 1)
	var id int64
	if err := conn.QueryRow(ctx, `INSERT INTO tokens (account, action, expires_at) SELECT id, 'password_recovery', now() + interval '1 hour' FROM accounts RETURNING id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	err := j.Join(ctx, []decoder.Token{{ID: id}}, rows)
	if !errors.As(err, &schema) || !errors.Is(err, ErrJoin) || !containsAll(err.Error(), want) {
		t.Fatalf("join on the changed schema = %v, want a SchemaError naming %q", err, want)
	}

	exec(`ALTER TABLE accounts ADD COLUMN login varchar(254)`)
	exec(`UPDATE accounts SET login = 'a'`)
	exec(`ALTER TABLE tokens ALTER COLUMN expires_at TYPE integer USING extract(epoch FROM expires_at)::integer`)
	if err := CheckSchema(ctx, conn, "public"); err != nil {
		t.Fatalf("fixed: CheckSchema: %v", err)
	}
	rows = make([]TokenState, 1)
	if err := j.Join(ctx, []decoder.Token{{ID: id}}, rows); err != nil || rows[0].Skip != Publish {
		t.Fatalf("fixed: join = %+v, %v", rows, err)
	}
}

func TestCheckSchemaWithoutTables(t *testing.T) {
	ctx, _, conn := setup(t)
	if _, err := conn.Exec(ctx, `DROP TABLE tokens`); err != nil {
		t.Fatal(err)
	}
	if err := CheckSchema(ctx, conn, "public"); err == nil || !strings.Contains(err.Error(), "table public.tokens does not exist") || strings.Count(err.Error(), "tokens does not exist") != 1 {
		t.Fatalf("CheckSchema without tokens = %v", err)
	}
}

func containsAll(s string, parts []string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

// Row-level security that hides rows from the tailer's role: with
// row_security left on, the join would take the hidden token for deleted;
// on a connection pgname.Isolate set up (row_security off) it fails
// instead, with a SchemaError naming the table, its policy and the way
// out, and CheckSchema says the same before any join.
func TestJoinRefusesRowSecurity(t *testing.T) {
	ctx, url, conn := setup(t)
	for _, sql := range []string{
		`DO $$ BEGIN CREATE ROLE rls_reader LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$`,
		`GRANT USAGE ON SCHEMA public TO rls_reader`,
		`GRANT SELECT ON tokens, accounts TO rls_reader`,
		`INSERT INTO accounts (email, login, status) VALUES ('a@x', 'a', 'active')`,
		`DO $$ BEGIN CREATE ROLE rls_app NOLOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$`,
		`CREATE POLICY app_only ON accounts TO rls_app USING (true)`,
		`ALTER TABLE accounts ENABLE ROW LEVEL SECURITY`,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	tok := insertToken(t, ctx, conn, "a", "password_recovery", "")
	connect := func(isolate bool) *pgx.Conn {
		t.Helper()
		cfg, err := pgx.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		cfg.User = "rls_reader"
		if isolate {
			pgname.Isolate(cfg.RuntimeParams)
		}
		c, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}

	rows := make([]TokenState, 1)
	if err := NewJoiner(connect(false), "public").Join(ctx, []decoder.Token{tok}, rows); err != nil || rows[0].Skip != SkipDeleted {
		t.Fatalf("with row_security on: %+v, %v; want the token taken for deleted (what Isolate prevents)", rows, err)
	}
	want := []string{"row-level security on public.accounts (policies app_only) applies to role rls_reader", "ALTER ROLE rls_reader BYPASSRLS"}
	iso := connect(true)
	var schema *SchemaError
	rows = make([]TokenState, 1)
	if err := NewJoiner(iso, "public").Join(ctx, []decoder.Token{tok}, rows); !errors.As(err, &schema) || !containsAll(err.Error(), want) {
		t.Fatalf("join under row-level security = %+v, %v; want a SchemaError naming %q", rows, err, want)
	}
	if err := CheckSchema(ctx, iso, "public"); !errors.As(err, &schema) || !containsAll(err.Error(), want) {
		t.Fatalf("CheckSchema = %v, want it to name %q", err, want)
	}
	if _, err := conn.Exec(ctx, `ALTER TABLE accounts DISABLE ROW LEVEL SECURITY`); err != nil {
		t.Fatal(err)
	}
	rows = make([]TokenState, 1)
	if err := NewJoiner(iso, "public").Join(ctx, []decoder.Token{tok}, rows); err != nil || rows[0].Skip != Publish {
		t.Fatalf("row-level security off: %+v, %v", rows, err)
	}
}
