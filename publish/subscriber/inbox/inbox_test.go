package inbox

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/publish/subscriber"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// testTrace is the traceparent of every third test token.
const testTrace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// testBatch is a message of two lines holding tokens first..first+n-1,
// every third traced.
func testBatch(first, n int) *subscriber.Decoded {
	b := &subscriber.Decoded{ID: fmt.Sprintf("0/%X:0-0/%X:9", first, first), KeyID: "k1"}
	for i := first; i < first+n; i++ {
		b.Tokens = append(b.Tokens, subscriber.SignedToken{ID: int64(i), Action: "activation", Email: fmt.Sprintf("u%d@x", i), Login: fmt.Sprintf("u%d", i),
			Token: fmt.Sprintf("tok%d", i), Key: fmt.Sprintf("key%d", i)})
		if i%3 == 0 {
			b.Tokens[len(b.Tokens)-1].Traceparent = testTrace
		}
	}
	b.Sizes = []int{n / 2, n - n/2}
	return b
}

// inboxPool is a pool on a database of its own with the inbox table,
// closed when t ends.
func inboxPool(ctx context.Context, t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(ctx, pgtest.Shared(t).CreateDB(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := Migrate(ctx, pool, ""); err != nil {
		t.Fatal(err)
	}
	return pool
}

// riverJobs is a Jobs sink on River's tables, migrated into pool's
// database.
func riverJobs(ctx context.Context, t *testing.T, pool *pgxpool.Pool) *Jobs {
	t.Helper()
	if err := MigrateRiver(ctx, pool, ""); err != nil {
		t.Fatal(err)
	}
	jobs, err := NewJobs("")
	if err != nil {
		t.Fatal(err)
	}
	return jobs
}

// Each sink stores a token once, however often the message comes: a
// message stored again adds nothing, one that overlaps adds what it does
// not share; the rows say where each token was on the stream.
func TestStoreOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := inboxPool(ctx, t)
	if err := Migrate(ctx, pool, ""); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	jobs := riverJobs(ctx, t, pool)
	type storer interface {
		Table
		Store(ctx context.Context, tx pgx.Tx, m Meta, b *subscriber.Decoded) (int, error)
	}
	for _, tc := range []struct {
		name  string
		sink  storer
		count string
	}{
		{"inbox", Inbox{}, `SELECT count(*), count(DISTINCT token_key) FROM mailroom_inbox`},
		{"river", jobs, `SELECT count(*), count(DISTINCT args->>'token_key') FROM river_job WHERE kind = 'mailroom_token'`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := func(b *subscriber.Decoded, seq uint64) int {
				t.Helper()
				var added int
				if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					var err error
					added, err = tc.sink.Store(ctx, tx, Meta{Stream: "S", Seq: seq}, b)
					return err
				}); err != nil {
					t.Fatal(err)
				}
				return added
			}
			for _, step := range []struct {
				first, n, want int
			}{{1, 10, 10}, {1, 10, 0}, {6, 10, 5}, {16, 1, 1}} {
				if got := store(testBatch(step.first, step.n), uint64(step.first)); got != step.want {
					t.Fatalf("tokens %d-%d: %d added, want %d", step.first, step.first+step.n-1, got, step.want)
				}
			}
			// Several messages at once, in one COPY; two that overlap,
			// and one stored before, one by one.
			// storeAll stores the batches of several messages together,
			// and says what each message added.
			storeAll := func(seqs ...uint64) []int {
				t.Helper()
				var us []*subscriber.Unit
				for _, seq := range seqs {
					us = append(us, testBatch(int(seq), 2+int(seq)/21).Units("S", seq, "")...)
				}
				var added []int
				if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					var err error
					added, err = tc.sink.StoreAll(ctx, tx, us)
					return err
				}); err != nil {
					t.Fatal(err)
				}
				perMsg := make([]int, len(seqs))
				for i, u := range us {
					perMsg[slices.Index(seqs, u.Seq)] += added[i]
				}
				return perMsg
			}
			if got := storeAll(17, 19); !slices.Equal(got, []int{2, 2}) {
				t.Fatalf("two new messages at once added %v, want [2 2]", got)
			}
			if got := storeAll(21, 22, 1); !slices.Equal(got, []int{3, 1, 0}) {
				t.Fatalf("overlapping messages and one stored before added %v, want [3 1 0]", got)
			}
			var rows, keys int
			if err := pool.QueryRow(ctx, tc.count).Scan(&rows, &keys); err != nil || rows != 24 || keys != 24 {
				t.Fatalf("%d rows of %d keys, want 24 of 24 (%v)", rows, keys, err)
			}
		})
	}
	var line, seq int64
	var keyID, batch string
	if err := pool.QueryRow(ctx, `SELECT line, stream_seq, key_id, batch_id FROM mailroom_inbox WHERE token_key = 'key13'`).Scan(&line, &seq, &keyID, &batch); err != nil ||
		line != 1 || seq != 6 || keyID != "k1" || batch != "0/6:0-0/6:9" {
		t.Fatalf("token 13: line %d, seq %d, key %q, batch %q (%v)", line, seq, keyID, batch, err)
	}
	// The trace goes on in the inbox row and the job's metadata.
	for key, want := range map[string]string{"key3": testTrace, "key15": testTrace, "key4": ""} {
		var row, job *string
		if err := pool.QueryRow(ctx, `SELECT (SELECT traceparent FROM mailroom_inbox WHERE token_key = $1),
			(SELECT metadata->>'traceparent' FROM river_job WHERE args->>'token_key' = $1)`, key).Scan(&row, &job); err != nil {
			t.Fatal(err)
		}
		if deref(row) != want || deref(job) != want {
			t.Errorf("%s: inbox traceparent %q, River metadata %q, want %q", key, deref(row), deref(job), want)
		}
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// Each table says what a durable stored by content: Position the newest
// message it stored a token of, Holds whether it stored one of a message
// by place and id (another message at the same place, a stream made
// again, is not it; nor another durable's).
func TestTablesSayWhatTheDurableStored(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := inboxPool(ctx, t)
	jobs := riverJobs(ctx, t, pool)
	for _, tc := range []struct {
		name  string
		table Table
	}{{"inbox", Inbox{}}, {"river", jobs}} {
		t.Run(tc.name, func(t *testing.T) {
			var us []*subscriber.Unit
			for _, seq := range []uint64{2, 5} {
				us = append(us, testBatch(int(seq)*10, 2).Units("S", seq, "d")...)
			}
			us = append(us, testBatch(90, 2).Units("S", 9, "other")...)
			if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := tc.table.StoreAll(ctx, tx, us)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			at, ok, err := tc.table.Position(ctx, pool, "S", "d")
			if err != nil || !ok || at.Seq != 5 || at.BatchID != testBatch(50, 2).ID {
				t.Fatalf("Position = %+v, %v, %v; want message 5 (%s)", at, ok, err, testBatch(50, 2).ID)
			}
			for _, c := range []struct {
				durable string
				seq     uint64
				id      string
				want    bool
			}{
				{"d", 2, testBatch(20, 2).ID, true},
				{"d", 5, testBatch(50, 2).ID, true},
				{"d", 2, testBatch(50, 2).ID, false},
				{"d", 3, testBatch(20, 2).ID, false},
				{"d", 9, testBatch(90, 2).ID, false},
				{"other", 9, testBatch(90, 2).ID, true},
			} {
				got, err := tc.table.Holds(ctx, pool, "S", c.durable, c.seq, c.id)
				if err != nil || got != c.want {
					t.Errorf("Holds(%s, %d, %s) = %v, %v; want %v", c.durable, c.seq, c.id, got, err, c.want)
				}
			}
		})
	}
}
