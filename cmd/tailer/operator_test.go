package main

// What operators configure and PostgreSQL allows (issue 69): row-level
// security, several mailroom schemas, replication roles, partitions that
// come and go, extension schemas, a publication still to be made. Each
// either carries every token once or is refused, lastingly, naming its
// way out.

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/replication"
)

// restrictedRole makes the role tailer (LOGIN REPLICATION, no superuser)
// on pg, and returns c's URL as that role.
func (c *cluster) restrictedRole(pg *pgtest.Server) string {
	c.t.Helper()
	admin, err := pgx.Connect(c.ctx, pg.URL("postgres"))
	if err != nil {
		c.t.Fatal(err)
	}
	defer admin.Close(c.ctx)
	if _, err := admin.Exec(c.ctx, `DO $$ BEGIN CREATE ROLE tailer LOGIN REPLICATION; EXCEPTION WHEN duplicate_object THEN NULL; END $$`); err != nil {
		c.t.Fatal(err)
	}
	c.Exec(`GRANT SELECT ON tokens, accounts TO tailer`)
	c.Exec(`GRANT SELECT, INSERT, UPDATE, DELETE ON tailer_slot TO tailer`)
	return strings.Replace(c.URL, "postgres://postgres@", "postgres://tailer@", 1)
}

// Row-level security on accounts or tokens, with a policy for the
// application's role only: the tailer's role would see no row, and every
// token would be skipped as deleted. The tailer refuses to read through
// it, naming the table and its policy, everywhere it says why it waits;
// with the role given BYPASSRLS it goes on by itself, and every token
// committed meanwhile is published once.
func TestRowSecurityIsRefused(t *testing.T) {
	t.Parallel()
	for _, table := range []string{"accounts", "tokens"} {
		t.Run(table, func(t *testing.T) {
			t.Parallel()
			pg := pgtest.Shared(t)
			c := newCluster(t, pg, 10, 50*time.Millisecond)
			url := c.restrictedRole(pg)
			p := c.watchedTailer("MAILROOM_DATABASE_URL=" + url)
			p.waitLog("msg=streaming", 1, 30*time.Second)
			c.accounts("before", 5)
			c.expectExactlyOnce(30 * time.Second)

			c.Exec(`DO $$ BEGIN CREATE ROLE app NOLOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$`)
			c.Exec(`CREATE POLICY tenant_only ON ` + table + ` TO app USING (true)`)
			c.Exec(`ALTER TABLE ` + table + ` ENABLE ROW LEVEL SECURITY`)
			c.accounts("hidden", 20)
			want := "row-level security on public." + table + " (policies tenant_only) applies to role tailer"
			p.blocked(c, "schema", want)
			if !strings.Contains(p.out.String(), "ALTER ROLE tailer BYPASSRLS") {
				t.Errorf("the log does not name the way out:\n%s", p.out.String())
			}
			// Refused, not skipped: nothing of the 20 was counted as deleted.
			_, metrics := httpGet(p.base + "/metrics")
			if v, _ := metricValue(metrics, `tailer_tokens_skipped_total{reason="deleted"}`); v != 0 {
				t.Errorf("%v tokens skipped as deleted under row-level security", v)
			}

			c.Exec(`ALTER ROLE tailer BYPASSRLS`)
			t.Cleanup(func() { c.Exec(`ALTER ROLE tailer NOBYPASSRLS`) })
			if n := c.expectExactlyOnce(60 * time.Second); n != 25 {
				t.Fatalf("%d tokens once on the stream, want 25", n)
			}
			p.ready(c)
		})
	}
}

// schemaEnv is the configuration of a tailer of schema in c's database:
// a publication, a slot, a stream and a subject of its own.
func schemaEnv(schema string) []string {
	return []string{"MAILROOM_SCHEMA=" + schema, "MAILROOM_PUBLICATION=mailroom_" + schema, "MAILROOM_SLOT=mailroom_" + schema,
		"MAILROOM_NATS_STREAM=" + strings.ToUpper(schema), "MAILROOM_NATS_SUBJECT=" + schema + ".batches"}
}

// migrateSchema runs tailer migrate with env and returns its exit code and
// output.
func (c *cluster) migrateSchema(env []string) (int, string) {
	c.t.Helper()
	m := c.command([]string{"migrate"}, env...)
	code := m.exit(60 * time.Second)
	return code, m.out.String()
}

// A second mailroom schema in the database, beside public's: tailer
// migrate refuses to make its slot before its publication exists (such
// a slot could never stream), naming the statement; made, the schema has
// a publication guard of its own that fires in every session, which
// tailer status checks, and a change of its publication made and undone
// between two of tailer run's checks is caught: refused until a resync,
// then every token once.
func TestSecondSchemaIsGuarded(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pgtest.Shared(t), 10, 50*time.Millisecond)
	env := schemaEnv("app")
	code, out := c.migrateSchema(env)
	if code != exitConfig || !strings.Contains(out, "publication mailroom_app does not exist") ||
		!strings.Contains(out, `CREATE PUBLICATION "mailroom_app" FOR TABLE "app"."tokens" WITH (publish = 'insert', publish_via_partition_root = true)`) {
		t.Fatalf("migrate without the schema's publication: exit %d, want %d naming the statement:\n%s", code, exitConfig, out)
	}
	var slots int
	if err := c.Conn.QueryRow(c.ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'mailroom_app'`).Scan(&slots); err != nil || slots != 0 {
		t.Fatalf("%d slots mailroom_app made without a publication (%v)", slots, err)
	}
	c.Exec(`CREATE PUBLICATION mailroom_app FOR TABLE app.tokens WITH (publish = 'insert', publish_via_partition_root = true)`)
	if code, out := c.migrateSchema(env); code != exitOK {
		t.Fatalf("migrate with the publication: exit %d:\n%s", code, out)
	}
	c.streamName, c.tokens = "APP", "app.tokens"
	if rep, code := c.statusWith(1<<40, env...); !rep.PublicationGuard {
		t.Fatalf("status of schema app: exit %d, publication_guard false: %+v", code, rep)
	}

	p := c.watchedTailer(env...)
	p.waitLog("msg=streaming", 1, 30*time.Second)
	c.Exec(`INSERT INTO app.accounts (email, login) SELECT 'app' || g || '@x', 'app' || g FROM generate_series(1, 5) g`)
	c.expectExactlyOnce(30 * time.Second)
	c.Exec(`BEGIN; ALTER PUBLICATION mailroom_app DROP TABLE app.tokens;
		INSERT INTO app.accounts (email, login) SELECT 'gap' || g || '@x', 'gap' || g FROM generate_series(1, 20) g;
		ALTER PUBLICATION mailroom_app ADD TABLE app.tokens; COMMIT`)
	p.blocked(c, "resync", "streaming on would skip them")
	r := c.command([]string{"resync"}, env...)
	if code := r.exit(60 * time.Second); code != exitOK {
		t.Fatalf("resync: exit %d:\n%s", code, r.out.String())
	}
	if n := c.expectExactlyOnce(60 * time.Second); n != 25 {
		t.Fatalf("%d tokens of app once on the stream, want 25", n)
	}
}

// A tokens table's publication changed in a session with
// session_replication_role = replica (a restore, a replication tool),
// where an event trigger made the plain way does not fire: the guard
// fires there too, and the change undone before any check of tailer run
// is refused until a resync, then every token once.
func TestGuardFiresInReplicaSessions(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pgtest.Shared(t), 10, 50*time.Millisecond)
	p := c.watchedTailer()
	p.waitLog("msg=streaming", 1, 30*time.Second)
	c.Exec(`INSERT INTO accounts (email, login, status) SELECT 'r' || g || '@x', 'r' || g, 'active' FROM generate_series(1, 20) g`)
	c.expectExactlyOnce(30 * time.Second)
	// The triggers do not fire in a replica session either: the tokens
	// are inserted as a restore would.
	c.Exec(`BEGIN; SET LOCAL session_replication_role = replica;
		ALTER PUBLICATION mailroom DROP TABLE tokens;
		INSERT INTO tokens (account, action) SELECT id, 'password_recovery' FROM accounts WHERE login LIKE 'r%';
		ALTER PUBLICATION mailroom ADD TABLE tokens; COMMIT`)
	p.blocked(c, "resync", "streaming on would skip them")
	r := c.command([]string{"resync"})
	if code := r.exit(60 * time.Second); code != exitOK {
		t.Fatalf("resync: exit %d:\n%s", code, r.out.String())
	}
	if n := c.expectExactlyOnce(60 * time.Second); n != 20 {
		t.Fatalf("%d tokens once on the stream, want 20", n)
	}
}

// pgcrypto installed before tailer migrate, outside MAILROOM_SCHEMA: in
// public (with another schema configured), or in a schema of extensions.
// tailer migrate makes the schema all the same, and its tokens get their
// random secrets: tailer run publishes every one once.
func TestPgcryptoInAnotherSchema(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		setup []string
	}{
		{"public", nil},
		{"extensions", []string{`DROP EXTENSION pgcrypto CASCADE`, `CREATE SCHEMA extensions`, `CREATE EXTENSION pgcrypto SCHEMA extensions`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := newCluster(t, pgtest.Shared(t), 10, 50*time.Millisecond)
			for _, sql := range tc.setup {
				c.Exec(sql)
			}
			env := schemaEnv("app")
			c.Exec(`CREATE SCHEMA app`)
			c.Exec(`CREATE PUBLICATION mailroom_app FOR TABLES IN SCHEMA app WITH (publish = 'insert', publish_via_partition_root = true)`)
			if code, out := c.migrateSchema(env); code != exitOK {
				t.Fatalf("migrate: exit %d:\n%s", code, out)
			}
			c.streamName, c.tokens = "APP", "app.tokens"
			p := c.tailer(env...)
			p.waitLog("msg=streaming", 1, 30*time.Second)
			c.Exec(`INSERT INTO app.accounts (email, login) SELECT 'x' || g || '@x', 'x' || g FROM generate_series(1, 12) g`)
			var secrets int
			if err := c.Conn.QueryRow(c.ctx, `SELECT count(DISTINCT secret) FROM app.tokens WHERE length(secret) = 32`).Scan(&secrets); err != nil || secrets != 12 {
				t.Fatalf("%d distinct 32-byte secrets of 12 (%v)", secrets, err)
			}
			if n := c.expectExactlyOnce(30 * time.Second); n != 12 {
				t.Fatalf("%d tokens once, want 12", n)
			}
		})
	}
}

// Two mailroom schemas configured with the same MAILROOM_SLOT: a tailer
// of each would stream it through its own publication and confirm it past
// the other's tokens. The second tailer migrate refuses to adopt it, and
// a tailer run of either refuses it while both records name it, each
// naming the other schema. A slot advanced by anyone but its tailer (the
// other schema's tailer before these checks, or by hand) is refused until
// a resync, across restarts, by the record's confirm limit; resynced,
// every token once.
func TestSharedSlotIsRefused(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pgtest.Shared(t), 10, 50*time.Millisecond)
	c.Exec(`CREATE SCHEMA app`)
	c.Exec(`CREATE PUBLICATION mailroom_app FOR TABLES IN SCHEMA app WITH (publish = 'insert', publish_via_partition_root = true)`)
	env := []string{"MAILROOM_SCHEMA=app", "MAILROOM_PUBLICATION=mailroom_app", "MAILROOM_SLOT=mailroom",
		"MAILROOM_NATS_STREAM=APP", "MAILROOM_NATS_SUBJECT=app.batches"}
	code, out := c.migrateSchema(env)
	if code != exitConfig || !strings.Contains(out, "slot mailroom: the slot is recorded in schema public too") || !strings.Contains(out, "MAILROOM_SLOT of its own") {
		t.Fatalf("migrate of a second schema with the first's slot: exit %d, want %d naming schema public:\n%s", code, exitConfig, out)
	}
	var recorded int
	if err := c.Conn.QueryRow(c.ctx, `SELECT count(*) FROM app.tailer_slot`).Scan(&recorded); err != nil || recorded != 0 {
		t.Fatalf("app recorded %d slots (%v), want none", recorded, err)
	}

	// As an older tailer left it: the second schema's record names the
	// slot too. Neither tailer streams it.
	c.Exec(`INSERT INTO app.tailer_slot (slot, incarnation, created_by) VALUES ('mailroom', 'older', 'adopted by tailer run')`)
	app := c.watchedTailer(env...)
	app.blocked(c, "schema", "the slot is recorded in schema public too")
	pub := c.watchedTailer()
	pub.blocked(c, "schema", "the slot is recorded in schema app too")
	app.term(30 * time.Second)
	pub.term(30 * time.Second)
	c.Exec(`DELETE FROM app.tailer_slot`)

	p := c.tailer()
	p.waitLog("msg=streaming", 1, 30*time.Second)
	c.accounts("before", 10)
	c.expectExactlyOnce(30 * time.Second)
	if code := p.term(30 * time.Second); code != exitOK {
		t.Fatalf("SIGTERM: exit %d", code)
	}
	// What the other schema's tailer did to the slot, by hand: tokens
	// committed, and the slot confirmed past them.
	c.accounts("skipped", 20)
	c.Exec(`SELECT pg_replication_slot_advance('mailroom', pg_current_wal_lsn())`)
	for i := range 2 {
		w := c.watchedTailer()
		w.blocked(c, "resync", "another process advanced it")
		if !strings.Contains(w.out.String(), "tailer resync") {
			t.Errorf("run %d: the log does not name the way out:\n%s", i, w.out.String())
		}
		w.term(30 * time.Second)
	}
	r := c.command([]string{"resync"})
	if code := r.exit(60 * time.Second); code != exitOK {
		t.Fatalf("resync: exit %d:\n%s", code, r.out.String())
	}
	p = c.tailer()
	p.waitLog("msg=streaming", 1, 30*time.Second)
	c.accounts("after", 5)
	if n := c.expectExactlyOnce(60 * time.Second); n != 35 {
		t.Fatalf("%d tokens once, want 35", n)
	}
}

// partitionTokens makes public.tokens a table partitioned by id, with one
// partition (tokens_a, ids below a million), published through its root,
// before the slot is made.
func (c *cluster) partitionTokens() {
	c.t.Helper()
	for _, sql := range []string{
		`ALTER PUBLICATION mailroom DROP TABLE tokens`,
		`ALTER TABLE tokens RENAME TO tokens_plain`,
		`ALTER SEQUENCE tokens_id_seq OWNED BY NONE`,
		`CREATE TABLE tokens (LIKE tokens_plain INCLUDING DEFAULTS INCLUDING CONSTRAINTS) PARTITION BY RANGE (id)`,
		`ALTER TABLE tokens ADD PRIMARY KEY (id)`,
		`CREATE TABLE tokens_a PARTITION OF tokens FOR VALUES FROM (1) TO (1000000)`,
		`DROP TABLE tokens_plain`,
		`ALTER PUBLICATION mailroom ADD TABLE tokens`,
	} {
		c.Exec(sql)
	}
	if _, err := replication.CreateSlot(c.ctx, replication.SchemaConn{Querier: c.Conn, Schema: "public"}, "mailroom", "tailer migrate", false, false); err != nil {
		c.t.Fatal(err)
	}
}

// Partitions that come and go under a partitioned tokens table: a table
// attached holding rows, and a partition detached concurrently under a
// writer that goes on writing into it, then attached again. Those rows
// entered tokens without an insert the slot carried: the publication
// guard marks the slot for a resync in the attach's transaction, naming
// the table; resynced, every token of tokens once. A partition made empty
// and filled by inserts is carried as any other.
func TestPartitionsComeAndGo(t *testing.T) {
	t.Parallel()
	for _, tc := range []string{"attached with rows", "detached concurrently and attached again under a writer"} {
		t.Run(tc, func(t *testing.T) {
			t.Parallel()
			c := newClusterWithoutSlot(t, pgtest.Shared(t), 10, 50*time.Millisecond)
			c.partitionTokens()
			p := c.watchedTailer()
			p.waitLog("msg=streaming", 1, 30*time.Second)
			c.Exec(`INSERT INTO accounts (email, login, status) SELECT 'p' || g || '@x', 'p' || g, 'active' FROM generate_series(1, 10) g`)
			c.Exec(`CREATE TABLE tokens_c PARTITION OF tokens FOR VALUES FROM (3000000) TO (4000000)`)
			c.Exec(`INSERT INTO tokens (id, account, action) SELECT 3000000 + g, (SELECT min(id) FROM accounts), 'password_recovery' FROM generate_series(1, 10) g`)
			c.expectExactlyOnce(30 * time.Second)
			var table string
			switch tc {
			case "attached with rows":
				table = "tokens_b"
				c.Exec(`CREATE TABLE tokens_b (LIKE tokens INCLUDING DEFAULTS)`)
				c.Exec(`INSERT INTO tokens_b (id, account, action) SELECT 1000000 + g, (SELECT min(id) FROM accounts), 'password_recovery' FROM generate_series(1, 50) g`)
				c.Exec(`ALTER TABLE tokens ATTACH PARTITION tokens_b FOR VALUES FROM (1000000) TO (2000000)`)
			default:
				table = "tokens_a"
				conn, err := pgx.Connect(c.ctx, c.URL)
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close(c.ctx)
				stop, done := make(chan struct{}), make(chan error)
				go func() {
					for {
						select {
						case <-stop:
							done <- nil
							return
						default:
						}
						if _, err := conn.Exec(c.ctx, `INSERT INTO tokens_a (account, action) SELECT min(id), 'password_recovery' FROM accounts`); err != nil {
							done <- err
							return
						}
						time.Sleep(5 * time.Millisecond)
					}
				}()
				time.Sleep(200 * time.Millisecond)
				c.Exec(`ALTER TABLE tokens DETACH PARTITION tokens_a CONCURRENTLY`)
				time.Sleep(300 * time.Millisecond)
				c.Exec(`ALTER TABLE tokens ATTACH PARTITION tokens_a FOR VALUES FROM (1) TO (1000000)`)
				time.Sleep(200 * time.Millisecond)
				close(stop)
				if err := <-done; err != nil {
					t.Fatal(err)
				}
			}
			p.blocked(c, "resync", "table public."+table+" was attached to public.tokens holding rows")
			r := c.command([]string{"resync"})
			if code := r.exit(60 * time.Second); code != exitOK {
				t.Fatalf("resync: exit %d:\n%s", code, r.out.String())
			}
			c.accounts("after", 5)
			if n := c.expectExactlyOnce(60 * time.Second); n < 25 {
				t.Fatalf("%d tokens once, want at least 25", n)
			}
		})
	}
}
