package config

// The settings, one row each: the variable, its flag, the commands that
// take it, its type, default and meaning, and how its value is read into
// a Config; and the readers the rows share.

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mailroom/tailer/decoder/action"
	"github.com/mailroom/tailer/internal/pgname"
	"github.com/mailroom/tailer/publish"
	"github.com/mailroom/tailer/publish/token"
	"github.com/mailroom/tailer/publish/wire"
	"github.com/mailroom/tailer/replication"
)

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
	{Env: "MAILROOM_SUBJECT_PER_ACTION", Cmds: Run | Resync, Flag: "subject-per-action", Type: "bool", Group: GroupBatches, Default: "false", Usage: "publish each action on its own subject, <subject>.<action> (" + strings.Join(action.Labels(), ", ") + "), one action a batch", Shown: true, set: boolVar(func(c *Config) *bool { return &c.PerAction })},
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
