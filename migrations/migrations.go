package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"

	"github.com/golang-migrate/migrate/v4"
	migratepgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/mailroom/tailer/internal/pgname"
)

//go:embed *.sql
var files embed.FS

// Publication is the publication the migrations create.
const Publication = "mailroom"

// Up applies every migration not yet applied to schema (made if missing).
// Running it again is a no-op.
func Up(ctx context.Context, databaseURL string, schema pgname.Schema) error {
	return run(ctx, databaseURL, schema, "up", (*migrate.Migrate).Up)
}

// GuardName is the event trigger that runs schema's publication guard.
// Event triggers are the database's, not a schema's: each schema of a
// database gets one of its own (the first had "tailer_publication_guard",
// which the check of a guard still finds by its function).
func GuardName(schema pgname.Schema) string {
	h := fnv.New32a()
	h.Write([]byte(schema))
	return fmt.Sprintf("tailer_publication_guard_%08x", h.Sum32())
}

// GuardSQL makes the publication guard (migration 10's
// tailer_publication_guard, in schema) an event trigger that fires in
// every session, those with session_replication_role = replica too (a
// restore, a replication tool): ENABLE ALWAYS, where an event trigger
// made the plain way fires in origin sessions alone. It takes a
// superuser: tailer migrate runs it when it can, and says so when it
// cannot.
func GuardSQL(schema pgname.Schema) string {
	name := pgx.Identifier{GuardName(schema)}.Sanitize()
	return `CREATE EVENT TRIGGER ` + name + ` ON ddl_command_end
	WHEN TAG IN ('` + strings.Join(guardTags, "', '") + `')
	EXECUTE FUNCTION ` + schema.Name("tailer_publication_guard") + `();
ALTER EVENT TRIGGER ` + name + ` ENABLE ALWAYS`
}

// guardTags are the commands after which the guard runs: those that can
// change what a publication carries, and those that make or attach a
// partition of tokens (CREATE TABLE, to see a partition empty as it is
// made; ALTER TABLE, for ATTACH and DETACH PARTITION).
var guardTags = []string{"CREATE PUBLICATION", "ALTER PUBLICATION", "DROP PUBLICATION", "CREATE TABLE", "ALTER TABLE", "DROP TABLE", "ALTER SCHEMA", "DROP SCHEMA"}

// InstallGuard makes schema's publication guard fire in every session:
// it runs GuardSQL when no event trigger runs the schema's guard, and
// enables one that does always. It reports false, and no error, when the
// role may not.
func InstallGuard(ctx context.Context, conn *pgx.Conn, schema pgname.Schema) (bool, error) {
	var (
		name    *string
		enabled string
		tags    []string
	)
	err := conn.QueryRow(ctx, `SELECT evtname::text, evtenabled::text, coalesce(evttags, '{}') FROM pg_event_trigger
		WHERE evtfoid = to_regprocedure($1) ORDER BY evtenabled = 'A' DESC, evtname LIMIT 1`, schema.Name("tailer_publication_guard")+"()").Scan(&name, &enabled, &tags)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return false, fmt.Errorf("look up the publication guard of schema %s: %w", schema.Ident(), err)
	}
	sql := GuardSQL(schema)
	slices.Sort(tags)
	switch {
	case name != nil && enabled == "A" && slices.Equal(tags, sortedGuardTags()):
		return true, nil
	case name != nil:
		// Made by an older tailer: without ENABLE ALWAYS, or without the
		// commands that make a partition. Event triggers' commands cannot
		// be changed: it is made again.
		sql = `DROP EVENT TRIGGER ` + pgx.Identifier{*name}.Sanitize() + `;
` + sql
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("install the publication guard: %w", err)
	}
	defer tx.Rollback(context.Background())
	_, err = tx.Exec(ctx, sql)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == pgerrcode.InsufficientPrivilege {
		return false, nil
	}
	if err == nil {
		err = tx.Commit(ctx)
	}
	if err != nil {
		return false, fmt.Errorf("install the publication guard: %w", err)
	}
	return true, nil
}

func sortedGuardTags() []string {
	tags := slices.Clone(guardTags)
	slices.Sort(tags)
	return tags
}

// Down reverts every migration of schema.
func Down(ctx context.Context, databaseURL string, schema pgname.Schema) error {
	return run(ctx, databaseURL, schema, "down", (*migrate.Migrate).Down)
}

// Version reports the applied version and whether the last migration failed
// halfway (dirty). Version 0 means none applied.
func Version(ctx context.Context, databaseURL string, schema pgname.Schema) (version uint, dirty bool, err error) {
	err = withMigrate(ctx, databaseURL, schema, func(m *migrate.Migrate) error {
		version, dirty, err = m.Version()
		if errors.Is(err, migrate.ErrNilVersion) {
			return nil
		}
		return err
	})
	return version, dirty, err
}

func run(ctx context.Context, databaseURL string, schema pgname.Schema, what string, f func(*migrate.Migrate) error) error {
	err := withMigrate(ctx, databaseURL, schema, func(m *migrate.Migrate) error {
		if err := f(m); err != nil && !errors.Is(err, migrate.ErrNoChange) {
			return err
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("migrate %s: %w", what, err)
	}
	return nil
}

// withMigrate runs f on a migrate.Migrate of schema. Its connections
// search schema alone (and pg_catalog, and their own temporary tables
// last): the migrations name their tables without a schema, and a schema
// named after the role, first in PostgreSQL's default search_path, would
// otherwise receive them. The schema is made first if it is missing.
func withMigrate(ctx context.Context, databaseURL string, schema pgname.Schema, f func(*migrate.Migrate) error) error {
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return fmt.Errorf("parse database URL: %w", err)
	}
	if err := ensureSchema(ctx, cfg, schema); err != nil {
		return err
	}
	cfg.RuntimeParams["search_path"] = schema.Ident() + ", pg_temp"
	db := stdlib.OpenDB(*cfg)
	defer db.Close()
	if err := db.PingContext(ctx); err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	driver, err := migratepgx.WithInstance(db, &migratepgx.Config{SchemaName: string(schema)})
	if err != nil {
		return err
	}
	src, err := iofs.New(files, ".")
	if err != nil {
		return err
	}
	m, err := migrate.NewWithInstance("iofs", src, "pgx5", driver)
	if err != nil {
		return err
	}
	defer m.Close()
	return f(m)
}

// ensureSchema makes schema when it does not exist. It looks first: CREATE
// SCHEMA IF NOT EXISTS needs the right to create schemas in the database
// even when there is nothing to create.
func ensureSchema(ctx context.Context, cfg *pgx.ConnConfig, schema pgname.Schema) error {
	cfg = cfg.Copy()
	pgname.Isolate(cfg.RuntimeParams)
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.Background())
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)`, string(schema)).Scan(&exists); err != nil {
		return fmt.Errorf("look up schema %s: %w", schema.Ident(), err)
	}
	if exists {
		return nil
	}
	if _, err := conn.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+schema.Ident()); err != nil {
		return fmt.Errorf("create schema %s (MAILROOM_SCHEMA): %w", schema.Ident(), err)
	}
	return nil
}
