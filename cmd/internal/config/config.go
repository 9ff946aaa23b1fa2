package config

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go"

	"github.com/mailroom/tailer/internal/pgname"
	"github.com/mailroom/tailer/publish"
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

// Vars lists every setting, in help order.
var Vars = []Var{
	{Env: "MAILROOM_DATABASE_URL", Cmds: Run | Resync | Status, Flag: "database-url", Type: "url", Group: GroupPostgreSQL, Usage: "PostgreSQL URL (required), e.g. postgres://user@host:5432/mailroom", Secret: true, set: func(c *Config, v string) error {
		if v == "" {
			return errors.New("is required")
		}
		if err := misread(v, "MAILROOM_DATABASE_PASSWORD"); err != nil {
			return err
		}
		if _, err := pgconn.ParseConfig(v); err != nil {
			return invalid("cannot be parsed as a postgres:// URL or a key=value connection string (%s)", parseFailure(err))
		}
		c.DatabaseURL = v
		return nil
	}},
	{Env: "MAILROOM_DATABASE_PASSWORD", Cmds: Run | Resync | Status, Flag: "database-password", Type: "string", Group: GroupPostgreSQL, Usage: "password of MAILROOM_DATABASE_URL's user, any characters, no percent-encoding (replaces a password in the URL)", Secret: true, set: func(c *Config, v string) error {
		if v == "" {
			return nil
		}
		u, err := withPassword(c.DatabaseURL, v)
		if err != nil {
			return err
		}
		c.DatabaseURL, c.PasswordApart = u, true
		return nil
	}},
	{Env: "MAILROOM_INBOX_URL", Cmds: Subscribe | Audit, Flag: "inbox-url", Type: "url", Group: GroupPostgreSQL, Usage: "PostgreSQL URL of the consumer's database, for tailer subscribe --into inbox or river", Secret: true, set: func(c *Config, v string) error {
		if v == "" {
			return nil
		}
		if err := misread(v, "MAILROOM_INBOX_PASSWORD"); err != nil {
			return err
		}
		if _, err := pgconn.ParseConfig(v); err != nil {
			return invalid("cannot be parsed as a postgres:// URL or a key=value connection string (%s)", parseFailure(err))
		}
		c.InboxURL = v
		return nil
	}},
	{Env: "MAILROOM_INBOX_PASSWORD", Cmds: Subscribe | Audit, Flag: "inbox-password", Type: "string", Group: GroupPostgreSQL, Usage: "password of MAILROOM_INBOX_URL's user, any characters, no percent-encoding", Secret: true, set: func(c *Config, v string) error {
		if v == "" {
			return nil
		}
		if c.InboxURL == "" {
			return errors.New("set without MAILROOM_INBOX_URL")
		}
		u, err := withPassword(c.InboxURL, v)
		if err != nil {
			return err
		}
		c.InboxURL = u
		return nil
	}},
	{Env: "MAILROOM_INBOX_SCHEMA", Cmds: Subscribe | Audit, Flag: "inbox-schema", Type: "name", Group: GroupPostgreSQL, Default: "public", Usage: "schema of the inbox table and River's tables in the consumer's database; every query names it, never the search_path", set: func(c *Config, v string) error {
		c.InboxSchema = pgname.Schema(v)
		return schemaName(c.InboxSchema)
	}},
	{Env: "MAILROOM_SECRET_KEY", Cmds: Run | Resync | Verify, Flag: "secret-key", Type: "hex", Group: GroupSigning, Usage: "HMAC signing key: exactly 64 hex characters (or use MAILROOM_SECRET_KEY_FILE)", Secret: true, set: func(c *Config, v string) error {
		// Trimmed like the file form: a key pasted with its newline is the
		// same key.
		v = strings.TrimSpace(v)
		if v == "" {
			return nil
		}
		key, err := token.ParseKey(v)
		if err != nil {
			return err
		}
		c.Keys, err = token.SingleKey(key)
		return err
	}},
	{Env: "MAILROOM_SECRET_KEY_FILE", Cmds: Run | Resync | Verify, Flag: "secret-key-file", Type: "file", Group: GroupSigning, Usage: "file holding the signing key as 64 hex characters", set: func(c *Config, v string) error {
		if v == "" {
			return nil
		}
		if c.Keys != nil {
			return errors.New("set together with MAILROOM_SECRET_KEY: use one of them")
		}
		data, err := os.ReadFile(v)
		if err != nil {
			return invalid("cannot read the key file it names: %v", pathErr(err))
		}
		key, err := token.ParseKey(strings.TrimSpace(string(data)))
		if err != nil {
			return fmt.Errorf("the key in the file %w", err)
		}
		c.Keys, err = token.SingleKey(key)
		return err
	}},
	{Env: "MAILROOM_KEYRING_FILE", Cmds: Run | Resync | Verify, Flag: "keyring-file", Type: "file", Group: GroupSigning, Usage: "keyring file: a signing key a line, its id and its 64 hex characters, the key that signs marked primary (instead of MAILROOM_SECRET_KEY)", set: func(c *Config, v string) error {
		if v == "" {
			return nil
		}
		if c.Keys != nil {
			return errors.New("set together with MAILROOM_SECRET_KEY or MAILROOM_SECRET_KEY_FILE: use one of them")
		}
		data, err := os.ReadFile(v)
		if err != nil {
			return invalid("cannot read the keyring file it names: %v", pathErr(err))
		}
		ring, err := token.ParseRing(data)
		if err != nil {
			return fmt.Errorf("the keyring file %w", err)
		}
		c.Keys = ring
		return nil
	}},
	{Env: "MAILROOM_BATCH_LIMIT", Cmds: Run | Resync, Flag: "batch-limit", Type: "int", Group: GroupBatches, Default: "10", Usage: "most tokens in one batch", Shown: true, set: func(c *Config, v string) error {
		n, err := positiveInt(v, 1_000_000)
		c.BatchLimit = n
		return err
	}},
	{Env: "MAILROOM_BATCH_TIMEOUT", Cmds: Run, Flag: "batch-timeout", Type: "ms", Group: GroupBatches, Default: "5000", Usage: "milliseconds after a batch's first token when it is cut at the latest", Shown: true, set: millisVar(func(c *Config) *time.Duration { return &c.BatchTimeout }, 0, 86_400_000)},
	{Env: "MAILROOM_NATS_URL", Cmds: Run | Resync | Status | Subscribe, Flag: "nats-url", Type: "urls", Group: GroupNATS, Usage: "NATS server URL(s), comma-separated; unset: tailer run starts an embedded JetStream server on MAILROOM_DATA_DIR, and the other commands use the one of the tailer run holding that directory", Secret: true, set: func(c *Config, v string) error {
		parts := strings.Split(v, ",")
		for i, part := range parts {
			if v == "" {
				break
			}
			if err := misread(strings.TrimSpace(part), "MAILROOM_NATS_PASSWORD (with MAILROOM_NATS_USER)"); err != nil {
				return err
			}
			u, err := url.Parse(strings.TrimSpace(part))
			if err != nil || u.Host == "" || (u.Scheme != "nats" && u.Scheme != "tls" && u.Scheme != "ws" && u.Scheme != "wss") {
				return invalid("must be nats://host:port (or tls://, ws://, wss://), comma-separated for a cluster; URL %d of %d is not", i+1, len(parts))
			}
		}
		c.NATSURL = v
		return nil
	}},
	{Env: "MAILROOM_NATS_USER", Cmds: Run | Resync | Status | Subscribe, Flag: "nats-user", Type: "string", Group: GroupNATS, Usage: "NATS user name (with MAILROOM_NATS_PASSWORD)", set: func(c *Config, v string) error {
		c.NATSUser = v
		return nil
	}},
	{Env: "MAILROOM_NATS_PASSWORD", Cmds: Run | Resync | Status | Subscribe, Flag: "nats-password", Type: "string", Group: GroupNATS, Usage: "NATS password of MAILROOM_NATS_USER", Secret: true, set: func(c *Config, v string) error {
		if v != "" && c.NATSUser == "" {
			return errors.New("is set without MAILROOM_NATS_USER")
		}
		c.NATSPassword = v
		return nil
	}},
	{Env: "MAILROOM_NATS_TOKEN", Cmds: Run | Resync | Status | Subscribe, Flag: "nats-token", Type: "string", Group: GroupNATS, Usage: "NATS authentication token", Secret: true, set: func(c *Config, v string) error {
		c.NATSToken = v
		return nil
	}},
	{Env: "MAILROOM_NATS_CREDS", Cmds: Run | Resync | Status | Subscribe, Flag: "nats-creds", Type: "file", Group: GroupNATS, Usage: "NATS credentials file (JWT and nkey seed, as nsc writes it)", set: fileVar(func(c *Config) *string { return &c.NATSCreds })},
	{Env: "MAILROOM_NATS_NKEY", Cmds: Run | Resync | Status | Subscribe, Flag: "nats-nkey", Type: "file", Group: GroupNATS, Usage: "file holding a NATS nkey seed (SU...)", set: fileVar(func(c *Config) *string { return &c.NATSNkey })},
	{Env: "MAILROOM_NATS_TLS_CA", Cmds: Run | Resync | Status | Subscribe, Flag: "nats-tls-ca", Type: "file", Group: GroupNATS, Usage: "PEM file of the CA that signed the NATS server's certificate (enables TLS)", set: fileVar(func(c *Config) *string { return &c.NATSTLSCA })},
	{Env: "MAILROOM_NATS_TLS_CERT", Cmds: Run | Resync | Status | Subscribe, Flag: "nats-tls-cert", Type: "file", Group: GroupNATS, Usage: "PEM client certificate for NATS (with MAILROOM_NATS_TLS_KEY)", set: fileVar(func(c *Config) *string { return &c.NATSTLSCert })},
	{Env: "MAILROOM_NATS_TLS_KEY", Cmds: Run | Resync | Status | Subscribe, Flag: "nats-tls-key", Type: "file", Group: GroupNATS, Usage: "PEM private key of MAILROOM_NATS_TLS_CERT", set: func(c *Config, v string) error {
		if (v == "") != (c.NATSTLSCert == "") {
			return errors.New("must be set together with MAILROOM_NATS_TLS_CERT")
		}
		return fileVar(func(c *Config) *string { return &c.NATSTLSKey })(c, v)
	}},
	{Env: "MAILROOM_NATS_LISTEN", Cmds: Run | Resync | Status | Subscribe, Flag: "nats-listen", Type: "host:port", Group: GroupNATS, Default: "127.0.0.1:4222", Usage: "client address of the embedded NATS server (where status, subscribe and dead-letters look for it when no tailer run on MAILROOM_DATA_DIR says where it listens)", set: func(c *Config, v string) error {
		if _, _, err := net.SplitHostPort(v); err != nil {
			return invalid("must be host:port")
		}
		c.NATSListen = v
		return nil
	}},
	{Env: "MAILROOM_NATS_SYNC", Cmds: Run | Resync, Flag: "nats-sync", Type: "always|duration", Group: GroupNATS, Default: "always", Usage: "when the embedded NATS server syncs its store to disk: always (before every acknowledgement) or an interval such as 1s (faster for many small batches; a host crash loses up to that much)", Shown: true, set: func(c *Config, v string) error {
		if v == "always" {
			c.NATSSync = 0
			return nil
		}
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return invalid("must be always or a positive duration such as 1s")
		}
		c.NATSSync = d
		return nil
	}},
	{Env: "MAILROOM_DATA_DIR", Cmds: Run | Resync | Status | Subscribe, Flag: "data-dir", Type: "dir", Group: GroupNATS, Default: "tailer-data", Usage: "directory of the embedded NATS server's JetStream store, held by one tailer run at a time; resync, status, subscribe and dead-letters with MAILROOM_NATS_URL unset use the server of the tailer run that holds it", set: func(c *Config, v string) error {
		if v == "" {
			return errors.New("must not be empty")
		}
		c.DataDir = v
		return nil
	}},
	{Env: "MAILROOM_NATS_STREAM", Cmds: Run | Resync | Status | Subscribe, Flag: "nats-stream", Type: "name", Group: GroupNATS, Default: "MAILROOM", Usage: "JetStream stream name (created if missing)", set: func(c *Config, v string) error {
		if v == "" || strings.ContainsAny(v, ".*>/\\") || strings.ContainsFunc(v, notPrintable) {
			return invalid("must be a stream name of printable characters without spaces, '.', '*', '>', '/' or '\\'")
		}
		c.Stream = v
		return nil
	}},
	{Env: "MAILROOM_NATS_SUBJECT", Cmds: Run | Resync | Subscribe, Flag: "nats-subject", Type: "subject", Group: GroupNATS, Default: "mailroom.batches", Usage: "subject batches are published on", set: func(c *Config, v string) error {
		if v == "" || strings.ContainsAny(v, "*>") || strings.ContainsFunc(v, notPrintable) || strings.HasPrefix(v, ".") || strings.HasSuffix(v, ".") || strings.Contains(v, "..") {
			return invalid("must be a literal subject such as mailroom.batches")
		}
		c.Subject = v
		return nil
	}},
	{Env: "MAILROOM_NATS_REPLICAS", Cmds: Run | Resync, Flag: "nats-replicas", Type: "int", Group: GroupNATS, Default: "1", Usage: "replicas of the stream when the tailer creates it (3 on a three-node cluster)", Shown: true, set: func(c *Config, v string) error {
		n, err := positiveInt(v, 5)
		c.Replicas = n
		return err
	}},
	{Env: "MAILROOM_SUBJECT_PER_ACTION", Cmds: Run | Resync, Flag: "subject-per-action", Type: "bool", Group: GroupBatches, Default: "false", Usage: "publish each action on its own subject, <subject>.<action> (" + strings.Join(token.Labels(), ", ") + "), one action a batch", Shown: true, set: boolVar(func(c *Config) *bool { return &c.PerAction })},
	{Env: "MAILROOM_FORMAT", Cmds: Run | Resync, Flag: "format", Type: "line|json", Group: GroupBatches, Default: "line", Usage: "message body: line (collector-compatible) or json", Shown: true, set: func(c *Config, v string) error {
		f, err := wire.ParseFormat(v)
		if err != nil {
			return invalid("must be line or json")
		}
		c.Format = f
		return nil
	}},
	{Env: "MAILROOM_HTTP_ADDR", Cmds: Run | Health, Flag: "http-addr", Type: "host:port", Group: GroupOperations, Default: "127.0.0.1:9187", Usage: "address for /metrics, /healthz and /readyz; empty disables", EmptyIsValue: true, set: func(c *Config, v string) error {
		if v != "" {
			if _, _, err := net.SplitHostPort(v); err != nil {
				return invalid("must be host:port or empty")
			}
		}
		c.HTTPAddr = v
		return nil
	}},
	{Env: "MAILROOM_SLOT", Cmds: Run | Resync | Status, Flag: "slot", Type: "name", Group: GroupPostgreSQL, Default: "mailroom", Usage: "logical replication slot name", set: func(c *Config, v string) error {
		c.Slot = v
		return validName(v)
	}},
	{Env: "MAILROOM_SCHEMA", Cmds: Run | Resync | Status, Flag: "schema", Type: "name", Group: GroupPostgreSQL, Default: "public", Usage: "schema of the tokens and accounts tables and of the tailer's own; every query names it, never the search_path", set: func(c *Config, v string) error {
		c.Schema = pgname.Schema(v)
		return schemaName(c.Schema)
	}},
	{Env: "MAILROOM_PUBLICATION", Cmds: Run | Resync | Status, Flag: "publication", Type: "name", Group: GroupPostgreSQL, Default: "mailroom", Usage: "publication holding the tokens table", set: func(c *Config, v string) error {
		c.Publication = v
		return validName(v)
	}},
	{Env: "MAILROOM_PROTO_VERSION", Cmds: Run, Flag: "proto-version", Type: "int", Group: GroupPostgreSQL, Default: "2", Usage: "pgoutput protocol version: 1, or 2 to stream large transactions", Shown: true, set: func(c *Config, v string) error {
		switch v {
		case "1", "2":
			c.ProtoVersion = int(v[0] - '0')
			return nil
		}
		return invalid("must be 1 or 2")
	}},
	{Env: "MAILROOM_BINARY", Cmds: Run, Flag: "binary", Type: "bool", Group: GroupPostgreSQL, Default: "true", Usage: "ask pgoutput for binary column values (cheaper for the server)", Shown: true, set: boolVar(func(c *Config) *bool { return &c.Binary })},
	{Env: "MAILROOM_MAX_IN_FLIGHT", Cmds: Run | Resync, Flag: "max-in-flight", Type: "auto|int", Group: GroupBatches, Default: "auto", Usage: "messages published and awaiting their PubAck at once; batches ready meanwhile go out together in the next message (auto: 1 on a stream of one replica, 2 on a replicated one)", Shown: true, set: func(c *Config, v string) error {
		if v == "auto" {
			c.MaxInFlight = 0
			return nil
		}
		n, err := positiveInt(v, MaxInFlight)
		if err != nil {
			return invalid("must be auto or a whole number from 1 to %d", MaxInFlight)
		}
		c.MaxInFlight = n
		return nil
	}},
	{Env: "MAILROOM_MAX_BATCHES_PER_MESSAGE", Cmds: Run | Resync, Flag: "max-batches-per-message", Type: "int", Group: GroupBatches, Default: strconv.Itoa(publish.DefaultMaxBatches), Usage: "most batches one message carries when batches go out together (1: a message per batch, for consumers that take a message as one line)", Shown: true, set: func(c *Config, v string) error {
		n, err := positiveInt(v, 100_000)
		c.MaxBatches = n
		return err
	}},
	{Env: "MAILROOM_MAX_LAG", Cmds: Run | Status, Flag: "max-lag", Type: "bytes", Group: GroupOperations, Default: "67108864", Usage: "slot lag in bytes above which /readyz reports not ready (and tailer status exits 1)", Shown: true, set: func(c *Config, v string) error {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return invalid("must be a number of bytes >= 0")
		}
		c.MaxLag = n
		return nil
	}},
	{Env: "MAILROOM_MAX_LAG_SECONDS", Cmds: Status, Flag: "max-lag-seconds", Type: "seconds", Group: GroupOperations, Default: "60", Usage: "lag in time (seconds since the newest commit or heartbeat confirmed) past which tailer status exits 1; tailer run's heartbeats keep it under MAILROOM_HEARTBEAT_INTERVAL while it keeps up", Shown: true, set: secondsVar(func(c *Config) *time.Duration { return &c.MaxLagSeconds })},
	{Env: "MAILROOM_MAX_UNHELD_SECONDS", Cmds: Status, Flag: "max-unheld-seconds", Type: "seconds", Group: GroupOperations, Default: "70", Usage: "seconds the slot may go without a tailer holding it before tailer status exits 1 (a restart, a standby taking over, take seconds)", Shown: true, set: secondsVar(func(c *Config) *time.Duration { return &c.MaxUnheld })},
	{Env: "MAILROOM_LAG_INTERVAL", Cmds: Run, Flag: "lag-interval", Type: "ms", Group: GroupOperations, Default: "5000", Usage: "milliseconds between samples of the slot's lag for metrics and /readyz", Shown: true, set: millisVar(func(c *Config) *time.Duration { return &c.LagInterval }, 1, 3_600_000)},
	{Env: "MAILROOM_HEARTBEAT_INTERVAL", Cmds: Run, Flag: "heartbeat-interval", Type: "ms", Group: GroupPostgreSQL, Default: "5000", Usage: "milliseconds between heartbeats written into the WAL (a logical message) while tailer run streams, so that the lag in seconds moves when no token is written; 0 writes none", Shown: true, set: millisVar(func(c *Config) *time.Duration { return &c.HeartbeatInterval }, 0, 3_600_000)},
	{Env: "MAILROOM_PUBACK_TIMEOUT", Cmds: Run | Resync, Flag: "puback-timeout", Type: "ms", Group: GroupNATS, Default: "5000", Usage: "milliseconds a publish waits for its PubAck before the session starts again, on whichever server then leads the stream (a node partitioned or frozen: a cluster elects another leader within seconds); /readyz says a wait past a second", Shown: true, set: millisVar(func(c *Config) *time.Duration { return &c.PubAckTimeout }, 500, 600_000)},
	{Env: "MAILROOM_REPLICATION_TIMEOUT", Cmds: Run, Flag: "replication-timeout", Type: "ms", Group: GroupPostgreSQL, Default: "60000", Usage: "milliseconds the replication connection may stay silent (no message, no keepalive) before it is reconnected", Shown: true, set: millisVar(func(c *Config) *time.Duration { return &c.ReplicationTimeout }, 1000, 3_600_000)},
	{Env: "MAILROOM_PPROF", Cmds: Run, Flag: "pprof", Type: "bool", Group: GroupOperations, Default: "false", Usage: "serve /debug/pprof on the HTTP address (profiles show code paths; keep the address private)", Shown: true, set: boolVar(func(c *Config) *bool { return &c.Pprof })},
	{Env: "MAILROOM_SLOT_FAILOVER", Cmds: Run | Resync, Flag: "slot-failover", Type: "auto|bool", Group: GroupPostgreSQL, Default: replication.FailoverAuto, Usage: "make the slot a failover slot, kept in step on standbys with sync_replication_slots (PostgreSQL 17+): auto (on 17+), true (refused on 16 and older) or false", Shown: true, set: func(c *Config, v string) error {
		switch v {
		case replication.FailoverAuto, replication.FailoverOn, replication.FailoverOff:
			c.SlotFailover = v
			return nil
		}
		return invalid("must be auto, true or false")
	}},
	{Env: "MAILROOM_AUTO_RESYNC", Cmds: Run, Flag: "auto-resync", Type: "bool", Group: GroupPostgreSQL, Default: "false", Usage: "when the slot is lost or gone, recreate it and publish the still-eligible tokens the stream lacks (tailer resync) instead of waiting for the operator", Shown: true, set: boolVar(func(c *Config) *bool { return &c.AutoResync })},
	{Env: "MAILROOM_AUDIT_INTERVAL", Cmds: Run, Flag: "audit-interval", Type: "ms", Group: GroupOperations, Default: "60000", Usage: "milliseconds between audits of the tokens confirmed since the last one, by content: each eligible token against the keys the stream holds (tailer audit); 0: none", Shown: true, set: millisVar(func(c *Config) *time.Duration { return &c.AuditInterval }, 0, 86_400_000)},
	{Env: "MAILROOM_AUDIT_GRACE", Cmds: Run, Flag: "audit-grace", Type: "ms", Group: GroupOperations, Default: "60000", Usage: "milliseconds after their creation tokens are audited (at least twice MAILROOM_LAG_INTERVAL and MAILROOM_BATCH_TIMEOUT together): tokens a transaction commits later than this after it began are left to tailer audit", Shown: true, set: millisVar(func(c *Config) *time.Duration { return &c.AuditGrace }, 1000, 86_400_000)},
	{Env: "MAILROOM_AUDIT_HEAL", Cmds: Run, Flag: "audit-heal", Type: "bool", Group: GroupOperations, Default: "false", Usage: "publish, once, the still-eligible tokens an audit finds missing from the stream (as tailer audit --heal does) instead of only saying so", Shown: true, set: boolVar(func(c *Config) *bool { return &c.AuditHeal })},
	{Env: "MAILROOM_LOG_FORMAT", Cmds: Run | Resync, Flag: "log-format", Type: "text|json", Group: GroupOperations, Default: "text", Usage: "log format: text or json", Shown: true, set: func(c *Config, v string) error {
		if v != "text" && v != "json" {
			return invalid("must be text or json")
		}
		c.LogFormat = v
		return nil
	}},
	{Env: "MAILROOM_LOG_LEVEL", Cmds: Run | Resync, Flag: "log-level", Type: "debug|info|warn|error", Group: GroupOperations, Default: "info", Usage: "log level: debug, info, warn or error", Shown: true, set: func(c *Config, v string) error {
		switch v {
		case "debug", "info", "warn", "error":
			c.LogLevel = v
			return nil
		}
		return invalid("must be debug, info, warn or error")
	}},
}

// MaxInFlight bounds MAILROOM_MAX_IN_FLIGHT below the NATS client's cap on
// asynchronous publishes awaiting their PubAck (1024); past it, publishing
// stalls the session.
const MaxInFlight = 1000

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

func positiveInt(v string, max int) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > max {
		return 0, invalid("must be a whole number from 1 to %d", max)
	}
	return n, nil
}

// boolVar sets a true/false setting.
func boolVar(field func(*Config) *bool) func(*Config, string) error {
	return func(c *Config, v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return invalid("must be true or false")
		}
		*field(c) = b
		return nil
	}
}

// millisVar sets a duration given in whole milliseconds from min to max.
// secondsVar sets a duration given in whole seconds, from 1 to a day.
func secondsVar(field func(*Config) *time.Duration) func(*Config, string) error {
	return func(c *Config, v string) error {
		n, err := positiveInt(v, 86_400)
		*field(c) = time.Duration(n) * time.Second
		return err
	}
}

func millisVar(field func(*Config) *time.Duration, min, max int) func(*Config, string) error {
	return func(c *Config, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < min || n > max {
			return invalid("must be a whole number of milliseconds from %d to %d", min, max)
		}
		*field(c) = time.Duration(n) * time.Millisecond
		return nil
	}
}

// fileVar sets the path of a file the command will read, checked now.
func fileVar(field func(*Config) *string) func(*Config, string) error {
	return func(c *Config, v string) error {
		*field(c) = v
		return readable(v)
	}
}

// notPrintable reports a space, a control character or one that is not
// printable: none belongs in a NATS name or subject.
func notPrintable(r rune) bool { return unicode.IsSpace(r) || !unicode.IsPrint(r) }

// schemaName refuses what cannot name a schema.
func schemaName(s pgname.Schema) error {
	if err := s.Check(); err != nil {
		return invalid("%s", err)
	}
	return nil
}

func validName(v string) error {
	if replication.ValidateName(v) != nil {
		return invalid("must be 1-63 lower-case letters, digits or underscores, not starting with a digit")
	}
	return nil
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
