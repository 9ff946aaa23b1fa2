package replication

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mailroom/tailer/internal/testutil/pgtest"
)

func TestCheckPublication(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, pgtest.Shared(t).CreateDB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	installPublicationCheck(t, conn)
	if _, err := conn.Exec(ctx, `CREATE SCHEMA other;
		CREATE TABLE tokens (id bigint PRIMARY KEY, action text, secret bytea, code text, account bigint, note text);
		CREATE TABLE other.accounts (id bigint PRIMARY KEY);
		CREATE TABLE other.parted (id bigint) PARTITION BY RANGE (id);`); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, setup, problem string
	}{
		{"for table tokens", `CREATE PUBLICATION p FOR TABLE tokens WITH (publish = 'insert')`, ""},
		{"missing", ``, "does not exist"},
		{"other tables only", `CREATE PUBLICATION p FOR TABLE other.accounts`, "does not include the tokens table"},
		{"tokens, not inserts", `CREATE PUBLICATION p FOR TABLE tokens WITH (publish = 'update, delete')`, "does not publish inserts (publish = 'insert')"},
		{"for all tables", `CREATE PUBLICATION p FOR ALL TABLES`, ""},
		{"tokens' schema", `CREATE PUBLICATION p FOR TABLES IN SCHEMA public`, ""},
		{"another schema", `CREATE PUBLICATION p FOR TABLES IN SCHEMA other`, "does not include the tokens table"},
		// A partition is published under its own name unless the
		// publication publishes through the root.
		{"partition of a published table", `ALTER TABLE tokens RENAME TO t0; CREATE TABLE tokens PARTITION OF other.parted FOR VALUES FROM (0) TO (10);
			CREATE PUBLICATION p FOR TABLE other.parted`, ""},
		{"partition published through its root", `ALTER TABLE tokens RENAME TO t0; CREATE TABLE tokens PARTITION OF other.parted FOR VALUES FROM (0) TO (10);
			CREATE PUBLICATION p FOR TABLE other.parted WITH (publish_via_partition_root)`, "does not include the tokens table"},
		{"partition, all tables through roots", `ALTER TABLE tokens RENAME TO t0; CREATE TABLE tokens PARTITION OF other.parted FOR VALUES FROM (0) TO (10);
			CREATE PUBLICATION p FOR ALL TABLES WITH (publish_via_partition_root)`, "does not include the tokens table"},
		{"no tokens table", `ALTER TABLE tokens RENAME TO t0; CREATE PUBLICATION p FOR ALL TABLES`, "does not include the tokens table"},
		// pgoutput leaves out the rows a row filter filters out, and sends
		// only a column list's columns.
		{"a row filter", `CREATE PUBLICATION p FOR TABLE tokens WHERE (id % 2 = 0) WITH (publish = 'insert')`, "filters the tokens table's rows (a row filter, WHERE ((id % (2)::bigint) = 0))"},
		{"a column list without the secret", `CREATE PUBLICATION p FOR TABLE tokens (id, action, code, account) WITH (publish = 'insert')`, "publishes a column list of the tokens table without every column"},
		{"a column list with every column read", `CREATE PUBLICATION p FOR TABLE tokens (id, action, secret, code, account) WITH (publish = 'insert')`, ""},
		{"a row filter on a partition", `ALTER TABLE tokens RENAME TO t0; CREATE TABLE tokens PARTITION OF other.parted FOR VALUES FROM (0) TO (10);
			CREATE PUBLICATION p FOR TABLE tokens WHERE (id > 1)`, "filters the tokens table's rows"},
		// A partitioned tokens table: its inserts reach the tailer under
		// its own name only through the root.
		{"tokens partitioned, published under its partitions' names", `ALTER TABLE tokens RENAME TO t0;
			CREATE TABLE tokens (id bigint, action text, secret bytea, code text, account bigint) PARTITION BY RANGE (id);
			CREATE TABLE tokens_p1 PARTITION OF tokens FOR VALUES FROM (0) TO (100);
			CREATE PUBLICATION p FOR TABLE tokens WITH (publish = 'insert')`, "publishes the partitioned tokens table's inserts under the names of its partitions"},
		{"tokens partitioned, its partitions published alone", `ALTER TABLE tokens RENAME TO t0;
			CREATE TABLE tokens (id bigint, action text, secret bytea, code text, account bigint) PARTITION BY RANGE (id);
			CREATE TABLE tokens_p1 PARTITION OF tokens FOR VALUES FROM (0) TO (100);
			CREATE PUBLICATION p FOR TABLE tokens_p1 WITH (publish = 'insert', publish_via_partition_root)`, "does not include the tokens table"},
		{"tokens partitioned, published through the root", `ALTER TABLE tokens RENAME TO t0;
			CREATE TABLE tokens (id bigint, action text, secret bytea, code text, account bigint) PARTITION BY RANGE (id);
			CREATE TABLE tokens_p1 PARTITION OF tokens FOR VALUES FROM (0) TO (100);
			CREATE PUBLICATION p FOR TABLE tokens WITH (publish = 'insert', publish_via_partition_root)`, ""},
		// A table tokens of another schema, first in the search path, is
		// not the tokens table: neither when published nor when not.
		{"a shadow tokens published", `CREATE SCHEMA shadow; CREATE TABLE shadow.tokens (LIKE tokens); SET LOCAL search_path = shadow, public;
			CREATE PUBLICATION p FOR TABLE shadow.tokens WITH (publish = 'insert')`, "does not include the tokens table"},
		{"a shadow tokens beside the real one", `CREATE SCHEMA shadow; CREATE TABLE shadow.tokens (LIKE tokens); SET LOCAL search_path = shadow, public;
			CREATE PUBLICATION p FOR TABLE public.tokens WITH (publish = 'insert')`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			if tc.setup != "" {
				if _, err := tx.Exec(ctx, tc.setup); err != nil {
					t.Fatal(err)
				}
			}
			err = CheckPublication(ctx, SchemaConn{Querier: tx, Schema: "public"}, "p")
			var pub *PublicationError
			switch {
			case tc.problem == "" && err != nil:
				t.Fatalf("CheckPublication: %v", err)
			case tc.problem != "" && (!errors.As(err, &pub) || !strings.HasPrefix(pub.Problem, tc.problem) || pub.Publication != "p"):
				t.Fatalf("CheckPublication = %v, want the problem %q", err, tc.problem)
			}
		})
	}
}

// A publication dropped and made again in one transaction is never seen
// as lacking the tokens table by a check running as it commits: the check
// reads the catalogs in one snapshot. (Through pg_publication_tables it
// looked the publication up by name in a newer catalog snapshot than the
// row it had found, and so sometimes found no tables at all.)
func TestCheckPublicationWhileMadeAgain(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url := pgtest.Shared(t).CreateDB(t)
	remake, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer remake.Close(ctx)
	check, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer check.Close(ctx)
	installPublicationCheck(t, remake)
	if _, err := remake.Exec(ctx, `CREATE TABLE tokens (id bigint PRIMARY KEY);
		CREATE PUBLICATION p FOR TABLE tokens WITH (publish = 'insert')`); err != nil {
		t.Fatal(err)
	}
	const remakes = 300
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		for i := 0; i < remakes; i++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			if _, err := remake.Exec(ctx, `BEGIN; DROP PUBLICATION p; CREATE PUBLICATION p FOR TABLE tokens WITH (publish = 'insert'); COMMIT`); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for checks := 0; ; checks++ {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%d checks during %d remakes", checks, remakes)
			return
		default:
		}
		if err := CheckPublication(ctx, SchemaConn{Querier: check, Schema: "public"}, "p"); err != nil {
			close(stop)
			<-done
			t.Fatalf("check %d, as the publication was made again: %v", checks, err)
		}
	}
}

// installPublicationCheck makes migration 7's functions in a database of
// the test's own making (it has no tailer_slot: the migration's change to
// it is left out).
func installPublicationCheck(t *testing.T, conn *pgx.Conn) {
	t.Helper()
	for _, m := range []string{"000007_tailer_publication_guard", "000010_tailer_schema_names"} {
		sql, err := os.ReadFile("../migrations/" + m + ".up.sql")
		if err != nil {
			t.Fatal(err)
		}
		body := strings.ReplaceAll(string(sql), "ALTER TABLE tailer_slot", "ALTER TABLE IF EXISTS tailer_slot")
		if _, err := conn.Exec(context.Background(), body); err != nil {
			t.Fatalf("%s: %v", m, err)
		}
	}
}
