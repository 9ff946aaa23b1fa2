package sim

import (
	"context"
	"fmt"
	"github.com/mailroom/tailer/decoder/wal"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"pgregory.net/rapid"

	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/migrations/migratetest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// The slot model replays what a real pgoutput slot replays: the same
// transactions of tokens, committed before the slot was made or after,
// some while the publication left the tokens table out (a change and its
// change back between two checks), some into a table attached to a
// partitioned tokens table holding them, or into a partition detached
// concurrently and attached again, with the slot confirmed at some of
// them, give the same transactions, with the same tokens, from the
// confirmed position on, however often replayed, on the model and on
// PostgreSQL (pg_logical_slot_peek_binary_changes through the mailroom
// publication, pg_replication_slot_advance).
func TestSlotModelAgreesWithPostgreSQL(t *testing.T) {
	for _, partitioned := range []bool{false, true} {
		t.Run(fmt.Sprintf("partitioned %v", partitioned), func(t *testing.T) {
			db := migratetest.NewDB(t, pgtest.Shared(t))
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			if partitioned {
				partitionTokens(t, ctx, db.Conn)
			}
			n, attached := 0, 0
			rapid.Check(t, func(rt *rapid.T) {
				n++
				c := &slotCheck{ctx: ctx, conn: db.Conn, slot: fmt.Sprintf("model_%d", n), model: newDB(new(int), new(int)), attached: &attached}
				for range rapid.IntRange(0, 2).Draw(rt, "before the slot") {
					c.commit(rt)
				}
				c.makeSlot(rt)
				defer c.exec(rt, `SELECT pg_drop_replication_slot($1)`, c.slot)
				// The tables attached go with the check: each one more
				// partition slows every insert and decode after it.
				defer func() {
					for _, table := range c.tables {
						c.exec(rt, `DROP TABLE `+table)
					}
				}()
				ops := map[string]func(*rapid.T){
					"commit":                    c.commit,
					"publication changed, back": c.publicationChanged,
					"confirm":                   c.confirm,
					"":                          c.agree,
				}
				if partitioned {
					ops["a table attached holding rows"] = c.attachWithRows
					ops["detached concurrently, written, attached again"] = c.detachWriteAttach
				}
				rt.Repeat(ops)
			})
		})
	}
}

// partitionTokens makes tokens a table partitioned by id, its rows in
// tokens_main (ids below a billion), published through its root.
func partitionTokens(t *testing.T, ctx context.Context, conn *pgx.Conn) {
	for _, sql := range []string{
		`ALTER PUBLICATION mailroom DROP TABLE tokens`,
		`ALTER TABLE tokens RENAME TO tokens_plain`,
		`ALTER SEQUENCE tokens_id_seq OWNED BY NONE`,
		`CREATE TABLE tokens (LIKE tokens_plain INCLUDING DEFAULTS INCLUDING CONSTRAINTS) PARTITION BY RANGE (id)`,
		`CREATE TABLE tokens_main PARTITION OF tokens FOR VALUES FROM (1) TO (1000000000)`,
		`INSERT INTO tokens SELECT * FROM tokens_plain`,
		`DROP TABLE tokens_plain`,
		`ALTER PUBLICATION mailroom ADD TABLE tokens`,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
}

// attachWithRows attaches a table holding 1 to 3 tokens to tokens: they
// enter it without an insert the slot carries.
func (c *slotCheck) attachWithRows(rt *rapid.T) {
	n := rapid.IntRange(1, 3).Draw(rt, "rows")
	*c.attached++
	table, lo := fmt.Sprintf("tokens_attached_%d", *c.attached), 1000000000+*c.attached*1000
	c.exec(rt, `CREATE TABLE `+table+` (LIKE tokens INCLUDING DEFAULTS)`)
	c.exec(rt, `INSERT INTO `+table+` (id, account, action) SELECT $1::bigint + g, 1, 'password_recovery' FROM generate_series(1, $2::int) g`, lo, n)
	c.exec(rt, fmt.Sprintf(`ALTER TABLE tokens ATTACH PARTITION %s FOR VALUES FROM (%d) TO (%d)`, table, lo, lo+1000))
	c.tables = append(c.tables, table)
	c.model.attach(n)
}

// detachWriteAttach detaches tokens_main concurrently, writes 1 to 3
// tokens into it, and attaches it again: they too enter tokens without
// an insert the slot carries.
func (c *slotCheck) detachWriteAttach(rt *rapid.T) {
	n := rapid.IntRange(1, 3).Draw(rt, "rows")
	c.exec(rt, `ALTER TABLE tokens DETACH PARTITION tokens_main CONCURRENTLY`)
	c.exec(rt, `INSERT INTO tokens_main (account, action) SELECT 1, 'password_recovery' FROM generate_series(1, $1::int)`, n)
	c.exec(rt, `ALTER TABLE tokens ATTACH PARTITION tokens_main FOR VALUES FROM (1) TO (1000000000)`)
	c.model.attach(n)
}

// slotCheck runs each operation on the model and on a real slot; ends are
// the real transactions' end positions, in the model's order.
type slotCheck struct {
	ctx   context.Context
	conn  *pgx.Conn
	slot  string
	model *dbModel
	ends  map[wal.LSN]wal.LSN
	// attached counts the tables attached in the database, for their
	// names and ranges; tables are the check's.
	attached *int
	tables   []string
}

func (c *slotCheck) exec(rt *rapid.T, sql string, args ...any) {
	if _, err := c.conn.Exec(c.ctx, sql, args...); err != nil {
		rt.Fatalf("%s: %v", sql, err)
	}
}

func (c *slotCheck) makeSlot(rt *rapid.T) {
	c.exec(rt, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, c.slot)
	c.model.makeSlot()
	c.ends = map[wal.LSN]wal.LSN{}
}

// commit commits a transaction of 1 to 3 tokens (an account each, whose
// activation token its trigger makes).
func (c *slotCheck) commit(rt *rapid.T) {
	n := rapid.IntRange(1, 3).Draw(rt, "tokens")
	c.exec(rt, `INSERT INTO accounts (email, login) SELECT 'm'||g||'-'||gen_random_uuid()||'@x', 'm'||gen_random_uuid() FROM generate_series(1, $1) g`, n)
	c.model.commit(n)
}

// publicationChanged commits tokens while the publication leaves the
// tokens table out, and puts it back.
func (c *slotCheck) publicationChanged(rt *rapid.T) {
	c.exec(rt, `ALTER PUBLICATION mailroom DROP TABLE tokens`)
	c.model.breakPublication()
	c.commit(rt)
	c.exec(rt, `ALTER PUBLICATION mailroom ADD TABLE tokens`)
	c.model.broken = false
}

// confirm confirms the slot at one of the transactions it replays.
func (c *slotCheck) confirm(rt *rapid.T) {
	c.agree(rt)
	txs := c.carried()
	if len(txs) == 0 {
		rt.Skip("nothing to confirm")
	}
	tx := rapid.SampledFrom(txs).Draw(rt, "confirmed at")
	c.exec(rt, `SELECT pg_replication_slot_advance($1, $2::pg_lsn)`, c.slot, c.ends[tx.commit].String())
	c.model.confirm(tx.commit)
}

// agree compares the transactions the slot replays with the model's,
// and learns their real end positions. A transaction without a token
// insert the publication carries is not replayed at all (pgoutput skips
// empty transactions): the model keeps it, as a place in the WAL.
func (c *slotCheck) agree(rt *rapid.T) {
	if err := c.agrees(); err != nil {
		rt.Fatal(err)
	}
}

// agrees is agree's finding: nil when the slot and the model agree.
func (c *slotCheck) agrees() error {
	real, err := c.replay()
	if err != nil {
		return err
	}
	var want, got []string
	var commits []wal.LSN
	for _, tx := range c.carried() {
		commits = append(commits, tx.commit)
		want = append(want, fmt.Sprint(len(tx.toks)))
	}
	for _, tx := range real {
		got = append(got, fmt.Sprint(tx.tokens))
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		return fmt.Errorf("the slot replays transactions of %v tokens, the model %v", got, want)
	}
	for i, tx := range real {
		c.ends[commits[i]] = tx.end
	}
	return nil
}

// carried are the transactions the model's slot replays with tokens.
func (c *slotCheck) carried() []tx {
	var out []tx
	for _, t := range c.model.replay(c.model.slot.confirmed) {
		if t.inSlot {
			out = append(out, t)
		}
	}
	return out
}

// realTx is a transaction the slot replays: how many token inserts it
// carries, and where it ends.
type realTx struct {
	tokens int
	end    wal.LSN
}

// replay peeks at what the slot replays through the mailroom publication.
func (c *slotCheck) replay() ([]realTx, error) {
	rows, err := c.conn.Query(c.ctx, `SELECT data FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL, 'proto_version', '1', 'publication_names', 'mailroom')`, c.slot)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	relations := map[uint32]string{}
	var out []realTx
	var cur realTx
	for rows.Next() {
		var data []byte
		if err := rows.Scan(&data); err != nil {
			return nil, err
		}
		m, err := pglogrepl.Parse(data)
		if err != nil {
			return nil, err
		}
		switch m := m.(type) {
		case *pglogrepl.RelationMessage:
			relations[m.RelationID] = m.RelationName
		case *pglogrepl.BeginMessage:
			cur = realTx{}
		case *pglogrepl.InsertMessage:
			if relations[m.RelationID] == "tokens" {
				cur.tokens++
			}
		case *pglogrepl.CommitMessage:
			cur.end = wal.LSN(m.TransactionEndLSN)
			out = append(out, cur)
		}
	}
	return out, rows.Err()
}
