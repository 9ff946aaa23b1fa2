package replication

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"regexp"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/mailroom/tailer/internal/pgname"
)

// Plugin is the output plugin the tailer decodes.
const Plugin = "pgoutput"

var identRe = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// ValidateName checks a slot or publication name. Both end up in
// replication commands that do not take parameters, so only PostgreSQL's own
// slot-name alphabet is accepted: lower-case letters, digits and underscores,
// at most 63 characters.
func ValidateName(name string) error {
	if !identRe.MatchString(name) {
		return fmt.Errorf("%q is not a valid name: use 1-63 lower-case letters, digits or underscores, not starting with a digit", name)
	}
	return nil
}

// Open opens an ordinary connection to the database named in url, named
// app in pg_stat_activity (so that operators, and pg_terminate_backend,
// tell it apart), with the run-time parameters params, and searching
// pg_catalog alone (pgname.Isolate), whatever the URL, the role or the
// database set.
func Open(ctx context.Context, url, app string, params map[string]string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database URL: %w", err)
	}
	cfg.RuntimeParams["application_name"] = app
	maps.Copy(cfg.RuntimeParams, params)
	pgname.Isolate(cfg.RuntimeParams)
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	return conn, nil
}

// Connect opens a replication connection (replication=database) to the
// database named in url.
func Connect(ctx context.Context, url string) (*pgconn.PgConn, error) {
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database URL: %w", err)
	}
	cfg.RuntimeParams["replication"] = "database"
	cfg.RuntimeParams["application_name"] = "tailer"
	pgname.Isolate(cfg.RuntimeParams)
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return newLowWaterConn(c), nil
	}
	// pgproto3 reads at most 8 KiB at a time; a large buffer lets one read
	// take everything that has piled up.
	cfg.BuildFrontend = func(r io.Reader, w io.Writer) *pgproto3.Frontend {
		return pgproto3.NewFrontend(bufio.NewReaderSize(r, readBuffer), w)
	}
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("replication connect: %w", err)
	}
	return conn, nil
}
