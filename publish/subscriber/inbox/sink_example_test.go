package inbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/publish/subscriber"
	"github.com/mailroom/tailer/publish/subscriber/inbox"
)

// Webhooks is a Table of one's own, beside Inbox and Jobs: a
// transactional outbox of webhook calls, one a token, in a table of the
// service's (webhook_outbox: token_key primary key, body,
// stream, durable, stream_seq, batch_id), which a relay posts and marks
// sent. A token stored twice adds nothing: its key is the row's.
type Webhooks struct{}

func (Webhooks) StoreAll(ctx context.Context, tx pgx.Tx, us []*subscriber.Unit) ([]int, error) {
	added := make([]int, len(us))
	for i, u := range us {
		for _, t := range u.Tokens {
			body, _ := json.Marshal(t) // strings and numbers: it does not fail
			tag, err := tx.Exec(ctx, `INSERT INTO webhook_outbox (token_key, body, stream, durable, stream_seq, batch_id)
				VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (token_key) DO NOTHING`,
				t.Key, body, u.Stream, u.Durable, int64(u.Seq), u.ID)
			if err != nil {
				return nil, err
			}
			added[i] += int(tag.RowsAffected())
		}
	}
	return added, nil
}

// Position is where the durable got to: the newest message it stored a
// token of, by content (its id, a token's key) and place.
func (Webhooks) Position(ctx context.Context, pool *pgxpool.Pool, stream, durable string) (subscriber.Stored, bool, error) {
	var at subscriber.Stored
	err := pool.QueryRow(ctx, `SELECT stream_seq, batch_id, token_key FROM webhook_outbox
		WHERE stream = $1 AND durable = $2 ORDER BY stream_seq DESC LIMIT 1`, stream, durable).Scan(&at.Seq, &at.BatchID, &at.Key)
	if errors.Is(err, pgx.ErrNoRows) {
		return at, false, nil
	}
	return at, err == nil, err
}

// Holds is whether the durable stored a token of the message at seq
// with id batchID.
func (Webhooks) Holds(ctx context.Context, pool *pgxpool.Pool, stream, durable string, seq uint64, batchID string) (bool, error) {
	var there bool
	err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM webhook_outbox
		WHERE stream = $1 AND durable = $2 AND stream_seq = $3 AND batch_id = $4)`, stream, durable, int64(seq), batchID).Scan(&there)
	return there, err
}

// The subscriber that stores into the inbox and River stores into a
// Table of one's own: exactly once into the outbox, a message
// acknowledged after its commit.
func Example_customTable() {
	ctx := context.Background()
	var (
		pool *pgxpool.Pool       // the service's database, with webhook_outbox
		js   jetstream.JetStream // connected to the tailer's NATS
	)
	sub, err := subscriber.NewSubscriber(subscriber.Config{
		Stream: "MAILROOM", Subject: "mailroom.batches", Durable: "webhooks",
		Sink: &inbox.DB{Pool: pool, Table: Webhooks{}, Log: slog.Default()},
		Log:  slog.Default(),
	})
	if err == nil {
		defer sub.Close()
		err = sub.Run(ctx, js)
	}
	if err != nil {
		slog.Error("webhooks", "err", err)
	}
}

// The example's store against a real database: each token stored once
// however often its message comes, and the newest message stored is where
// the durable got to.
func TestCustomTable(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.Shared(t).CreateDB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE webhook_outbox (token_key text PRIMARY KEY, body jsonb NOT NULL, stream text NOT NULL,
		durable text NOT NULL, stream_seq bigint NOT NULL, batch_id text NOT NULL, sent_at timestamptz)`); err != nil {
		t.Fatal(err)
	}
	message := func(seq uint64, ids ...int) *subscriber.Unit {
		u := &subscriber.Unit{Stream: "S", Seq: seq, Durable: "webhooks", ID: fmt.Sprintf("batch-%d", seq)}
		for _, id := range ids {
			u.Tokens = append(u.Tokens, subscriber.SignedToken{ID: int64(id), Email: "a@x", Token: fmt.Sprint("tok", id), Key: fmt.Sprint("key", id)})
		}
		return u
	}
	store := func(us ...*subscriber.Unit) (added []int) {
		t.Helper()
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) (err error) {
			added, err = Webhooks{}.StoreAll(ctx, tx, us)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return added
	}
	if got := store(message(3, 1, 2), message(5, 3)); !slices.Equal(got, []int{2, 1}) {
		t.Fatalf("first delivery added %v, want [2 1]", got)
	}
	if got := store(message(5, 3), message(8, 3, 4)); !slices.Equal(got, []int{0, 1}) {
		t.Fatalf("a message again and one overlapping added %v, want [0 1]", got)
	}
	at, ok, err := Webhooks{}.Position(ctx, pool, "S", "webhooks")
	if err != nil || !ok || at.Seq != 8 || at.BatchID != "batch-8" || at.Key != "key4" {
		t.Fatalf("Position = %+v, %v, %v; want message 8 (batch-8, key4)", at, ok, err)
	}
	if there, err := (Webhooks{}).Holds(ctx, pool, "S", "webhooks", 5, "batch-5"); err != nil || !there {
		t.Fatalf("Holds(5, batch-5) = %v, %v; want stored", there, err)
	}
	if there, err := (Webhooks{}).Holds(ctx, pool, "S", "webhooks", 5, "batch-8"); err != nil || there {
		t.Fatalf("Holds(5, batch-8) = %v, %v; want not stored: another message", there, err)
	}
}
