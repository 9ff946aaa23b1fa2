package main

// tailer migrate and tailer resync: the schema, the slot, and the tokens a
// new slot did not capture.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"

	"github.com/mailroom/tailer/cmd/internal/config"
	"github.com/mailroom/tailer/cmd/internal/daemon"
	"github.com/mailroom/tailer/cmd/internal/resync"
	"github.com/mailroom/tailer/migrations"
	"github.com/mailroom/tailer/replication"
)

func migrate(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	direction := "up"
	if len(args) > 0 && (args[0] == "up" || args[0] == "down") {
		direction, args = args[0], args[1:]
	}
	cfg, _, code := loadConfig("migrate [up|down]", migrateVars, args, getenv, stderr)
	if cfg == nil {
		return code
	}
	log := daemon.NewLogger(cfg.LogFormat, cfg.LogLevel, stderr)
	conn, err := pgx.Connect(ctx, cfg.DatabaseURL)
	if err != nil {
		log.Error("connect to PostgreSQL", "err", err)
		return exitFailure
	}
	defer conn.Close(context.Background())
	if direction == "down" {
		// The slot goes first: left behind it would retain WAL forever.
		if err := replication.DropSlot(ctx, conn, cfg.Slot); err != nil {
			log.Error("migrate down", "err", err)
			return exitFailure
		}
		if err := migrations.Down(ctx, cfg.DatabaseURL); err != nil {
			log.Error("migrate down", "err", err)
			return exitFailure
		}
		log.Info("schema, publication and slot removed", "slot", cfg.Slot)
		return exitOK
	}
	if err := migrations.Up(ctx, cfg.DatabaseURL); err != nil {
		log.Error("migrate", "err", err)
		return exitFailure
	}
	version, _, _ := migrations.Version(ctx, cfg.DatabaseURL)
	state, err := resync.Load(ctx, conn, cfg.Slot)
	if err != nil {
		log.Error("migrate", "err", err)
		return exitFailure
	}
	cursor, collector, err := resync.CollectorCursor(ctx, conn)
	if err != nil {
		log.Error("migrate", "err", err)
		return exitFailure
	}
	_, err = replication.Slot(ctx, conn, cfg.Slot)
	if err != nil && !errors.Is(err, replication.ErrNoSlot) {
		log.Error("migrate", "err", err)
		return exitFailure
	}
	// A collector's database is adopted when the slot is made for it: the
	// tokens after the collector's cursor are in the slot's snapshot. A
	// resync left unfinished is finished.
	if state.Pending() || (collector && err != nil && !state.Exists) {
		if err := cfg.RequireKey(); err != nil {
			fmt.Fprintf(stderr, "tailer migrate: adopting the collector's database publishes the tokens after jobs.last_seq: %v\n", err)
			return exitConfig
		}
		var after *int64
		if !state.Pending() {
			after = &cursor
			log.Info("adopting mailroom's collector: publishing the eligible tokens after its cursor", "jobs.last_seq", cursor)
		}
		rep, err := runResync(ctx, cfg, log, after)
		if err != nil {
			return exitCode(stderr, "migrate", log, err)
		}
		daemon.LogResync(log, "slot created from a snapshot; its tokens are on the stream", rep)
		log.Info("schema up to date", "version", version, "publication", migrations.Publication, "slot", cfg.Slot)
		return exitOK
	}
	created, err := replication.EnsureSlot(ctx, conn, cfg.Slot)
	if err != nil {
		log.Error("migrate", "err", err)
		return exitFailure
	}
	log.Info("schema up to date", "version", version, "publication", migrations.Publication, "slot", cfg.Slot, "slot_created", created)
	return exitOK
}

func resyncCmd(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) int {
	cfg, _, code := loadKeyedConfig("resync", resyncVars, args, getenv, stderr)
	if cfg == nil {
		return code
	}
	log := daemon.NewLogger(cfg.LogFormat, cfg.LogLevel, stderr)
	rep, err := runResync(ctx, cfg, log, nil)
	if err != nil {
		return exitCode(stderr, "resync", log, err)
	}
	daemon.LogResync(log, "slot resynced: start tailer run", rep)
	return exitOK
}

// runResync recreates cfg's slot from a snapshot and publishes what the
// stream lacks (see package resync).
func runResync(ctx context.Context, cfg *config.Config, log *slog.Logger, after *int64) (resync.Report, error) {
	opts, err := daemon.ResyncOptions(cfg, log)
	if err != nil {
		return resync.Report{}, err
	}
	opts.AfterID = after
	nc, shutdown, err := daemon.ConnectNATS(cfg, log, nats.Name("tailer resync"))
	if err != nil {
		return resync.Report{}, err
	}
	defer shutdown()
	return resync.Run(ctx, nc, opts)
}
