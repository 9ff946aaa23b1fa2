package join

import (
	"errors"
	"strings"
	"testing"

	"github.com/mailroom/tailer/decoder"
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
