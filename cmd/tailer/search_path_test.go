package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/internal/testutil/tailertest"
	"github.com/mailroom/tailer/publish/wire"
	"github.com/mailroom/tailer/publish/wire/wiretest"
)

// A schema that shadows the tailer's tables on a search path: named after
// the tailer's role ("$user" comes first in PostgreSQL's default
// search_path), or put first in the database's search_path with its tokens
// table added to the publication. Each holds accounts with the same ids and
// other addresses, and tokens of other contents. Every token is published
// once, signed for its own account's address, by tailer run and by tailer
// resync; status finds nothing wrong with the publication.
func TestShadowSchemas(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// shadow makes the shadow schema named schema visible first.
		shadow func(c *cluster, role, db string) string
	}{
		{"named after the role", func(c *cluster, role, db string) string {
			return pgx.Identifier{role}.Sanitize()
		}},
		{"first in the database's search_path, its tokens published", func(c *cluster, role, db string) string {
			c.Exec(`CREATE SCHEMA shadow`)
			c.Exec(`ALTER DATABASE ` + pgx.Identifier{db}.Sanitize() + ` SET search_path = shadow, public`)
			return "shadow"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := newCluster(t, pgtest.Shared(t), 10, 100*time.Millisecond)
			var role, db string
			if err := c.Conn.QueryRow(c.ctx, `SELECT current_user, current_database()`).Scan(&role, &db); err != nil {
				t.Fatal(err)
			}
			schema := tc.shadow(c, role, db)
			if schema != "shadow" {
				c.Exec(`CREATE SCHEMA ` + schema)
			}
			// The shadow: accounts under the real ids with other addresses,
			// a tokens table of other rows; published too, where the
			// database's search path puts it first.
			c.Exec(`CREATE TABLE ` + schema + `.accounts (LIKE public.accounts INCLUDING ALL)`)
			c.Exec(`CREATE TABLE ` + schema + `.tokens (LIKE public.tokens INCLUDING ALL)`)
			c.Exec(`INSERT INTO ` + schema + `.accounts (id, email, login, status) SELECT g, 'attacker+' || g || '@evil.example', 'evil' || g, 'active' FROM generate_series(1, 200) g`)
			if schema == "shadow" {
				c.Exec(`ALTER PUBLICATION mailroom ADD TABLE shadow.tokens`)
			}
			write := func(prefix string, n int) {
				// A new session: the database's search_path applies. Its
				// unqualified names are the application's; the trigger's
				// insert into tokens must still land in public.tokens.
				conn, err := pgx.Connect(c.ctx, c.URL)
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close(c.ctx)
				if _, err := conn.Exec(c.ctx, `INSERT INTO public.accounts (email, login) SELECT $1 || g || '@example.com', $1 || g FROM generate_series(1, $2::int) g`, prefix, n); err != nil {
					t.Fatal(err)
				}
				if _, err := conn.Exec(c.ctx, `INSERT INTO `+schema+`.tokens (account, action) SELECT g, 'activation' FROM generate_series(1, $1::int) g`, n); err != nil {
					t.Fatal(err)
				}
			}
			write("early", 20)
			tp := c.tailer()
			tp.waitLog("streaming", 1, 20*time.Second)
			write("live", 20)
			expectRealAddresses(t, c, 40)
			if rep, code := c.status(1 << 30); code != 0 || len(rep.Problems) != 0 || rep.Blocked != "" {
				t.Fatalf("tailer status exit %d, problems %q, blocked %q", code, rep.Problems, rep.Blocked)
			}

			// tailer resync, after the slot was dropped: the tokens
			// inserted meanwhile, from the snapshot's query, to their own
			// addresses too.
			if code := tp.term(15 * time.Second); code != 0 {
				t.Fatalf("tailer exit %d after SIGTERM", code)
			}
			c.Exec(`SELECT pg_drop_replication_slot('mailroom')`)
			write("dropped", 10)
			r := c.command([]string{"resync"})
			if code := r.exit(60 * time.Second); code != 0 {
				t.Fatalf("tailer resync exit %d:\n%s", code, r.out.String())
			}
			expectRealAddresses(t, c, 50)
			if strings.Contains(tp.out.String()+r.out.String(), "level=WARN") {
				t.Errorf("a warning was said:\n%s%s", tp.out.String(), r.out.String())
			}
		})
	}
}

// expectRealAddresses waits until every one of the n tokens of
// public.tokens is on the stream once, each in a line for its own
// account's address.
func expectRealAddresses(t *testing.T, c *cluster, n int) {
	t.Helper()
	rows, _ := c.Conn.Query(c.ctx, `SELECT t.id, a.email FROM public.tokens t JOIN public.accounts a ON a.id = t.account`)
	want := map[int64]string{}
	for rows.Next() {
		var id int64
		var email string
		if err := rows.Scan(&id, &email); err != nil {
			t.Fatal(err)
		}
		want[id] = email
	}
	if err := rows.Err(); err != nil || len(want) != n {
		t.Fatalf("%d tokens in public.tokens, want %d: %v", len(want), n, err)
	}
	tailertest.Eventually(t, 30*time.Second, func() error {
		got := map[int64][]string{}
		for _, m := range c.messages() {
			ids, err := wiretest.TokenIDs(m)
			if err != nil {
				t.Fatal(err)
			}
			fields := strings.Split(strings.ReplaceAll(string(m.Data), "\n", ","), ",")
			if len(fields) != 5*len(ids) || m.Header.Get(wire.HeaderFormat) == "json" {
				t.Fatalf("message %d: %d fields for %d tokens", m.Sequence, len(fields), len(ids))
			}
			for i, id := range ids {
				got[id] = append(got[id], fields[5*i+1])
			}
		}
		for id, emails := range got {
			if e, ok := want[id]; !ok || len(emails) != 1 || emails[0] != e {
				t.Fatalf("token %d published to %q, want once to %q", id, emails, e)
			}
		}
		if len(got) != n {
			return fmt.Errorf("%d of %d tokens on the stream", len(got), n)
		}
		return nil
	})
}
