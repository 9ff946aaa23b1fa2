package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"

	"github.com/golang-migrate/migrate/v4"
	migratepgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
)

//go:embed *.sql
var files embed.FS

// Publication is the publication the migrations create.
const Publication = "mailroom"

// Up applies every migration not yet applied. Running it again is a no-op.
func Up(ctx context.Context, databaseURL string) error {
	return run(ctx, databaseURL, "up", (*migrate.Migrate).Up)
}

// GuardSQL makes the publication guard (migration 7's
// tailer_publication_guard) an event trigger. It takes a superuser: tailer
// migrate runs it when it can, and says so when it cannot.
const GuardSQL = `CREATE EVENT TRIGGER tailer_publication_guard ON ddl_command_end
	WHEN TAG IN ('CREATE PUBLICATION', 'ALTER PUBLICATION', 'DROP PUBLICATION', 'ALTER TABLE', 'DROP TABLE', 'ALTER SCHEMA', 'DROP SCHEMA')
	EXECUTE FUNCTION tailer_publication_guard()`

// InstallGuard runs GuardSQL unless the guard is there already. It
// reports false, and no error, when the role may not create event
// triggers.
func InstallGuard(ctx context.Context, conn *pgx.Conn) (bool, error) {
	var there bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_event_trigger WHERE evtname = 'tailer_publication_guard')`).Scan(&there); err != nil {
		return false, fmt.Errorf("look up the publication guard: %w", err)
	}
	if there {
		return true, nil
	}
	_, err := conn.Exec(ctx, GuardSQL)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == pgerrcode.InsufficientPrivilege {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("install the publication guard: %w", err)
	}
	return true, nil
}

// Down reverts every migration.
func Down(ctx context.Context, databaseURL string) error {
	return run(ctx, databaseURL, "down", (*migrate.Migrate).Down)
}

// Version reports the applied version and whether the last migration failed
// halfway (dirty). Version 0 means none applied.
func Version(ctx context.Context, databaseURL string) (version uint, dirty bool, err error) {
	err = withMigrate(ctx, databaseURL, func(m *migrate.Migrate) error {
		version, dirty, err = m.Version()
		if errors.Is(err, migrate.ErrNilVersion) {
			return nil
		}
		return err
	})
	return version, dirty, err
}

func run(ctx context.Context, databaseURL, what string, f func(*migrate.Migrate) error) error {
	err := withMigrate(ctx, databaseURL, func(m *migrate.Migrate) error {
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

func withMigrate(ctx context.Context, databaseURL string, f func(*migrate.Migrate) error) error {
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return fmt.Errorf("parse database URL: %w", err)
	}
	db := stdlib.OpenDB(*cfg)
	defer db.Close()
	if err := db.PingContext(ctx); err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	driver, err := migratepgx.WithInstance(db, &migratepgx.Config{})
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
