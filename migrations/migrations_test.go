package migrations

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/golang-migrate/migrate/v4"
	"github.com/jackc/pgx/v5"

	"github.com/mailroom/tailer/internal/pgname"
	"github.com/mailroom/tailer/internal/testutil/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func setup(t *testing.T) (context.Context, *pgx.Conn, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	url := pgtest.Shared(t).CreateDB(t)
	if err := Up(ctx, url, "public"); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return ctx, conn, url
}

func TestUpIsIdempotentAndReversible(t *testing.T) {
	ctx, conn, url := setup(t)
	if err := Up(ctx, url, "public"); err != nil {
		t.Fatalf("second Up: %v", err)
	}
	v, dirty, err := Version(ctx, url, "public")
	if err != nil || v != 15 || dirty {
		t.Fatalf("Version = %d, %v, %v", v, dirty, err)
	}
	if on, err := InstallGuard(ctx, conn, "public"); err != nil || !on {
		t.Fatalf("InstallGuard = %v, %v", on, err)
	}
	var pub string
	if err := conn.QueryRow(ctx, `SELECT pubname FROM pg_publication_tables WHERE tablename = 'tokens'`).Scan(&pub); err != nil || pub != Publication {
		t.Fatalf("publication = %q, %v", pub, err)
	}
	var ins, upd bool
	if err := conn.QueryRow(ctx, `SELECT pubinsert, pubupdate FROM pg_publication WHERE pubname = $1`, Publication).Scan(&ins, &upd); err != nil || !ins || upd {
		t.Fatalf("publication publishes insert=%v update=%v (%v), want inserts only", ins, upd, err)
	}
	if err := Down(ctx, url, "public"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE tablename IN ('accounts','tokens')`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("tables after Down = %d, %v", n, err)
	}
	if err := Up(ctx, url, "public"); err != nil {
		t.Fatalf("Up after Down: %v", err)
	}
}

func TestAdoptsExistingMailroomSchema(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := pgtest.Shared(t).CreateDB(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// A database set up by the collector's own migration already has the
	// types and tables.
	if _, err := conn.Exec(ctx, `
		CREATE EXTENSION pgcrypto;
		CREATE TYPE account_status AS ENUM ('provisioned', 'active', 'suspended');
		CREATE TYPE token_action AS ENUM ('activation', 'password_recovery');
		CREATE TABLE accounts (id BIGSERIAL PRIMARY KEY, email VARCHAR(254) UNIQUE NOT NULL,
			status account_status DEFAULT 'provisioned' NOT NULL, login VARCHAR(254) UNIQUE NOT NULL,
			created_at INTEGER DEFAULT EXTRACT(EPOCH FROM NOW()) NOT NULL, status_changed_at INTEGER,
			activated_at INTEGER, suspended_at INTEGER, unsuspended_at INTEGER);
		INSERT INTO accounts (email, login) VALUES ('old@example.com', 'old');
	`); err != nil {
		t.Fatal(err)
	}
	if err := Up(ctx, url, "public"); err != nil {
		t.Fatalf("Up over an existing schema: %v", err)
	}
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM accounts`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("existing rows = %d, %v", n, err)
	}
}

func TestTriggers(t *testing.T) {
	ctx, conn, _ := setup(t)
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := conn.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	type account struct {
		status                                     string
		changed, activated, suspended, unsuspended *int32
	}
	get := func(id int64) account {
		t.Helper()
		var a account
		if err := conn.QueryRow(ctx, `SELECT status::text, status_changed_at, activated_at, suspended_at, unsuspended_at FROM accounts WHERE id = $1`, id).
			Scan(&a.status, &a.changed, &a.activated, &a.suspended, &a.unsuspended); err != nil {
			t.Fatal(err)
		}
		return a
	}

	t.Run("activation token in the same transaction as the account", func(t *testing.T) {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var id int64
		if err := tx.QueryRow(ctx, `INSERT INTO accounts (email, login) VALUES ('a@example.com', 'a') RETURNING id`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		var action, code string
		var secret []byte
		var expires, created int32
		if err := tx.QueryRow(ctx, `SELECT action::text, secret, code, expires_at, created_at FROM tokens WHERE account = $1`, id).
			Scan(&action, &secret, &code, &expires, &created); err != nil {
			t.Fatalf("token inside the inserting transaction: %v", err)
		}
		if action != "activation" || len(secret) != 32 || len(code) != 5 || expires-created != 900 {
			t.Fatalf("token = %s secret %d bytes code %q ttl %d", action, len(secret), code, expires-created)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		var n int
		conn.QueryRow(ctx, `SELECT count(*) FROM tokens`).Scan(&n)
		if n != 0 {
			t.Fatalf("rolled back account left %d tokens", n)
		}
	})

	t.Run("no activation token for an account inserted active", func(t *testing.T) {
		var id int64
		conn.QueryRow(ctx, `INSERT INTO accounts (email, login, status) VALUES ('b@example.com', 'b', 'active') RETURNING id`).Scan(&id)
		var n int
		conn.QueryRow(ctx, `SELECT count(*) FROM tokens WHERE account = $1`, id).Scan(&n)
		if n != 0 {
			t.Fatalf("%d tokens for an active account", n)
		}
	})

	t.Run("consuming the activation token activates the account", func(t *testing.T) {
		var id int64
		conn.QueryRow(ctx, `INSERT INTO accounts (email, login) VALUES ('c@example.com', 'c') RETURNING id`).Scan(&id)
		exec(`UPDATE tokens SET consumed_at = extract(epoch FROM now()) WHERE account = $1 AND action = 'activation'`, id)
		a := get(id)
		if a.status != "active" || a.activated == nil || a.changed == nil {
			t.Fatalf("after consume: %+v", a)
		}
	})

	t.Run("consuming a recovery token changes nothing", func(t *testing.T) {
		var id int64
		conn.QueryRow(ctx, `INSERT INTO accounts (email, login) VALUES ('d@example.com', 'd') RETURNING id`).Scan(&id)
		exec(`INSERT INTO tokens (account, action) VALUES ($1, 'password_recovery')`, id)
		exec(`UPDATE tokens SET consumed_at = 1 WHERE account = $1 AND action = 'password_recovery'`, id)
		if a := get(id); a.status != "provisioned" {
			t.Fatalf("status = %s", a.status)
		}
	})

	t.Run("suspend and unsuspend an activated account", func(t *testing.T) {
		var id int64
		conn.QueryRow(ctx, `INSERT INTO accounts (email, login) VALUES ('e@example.com', 'e') RETURNING id`).Scan(&id)
		exec(`UPDATE accounts SET status = 'active' WHERE id = $1`, id)
		exec(`UPDATE accounts SET status = 'suspended' WHERE id = $1`, id)
		a := get(id)
		if a.status != "suspended" || a.suspended == nil || a.unsuspended != nil {
			t.Fatalf("after suspend: %+v", a)
		}
		exec(`UPDATE accounts SET status = 'active' WHERE id = $1`, id)
		a = get(id)
		if a.status != "active" || a.suspended != nil || a.unsuspended == nil || a.activated == nil {
			t.Fatalf("after unsuspend: %+v", a)
		}
	})

	t.Run("unsuspending a never-activated account reverts to provisioned", func(t *testing.T) {
		var id int64
		conn.QueryRow(ctx, `INSERT INTO accounts (email, login) VALUES ('f@example.com', 'f') RETURNING id`).Scan(&id)
		exec(`UPDATE accounts SET status = 'suspended' WHERE id = $1`, id)
		exec(`UPDATE accounts SET status = 'active' WHERE id = $1`, id)
		a := get(id)
		if a.status != "provisioned" || a.activated != nil || a.unsuspended == nil || a.suspended != nil {
			t.Fatalf("after unsuspend of a never-activated account: %+v", a)
		}
	})

	t.Run("same status leaves timestamps alone", func(t *testing.T) {
		var id int64
		conn.QueryRow(ctx, `INSERT INTO accounts (email, login) VALUES ('g@example.com', 'g') RETURNING id`).Scan(&id)
		exec(`UPDATE accounts SET status = 'provisioned' WHERE id = $1`, id)
		if a := get(id); a.changed != nil {
			t.Fatalf("status_changed_at set without a change: %+v", a)
		}
	})

	t.Run("deferred foreign key allows the token before the account", func(t *testing.T) {
		tx, _ := conn.Begin(ctx)
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, `INSERT INTO tokens (account, action) VALUES (999999, 'password_recovery')`); err != nil {
			t.Fatalf("insert before account: %v", err)
		}
		if err := tx.Commit(ctx); err == nil {
			t.Fatal("commit without the account succeeded")
		}
	})
}

// A database of an older tailer (migrations up to 4) keeps what it knew:
// tailer_resync's rows become slot records, and a slot made before
// incarnations is recorded as legacy, its batches without an incarnation
// its own. A slot of another database is left alone.
func TestSlotRecordsFromAnOlderTailer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := pgtest.Shared(t).CreateDB(t)
	if err := withMigrate(ctx, url, "public", func(m *migrate.Migrate) error { return m.Migrate(4) }); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, sql := range []string{
		`SELECT pg_create_logical_replication_slot('old', 'pgoutput')`,
		`SELECT pg_create_logical_replication_slot('resynced', 'pgoutput')`,
		`INSERT INTO tailer_resync (slot, after_id, consistent_point, stream_seq, done_at) VALUES ('resynced', 42, '0/1000', 7, now())`,
		`INSERT INTO tailer_resync (slot) VALUES ('halfway')`,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	t.Cleanup(func() {
		conn.Exec(context.Background(), `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name IN ('old', 'resynced')`)
	})
	if err := Up(ctx, url, "public"); err != nil {
		t.Fatal(err)
	}
	rows, err := conn.Query(ctx, `SELECT slot || ' ' || resync_pending || ' ' || coalesce(stream_seq::text, '-') || ' ' || legacy || ' ' ||
		coalesce(collector_last_seq::text, '-') || ' ' || (length(incarnation) = 32) FROM tailer_slot ORDER BY slot`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"halfway true - true - true", "old false 0 true - true", "resynced false 7 true 42 true"}
	if strings.Join(got, "; ") != strings.Join(want, "; ") {
		t.Fatalf("tailer_slot = %q, want %q", got, want)
	}
	var old *string
	if err := conn.QueryRow(ctx, `SELECT to_regclass('tailer_resync')::text`).Scan(&old); err != nil || old != nil {
		t.Fatalf("tailer_resync still there (%v, %v)", old, err)
	}
	// Down to 4 gives tailer_resync its rows back.
	if err := withMigrate(ctx, url, "public", func(m *migrate.Migrate) error { return m.Migrate(4) }); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM tailer_resync WHERE slot = 'resynced' AND after_id = 42 AND stream_seq = 7 AND done_at IS NOT NULL`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("tailer_resync after down: %d, %v", n, err)
	}
}

// The publication guard marks, in the transaction that changes it, every
// slot whose publication can no longer carry token inserts, even when the
// same transaction puts it right again; it leaves alone a change that keeps
// the inserts coming, and a role that may not create event triggers is
// told apart from a failure.
func TestPublicationGuard(t *testing.T) {
	ctx, conn, _ := setup(t)
	if on, err := InstallGuard(ctx, conn, "public"); err != nil || !on {
		t.Fatalf("InstallGuard = %v, %v", on, err)
	}
	if on, err := InstallGuard(ctx, conn, "public"); err != nil || !on {
		t.Fatalf("InstallGuard again = %v, %v", on, err)
	}
	needed := func() bool {
		t.Helper()
		var b bool
		if err := conn.QueryRow(ctx, `SELECT resync_needed FROM tailer_slot WHERE slot = 's'`).Scan(&b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	if _, err := conn.Exec(ctx, `INSERT INTO tailer_slot (slot, incarnation, created_by, publication) VALUES ('s', 'i', 'test', 'mailroom')`); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, change string
		marked       bool
	}{
		{"inserts kept, updates added", `ALTER PUBLICATION mailroom SET (publish = 'insert, update')`, false},
		{"another table added", `CREATE TABLE other (id int); ALTER PUBLICATION mailroom ADD TABLE other`, false},
		{"tokens out and back in one transaction", `BEGIN; ALTER PUBLICATION mailroom DROP TABLE tokens; ALTER PUBLICATION mailroom ADD TABLE tokens; COMMIT`, true},
		{"inserts off and on", `ALTER PUBLICATION mailroom SET (publish = 'update'); ALTER PUBLICATION mailroom SET (publish = 'insert')`, true},
		{"a row filter", `ALTER PUBLICATION mailroom SET TABLE tokens WHERE (id > 0), other`, true},
		{"a column list", `ALTER PUBLICATION mailroom SET TABLE tokens (id, action, account), other`, true},
		{"dropped and made again", `DROP PUBLICATION mailroom; CREATE PUBLICATION mailroom FOR TABLE tokens WITH (publish = 'insert')`, true},
		{"tokens renamed", `ALTER TABLE tokens RENAME TO tokens2`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := conn.Exec(ctx, tc.change); err != nil {
				t.Fatal(err)
			}
			if got := needed(); got != tc.marked {
				t.Fatalf("resync_needed %v, want %v", got, tc.marked)
			}
			if _, err := conn.Exec(ctx, `UPDATE tailer_slot SET resync_needed = false`); err != nil {
				t.Fatal(err)
			}
		})
	}
	if _, err := conn.Exec(ctx, `DROP EVENT TRIGGER `+GuardName("public")+`; CREATE ROLE guard_test_nobody; SET ROLE guard_test_nobody`); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(context.Background(), `RESET ROLE; DROP ROLE guard_test_nobody`)
	if on, err := InstallGuard(ctx, conn, "public"); err != nil || on {
		t.Fatalf("InstallGuard as a role that may not = %v, %v; want false and no error", on, err)
	}
}

// Each schema of a database gets a guard of its own, which fires in every
// session: two schemas migrated give two event triggers, both enabled
// always, each marking its own schema's slot. A guard made the old way
// (one name for the database, fired in origin sessions alone, without the
// commands that make partitions) is found by its function and made again
// as it is now, not made twice.
func TestGuardPerSchemaFiresAlways(t *testing.T) {
	ctx, conn, url := setup(t)
	if _, err := conn.Exec(ctx, `CREATE EVENT TRIGGER tailer_publication_guard ON ddl_command_end
		WHEN TAG IN ('ALTER PUBLICATION') EXECUTE FUNCTION public.tailer_publication_guard()`); err != nil {
		t.Fatal(err)
	}
	if err := Up(ctx, url, "app"); err != nil {
		t.Fatal(err)
	}
	for _, schema := range []pgname.Schema{"public", "app"} {
		if on, err := InstallGuard(ctx, conn, schema); err != nil || !on {
			t.Fatalf("InstallGuard(%s) = %v, %v", schema, on, err)
		}
	}
	rows, err := conn.Query(ctx, `SELECT evtname::text || ' ' || evtfoid::regproc::text || ' ' || evtenabled::text FROM pg_event_trigger ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	want := []string{GuardName("app") + " app.tailer_publication_guard A", GuardName("public") + " tailer_publication_guard A"}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("event triggers %q (%v), want %q", got, err, want)
	}
	for _, sql := range []string{
		`CREATE PUBLICATION mailroom_app FOR TABLE app.tokens WITH (publish = 'insert')`,
		`INSERT INTO app.tailer_slot (slot, incarnation, created_by, publication) VALUES ('app', 'i', 'test', 'mailroom_app')`,
		`BEGIN; SET LOCAL session_replication_role = replica; ALTER PUBLICATION mailroom_app DROP TABLE app.tokens; ALTER PUBLICATION mailroom_app ADD TABLE app.tokens; COMMIT`,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	var needed bool
	if err := conn.QueryRow(ctx, `SELECT resync_needed FROM app.tailer_slot WHERE slot = 'app'`).Scan(&needed); err != nil || !needed {
		t.Fatalf("app's slot after its publication changed in a replica session: resync_needed %v, %v", needed, err)
	}
}
