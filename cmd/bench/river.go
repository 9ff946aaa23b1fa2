package main

// River's own insert, alone: the ceiling of tailer subscribe --into river.

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/mailroom/tailer/internal/pgserver"
	"github.com/mailroom/tailer/publish/subscriber"
	"github.com/mailroom/tailer/publish/subscriber/inbox"
	"github.com/mailroom/tailer/publish/wire"
)

// riverAlone inserts the jobs tailer subscribe --into river makes of the
// stream at natsURL (inbox.JobParams of each message), n of them, with
// River's COPY insert alone: transactions of riverPart jobs, riverAtOnce
// at a time, into a database of its own.
func riverAlone(ctx context.Context, pg *pgserver.Server, natsURL string, n int) (SubscriberDrain, error) {
	d := SubscriberDrain{Into: "river-alone", Tokens: n}
	jobs, err := streamJobs(ctx, natsURL, n)
	if err != nil {
		return d, err
	}
	url, err := createDB(ctx, pg, "bench_river_alone")
	if err != nil {
		return d, err
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return d, err
	}
	defer pool.Close()
	if err := inbox.MigrateRiver(ctx, pool, ""); err != nil {
		return d, err
	}
	client, err := river.NewClient(riverpgxv5.New(nil), &river.Config{})
	if err != nil {
		return d, err
	}
	if err := checkpoint(ctx, pg); err != nil {
		return d, err
	}
	parts := make(chan []river.InsertManyParams, len(jobs)/riverPart+1)
	for from := 0; from < len(jobs); from += riverPart {
		parts <- jobs[from:min(from+riverPart, len(jobs))]
	}
	close(parts)
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, riverAtOnce)
	for range riverAtOnce {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := range parts {
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := client.InsertManyFastTx(ctx, tx, p)
					return err
				})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	d.Seconds = time.Since(start).Seconds()
	select {
	case err := <-errs:
		return d, fmt.Errorf("River insert: %w", err)
	default:
	}
	d.TokensPerSecond = float64(n) / d.Seconds
	return d, nil
}

// streamJobs reads the stream at natsURL, which holds n tokens, and makes
// the jobs of their messages as the subscriber would.
func streamJobs(ctx context.Context, natsURL string, n int) ([]river.InsertManyParams, error) {
	nc, err := nats.Connect(natsURL)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	s, err := js.Stream(ctx, "MAILROOM")
	if err != nil {
		return nil, err
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: wire.DataSubjects("mailroom.batches")})
	if err != nil {
		return nil, err
	}
	var jobs []river.InsertManyParams
	for len(jobs) < n {
		msg, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			return nil, fmt.Errorf("read the stream back, %d of %d tokens: %w", len(jobs), n, err)
		}
		b, err := subscriber.Decode(msg.Headers(), msg.Data())
		if err != nil {
			return nil, err
		}
		meta, _ := msg.Metadata()
		jobs = append(jobs, inbox.JobParams(b.Units("MAILROOM", meta.Sequence.Stream, "bench-river")...)...)
	}
	return jobs, nil
}

// riverPart and riverAtOnce: transactions of 1,000 jobs, four at a time,
// as a large message's parts go (inbox's partsAtOnce).
const (
	riverPart   = 1000
	riverAtOnce = 4
)
