package daemon

import (
	"crypto/x509"
	"errors"
	"fmt"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mailroom/tailer/cmd/internal/config"
	"github.com/mailroom/tailer/replication"
)

// stopError is a graceful stop that could not publish every token it had
// read; they stay in the slot for the next run.
type stopError struct{ err error }

func (e *stopError) Error() string {
	return "stopped without publishing every token read (they stay in the slot for the next run): " + e.err.Error()
}
func (e *stopError) Unwrap() error { return e.err }

// slotLostError is a slot the server invalidated: retrying cannot read it,
// but the operator may recreate it while the tailer waits.
type slotLostError struct {
	slot  replication.SlotInfo
	cause error // the server's refusal, when it came at the start of streaming
}

func (e *slotLostError) Error() string {
	if e.cause != nil {
		return LostSlotMessage(e.slot) + " (" + e.cause.Error() + ")"
	}
	return LostSlotMessage(e.slot)
}

// blockedError is a slot the tailer must not stream from until the
// operator acts: a resync started and did not finish, the slot is gone
// while the database or the stream says it existed, the stream's batches
// are not the slot's, a schema or a publication the tailer cannot read
// tokens through. reason is the tailer_blocked label; resync says a
// resync is the way out (so MAILROOM_AUTO_RESYNC applies).
type blockedError struct {
	reason string
	msg    string
	resync bool
}

// Why the tailer waits for the operator (tailer_blocked's reason label).
const (
	blockedResync      = "resync"
	blockedSchema      = "schema"
	blockedPublication = "publication"
	blockedStream      = "stream"
	// blockedNATS: NATS takes no batches until the operator acts (its
	// store full, the tailer's user denied); the tailer goes on by itself
	// once it does.
	blockedNATS = "nats"
)

var blockedReasons = []string{blockedResync, blockedSchema, blockedPublication, blockedStream, blockedNATS}

func (e *blockedError) Error() string { return e.msg }

// resyncFailedError is an automatic resync that failed; the next session
// tries again.
type resyncFailedError struct{ err error }

func (e *resyncFailedError) Error() string { return "resync: " + e.err.Error() }
func (e *resyncFailedError) Unwrap() error { return e.err }

// errResynced ends a session that resynced the slot: the next one streams
// from the new slot.
var errResynced = errors.New("slot resynced")

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
func StartupConfigError(err error) error {
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
	case pgerrcode.InvalidPassword, pgerrcode.InvalidAuthorizationSpecification:
		return &config.Error{Var: "MAILROOM_DATABASE_URL", Err: fmt.Errorf("authentication failed: %s (SQLSTATE %s)", pgErr.Message, pgErr.Code)}
	case pgerrcode.InvalidCatalogName:
		return &config.Error{Var: "MAILROOM_DATABASE_URL", Err: fmt.Errorf("%s (SQLSTATE %s)", pgErr.Message, pgErr.Code)}
	}
	return nil
}
