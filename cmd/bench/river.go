package main

// River's own insert, alone: the ceiling of tailer subscribe --into river.

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/mailroom/tailer/internal/pgserver"
	"github.com/mailroom/tailer/publish/consume/inbox"
	"github.com/mailroom/tailer/publish/token"
)

// riverAlone inserts n jobs of the kind the subscriber makes (inbox's
// TokenArgs, unique by token key, fields of a token's sizes) with River's
// COPY insert, as the subscriber parts a message: transactions of
// riverPart jobs, riverAtOnce at a time, into a database of its own.
func riverAlone(ctx context.Context, pg *pgserver.Server, n int) (SubscriberDrain, error) {
	d := SubscriberDrain{Into: "river-alone", Tokens: n}
	url, err := createDB(ctx, pg, "bench_river_alone")
	if err != nil {
		return d, err
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return d, err
	}
	defer pool.Close()
	if err := inbox.MigrateRiver(ctx, pool); err != nil {
		return d, err
	}
	client, err := river.NewClient(riverpgxv5.New(nil), &river.Config{})
	if err != nil {
		return d, err
	}
	parts := make(chan []river.InsertManyParams, riverAtOnce)
	go func() {
		defer close(parts)
		for from := 0; from < n; from += riverPart {
			parts <- riverJobs(from, min(from+riverPart, n))
		}
	}()
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

// riverPart and riverAtOnce are the subscriber's parts of a large message
// (inbox's partTokens and partsAtOnce).
const (
	riverPart   = 1000
	riverAtOnce = 4
)

// riverJobs are the jobs of tokens from to to-1.
func riverJobs(from, to int) []river.InsertManyParams {
	out := make([]river.InsertManyParams, 0, to-from)
	for i := from; i < to; i++ {
		id := strconv.Itoa(i + 1)
		out = append(out, river.InsertManyParams{Args: inbox.TokenArgs{
			TokenKey: fmt.Sprintf("%022d", i), TokenID: int64(i + 1), Action: token.Activation.String(),
			Email: "user" + id + "@example.com", Login: "user" + id, Token: strings.Repeat("A", token.Len-len(id)) + id,
			Code: "01234", BatchID: "0/16B3748:0-0/16B3800:9", Line: i % 10, Stream: "MAILROOM", StreamSeq: uint64(i / 1000), Durable: "bench",
		}})
	}
	return out
}
