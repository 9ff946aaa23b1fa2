package main

// Schema and publication changes under a running tailer: what it can read
// just works, what it cannot is said once, in the log, /readyz, the
// tailer_blocked metric and tailer status, and the tailer goes on by itself
// (or after tailer resync, where only a new slot can go on) with every
// token published once.

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/internal/testutil/tailertest"
)

// watched is a tailer with its HTTP endpoints, sampling fast, and the
// settings it was started with beside the cluster's.
type watched struct {
	*proc
	base string
	env  []string
}

func (c *cluster) watchedTailer(env ...string) *watched {
	c.t.Helper()
	p, base := c.tailerWithHTTP(append([]string{"MAILROOM_LAG_INTERVAL=200"}, env...)...)
	return &watched{p, base, env}
}

// blocked waits until the tailer says, everywhere, that it waits for the
// operator for reason, naming want: the log, /readyz, tailer_blocked and
// tailer status (with the tailer's settings). Alternatives, where two
// checks may see a change first, are separated by "|", reason and want
// side by side.
func (w *watched) blocked(c *cluster, reason, want string) {
	c.t.Helper()
	reasons, wants := strings.Split(reason, "|"), strings.Split(want, "|")
	tailertest.Eventually(c.t, 30*time.Second, func() error {
		code, body := httpGet(w.base + "/readyz")
		_, metrics := httpGet(w.base + "/metrics")
		rep, scode := c.statusWith(1<<40, w.env...)
		for i, reason := range reasons {
			want := wants[i]
			v, _ := metricValue(metrics, `tailer_blocked{reason="`+reason+`"}`)
			if code == 503 && strings.Contains(body, want) && v == 1 && scode == 1 && strings.Contains(rep.Blocked, want) &&
				strings.Contains(w.out.String(), want) {
				return nil
			}
		}
		return fmt.Errorf("not blocked for %s naming %q: /readyz %d %s; %s; status %d %+v\n%s", reason, want, code, body, grepLines(metrics, "tailer_blocked{"), scode, rep, w.out.String())
	})
}

// ready waits until /readyz is 200 and no reason is blocked.
func (w *watched) ready(c *cluster) {
	c.t.Helper()
	tailertest.Eventually(c.t, 30*time.Second, func() error {
		code, _ := httpGet(w.base + "/readyz")
		_, metrics := httpGet(w.base + "/metrics")
		if code == 200 && !strings.Contains(grepLines(metrics, "tailer_blocked{"), "} 1") {
			return nil
		}
		return fmt.Errorf("/readyz %d, %s:\n%s", code, grepLines(metrics, "tailer_blocked{"), w.out.String())
	})
}

func (c *cluster) accounts(prefix string, n int) {
	c.t.Helper()
	c.Exec(`INSERT INTO accounts (email, login) SELECT $1 || g || '@x', $1 || g FROM generate_series(1, $2::int) g`, prefix, n)
}

// Column type changes: integer widths (expires_at to bigint and back,
// account to integer) just work; expires_at as a timestamp is one error
// naming the table, the column and both types, said once, and the tailer
// goes on by itself once it is changed back, the tokens inserted meanwhile
// published once. Added columns and a wider code keep working.
func TestSchemaChangeUnderTheTailer(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pgtest.Shared(t), 10, 50*time.Millisecond)
	p := c.watchedTailer()
	p.waitLog("msg=streaming", 1, 30*time.Second)
	c.accounts("before", 5)
	for i, sql := range []string{
		`ALTER TABLE tokens ALTER COLUMN expires_at TYPE bigint`,
		`ALTER TABLE tokens ALTER COLUMN account TYPE integer`,
		`ALTER TABLE tokens ADD COLUMN note text`,
		`ALTER TABLE tokens ALTER COLUMN code TYPE varchar(10)`,
		`ALTER TABLE tokens ALTER COLUMN expires_at TYPE integer`,
	} {
		c.Exec(sql)
		c.accounts(fmt.Sprintf("after%d_", i), 5)
		c.expectExactlyOnce(30 * time.Second)
	}

	c.Exec(`ALTER TABLE tokens ALTER COLUMN expires_at DROP DEFAULT`)
	c.Exec(`ALTER TABLE tokens ALTER COLUMN expires_at TYPE timestamptz USING to_timestamp(expires_at)`)
	c.Exec(`ALTER TABLE tokens ALTER COLUMN expires_at SET DEFAULT now() + interval '15 minutes'`)
	c.accounts("broken", 5)
	const want = "table tokens, column expires_at is timestamp with time zone, the tailer reads smallint, integer or bigint"
	p.blocked(c, "schema", want)
	// It keeps checking, and says it once.
	time.Sleep(6 * time.Second)
	if n := strings.Count(p.out.String(), want); n != 1 {
		t.Errorf("the schema error was logged %d times, want once:\n%s", n, p.out.String())
	}

	c.Exec(`ALTER TABLE tokens ALTER COLUMN expires_at DROP DEFAULT`)
	c.Exec(`ALTER TABLE tokens ALTER COLUMN expires_at TYPE integer USING extract(epoch FROM expires_at)::integer`)
	c.Exec(`ALTER TABLE tokens ALTER COLUMN expires_at SET DEFAULT extract(epoch FROM now() + interval '15 minutes')`)
	c.accounts("fixed", 5)
	if n := c.expectExactlyOnce(60 * time.Second); n != 5*8 {
		t.Fatalf("%d tokens", n)
	}
	p.ready(c)
	if rep, code := c.status(1 << 40); code != 0 || rep.Blocked != "" || len(rep.Problems) != 0 {
		t.Fatalf("tailer status once fixed: exit %d, %+v", code, rep)
	}
}

// The publication dropped and made again under a running tailer: the slot
// cannot decode past the drop (PostgreSQL's own behaviour); the tailer says
// so once, naming tailer resync, and after it every token is published once.
// A change of the publication made and undone between two of the tailer's
// checks (in one transaction) is caught by the publication guard, and a
// row filter or a column list by the check and the decoder: each leaves a
// resync to do, and none a token skipped. A writer inserts tokens from
// the change until after the way out.
// The tokens table taken out of the publication (its inserts silently left
// out of the slot's stream) stops the tailer within a sample; put back, it
// still waits for a resync (the stream lacks the inserts made meanwhile for
// good), and so does a tailer started then; resynced, every token is
// published once. With MAILROOM_AUTO_RESYNC the tailer resyncs by itself
// once the publication is fixed.
func TestPublicationChanges(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, reason, want string
		change, fix        []string
		// needed: fixed, the publication still leaves a resync to do.
		needed, auto bool
	}{
		// A token inserted between the drop and the new publication (one
		// transaction, so that the tailer only sees it once it is all done).
		// Said as the decoder meets the new publication, or as the slot's
		// mark that the publication guard set in that transaction, whichever
		// the tailer finds first (a CI run found the mark first).
		{"dropped and made again", "publication|resync", "was dropped and made again|streaming on would skip them",
			[]string{`BEGIN; DROP PUBLICATION mailroom; INSERT INTO accounts (email, login) VALUES ('between@x', 'between');
				CREATE PUBLICATION mailroom FOR TABLE tokens WITH (publish = 'insert'); COMMIT`}, nil, false, false},
		{"tokens taken out", "publication", "does not include the tokens table",
			[]string{`ALTER PUBLICATION mailroom DROP TABLE tokens`}, []string{`ALTER PUBLICATION mailroom ADD TABLE tokens`}, true, false},
		{"tokens taken out, auto resync", "publication", "does not include the tokens table",
			[]string{`ALTER PUBLICATION mailroom DROP TABLE tokens`}, []string{`ALTER PUBLICATION mailroom ADD TABLE tokens`}, true, true},
		// Changed and changed back in one transaction, so that no check of
		// the publication can see it wrong: the publication guard marked
		// the slot in that transaction.
		{"tokens taken out and put back between two checks", "resync", "streaming on would skip them",
			[]string{`BEGIN; ALTER PUBLICATION mailroom DROP TABLE tokens; INSERT INTO accounts (email, login) SELECT 'gap' || g || '@x', 'gap' || g FROM generate_series(1, 5) g;
				ALTER PUBLICATION mailroom ADD TABLE tokens; COMMIT`}, nil, true, false},
		{"inserts turned off and on between two checks", "resync", "streaming on would skip them",
			[]string{`BEGIN; ALTER PUBLICATION mailroom SET (publish = 'update'); INSERT INTO accounts (email, login) SELECT 'gap' || g || '@x', 'gap' || g FROM generate_series(1, 5) g;
				ALTER PUBLICATION mailroom SET (publish = 'insert'); COMMIT`}, nil, true, false},
		{"a row filter", "publication", "filters the tokens table's rows",
			[]string{`ALTER PUBLICATION mailroom SET TABLE tokens WHERE (id % 2 = 0)`}, []string{`ALTER PUBLICATION mailroom SET TABLE tokens`}, true, false},
		// Said as the stream describes the relation (its first insert), or
		// as the publication's check finds it, whichever comes first.
		{"a column list", "publication", "column list",
			[]string{`ALTER PUBLICATION mailroom SET TABLE tokens (id, action, account)`}, []string{`ALTER PUBLICATION mailroom SET TABLE tokens`}, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := newCluster(t, pgtest.Shared(t), 10, 50*time.Millisecond)
			var env []string
			if tc.auto {
				env = []string{"MAILROOM_AUTO_RESYNC=true"}
			}
			p := c.watchedTailer(env...)
			p.waitLog("msg=streaming", 1, 30*time.Second)
			c.accounts("before", 5)
			c.expectExactlyOnce(30 * time.Second)
			// Under a writer from the change until after the way out.
			w := c.startWriter(2, 20*time.Millisecond)
			for _, sql := range tc.change {
				c.Exec(sql)
			}
			c.accounts("during", 5)
			p.blocked(c, tc.reason, tc.want)
			if !strings.Contains(p.out.String(), "tailer resync") {
				t.Errorf("the log does not name the way out:\n%s", p.out.String())
			}
			for _, sql := range tc.fix {
				c.Exec(sql)
			}
			waiting := p
			switch {
			case tc.auto:
				p.waitLog("msg=\"slot resynced\"", 1, 60*time.Second)
			case tc.needed:
				const needed = "streaming on would skip them"
				p.blocked(c, "resync", needed)
				if code := p.term(30 * time.Second); code != exitOK {
					t.Fatalf("SIGTERM while waiting: exit %d:\n%s", code, p.out.String())
				}
				waiting = c.watchedTailer()
				waiting.blocked(c, "resync", needed)
				fallthrough
			default:
				// The tailer waits, and lets go of the slot between its
				// checks: tailer resync runs beside it.
				r := c.command([]string{"resync"})
				if code := r.exit(60 * time.Second); code != exitOK {
					t.Fatalf("resync: exit %d:\n%s", code, r.out.String())
				}
			}
			c.accounts("after", 5)
			w.halt()
			if w.err != nil {
				t.Fatal(w.err)
			}
			if n := c.expectExactlyOnce(60 * time.Second); n < 15 {
				t.Fatalf("%d tokens", n)
			}
			waiting.ready(c)
			n := 0
			for _, want := range strings.Split(tc.want, "|") {
				n += strings.Count(p.out.String(), want)
			}
			if n != 1 && !(tc.name == "a column list" && n == 2) {
				t.Errorf("said %d times, want once:\n%s", n, p.out.String())
			}
			if strings.Contains(p.out.String(), "skipping a token row that cannot be decoded") {
				t.Errorf("tokens skipped as bad rows:\n%s", p.out.String())
			}
		})
	}
}

// A value added to the token_action type stops the tailer, said
// everywhere with the fix, before a token of it can be skipped (issue 45:
// each was skipped as malformed with /readyz 200); the value taken out
// again, it goes on by itself.
func TestUnknownActionStopsTheTailer(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pgtest.Shared(t), 10, 50*time.Millisecond)
	p := c.watchedTailer()
	p.waitLog("msg=streaming", 1, 30*time.Second)
	c.accounts("before", 5)
	c.expectExactlyOnce(30 * time.Second)
	c.Exec(`ALTER TYPE token_action ADD VALUE 'magic_link'`)
	p.blocked(c, "schema", `type public.token_action of tokens.action has value(s) magic_link that are no token action this tailer knows`)
	c.Exec(`DELETE FROM pg_enum WHERE enumtypid = 'token_action'::regtype AND enumlabel = 'magic_link'`)
	p.ready(c)
	c.accounts("after", 5)
	if n := c.expectExactlyOnce(30 * time.Second); n != 10 {
		t.Fatalf("%d tokens", n)
	}
}

// A tokens table made partitioned (issue 62: after the documented way
// out, every token inserted into such a table was lost, the slot
// confirmed past it). Replaced under the tailer by a partitioned table
// that the publication sends under its partitions' names: a refusal that
// lasts, a resync refused until the publication publishes through the
// root, then every token once. Made partitioned before the tailer starts,
// with partitions attached and detached under a writer: every token once.
func TestPartitionedTokens(t *testing.T) {
	t.Parallel()
	t.Run("replaced, published under its partitions' names", func(t *testing.T) {
		t.Parallel()
		c := newCluster(t, pgtest.Shared(t), 10, 50*time.Millisecond)
		p := c.watchedTailer()
		p.waitLog("msg=streaming", 1, 30*time.Second)
		c.accounts("before", 5)
		c.expectExactlyOnce(30 * time.Second)
		w := c.startWriter(2, 20*time.Millisecond)
		c.Exec(`BEGIN;
			ALTER TABLE tokens RENAME TO tokens_old;
			ALTER PUBLICATION mailroom DROP TABLE tokens_old;
			CREATE TABLE tokens (LIKE tokens_old INCLUDING DEFAULTS) PARTITION BY RANGE (id);
			CREATE TABLE tokens_p1 PARTITION OF tokens FOR VALUES FROM (MINVALUE) TO (MAXVALUE);
			ALTER PUBLICATION mailroom ADD TABLE tokens;
			ALTER PUBLICATION mailroom SET (publish_via_partition_root = false);
			COMMIT`)
		c.accounts("during", 5)
		p.blocked(c, "publication|resync", "under the names of its partitions|streaming on would skip them")
		// The way out is refused while the publication cannot feed a new
		// slot: it would lose the inserts from its snapshot on.
		r := c.command([]string{"resync"})
		if code := r.exit(60 * time.Second); code == exitOK || !strings.Contains(r.out.String(), "publish_via_partition_root = true") {
			t.Fatalf("resync with the partitions published under their names: exit %d:\n%s", code, r.out.String())
		}
		c.Exec(`ALTER PUBLICATION mailroom SET (publish_via_partition_root = true)`)
		// Still refused until the resync: the inserts of that time are
		// not in the slot's stream.
		time.Sleep(time.Second)
		p.blocked(c, "publication|resync", "under the names of its partitions|streaming on would skip them")
		r = c.command([]string{"resync"})
		if code := r.exit(60 * time.Second); code != exitOK {
			t.Fatalf("resync: exit %d:\n%s", code, r.out.String())
		}
		c.accounts("after", 5)
		w.halt()
		if w.err != nil {
			t.Fatal(w.err)
		}
		if n := c.expectExactlyOnce(60 * time.Second); n < 10 {
			t.Fatalf("%d tokens in the partitioned table", n)
		}
		p.ready(c)
	})
	t.Run("attached and detached under a writer", func(t *testing.T) {
		t.Parallel()
		c := newCluster(t, pgtest.Shared(t), 10, 50*time.Millisecond)
		// One partition, the default: every row.
		c.Exec(`BEGIN;
			ALTER TABLE tokens RENAME TO tokens_plain;
			ALTER PUBLICATION mailroom DROP TABLE tokens_plain;
			CREATE TABLE tokens (LIKE tokens_plain INCLUDING DEFAULTS) PARTITION BY RANGE (id);
			CREATE TABLE tokens_default PARTITION OF tokens DEFAULT;
			ALTER PUBLICATION mailroom ADD TABLE tokens;
			COMMIT`)
		p := c.watchedTailer()
		p.waitLog("msg=streaming", 1, 30*time.Second)
		w := c.startWriter(2, 20*time.Millisecond)
		maxID := func() int64 {
			var id int64
			if err := c.Conn.QueryRow(c.ctx, `SELECT coalesce(max(id), 0) FROM tokens`).Scan(&id); err != nil {
				t.Fatal(err)
			}
			return id
		}
		// Three: two ranges ahead of the ids being inserted.
		from := maxID() + 200
		c.Exec(fmt.Sprintf(`CREATE TABLE tokens_a (LIKE tokens_plain INCLUDING DEFAULTS); ALTER TABLE tokens ATTACH PARTITION tokens_a FOR VALUES FROM (%d) TO (%d)`, from, from+200))
		c.Exec(fmt.Sprintf(`CREATE TABLE tokens_b (LIKE tokens_plain INCLUDING DEFAULTS); ALTER TABLE tokens ATTACH PARTITION tokens_b FOR VALUES FROM (%d) TO (%d)`, from+200, from+1_000_000))
		tailertest.Eventually(t, 60*time.Second, func() error {
			if id := maxID(); id < from+250 {
				return fmt.Errorf("tokens up to id %d, want past %d", id, from+250)
			}
			return nil
		})
		c.expectExactlyOnce(60 * time.Second)
		// The default holds only tokens on the stream now: detached, the
		// rows leave the table, and what comes after goes on.
		c.Exec(`ALTER TABLE tokens DETACH PARTITION tokens_default`)
		c.accounts("after", 5)
		w.halt()
		if w.err != nil {
			t.Fatal(w.err)
		}
		if n := c.expectExactlyOnce(60 * time.Second); n < 55 {
			t.Fatalf("%d tokens in the partitions attached later", n)
		}
		var onStream, detached int
		for _, n := range c.tokenCounts() {
			onStream += n
		}
		if err := c.Conn.QueryRow(c.ctx, `SELECT count(*) FROM tokens_default`).Scan(&detached); err != nil {
			t.Fatal(err)
		}
		var attached int
		if err := c.Conn.QueryRow(c.ctx, `SELECT count(*) FROM tokens`).Scan(&attached); err != nil {
			t.Fatal(err)
		}
		if onStream != detached+attached {
			t.Fatalf("%d tokens on the stream, want the %d detached and %d attached", onStream, detached, attached)
		}
		p.ready(c)
		if strings.Contains(p.out.String(), "level=ERROR") {
			t.Errorf("an error was said:\n%s", p.out.String())
		}
	})
}
