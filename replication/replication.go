package replication

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"regexp"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
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

// Connect opens a replication connection (replication=database) to the
// database named in url.
func Connect(ctx context.Context, url string) (*pgconn.PgConn, error) {
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database URL: %w", err)
	}
	cfg.RuntimeParams["replication"] = "database"
	cfg.RuntimeParams["application_name"] = "tailer"
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
