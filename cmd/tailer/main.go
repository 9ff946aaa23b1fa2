package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/spf13/cobra"

	"github.com/mailroom/tailer/cmd/internal/config"
	"github.com/mailroom/tailer/cmd/internal/daemon"
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

// run is the tailer with args, the environment (lookupEnv, as
// os.LookupEnv) and its output: what main and the tests call.
func run(args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return execute(ctx, args, lookupEnv, stdout, stderr)
}

func (x *cli) runCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "run",
		Short: "stream tokens from the slot, sign them and publish batches",
		Long: `Stream the token inserts from the replication slot, join account data, cut
batches, sign each token and publish the batches to NATS JetStream,
confirming WAL positions to the slot once the stream acknowledged them.
With MAILROOM_NATS_URL unset it runs a NATS server of its own, its store
in MAILROOM_DATA_DIR.`,
	}
	load := x.settings(c, runVars, true)
	return x.leaf(c, func(c *cobra.Command, _ []string) int {
		cfg, err := load()
		if err != nil {
			return exitConfig
		}
		return runTailer(c.Context(), cfg, x.env, x.stderr)
	})
}

// runTailer is tailer run with its settings.
func runTailer(ctx context.Context, cfg *config.Config, lookupEnv func(string) (string, bool), stderr io.Writer) int {
	log := daemon.NewLogger(cfg.LogFormat, cfg.LogLevel, stderr)
	daemon.TuneRuntime()
	ended := make(chan struct{})
	defer close(ended)
	go func() {
		// A second signal means "now": skip the graceful drain.
		select {
		case <-ctx.Done():
		case <-ended:
			return
		}
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
		defer signal.Stop(sig)
		select {
		case <-sig:
			log.Warn("second signal: exiting at once")
			os.Exit(exitFailure)
		case <-ended:
		}
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
}

// connectError is err of a connection to MAILROOM_DATABASE_URL, as a
// configuration error (exit 2, one line) when only the operator can fix it:
// a password or user refused, a database that does not exist, a TLS
// certificate not accepted.
func connectError(err error, cfg *config.Config) error {
	if cerr := daemon.StartupConfigError(err, cfg); cerr != nil {
		return cerr
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		// Of each address tried, pgconn says one line: the last says why.
		lines := strings.Split(strings.TrimSpace(ce.Unwrap().Error()), "\n")
		why := strings.TrimSpace(lines[len(lines)-1])
		if i := strings.Index(why, "): "); i > 0 {
			why = why[i+3:]
		}
		return &unreachableError{fmt.Sprintf("cannot connect to PostgreSQL at %s:%d (MAILROOM_DATABASE_URL): %s; is the server up, and the URL's host and port its own?", ce.Config.Host, ce.Config.Port, why)}
	}
	return fmt.Errorf("connect to PostgreSQL: %w", err)
}

// unreachableError: PostgreSQL did not answer (down, or another host or
// port): one line, exit 1; the settings may well be right.
type unreachableError struct{ msg string }

func (e *unreachableError) Error() string { return e.msg }

// exitCode reports a command's failure: a configuration error as one line
// (exit 2), anything else logged (exit 1).
func exitCode(stderr io.Writer, cmd string, log *slog.Logger, err error) int {
	var cfgErr *config.Error
	if errors.As(err, &cfgErr) {
		fmt.Fprintf(stderr, "tailer %s: %v\n", cmd, cfgErr)
		return exitConfig
	}
	var down *unreachableError
	if errors.As(err, &down) {
		fmt.Fprintf(stderr, "tailer %s: %v\n", cmd, down)
		return exitFailure
	}
	log.Error("tailer "+cmd+" failed", "err", err)
	return exitFailure
}
