package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/cmd/internal/config"
	"github.com/mailroom/tailer/cmd/internal/natsconn"
	"github.com/mailroom/tailer/cmd/internal/subscribe"
	"github.com/mailroom/tailer/publish/subscriber"
	"github.com/mailroom/tailer/publish/subscriber/inbox"
)

// subscribeInto stores the tokens of durable's messages in the database at
// MAILROOM_INBOX_URL, exactly once: into (inbox or river) says as what.
func subscribeInto(ctx context.Context, cfg *config.Config, into string, migrate bool, c subscriber.Config, js jetstream.JetStream,
	healthAddr string, denials *subscribe.Denials, stderr io.Writer, log *slog.Logger) int {
	pool, err := inbox.Connect(ctx, cfg.InboxURL)
	if err != nil {
		fmt.Fprintf(stderr, "tailer subscribe: MAILROOM_INBOX_URL: %v\n", err)
		return exitConfig
	}
	defer pool.Close()
	var table inbox.Table = inbox.Inbox{Schema: cfg.InboxSchema}
	if into == "river" {
		jobs, err := inbox.NewJobs(cfg.InboxSchema)
		if err != nil {
			log.Error("subscribe failed", "err", err)
			return exitFailure
		}
		table = jobs
	}
	if migrate {
		if into == "river" {
			err = inbox.MigrateRiver(ctx, pool, cfg.InboxSchema)
		} else {
			err = inbox.Migrate(ctx, pool, cfg.InboxSchema)
		}
		if err != nil {
			log.Error("subscribe failed", "err", err)
			return exitFailure
		}
		log.Info("migrated the consumer's database", "into", into)
	}
	name := map[string]string{"inbox": "mailroom_inbox", "river": "river_job"}[into]
	var there bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, cfg.InboxSchema.Name(name)).Scan(&there); err != nil {
		log.Error("subscribe failed", "err", fmt.Errorf("MAILROOM_INBOX_URL: look for table %s: %w", name, err))
		return exitFailure
	}
	if !there {
		fmt.Fprintf(stderr, "tailer subscribe: the consumer's database (MAILROOM_INBOX_URL) has no table %s: start the subscriber once with --migrate, which makes it\n", cfg.InboxSchema.Name(name))
		return exitConfig
	}
	db := &inbox.DB{Pool: pool, Table: table, Log: log}
	c.Sink = db
	sub, err := subscriber.NewSubscriber(c)
	if err != nil {
		log.Error("subscribe failed", "err", err)
		return exitFailure
	}
	defer sub.Close()
	denials.Watch(func() int { return sub.Stats().Acked })
	if healthAddr != "" {
		stop, err := subscribe.Serve(healthAddr, &subscribe.Probe{Stream: c.Stream, Durable: c.Durable, JS: js, Server: config.RedactURL(natsconn.URL(cfg)), Consuming: sub.Consuming, Stats: sub.Stats,
			Denied: denials.Denied})
		if err != nil {
			fmt.Fprintf(stderr, "tailer subscribe: --health-addr: %v\n", err)
			return exitConfig
		}
		defer stop()
	}
	err = sub.Run(ctx, js)
	log.Info("stopped", "messages", sub.Stats().Acked, "tokens_added", db.Added.Load(), "transactions_stored_before", db.Again.Load())
	if err != nil {
		log.Error("subscribe failed", "err", err)
		return exitFailure
	}
	return exitOK
}
