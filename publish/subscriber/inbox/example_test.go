package inbox_test

import (
	"context"
	"errors"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/mailroom/tailer/publish/subscriber"
	"github.com/mailroom/tailer/publish/subscriber/inbox"
)

// Mailer is a mail provider's API that takes an idempotency key: a second
// send with the same key is not sent again.
type Mailer interface {
	Send(ctx context.Context, idempotencyKey, to, template string, data map[string]string) error
}

// SendToken mails the token of a job tailer subscribe --into river made.
// River retries a job whose Work failed, also one whose send went through
// but whose answer was lost: the token key, as the idempotency key, makes
// the provider send it once.
type SendToken struct {
	river.WorkerDefaults[inbox.TokenArgs]
	Mailer Mailer
}

func (w *SendToken) Work(ctx context.Context, job *river.Job[inbox.TokenArgs]) error {
	a := job.Args
	template := "activation"
	if a.Action == "password_recovery" {
		template = "password_recovery"
	}
	return w.Mailer.Send(ctx, a.TokenKey, a.Email, template, map[string]string{"login": a.Login, "token": a.Token, "code": a.Code})
}

// A service that mails tokens runs a River client with the SendToken
// worker on the database tailer subscribe --into river stores jobs in.
func Example_riverWorker() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	workers := river.NewWorkers()
	river.AddWorker(workers, &SendToken{Mailer: nil /* your provider's client */})
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 10}},
		Workers: workers,
	})
	if err != nil {
		panic(err)
	}
	if err := client.Start(ctx); err != nil {
		panic(err)
	}
	defer client.Stop(ctx)
}

// A service that consumes the stream itself stores each message's tokens
// in a transaction of its own, with whatever else it writes, and
// acknowledges the message after the commit: a message delivered again
// (its ack lost) adds nothing.
func Example_ownTransaction() {
	ctx := context.Background()
	var (
		pool *pgxpool.Pool // the service's database, after inbox.Migrate
		msg  jetstream.Msg // from the service's own durable consumer
	)
	b, err := subscriber.Decode(msg.Headers(), msg.Data())
	if err != nil {
		msg.Term() // malformed: redelivering it would not help
		return
	}
	meta, _ := msg.Metadata()
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := inbox.Inbox{}.Store(ctx, tx, inbox.Meta{Stream: meta.Stream, Seq: meta.Sequence.Stream}, b)
		// ... the service's own writes, in tx ...
		return err
	})
	if err != nil {
		return // not acknowledged: delivered again
	}
	if err := msg.DoubleAck(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return // stored: delivered again, it adds nothing
	}
}
