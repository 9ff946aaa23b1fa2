package daemon

import (
	"crypto/x509"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mailroom/tailer/cmd/internal/config"
	"github.com/mailroom/tailer/internal/pgname"
)

// stopError is a graceful stop that could not publish every token it had
// read; they stay in the slot for the next run.
type stopError struct{ err error }

func (e *stopError) Error() string {
	return "stopped without publishing every token read (they stay in the slot for the next run): " + e.err.Error()
}
func (e *stopError) Unwrap() error { return e.err }

// What a failed session's error is blamed on, for tailer_reconnects_total.
const (
	targetPostgres = "postgres"
	targetNATS     = "nats"
)

type sessionError struct {
	target string
	err    error
}

func (e *sessionError) Error() string { return e.err.Error() }
func (e *sessionError) Unwrap() error { return e.err }

func pgErr(err error) error {
	if err == nil {
		return nil
	}
	return &sessionError{targetPostgres, err}
}

func natsErr(err error) error {
	if err == nil {
		return nil
	}
	return &sessionError{targetNATS, err}
}

// StartupConfigError turns errors that only the operator can fix (a wrong
// password or user, a database that does not exist) into a configuration
// error, so that the first start fails with exit code 2 instead of retrying
// forever. Later, the same errors are retried: a password may be rotated
// while the tailer runs.
func StartupConfigError(err error, cfg *config.Config) error {
	var (
		unknownCA x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
	)
	var tlsErr error
	switch {
	case errors.As(err, &unknownCA):
		tlsErr = unknownCA
	case errors.As(err, &hostname):
		tlsErr = hostname
	case errors.As(err, &invalid):
		tlsErr = invalid
	}
	if tlsErr != nil {
		return &config.Error{Var: "MAILROOM_DATABASE_URL", Err: fmt.Errorf("the server's TLS certificate is not accepted (see sslrootcert and sslmode): %w", tlsErr)}
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return nil
	}
	switch pgErr.Code {
	case pgerrcode.InvalidPassword:
		if cfg.PasswordApart {
			return &config.Error{Var: "MAILROOM_DATABASE_PASSWORD", Err: fmt.Errorf("the server refused it for the user of MAILROOM_DATABASE_URL: %s (SQLSTATE %s)", pgErr.Message, pgErr.Code)}
		}
		return &config.Error{Var: "MAILROOM_DATABASE_URL", Err: fmt.Errorf("authentication failed: %s (SQLSTATE %s)", pgErr.Message, pgErr.Code)}
	case pgerrcode.InvalidAuthorizationSpecification:
		return &config.Error{Var: "MAILROOM_DATABASE_URL", Err: fmt.Errorf("authentication failed: %s (SQLSTATE %s)", pgErr.Message, pgErr.Code)}
	case pgerrcode.InvalidCatalogName:
		return &config.Error{Var: "MAILROOM_DATABASE_URL", Err: fmt.Errorf("%s (SQLSTATE %s)", pgErr.Message, pgErr.Code)}
	case pgerrcode.InsufficientPrivilege:
		return &config.Error{Var: "MAILROOM_DATABASE_URL", Err: fmt.Errorf("its user lacks a grant: %s (SQLSTATE %s); %s", pgErr.Message, pgErr.Code, missingGrant(pgErr.Message, cfg.Schema))}
	}
	return nil
}

// tableGrants are the privileges the tailer's role needs on each table it
// reads or writes (migrations 3, 4 and 5 grant them to a role named tailer).
var tableGrants = map[string]string{
	"tokens": "SELECT", "accounts": "SELECT",
	"tailer_slot": "SELECT, INSERT, UPDATE, DELETE", "tailer_resync": "SELECT, INSERT, UPDATE, DELETE",
}

// missingGrant names the statement that gives what PostgreSQL's refusal
// (msg) says is missing.
func missingGrant(msg string, schema pgname.Schema) string {
	if table, ok := strings.CutPrefix(msg, "permission denied for table "); ok {
		if grant, ok := tableGrants[table]; ok {
			return fmt.Sprintf("as the tables' owner, GRANT %s ON %s TO that user", grant, schema.Name(table))
		}
	}
	if strings.Contains(msg, "replication") {
		return "as a superuser, ALTER ROLE that user REPLICATION (streaming from a slot needs it)"
	}
	return "grant it as the object's owner (docs/deploy.md, 'Locked down by default', lists the tailer role's grants)"
}
