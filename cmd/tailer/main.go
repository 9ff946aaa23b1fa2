package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/mailroom/tailer/cmd/internal/config"
	"github.com/mailroom/tailer/cmd/internal/daemon"
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
  tailer subscribe  print published batches, one line each, or feed them to a sender
  tailer dead-letters  list or re-send the batches a durable's senders kept failing on
  tailer nats-metrics  export the NATS servers' view of the stream, consumers and cluster to Prometheus
  tailer version    print the version and commit (also --version)

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
	os.Exit(run(os.Args[1:], os.LookupEnv, os.Stdout, os.Stderr))
}

// Each command's settings, from config.Vars (a setting names its commands
// there).
var (
	runVars     = config.For(config.Run)
	resyncVars  = config.For(config.Resync)
	migrateVars = resyncVars
	statusVars  = config.For(config.Status)
	verifyVars  = config.For(config.Verify)
	healthVars  = config.For(config.Health)
	subVars     = config.For(config.Subscribe)
)

func run(args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, usage)
		if len(args) == 0 {
			return exitConfig
		}
		return exitOK
	}
	if args[0] == "version" || args[0] == "--version" || args[0] == "-version" {
		return printVersion(stdout)
	}
	cmd, rest := args[0], args[1:]
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	switch cmd {
	case "run":
		cfg, _, code := loadKeyedConfig("run", runVars, rest, lookupEnv, stderr)
		if cfg == nil {
			return code
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
		tracing, err := daemon.NewTracing(lookupEnv)
		if err != nil {
			fmt.Fprintf(stderr, "tailer run: %v\n", err)
			return exitConfig
		}
		defer tracing.Shutdown()
		d := daemon.New(cfg, log)
		d.Tracer = tracing.Tracer
		if err := d.Run(ctx); err != nil {
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
		return migrate(ctx, rest, lookupEnv, stdout, stderr)
	case "resync":
		return resyncCmd(ctx, rest, lookupEnv, stderr)
	case "status":
		return status(ctx, rest, lookupEnv, stdout, stderr)
	case "health":
		return health(ctx, rest, lookupEnv, stdout, stderr)
	case "verify":
		return verify(rest, lookupEnv, stdout, stderr)
	case "subscribe":
		return subscribe(ctx, rest, lookupEnv, stdout, stderr)
	case "dead-letters":
		return deadLetters(ctx, rest, lookupEnv, stdout, stderr)
	case "nats-metrics":
		return natsMetrics(ctx, rest, stderr)
	}
	fmt.Fprintf(stderr, "tailer: unknown command %q\n\n%s", cmd, usage)
	return exitConfig
}

// loadKeyedConfig is loadConfig for a command that signs or verifies: a
// missing signing key is its configuration error.
func loadKeyedConfig(usage string, vars, args []string, lookupEnv func(string) (string, bool), stderr io.Writer) (*config.Config, []string, int) {
	load := loadConfig
	if strings.HasSuffix(usage, " TOKEN") {
		load = loadConfigArgs
	}
	cfg, rest, code := load(usage, vars, args, lookupEnv, stderr)
	if cfg == nil {
		return nil, nil, code
	}
	if err := cfg.RequireKey(); err != nil {
		name, _, _ := strings.Cut(usage, " ")
		fmt.Fprintf(stderr, "tailer %s: %v\n", name, err)
		return nil, nil, exitConfig
	}
	return cfg, rest, exitOK
}

// loadConfig reads the settings of a command that takes no arguments but
// its flags: one left over (a typo, a word meant for another command) is
// the one-line configuration error, exit 2, naming it. It returns a nil
// Config with the exit code when the command must not go on: after --help
// (0), or after printing the one-line configuration error (2).
func loadConfig(usage string, vars, args []string, lookupEnv func(string) (string, bool), stderr io.Writer) (*config.Config, []string, int) {
	cfg, rest, code := loadConfigArgs(usage, vars, args, lookupEnv, stderr)
	if cfg != nil && len(rest) > 0 {
		name, _, _ := strings.Cut(usage, " ")
		fmt.Fprintf(stderr, "tailer %s: unexpected argument %q: usage: tailer %s (tailer %s --help lists the flags)\n", name, rest[0], usage, name)
		return nil, nil, exitConfig
	}
	return cfg, rest, code
}

// loadConfigArgs is loadConfig for a command that takes arguments: it
// returns them.
func loadConfigArgs(usage string, vars, args []string, lookupEnv func(string) (string, bool), stderr io.Writer) (*config.Config, []string, int) {
	cfg, rest, err := config.Load("tailer "+usage, vars, args, lookupEnv, stderr)
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

// connectError is err of a connection to MAILROOM_DATABASE_URL, as a
// configuration error (exit 2, one line) when only the operator can fix it:
// a password or user refused, a database that does not exist, a TLS
// certificate not accepted.
func connectError(err error) error {
	if cerr := daemon.StartupConfigError(err); cerr != nil {
		return cerr
	}
	return fmt.Errorf("connect to PostgreSQL: %w", err)
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
