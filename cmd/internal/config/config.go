package config

import (
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mailroom/tailer/internal/pgname"
	"github.com/mailroom/tailer/publish/token"
	"github.com/mailroom/tailer/publish/wire"
	"github.com/mailroom/tailer/replication"
)

// Config is the tailer's configuration.
type Config struct {
	DatabaseURL string
	// PasswordApart: the password in DatabaseURL came from
	// MAILROOM_DATABASE_PASSWORD (or its file), where a refused one is
	// to be fixed.
	PasswordApart bool
	// InboxURL is the consumer's database, for tailer subscribe --into.
	InboxURL string
	// Keys signs (its primary key) and verifies tokens: the keyring file,
	// or a ring of the one key MAILROOM_SECRET_KEY (or its file) gives.
	Keys         *token.Ring
	BatchLimit   int
	BatchTimeout time.Duration
	NATSURL      string // empty: embedded server
	NATSListen   string // embedded server's client address
	// NATS credentials and TLS for MAILROOM_NATS_URL; see NATSOptions.
	NATSUser, NATSPassword, NATSToken  string
	NATSCreds, NATSNkey                string
	NATSTLSCA, NATSTLSCert, NATSTLSKey string
	// NATSSync is how often the embedded server syncs its store; 0 means
	// before every acknowledgement.
	NATSSync    time.Duration
	DataDir     string // embedded server's store
	Stream      string
	Subject     string
	Replicas    int
	PerAction   bool
	Format      wire.Format
	HTTPAddr    string
	Slot        string
	Publication string
	// Schema holds the tokens and accounts tables and the tailer's own;
	// InboxSchema the consumer's inbox and River tables.
	Schema, InboxSchema pgname.Schema
	ProtoVersion        int
	Binary              bool
	// MaxInFlight is 0 for auto: publish.InFlightFor the stream.
	MaxInFlight int
	MaxBatches  int
	LogFormat   string
	LogLevel    string
	// MaxLag is the slot lag in bytes above which the tailer is not ready.
	MaxLag int64
	// MaxLagSeconds is the lag in time past which tailer status exits 1;
	// MaxUnheld how long the slot may go without a tailer holding it.
	MaxLagSeconds, MaxUnheld time.Duration
	// LagInterval is how often the slot's lag is sampled.
	LagInterval time.Duration
	// HeartbeatInterval is how often tailer run writes a heartbeat into
	// the WAL while it streams; 0 writes none.
	HeartbeatInterval time.Duration
	// ReplicationTimeout is how long the replication connection may stay
	// silent (no message, no keepalive) before it is given up as dead.
	ReplicationTimeout time.Duration
	// PubAckTimeout is how long a publish waits for its PubAck before the
	// session gives up on the stream's leader and starts again.
	PubAckTimeout time.Duration
	// Pprof serves /debug/pprof on the HTTP address.
	Pprof bool
	// AutoResync lets tailer run resync a lost or vanished slot by itself.
	AutoResync bool
	// AuditInterval is how often tailer run audits the tokens confirmed
	// since its last audit (0: never), AuditGrace how long after their
	// creation; AuditHeal lets it publish what the audit finds missing.
	AuditInterval time.Duration
	AuditGrace    time.Duration
	AuditHeal     bool
	// SlotFailover is MAILROOM_SLOT_FAILOVER: auto, true or false.
	SlotFailover string
}

// InSchema is q in the schema of the tailer's tables (MAILROOM_SCHEMA).
func (c *Config) InSchema(q replication.Querier) replication.SchemaConn {
	return replication.SchemaConn{Querier: q, Schema: c.Schema}
}

// Cmd is a set of commands: the ones a setting applies to.
type Cmd uint8

// The commands that read settings. Resync also stands for tailer migrate,
// which may adopt a collector's database and publish as a resync does.
const (
	Run Cmd = 1 << iota
	Resync
	Status
	Verify
	Health
	Subscribe
	// Audit is tailer audit: Resync's settings (its --heal publishes as a
	// resync does), and the consumer's database for --into.
	Audit
)

// For returns the settings cmd takes, in help order: what a command passes
// to Load.
func For(cmd Cmd) []string {
	var envs []string
	for _, v := range Vars {
		if v.Cmds&cmd != 0 {
			envs = append(envs, v.Env)
		}
	}
	return envs
}

// Var describes one setting.
type Var struct {
	Env string
	// Cmds are the commands that take it.
	Cmds    Cmd
	Flag    string
	Default string
	Usage   string
	// Type names the kind of value in help ("int", "ms", "url", a choice
	// such as "line|json"); "bool" flags may be given without a value.
	Type string
	// Group is the heading the flag is listed under in help.
	Group string
	// Secret values are never echoed in errors or help. Each may also
	// come from the file named by <Env>_FILE (Docker and Kubernetes
	// secrets), which keeps it out of the process's environment and the
	// container's configuration; MAILROOM_SECRET_KEY has a setting of its
	// own for that.
	Secret bool
	// Shown: a bad value may be echoed in the error, because a value of
	// this setting cannot hold a secret (a number, a duration, a choice).
	// Any other bad value is only said to be there, by its length: a URL
	// may carry a password however malformed it is, and a password pasted
	// into the wrong setting is still one.
	Shown bool
	// EmptyIsValue: the setting given as the empty string (in the
	// environment too) means that, not its default.
	EmptyIsValue bool
	set          func(c *Config, v string) error
}

// valueError is a value a setting cannot take; Load adds the value, or
// only its length (see Var.Shown).
type valueError struct{ msg string }

func (e *valueError) Error() string { return e.msg }

func invalid(format string, a ...any) error { return &valueError{fmt.Sprintf(format, a...)} }

// RedactURL hides the user information (user, password or token) of a URL,
// and of each URL in a comma-separated list, so that it can be logged.
func RedactURL(s string) string {
	parts := strings.Split(s, ",")
	for i, part := range parts {
		u, err := url.Parse(strings.TrimSpace(part))
		switch {
		case err != nil && strings.Contains(part, "@"):
			parts[i] = "(a URL with user information that does not parse)"
		case err != nil:
		case u.User != nil:
			u.User = url.User("REDACTED")
			parts[i] = u.String()
		}
	}
	return strings.Join(parts, ",")
}

// parseFailure says why a connection string did not parse without showing
// any of it: the parser's own messages quote the string, or the part of it
// that broke the parse, which is often a piece of the password.
// misread refuses a URL that parses, but not as it was meant: two '@'
// in its host part, or one after its end (a password holding an unencoded '/',
// '?' or '#' ends the host part early, the rest of the password becomes
// the host, a name looked up on the network, and the path a database name
// printed in logs), or a '#' at all (a fragment means nothing to a server).
// The error names no part of the URL: it may hold a password. passwordVar
// is the setting that takes the password as it is.
func misread(raw, passwordVar string) error {
	i := strings.Index(raw, "://")
	if i < 0 {
		// key=value form: no URL syntax to misread.
		return nil
	}
	rest := raw[i+3:]
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	// Two '@' in the host part: clients split it at the first or the last
	// (pgx takes the rest of the password for a host).
	if strings.Count(rest[:end], "@") < 2 && !strings.Contains(rest[end:], "@") && !strings.Contains(rest, "#") {
		return nil
	}
	return invalid("does not parse as it was surely meant: it holds two '@' in its host part, an '@' after it, or a '#', as a password with an unencoded '/', '?', '#' or '@' makes it; "+
		"nothing was connected to: percent-encode the password (/ as %%2F, ? as %%3F, # as %%23, @ as %%40), or leave it out of the URL and give it in %s", passwordVar)
}

func parseFailure(err error) string {
	var urlErr *url.Error
	switch {
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, fs.ErrPermission):
		return "a file it names (sslrootcert, sslcert, sslkey, passfile) cannot be read"
	case strings.Contains(err.Error(), "invalid port"):
		return "its port is not a number; in a URL, a '/', '?', '#' or '@' in the password ends it early: percent-encode them, or give the password in MAILROOM_DATABASE_PASSWORD"
	case errors.As(err, &urlErr):
		return "not a valid URL: percent-encode the user name and password, or give the password in MAILROOM_DATABASE_PASSWORD"
	case strings.Contains(err.Error(), "sslmode"):
		return "sslmode is not one of disable, allow, prefer, require, verify-ca, verify-full"
	}
	return "check the URL's syntax; a password with URL-special characters must be percent-encoded"
}

// withPassword puts password into the connection string dsn, so that every
// connection the tailer makes (queries, replication, the lease) uses it.
// A password given apart from the URL needs no percent-encoding: that is
// its point (a generated password with '/' or '@' broke the URL pasted
// together by a compose file). It replaces a password the URL holds.
// MAILROOM_DATABASE_URL was parsed before: only a parse failure here is
// new.
func withPassword(dsn, password string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", invalid("cannot be used: MAILROOM_DATABASE_URL does not parse")
		}
		u.User = url.UserPassword(u.User.Username(), password)
		return u.String(), nil
	}
	// key=value form: a later keyword wins, and single quotes take any
	// character once backslashes and quotes are escaped.
	quoted := strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(password)
	return dsn + " password='" + quoted + "'", nil
}

// Error is a configuration error: exit code 2, one line.
type Error struct {
	Var string
	Err error
}

func (e *Error) Error() string { return e.Var + ": " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// fromFile: the setting may come from the file <Env>_FILE names.
func (v Var) fromFile(byEnv map[string]Var) bool {
	_, own := byEnv[v.Env+"_FILE"]
	return v.Secret && !own
}

// readable checks that a configured file can be read, so that a wrong path
// is a configuration error at startup rather than a connection failure.
func readable(path string) error {
	if path == "" {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return invalid("cannot read the file it names: %v", pathErr(err))
	}
	return f.Close()
}

// pathErr is err without the path it names, which Load shows or not.
func pathErr(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// NATSOptions are the connection options for the configured credentials
// and TLS.
func (c *Config) NATSOptions() []nats.Option {
	// A server frozen or cut off keeps its connection open and silent:
	// pings every 3 s, two unanswered, find it in 6-9 s (the default, 2
	// minutes each, in 4-6 minutes), and the client moves to another node.
	opts := []nats.Option{nats.PingInterval(3 * time.Second), nats.MaxPingsOutstanding(2)}
	if c.NATSUser != "" {
		opts = append(opts, nats.UserInfo(c.NATSUser, c.NATSPassword))
	}
	if c.NATSToken != "" {
		opts = append(opts, nats.Token(c.NATSToken))
	}
	if c.NATSCreds != "" {
		opts = append(opts, nats.UserCredentials(c.NATSCreds))
	}
	if c.NATSNkey != "" {
		if opt, err := nats.NkeyOptionFromSeed(c.NATSNkey); err == nil {
			opts = append(opts, opt)
		} else {
			opts = append(opts, func(*nats.Options) error { return fmt.Errorf("MAILROOM_NATS_NKEY: %w", err) })
		}
	}
	if c.NATSTLSCA != "" {
		opts = append(opts, nats.RootCAs(c.NATSTLSCA))
	}
	if c.NATSTLSCert != "" {
		opts = append(opts, nats.ClientCert(c.NATSTLSCert, c.NATSTLSKey))
	}
	return opts
}

// RequireKey is the error of a command that signs tokens when no key is
// set. It is not Load's: tailer migrate only needs one to adopt a
// collector's database.
func (c *Config) RequireKey() error {
	if c.Keys == nil {
		return &Error{Var: "MAILROOM_SECRET_KEY", Err: errors.New("is required (64 hex characters), or set MAILROOM_SECRET_KEY_FILE or MAILROOM_KEYRING_FILE")}
	}
	return nil
}
