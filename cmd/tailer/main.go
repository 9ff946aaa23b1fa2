// Command tailer publishes mailroom tokens from PostgreSQL's WAL to NATS
// JetStream. See the README for the commands and settings.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/cmd/internal/config"
	"github.com/mailroom/tailer/cmd/internal/daemon"
	"github.com/mailroom/tailer/cmd/internal/resync"
	"github.com/mailroom/tailer/decoder"
	"github.com/mailroom/tailer/migrations"
	"github.com/mailroom/tailer/publish"
	"github.com/mailroom/tailer/publish/consume"
	"github.com/mailroom/tailer/replication"
)

const usage = `tailer: publish mailroom tokens from PostgreSQL's WAL to NATS JetStream.

Usage:
  tailer run        stream tokens from the slot, sign them and publish batches
  tailer migrate    apply the schema and publication, create the slot (migrate down reverts);
                    on a collector's database, publish once the tokens after jobs.last_seq
  tailer resync     recreate a lost or dropped slot and publish, once, every
                    still-eligible token the stream lacks
  tailer status     show the slot, its lag and the stream; exit 1 above --max-lag
  tailer health     exit 0 when the running tailer's /readyz says ready (for container healthchecks)
  tailer verify     check a token with the signing key
  tailer subscribe  print published batches, one line each

Every setting is a MAILROOM_* environment variable and the matching flag;
run "tailer COMMAND --help" for those of a command.
`

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitConfig  = 2
)

func main() {
	os.Exit(run(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

var (
	runVars = []string{"MAILROOM_DATABASE_URL", "MAILROOM_SECRET_KEY", "MAILROOM_SECRET_KEY_FILE", "MAILROOM_BATCH_LIMIT", "MAILROOM_BATCH_TIMEOUT", "MAILROOM_NATS_URL", "MAILROOM_NATS_USER", "MAILROOM_NATS_PASSWORD", "MAILROOM_NATS_TOKEN", "MAILROOM_NATS_CREDS", "MAILROOM_NATS_NKEY", "MAILROOM_NATS_TLS_CA", "MAILROOM_NATS_TLS_CERT", "MAILROOM_NATS_TLS_KEY", "MAILROOM_NATS_LISTEN", "MAILROOM_NATS_SYNC", "MAILROOM_DATA_DIR", "MAILROOM_NATS_STREAM", "MAILROOM_NATS_SUBJECT", "MAILROOM_NATS_REPLICAS", "MAILROOM_SUBJECT_PER_ACTION", "MAILROOM_FORMAT", "MAILROOM_HTTP_ADDR", "MAILROOM_SLOT", "MAILROOM_PUBLICATION", "MAILROOM_PROTO_VERSION", "MAILROOM_BINARY", "MAILROOM_MAX_IN_FLIGHT", "MAILROOM_MAX_LAG", "MAILROOM_LAG_INTERVAL", "MAILROOM_REPLICATION_TIMEOUT", "MAILROOM_PPROF", "MAILROOM_AUTO_RESYNC", "MAILROOM_LOG_FORMAT", "MAILROOM_LOG_LEVEL"}
	// A resync (and the adoption of a collector's database by migrate)
	// publishes like tailer run.
	resyncVars  = []string{"MAILROOM_DATABASE_URL", "MAILROOM_SECRET_KEY", "MAILROOM_SECRET_KEY_FILE", "MAILROOM_BATCH_LIMIT", "MAILROOM_NATS_URL", "MAILROOM_NATS_USER", "MAILROOM_NATS_PASSWORD", "MAILROOM_NATS_TOKEN", "MAILROOM_NATS_CREDS", "MAILROOM_NATS_NKEY", "MAILROOM_NATS_TLS_CA", "MAILROOM_NATS_TLS_CERT", "MAILROOM_NATS_TLS_KEY", "MAILROOM_NATS_LISTEN", "MAILROOM_NATS_SYNC", "MAILROOM_DATA_DIR", "MAILROOM_NATS_STREAM", "MAILROOM_NATS_SUBJECT", "MAILROOM_NATS_REPLICAS", "MAILROOM_SUBJECT_PER_ACTION", "MAILROOM_FORMAT", "MAILROOM_SLOT", "MAILROOM_MAX_IN_FLIGHT", "MAILROOM_LOG_FORMAT", "MAILROOM_LOG_LEVEL"}
	migrateVars = resyncVars
	statusVars  = []string{"MAILROOM_DATABASE_URL", "MAILROOM_SLOT", "MAILROOM_NATS_URL", "MAILROOM_NATS_USER", "MAILROOM_NATS_PASSWORD", "MAILROOM_NATS_TOKEN", "MAILROOM_NATS_CREDS", "MAILROOM_NATS_NKEY", "MAILROOM_NATS_TLS_CA", "MAILROOM_NATS_TLS_CERT", "MAILROOM_NATS_TLS_KEY", "MAILROOM_NATS_STREAM", "MAILROOM_MAX_LAG"}
	verifyVars  = []string{"MAILROOM_SECRET_KEY", "MAILROOM_SECRET_KEY_FILE"}
	healthVars  = []string{"MAILROOM_HTTP_ADDR"}
	subVars     = []string{"MAILROOM_NATS_URL", "MAILROOM_NATS_USER", "MAILROOM_NATS_PASSWORD", "MAILROOM_NATS_TOKEN", "MAILROOM_NATS_CREDS", "MAILROOM_NATS_NKEY", "MAILROOM_NATS_TLS_CA", "MAILROOM_NATS_TLS_CERT", "MAILROOM_NATS_TLS_KEY", "MAILROOM_NATS_STREAM", "MAILROOM_NATS_SUBJECT"}
)

func run(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, usage)
		if len(args) == 0 {
			return exitConfig
		}
		return exitOK
	}
	cmd, rest := args[0], args[1:]
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	switch cmd {
	case "run":
		cfg, _, code := loadConfig("run", runVars, rest, getenv, stderr)
		if cfg == nil {
			return code
		}
		if err := cfg.RequireKey(); err != nil {
			fmt.Fprintf(stderr, "tailer run: %v\n", err)
			return exitConfig
		}
		log := daemon.NewLogger(cfg.LogFormat, cfg.LogLevel, stderr)
		daemon.TuneRuntime(cfg)
		go func() {
			// A second signal means "now": skip the graceful drain.
			<-ctx.Done()
			sig := make(chan os.Signal, 1)
			signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
			<-sig
			log.Warn("second signal: exiting at once")
			os.Exit(exitFailure)
		}()
		if err := daemon.New(cfg, log).Run(ctx); err != nil {
			var cfgErr *config.Error
			if errors.As(err, &cfgErr) {
				fmt.Fprintf(stderr, "tailer run: %v\n", cfgErr)
				return exitConfig
			}
			log.Error("tailer failed", "err", err)
			return exitFailure
		}
		return exitOK
	case "migrate":
		return migrate(ctx, rest, getenv, stdout, stderr)
	case "resync":
		return resyncCmd(ctx, rest, getenv, stderr)
	case "status":
		return status(ctx, rest, getenv, stdout, stderr)
	case "health":
		return health(ctx, rest, getenv, stdout, stderr)
	case "verify":
		return verify(rest, getenv, stdout, stderr)
	case "subscribe":
		return subscribe(ctx, rest, getenv, stdout, stderr)
	}
	fmt.Fprintf(stderr, "tailer: unknown command %q\n\n%s", cmd, usage)
	return exitConfig
}

// loadConfig reads the settings of a command. It returns a nil Config with
// the exit code when the command must not go on: after --help (0), or after
// printing the one-line configuration error (2).
func loadConfig(usage string, vars, args []string, getenv func(string) string, stderr io.Writer) (*config.Config, []string, int) {
	cfg, rest, err := config.Load("tailer "+usage, vars, args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil, nil, exitOK
	}
	if err != nil {
		name, _, _ := strings.Cut(usage, " ")
		fmt.Fprintf(stderr, "tailer %s: %v\n", name, err)
		return nil, nil, exitConfig
	}
	return cfg, rest, exitOK
}

func migrate(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	direction := "up"
	if len(args) > 0 && (args[0] == "up" || args[0] == "down") {
		direction, args = args[0], args[1:]
	}
	cfg, _, code := loadConfig("migrate [up|down]", migrateVars, args, getenv, stderr)
	if cfg == nil {
		return code
	}
	log := daemon.NewLogger(cfg.LogFormat, cfg.LogLevel, stderr)
	conn, err := pgx.Connect(ctx, cfg.DatabaseURL)
	if err != nil {
		log.Error("connect to PostgreSQL", "err", err)
		return exitFailure
	}
	defer conn.Close(context.Background())
	if direction == "down" {
		// The slot goes first: left behind it would retain WAL forever.
		if err := replication.DropSlot(ctx, conn, cfg.Slot); err != nil {
			log.Error("migrate down", "err", err)
			return exitFailure
		}
		if err := migrations.Down(ctx, cfg.DatabaseURL); err != nil {
			log.Error("migrate down", "err", err)
			return exitFailure
		}
		log.Info("schema, publication and slot removed", "slot", cfg.Slot)
		return exitOK
	}
	if err := migrations.Up(ctx, cfg.DatabaseURL); err != nil {
		log.Error("migrate", "err", err)
		return exitFailure
	}
	version, _, _ := migrations.Version(ctx, cfg.DatabaseURL)
	state, err := resync.Load(ctx, conn, cfg.Slot)
	if err != nil {
		log.Error("migrate", "err", err)
		return exitFailure
	}
	cursor, collector, err := resync.CollectorCursor(ctx, conn)
	if err != nil {
		log.Error("migrate", "err", err)
		return exitFailure
	}
	_, err = replication.Slot(ctx, conn, cfg.Slot)
	if err != nil && !errors.Is(err, replication.ErrNoSlot) {
		log.Error("migrate", "err", err)
		return exitFailure
	}
	// A collector's database is adopted when the slot is made for it: the
	// tokens after the collector's cursor are in the slot's snapshot. A
	// resync left unfinished is finished.
	if state.Pending() || (collector && err != nil && !state.Exists) {
		if err := cfg.RequireKey(); err != nil {
			fmt.Fprintf(stderr, "tailer migrate: adopting the collector's database publishes the tokens after jobs.last_seq: %v\n", err)
			return exitConfig
		}
		var after *int64
		if !state.Pending() {
			after = &cursor
			log.Info("adopting mailroom's collector: publishing the eligible tokens after its cursor", "jobs.last_seq", cursor)
		}
		rep, err := runResync(ctx, cfg, log, after)
		if err != nil {
			return exitCode(stderr, "migrate", log, err)
		}
		daemon.LogResync(log, "slot created from a snapshot; its tokens are on the stream", rep)
		log.Info("schema up to date", "version", version, "publication", migrations.Publication, "slot", cfg.Slot)
		return exitOK
	}
	created, err := replication.EnsureSlot(ctx, conn, cfg.Slot)
	if err != nil {
		log.Error("migrate", "err", err)
		return exitFailure
	}
	log.Info("schema up to date", "version", version, "publication", migrations.Publication, "slot", cfg.Slot, "slot_created", created)
	return exitOK
}

func resyncCmd(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) int {
	cfg, _, code := loadConfig("resync", resyncVars, args, getenv, stderr)
	if cfg == nil {
		return code
	}
	if err := cfg.RequireKey(); err != nil {
		fmt.Fprintf(stderr, "tailer resync: %v\n", err)
		return exitConfig
	}
	log := daemon.NewLogger(cfg.LogFormat, cfg.LogLevel, stderr)
	rep, err := runResync(ctx, cfg, log, nil)
	if err != nil {
		return exitCode(stderr, "resync", log, err)
	}
	daemon.LogResync(log, "slot resynced: start tailer run", rep)
	return exitOK
}

// runResync recreates cfg's slot from a snapshot and publishes what the
// stream lacks (see package resync).
func runResync(ctx context.Context, cfg *config.Config, log *slog.Logger, after *int64) (resync.Report, error) {
	opts, err := daemon.ResyncOptions(cfg, log)
	if err != nil {
		return resync.Report{}, err
	}
	opts.AfterID = after
	nc, shutdown, err := daemon.ConnectNATS(cfg, log, nats.Name("tailer resync"))
	if err != nil {
		return resync.Report{}, err
	}
	defer shutdown()
	return resync.Run(ctx, nc, opts)
}

// exitCode reports a command's failure: a configuration error as one line
// (exit 2), anything else logged (exit 1).
func exitCode(stderr io.Writer, cmd string, log *slog.Logger, err error) int {
	var cfgErr *config.Error
	if errors.As(err, &cfgErr) {
		fmt.Fprintf(stderr, "tailer %s: %v\n", cmd, cfgErr)
		return exitConfig
	}
	log.Error("tailer "+cmd+" failed", "err", err)
	return exitFailure
}

// statusReport is the --json output of tailer status.
type statusReport struct {
	Slot           string  `json:"slot"`
	Active         bool    `json:"active"`
	ActivePID      int32   `json:"active_pid"`
	ConfirmedLSN   string  `json:"confirmed_flush_lsn"`
	RestartLSN     string  `json:"restart_lsn"`
	CurrentLSN     string  `json:"current_wal_lsn"`
	LagBytes       int64   `json:"lag_bytes"`
	RetainedBytes  int64   `json:"retained_bytes"`
	WALStatus      string  `json:"wal_status"`
	Lost           string  `json:"lost,omitempty"`
	Stream         string  `json:"stream"`
	StreamMessages *uint64 `json:"stream_messages"`
	StreamLastSeq  *uint64 `json:"stream_last_seq"`
	StreamReplicas *int    `json:"stream_replicas"`
	StreamError    string  `json:"stream_error,omitempty"`
	MaxLagBytes    int64   `json:"max_lag_bytes"`
	OK             bool    `json:"ok"`
}

// health asks the tailer at MAILROOM_HTTP_ADDR whether it is ready: the
// container healthcheck of an image without curl.
func health(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	cfg, _, code := loadConfig("health", healthVars, args, getenv, stderr)
	if cfg == nil {
		return code
	}
	if cfg.HTTPAddr == "" {
		fmt.Fprintln(stderr, "tailer health: MAILROOM_HTTP_ADDR is empty: the tailer serves no /readyz")
		return exitConfig
	}
	host, port, err := net.SplitHostPort(cfg.HTTPAddr)
	if err != nil {
		fmt.Fprintf(stderr, "tailer health: MAILROOM_HTTP_ADDR: %v\n", err)
		return exitConfig
	}
	// A wildcard listen address is reached on loopback.
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(host, port)+"/readyz", nil)
	if err != nil {
		fmt.Fprintf(stderr, "tailer health: %v\n", err)
		return exitFailure
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Fprintf(stderr, "tailer health: %v\n", err)
		return exitFailure
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	fmt.Fprint(stdout, string(body))
	if resp.StatusCode != http.StatusOK {
		return exitFailure
	}
	return exitOK
}

func status(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	// --json is status's own flag; the rest are shared settings.
	var asJSON bool
	var shared []string
	for _, a := range args {
		if a == "--json" || a == "-json" {
			asJSON = true
			continue
		}
		shared = append(shared, a)
	}
	cfg, _, code := loadConfig("status [--json]", statusVars, shared, getenv, stderr)
	if cfg == nil {
		return code
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, cfg.DatabaseURL)
	if err != nil {
		fmt.Fprintf(stderr, "tailer status: connect to PostgreSQL: %v\n", err)
		return exitFailure
	}
	defer conn.Close(context.Background())
	slot, err := replication.Slot(ctx, conn, cfg.Slot)
	if err != nil {
		fmt.Fprintf(stderr, "tailer status: %v\n", err)
		return exitFailure
	}
	rep := statusReport{
		Slot: slot.Name, Active: slot.Active, ActivePID: slot.ActivePID,
		ConfirmedLSN: slot.ConfirmedFlush.String(), RestartLSN: slot.RestartLSN.String(), CurrentLSN: slot.CurrentLSN.String(),
		LagBytes: slot.LagBytes(), RetainedBytes: slot.RetainedBytes(), Stream: cfg.Stream, MaxLagBytes: cfg.MaxLag,
	}
	rep.WALStatus = slot.WALStatus
	if slot.Lost() {
		rep.Lost = slot.LostMessage()
	}
	rep.OK = rep.LagBytes <= cfg.MaxLag && !slot.Lost()
	if cfg.NATSURL != "" {
		if info, err := streamInfo(ctx, cfg); err != nil {
			rep.StreamError = err.Error()
		} else {
			rep.StreamMessages, rep.StreamLastSeq, rep.StreamReplicas = &info.State.Msgs, &info.State.LastSeq, &info.Config.Replicas
		}
	} else {
		rep.StreamError = "MAILROOM_NATS_URL not set (embedded server is only reachable while tailer run is up)"
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(rep)
	} else {
		fmt.Fprintf(stdout, "slot            %s (active=%v pid=%d)\n", rep.Slot, rep.Active, rep.ActivePID)
		fmt.Fprintf(stdout, "confirmed LSN   %s\nrestart LSN     %s\ncurrent LSN     %s\n", rep.ConfirmedLSN, rep.RestartLSN, rep.CurrentLSN)
		fmt.Fprintf(stdout, "lag             %d bytes (%s), max %s\n", rep.LagBytes, human(rep.LagBytes), human(cfg.MaxLag))
		fmt.Fprintf(stdout, "retained WAL    %d bytes (%s), wal_status %s\n", rep.RetainedBytes, human(rep.RetainedBytes), rep.WALStatus)
		if rep.Lost != "" {
			fmt.Fprintf(stdout, "LOST            %s\n", rep.Lost)
		}
		if rep.StreamError != "" {
			fmt.Fprintf(stdout, "stream          %s: %s\n", rep.Stream, rep.StreamError)
		} else {
			fmt.Fprintf(stdout, "stream          %s: %d messages, last seq %d, %d replicas\n", rep.Stream, *rep.StreamMessages, *rep.StreamLastSeq, *rep.StreamReplicas)
		}
	}
	if !rep.OK {
		return exitFailure
	}
	return exitOK
}

func streamInfo(ctx context.Context, cfg *config.Config) (*jetstream.StreamInfo, error) {
	nc, err := nats.Connect(cfg.NATSURL, append(cfg.NATSOptions(), nats.Name("tailer status"), nats.Timeout(5*time.Second))...)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	s, err := js.Stream(ctx, cfg.Stream)
	if err != nil {
		return nil, err
	}
	return s.Info(ctx)
}

func human(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

func verify(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	var code string
	var shared []string
	for i := 0; i < len(args); i++ {
		if args[i] == "--code" || args[i] == "-code" {
			if i+1 >= len(args) {
				fmt.Fprintln(stderr, "tailer verify: --code needs the 5-character code")
				return exitConfig
			}
			i++
			code = args[i]
			continue
		}
		shared = append(shared, args[i])
	}
	cfg, rest, exit := loadConfig("verify [--code CODE] TOKEN", verifyVars, shared, getenv, stderr)
	if cfg == nil {
		return exit
	}
	if err := cfg.RequireKey(); err != nil {
		fmt.Fprintf(stderr, "tailer verify: %v\n", err)
		return exitConfig
	}
	if len(rest) != 1 {
		fmt.Fprintln(stderr, "tailer verify: give exactly one token (and --code CODE for a password recovery token)")
		return exitConfig
	}
	signer, err := publish.NewSigner(cfg.SecretKey)
	if err != nil {
		fmt.Fprintf(stderr, "tailer verify: %v\n", err)
		return exitConfig
	}
	action := decoder.ActionActivation
	if code != "" {
		action = decoder.ActionPasswordRecovery
	}
	secret, err := signer.Verify(rest[0], action, code)
	if err != nil {
		fmt.Fprintf(stdout, "invalid %s token: %v\n", action, err)
		return exitFailure
	}
	fmt.Fprintf(stdout, "valid %s token; secret %x\n", action, secret)
	return exitOK
}

func subscribe(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tailer subscribe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	durable := fs.String("durable", "", "durable consumer name (created if missing); required")
	format := fs.String("format", "line", "output: line (collector lines) or json")
	perLine := fs.Int("max-tokens-per-line", 0, "split a batch into lines of at most N tokens (the mailroom sender holds 10); 0 keeps one line per batch")
	fromStart := fs.Bool("from-start", false, "a new consumer starts at the stream's first message instead of the next one")
	action := fs.String("filter-action", "", "only tokens of this action: activation or password_recovery")
	window := fs.Int("dedup-window", 0, "drop tokens whose key (a hash of the secret, never reused) was among the last N written (0: off); with stdout a file, also those at its end")
	ackWait := fs.Duration("ack-wait", 30*time.Second, "how long the server waits for an ack before redelivering, for a new consumer")
	// The shared settings come after the subscriber's own flags.
	var own, shared []string
	for i := 0; i < len(args); i++ {
		if args[i] == "-h" || args[i] == "--help" || args[i] == "-help" {
			// Both sets of flags: the subscriber's own, then the shared
			// settings it reads.
			own = []string{"-h"}
			break
		}
		name := strings.TrimLeft(strings.SplitN(args[i], "=", 2)[0], "-")
		if f := fs.Lookup(name); f != nil && strings.HasPrefix(args[i], "-") {
			own = append(own, args[i])
			if _, isBool := f.Value.(interface{ IsBoolFlag() bool }); !strings.Contains(args[i], "=") && !isBool && i+1 < len(args) {
				i++
				own = append(own, args[i])
			}
			continue
		}
		shared = append(shared, args[i])
	}
	if err := fs.Parse(own); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			config.Load("tailer subscribe --durable NAME [options]", subVars, []string{"-h"}, getenv, stderr)
			return exitOK
		}
		return exitConfig
	}
	cfg, _, code := loadConfig("subscribe --durable NAME [options]", subVars, shared, getenv, stderr)
	if cfg == nil {
		return code
	}
	bad := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "tailer subscribe: "+format+"\n", a...)
		return exitConfig
	}
	switch {
	case *durable == "" || strings.ContainsAny(*durable, " \t.*>"):
		return bad("--durable: a consumer name without spaces, '.', '*' or '>' is required, got %q", *durable)
	case *format != "line" && *format != "json":
		return bad("--format: must be line or json, got %q", *format)
	case *perLine < 0:
		return bad("--max-tokens-per-line: must be >= 0, got %d", *perLine)
	case *action != "" && *action != "activation" && *action != "password_recovery":
		return bad("--filter-action: must be activation or password_recovery, got %q", *action)
	case *window < 0:
		return bad("--dedup-window: must be >= 0, got %d", *window)
	case *ackWait < time.Second:
		return bad("--ack-wait: must be at least 1s, got %s", *ackWait)
	}
	log := daemon.NewLogger("text", "info", stderr)
	sub := &consume.Subscriber{
		Stream: cfg.Stream, Subject: cfg.Subject, Durable: *durable, FromStart: *fromStart,
		Action: *action, JSON: *format == "json", MaxTokensPerLine: *perLine, Out: stdout, Log: log,
		AckWait: *ackWait,
	}
	if *window > 0 {
		sub.Dedup = consume.NewDedup[string](*window)
		if f, ok := stdout.(*os.File); ok {
			if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
				// Reopened for reading: the tokens a killed run wrote but
				// could not acknowledge are at the end of this file.
				if r, err := os.Open("/proc/self/fd/1"); err == nil {
					err = consume.SeedFromOutput(r, st.Size(), sub.Dedup)
					r.Close()
					if err != nil {
						log.Warn("cannot read earlier output", "err", err)
					}
				}
			}
		}
	}
	url := cfg.NATSURL
	if url == "" {
		url = nats.DefaultURL
	}
	nc, err := nats.Connect(url, append(cfg.NATSOptions(), nats.Name("tailer subscribe"), nats.MaxReconnects(-1))...)
	if err != nil {
		fmt.Fprintf(stderr, "tailer subscribe: MAILROOM_NATS_URL: cannot connect to %s: %v\n", config.RedactURL(url), err)
		return exitConfig
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		fmt.Fprintf(stderr, "tailer subscribe: %v\n", err)
		return exitFailure
	}
	if err := sub.Run(ctx, js); err != nil {
		log.Error("subscribe failed", "err", err)
		return exitFailure
	}
	return exitOK
}
