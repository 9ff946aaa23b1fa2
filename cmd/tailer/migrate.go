package main

// tailer migrate and tailer resync: the schema, the slot, and the tokens a
// new slot did not capture.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/mailroom/tailer/cmd/internal/config"
	"github.com/mailroom/tailer/cmd/internal/daemon"
	"github.com/mailroom/tailer/migrations"
	"github.com/mailroom/tailer/publish/relay"
	"github.com/mailroom/tailer/publish/resync"
	"github.com/mailroom/tailer/replication"
)

func (x *cli) migrateCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "migrate [up|down]",
		Short: "apply the schema and publication, create the slot (down reverts)",
		Long: `Apply the schema and the publication and create the replication slot,
checking first that PostgreSQL can (wal_level, the user's rights, a slot
free). "migrate down" drops the slot, then the schema. On a database the
mailroom collector ran on, it also publishes, once, the tokens after
jobs.last_seq: the cutover, the only use of the signing, batch and NATS
settings here.`,
		Args: func(c *cobra.Command, args []string) error {
			for i, a := range args {
				if i > 0 || (a != "up" && a != "down") {
					return usagef("unexpected argument %q: migrate takes up (the default) or down", a)
				}
			}
			return nil
		},
		ValidArgs: []string{"up", "down"},
	}
	load := x.settings(c, migrateVars, false)
	// Only the cutover publishes: its settings under headings of their own.
	c.Flags().VisitAll(func(f *pflag.Flag) {
		if g := f.Annotations[config.GroupAnnotation]; len(g) > 0 && g[0] != config.GroupPostgreSQL && g[0] != config.GroupOperations {
			f.Annotations[config.GroupAnnotation] = []string{g[0] + ", for the cutover from the collector only"}
		}
	})
	return x.leaf(c, func(c *cobra.Command, args []string) int {
		cfg, err := load()
		if err != nil {
			return exitConfig
		}
		direction := "up"
		if len(args) == 1 {
			direction = args[0]
		}
		return migrate(c.Context(), cfg, direction, x.stderr)
	})
}

// migrate is tailer migrate with its settings.
func migrate(ctx context.Context, cfg *config.Config, direction string, stderr io.Writer) int {
	log := daemon.NewLogger(cfg.LogFormat, cfg.LogLevel, stderr)
	conn, err := replication.Open(ctx, cfg.DatabaseURL, "tailer migrate", nil)
	if err != nil {
		return exitCode(stderr, "migrate", log, connectError(err, cfg))
	}
	defer conn.Close(context.Background())
	if direction == "down" {
		return migrateDown(ctx, cfg, conn, log)
	}
	if problems, err := preflight(ctx, conn, cfg.Slot); err != nil {
		log.Error("migrate", "err", err)
		return exitFailure
	} else if len(problems) > 0 {
		fmt.Fprintf(stderr, "tailer migrate: nothing was changed: %s\n", strings.Join(problems, "; "))
		return exitConfig
	}
	if err := migrations.Up(ctx, cfg.DatabaseURL, cfg.Schema); err != nil {
		log.Error("migrate", "err", err)
		return exitFailure
	}
	version, _, _ := migrations.Version(ctx, cfg.DatabaseURL, cfg.Schema)
	guard, err := migrations.InstallGuard(ctx, conn, cfg.Schema)
	if err != nil {
		log.Error("migrate", "err", err)
		return exitFailure
	}
	if !guard {
		log.Warn("the publication guard of this schema is not installed, or does not fire in every session: making an event trigger, or enabling it always, takes a superuser. Without it a publication changed and changed back between two of tailer run's checks "+
			"(every MAILROOM_LAG_INTERVAL) leaves the token inserts of that time out of the slot's stream unseen. Have a superuser run `tailer migrate` again, or this in the database",
			"schema", cfg.Schema, "sql", strings.Join(strings.Fields(migrations.GuardSQL(cfg.Schema)), " "))
	}
	shared, unreadable, err := replication.SharedWith(ctx, cfg.InSchema(conn), cfg.Slot)
	if err != nil {
		log.Error("migrate", "err", err)
		return exitFailure
	}
	if len(shared) > 0 {
		fmt.Fprintf(stderr, "tailer migrate: the schema is up to date, but the slot was neither made nor adopted: %s\n", daemon.SlotSharedMessage(cfg.Slot, &relay.SlotSharedError{Schemas: shared}))
		return exitConfig
	}
	if len(unreadable) > 0 {
		log.Warn("the records of other mailroom schemas of this database cannot be read by this role: whether one names this slot too is not checked", "slot", cfg.Slot, "schemas", unreadable)
	}
	created, code, ok := ensureSlot(ctx, cfg, conn, log, stderr)
	if !ok {
		return code
	}
	if err := replication.SetPublication(ctx, cfg.InSchema(conn), cfg.Slot, cfg.Publication); err != nil {
		log.Error("migrate", "err", err)
		return exitFailure
	}
	log.Info("schema up to date", "version", version, "schema", cfg.Schema, "publication", cfg.Publication, "slot", cfg.Slot, "slot_created", created, "publication_guard", guard)
	return exitOK
}

// migrateDown drops the slot, then the schema and publication, under the
// slot's lease.
func migrateDown(ctx context.Context, cfg *config.Config, conn *pgx.Conn, log *slog.Logger) int {
	lease, err := replication.AcquireLease(ctx, cfg.DatabaseURL, cfg.Slot, replication.LeaseOptions{Application: "tailer migrate down", Wait: leaseWait})
	if err != nil {
		log.Error("migrate down", "err", leaseRefusal(err, "migrate down"))
		return exitFailure
	}
	defer lease.Release()
	// The slot goes first: left behind it would retain WAL forever.
	if err := replication.DropSlot(ctx, conn, cfg.Slot); err != nil {
		log.Error("migrate down", "err", err)
		return exitFailure
	}
	if err := migrations.Down(ctx, cfg.DatabaseURL, cfg.Schema); err != nil {
		log.Error("migrate down", "err", err)
		return exitFailure
	}
	log.Info("schema, publication and slot removed", "slot", cfg.Slot)
	return exitOK
}

// ensureSlot makes the slot if it is missing (from a snapshot when a
// collector's database is adopted, or a resync is to be finished) and
// checks the one there. ok false: the command ends with code.
func ensureSlot(ctx context.Context, cfg *config.Config, conn *pgx.Conn, log *slog.Logger, stderr io.Writer) (created bool, code int, ok bool) {
	if ready, err := slotInPlace(ctx, cfg.InSchema(conn), cfg.Slot); err != nil {
		log.Error("migrate", "err", err)
		return false, exitFailure, false
	} else if ready {
		return false, 0, true
	}
	// The slot is missing, or a resync of it did not finish: what to do
	// depends on its record, which only the lease's holder may act on.
	lease, err := replication.AcquireLease(ctx, cfg.DatabaseURL, cfg.Slot, replication.LeaseOptions{Application: "tailer migrate", Wait: leaseWait})
	if err != nil {
		log.Error("migrate", "err", leaseRefusal(err, "migrate"))
		return false, exitFailure, false
	}
	defer lease.Release()
	rec, err := replication.LoadRecord(ctx, cfg.InSchema(conn), cfg.Slot)
	if err != nil {
		log.Error("migrate", "err", err)
		return false, exitFailure, false
	}
	cutover, err := resync.CollectorCursor(ctx, cfg.InSchema(conn))
	if err != nil {
		log.Error("migrate", "err", err)
		return false, exitFailure, false
	}
	_, err = replication.Slot(ctx, conn, cfg.Slot)
	missing := errors.Is(err, replication.ErrNoSlot)
	if err != nil && !missing {
		log.Error("migrate", "err", err)
		return false, exitFailure, false
	}
	switch {
	case rec.ResyncPending || (missing && !rec.Exists && cutover != nil):
		// A collector's database is adopted when the slot is made for it:
		// the tokens after the collector's cursor are in the slot's
		// snapshot. A resync left unfinished is finished.
		if err := cfg.RequireKey(); err != nil {
			fmt.Fprintf(stderr, "tailer migrate: adopting the collector's database, or finishing a resync, publishes tokens: %v\n", err)
			return false, exitConfig, false
		}
		by := "tailer migrate (finishing a resync)"
		if !rec.ResyncPending {
			by = "tailer migrate (collector cutover)"
			log.Info("adopting mailroom's collector: publishing the eligible tokens after its cursor", "jobs.last_seq", cutover.LastSeq)
		} else {
			cutover = nil
		}
		rep, err := runResync(ctx, cfg, log, lease, by, cutover)
		if err != nil {
			return false, exitCode(stderr, "migrate", log, err), false
		}
		rep.Log(log, "slot created from a snapshot; its tokens are on the stream")
		return true, 0, true
	case !missing:
		return false, 0, true
	case rec.Exists:
		// A slot existed here: made anew, it would start after the tokens
		// committed since the old one was last read, and in a copy or a
		// restore of the database the stream's positions of the original
		// would skip this one's tokens.
		log.Error("migrate", "err", fmt.Errorf("slot %s does not exist, but this database recorded it (%s): it was dropped, or this database is a copy or a restore of the one it was made in. "+
			"tailer migrate does not make it again beside a stream that may hold its batches. To go on: run `tailer resync`, which recreates the slot and publishes, once, every still-eligible token the stream lacks",
			cfg.Slot, rec.Describe()))
		return false, exitFailure, false
	}
	return makeSlot(ctx, cfg, conn, log, stderr)
}

// makeSlot makes the missing slot, refusing a publication that does not
// carry the schema's tokens: a slot made before its publication can
// never stream (PostgreSQL looks the publication up as the catalog was
// at each change, and finds none before it was made).
func makeSlot(ctx context.Context, cfg *config.Config, conn *pgx.Conn, log *slog.Logger, stderr io.Writer) (created bool, code int, ok bool) {
	failover, err := wantFailover(ctx, conn, cfg.SlotFailover)
	if err != nil {
		fmt.Fprintf(stderr, "tailer migrate: %v\n", err)
		return false, exitConfig, false
	}
	var pub *replication.PublicationError
	if err := replication.CheckPublication(ctx, cfg.InSchema(conn), cfg.Publication); errors.As(err, &pub) {
		fmt.Fprintf(stderr, "tailer migrate: the schema is up to date, but the slot was not made: %v. %s\n", pub, publicationFix(cfg, pub))
		return false, exitConfig, false
	} else if err != nil {
		log.Error("migrate", "err", err)
		return false, exitFailure, false
	}
	if _, err := replication.CreateSlot(ctx, cfg.InSchema(conn), cfg.Slot, "tailer migrate", false, failover); err != nil {
		log.Error("migrate", "err", err)
		return false, exitFailure, false
	}
	return true, 0, true
}

// publicationFix says how to give the slot a publication that carries the
// schema's tokens table.
func publicationFix(cfg *config.Config, pub *replication.PublicationError) string {
	name, table := pgx.Identifier{cfg.Publication}.Sanitize(), cfg.Schema.Name("tokens")
	other := "set MAILROOM_PUBLICATION to a publication that carries it; each schema of a database needs a publication of its own"
	if pub.Problem == "does not exist" {
		return fmt.Sprintf("Make it, then run tailer migrate again: CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert', publish_via_partition_root = true) (or %s)", name, table, other)
	}
	return fmt.Sprintf("Fix it, then run tailer migrate again: ALTER PUBLICATION %s SET TABLE %s (or %s)", name, table, other)
}

// leaseWait is how long resync and migrate wait for a lease held by a
// process that does not stream from the slot: long enough for a tailer run
// that checks a lost or blocked slot to let go of it.
const leaseWait = 10 * time.Second

// slotInPlace reports whether the slot exists, no resync of it unfinished,
// and fit to stream from (an error says why not).
func slotInPlace(ctx context.Context, db replication.SchemaConn, name string) (bool, error) {
	conn := db.Querier
	slot, err := replication.Slot(ctx, conn, name)
	if errors.Is(err, replication.ErrNoSlot) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	if rec, err := replication.LoadRecord(ctx, db, name); err != nil || rec.ResyncPending {
		return false, nil
	}
	if err := replication.CheckSlot(ctx, conn, slot); err != nil {
		return false, daemon.Advise(err)
	}
	return true, nil
}

// leaseRefusal explains a lease that could not be had.
func leaseRefusal(err error, cmd string) error {
	var held *replication.LeaseHeldError
	if errors.As(err, &held) {
		return fmt.Errorf("%w. tailer %s changed nothing: stop that process first (a tailer run hands the slot over to a standby, or lets go of it when it cannot stream from it)", err, cmd)
	}
	return err
}

// preflight names what would stop migrate half way, before it writes
// anything: a server that cannot decode logically (wal_level), and, when
// the slot is still to be made, a user who may not make it or no slot free
// for it. Each names its fix.
func preflight(ctx context.Context, conn *pgx.Conn, slot string) ([]string, error) {
	var (
		walLevel            string
		replicate           bool
		freeSlots, haveSlot int
	)
	err := conn.QueryRow(ctx, `SELECT current_setting('wal_level'),
		(SELECT rolsuper OR rolreplication FROM pg_roles WHERE rolname = current_user),
		current_setting('max_replication_slots')::int - (SELECT count(*) FROM pg_replication_slots),
		(SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1)`, slot).Scan(&walLevel, &replicate, &freeSlots, &haveSlot)
	if err != nil {
		return nil, fmt.Errorf("check the server before migrating: %w", err)
	}
	var problems []string
	if walLevel != "logical" {
		problems = append(problems, fmt.Sprintf("wal_level is %s, and logical decoding needs logical: ALTER SYSTEM SET wal_level = logical, then restart PostgreSQL", walLevel))
	}
	if haveSlot == 0 && !replicate {
		problems = append(problems, "the user may not make the replication slot: ALTER ROLE <user> REPLICATION (or run migrate as a user who may, as the compose stack's roles do)")
	}
	if haveSlot == 0 && freeSlots < 1 {
		problems = append(problems, "max_replication_slots leaves no slot free for the tailer's: raise it (ALTER SYSTEM SET max_replication_slots = ..., then restart), or drop a slot nobody reads")
	}
	return problems, nil
}
