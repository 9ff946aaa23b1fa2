package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/mailroom/tailer/cmd/internal/config"
	"github.com/mailroom/tailer/cmd/internal/daemon"
	"github.com/mailroom/tailer/cmd/internal/natsconn"
	"github.com/mailroom/tailer/cmd/internal/subscribe"
	"github.com/mailroom/tailer/decoder/action"
	"github.com/mailroom/tailer/publish/subscriber"
)

func (x *cli) subscribeCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "subscribe --durable NAME",
		Short: "print published batches, one line each, feed them to a sender, or store them in a database",
		Long: `Read the stream through the durable consumer NAME and hand each batch on
once: as collector lines (or JSON) on the standard output, to a sender
it runs (--exec), or into a table of MAILROOM_INBOX_URL (--into). Several
subscribers on one durable stand by for each other: one delivers at a
time.`,
		Example: `  tailer subscribe --durable mailer --exec 'mailroom-sender' --reports --health-addr :9189
  tailer subscribe --durable inbox --into inbox --migrate`,
	}
	f, load := x.bindSubscribe(c)
	return x.leaf(c, func(c *cobra.Command, _ []string) int {
		cfg, err := load()
		if err != nil {
			return exitConfig
		}
		return subscribeAs(c.Context(), c.CommandPath(), f, cfg, x.stdout, x.stderr)
	})
}

// subscribeAs is tailer subscribe, or, as "tailer dead-letters resend",
// the same on a durable's dead letters until none is left.
func subscribeAs(ctx context.Context, command string, f *subscribeFlags, cfg *config.Config, stdout, stderr io.Writer) int {
	resend := command == "tailer dead-letters resend"
	bad := func(format string, a ...any) int {
		fmt.Fprintf(stderr, command+": "+format+"\n", a...)
		return exitConfig
	}
	if msg := f.check(cfg, resend); msg != "" {
		return bad("%s", msg)
	}
	done, err := exitCodes(f.doneExit)
	if err != nil {
		return bad("--done-exit: %v", err)
	}
	transient, err := exitCodes(f.transientExit)
	if err != nil {
		return bad("--transient-exit: %v", err)
	}
	log := daemon.NewLogger("text", "info", stderr)
	url := natsconn.URL(cfg)
	server := config.RedactURL(url)
	denials := &subscribe.Denials{Log: log}
	nc, err := nats.Connect(url, append(append(cfg.NATSOptions(), nats.Name("tailer subscribe"), nats.MaxReconnects(-1), nats.ErrorHandler(denials.Handler)),
		saysAway(log, server)...)...)
	if err != nil {
		fmt.Fprintf(stderr, "%s: cannot connect to NATS at %s (%s): %v\n", command, config.RedactURL(url), natsconn.Source(cfg), err)
		return exitConfig
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", command, err)
		return exitFailure
	}
	if f.into != "" {
		c := subscriber.Config{Stream: cfg.Stream, Subject: cfg.Subject, Durable: f.durable, FromStart: f.fromStart, Action: f.action, AckWait: f.ackWait, Log: log}
		return subscribeInto(ctx, cfg, f.into, f.migrate, c, js, f.healthAddr, denials, stderr, log)
	}
	sub, lines, err := f.subscriber(ctx, cfg, js, stdout, log, resend)
	if err != nil {
		log.Error("subscribe failed", "err", err)
		return exitFailure
	}
	defer sub.Close()
	denials.Watch(func() int { return sub.Stats().Acked })
	// A reader gone is an error to handle (its batches handed back), not
	// a signal that ends the process before it can.
	signal.Ignore(syscall.SIGPIPE)
	sender := &subscribe.Sender{Command: f.exec, Reports: f.reports, DoneExit: done, TransientExit: transient,
		StopTimeout: f.stopTimeout, Stdout: stdout, Stderr: stderr, Log: log, Once: resend}
	stop, err := f.watchReader(ctx, cfg, js, sub, lines, sender, denials, log)
	if err != nil {
		return bad("--health-addr: %v", err)
	}
	defer stop()
	if f.exec != "" {
		err = sender.Run(ctx, sub, lines, js)
		stopped(sub, js, log)
	} else {
		err = sub.Run(ctx, js)
		outcome := subscriber.ReaderStopped
		if errors.Is(err, subscriber.ErrReaderGone) {
			outcome = subscriber.ReaderFailed
		}
		if n := sub.ReaderEnded(context.Background(), outcome); n > 0 {
			log.Info("lines the reader may not have finished are delivered again", "messages", n)
		}
	}
	unpin, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	sub.Unpin(unpin, js)
	if resend && err == nil {
		err = removeResent(unpin, js, cfg.Stream, f.durable, sub.Consumer(), log)
	}
	return subscribeEnded(sub, err, log)
}

// watchReader serves the health endpoint (--health-addr) and says in the
// log when the reader stalls (--stall-timeout); stop ends both.
func (f *subscribeFlags) watchReader(ctx context.Context, cfg *config.Config, js jetstream.JetStream, sub *subscriber.Subscriber, lines *subscriber.Lines,
	sender *subscribe.Sender, denials *subscribe.Denials, log *slog.Logger) (stop func(), err error) {
	reader := func() string { return "the reader of the standard output" }
	if f.exec != "" {
		reader = sender.Name
	}
	stall := &subscribe.Stall{Reader: reader, Timeout: f.stall, Stalled: lines.Stalled}
	stopServing := func() {}
	if f.healthAddr != "" {
		probe := &subscribe.Probe{Stream: cfg.Stream, Durable: f.durable, JS: js, Server: config.RedactURL(natsconn.URL(cfg)), Consuming: sub.Consuming, Stats: sub.Stats, GroupStall: f.stall,
			Denied: denials.Denied}
		if f.stall > 0 {
			probe.Stalled = stall.Reason
		}
		if stopServing, err = subscribe.Serve(f.healthAddr, probe); err != nil {
			return nil, err
		}
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	if f.stall > 0 {
		go stall.Watch(watchCtx, log)
	}
	return func() { stopWatch(); stopServing() }, nil
}

// subscribeEnded says how the subscriber ended, err what Run returned,
// and returns the exit code.
func subscribeEnded(sub *subscriber.Subscriber, err error, log *slog.Logger) int {
	if st := sub.Stats(); st.Redelivered > 0 {
		log.Info("messages delivered more than once", "messages", st.Redelivered, "batches_done_before", st.Skipped)
	}
	switch {
	case errors.Is(err, subscriber.ErrReaderGone):
		log.Error("the reader of the lines is gone", "err", err)
		return exitFailure
	case errors.Is(err, subscribe.ErrSenderFailing):
		log.Error("stopped: what the sender had not finished stays where it was", "err", err)
		return exitFailure
	case err != nil:
		log.Error("subscribe failed", "err", err)
		return exitFailure
	}
	return exitOK
}

// subscribeFlags are tailer subscribe's own flags.
type subscribeFlags struct {
	durable, format, action, exec, doneExit, transientExit, healthAddr, into string
	perLine, window, maxDeliveries                                           int
	fromStart, reports, migrate                                              bool
	ackWait, stall, stopTimeout, pinnedTTL                                   time.Duration
}

// bindSubscribe adds the subscriber's own flags and its settings to c.
func (x *cli) bindSubscribe(c *cobra.Command) (*subscribeFlags, func() (*config.Config, error)) {
	var f subscribeFlags
	fs := c.Flags()
	fs.StringVar(&f.durable, "durable", "", "`name` of the durable consumer (made if missing); required")
	fs.StringVar(&f.format, "format", "line", "output: `line|json`, collector lines or a JSON object a batch")
	fs.IntVar(&f.perLine, "max-tokens-per-line", 0, "split a batch into lines of at most N tokens (the mailroom sender holds 10); 0 keeps one line per batch")
	fs.BoolVar(&f.fromStart, "from-start", false, "a new consumer starts at the stream's first message instead of the next one")
	fs.StringVar(&f.action, "filter-action", "", "only tokens of this `action`: "+strings.Join(action.Labels(), " or "))
	fs.IntVar(&f.window, "dedup-window", 0, "drop tokens whose key (a hash of the secret, never reused) was among the last N written (0: off); with stdout a file, also those at its end")
	fs.DurationVar(&f.ackWait, "ack-wait", subscriber.DefaultAckWait, "how long the server waits for an ack before redelivering, for a new consumer")
	fs.StringVar(&f.exec, "exec", "", "start this `command` (sh -c) as the sender, its standard input the lines; start it again when it exits, giving it what it had not finished; on SIGTERM close its input once it has taken all of it")
	fs.BoolVar(&f.reports, "reports", false, "with --exec: the sender writes each line it finished, as it was given, to file descriptor 3 (MAILROOM_REPORT_FD); only reported lines are done, so it may read ahead as far as it likes")
	fs.StringVar(&f.doneExit, "done-exit", "0", "with --exec: exit `codes` that mean the sender finished what it was given, when it exits after the end of its input (the mailroom sender: 0,1)")
	fs.StringVar(&f.transientExit, "transient-exit", "75", "with --exec: exit `codes` that mean the sender could not work for a reason not the batch's (75: EX_TEMPFAIL); they count no delivery against it")
	fs.IntVar(&f.maxDeliveries, "max-deliveries", 5, "set a batch aside on the dead-letter stream once this many senders failed with it taken and not finished (0: never)")
	fs.DurationVar(&f.stall, "stall-timeout", 2*time.Minute, "/readyz fails once the sender has had lines waiting this long without taking or finishing any, or the durable messages waiting this long with no subscriber of it delivering (0: never)")
	fs.DurationVar(&f.stopTimeout, "stop-timeout", 30*time.Second, "with --exec: how long a stopping subscriber waits for the sender to finish its input before stopping its process group")
	fs.DurationVar(&f.pinnedTTL, "pinned-ttl", 10*time.Second, "for a new consumer: the subscriber it delivers to (one at a time) hands over to a standby once it has not asked for messages this long")
	fs.StringVar(&f.healthAddr, "health-addr", "", "serve /healthz, /readyz (consuming, the server answers for the consumer, the sender not stalled; says active or standby) and /metrics on this `host:port`, for tailer health --http-addr; empty: none")
	fs.StringVar(&f.into, "into", "", "store the tokens in the database at MAILROOM_INBOX_URL, exactly once, instead of writing lines, as `inbox|river`: rows of the table mailroom_inbox, or River jobs of kind mailroom_token")
	fs.BoolVar(&f.migrate, "migrate", false, "with --into: first make the inbox table (inbox), or apply River's migrations (river)")
	return &f, x.settings(c, subVars, false)
}

// check says what is wrong with the flags, or "".
func (f *subscribeFlags) check(cfg *config.Config, resend bool) string {
	switch {
	case f.durable == "" || strings.ContainsAny(f.durable, " \t.*>"):
		return fmt.Sprintf("--durable: a consumer name without spaces, '.', '*' or '>' is required, got %q", f.durable)
	case f.format != "line" && f.format != "json":
		return fmt.Sprintf("--format: must be line or json, got %q", f.format)
	case f.perLine < 0:
		return fmt.Sprintf("--max-tokens-per-line: must be >= 0, got %d", f.perLine)
	case f.action != "" && !slices.Contains(action.Labels(), f.action):
		return fmt.Sprintf("--filter-action: must be %s, got %q", strings.Join(action.Labels(), " or "), f.action)
	case f.window < 0:
		return fmt.Sprintf("--dedup-window: must be >= 0, got %d", f.window)
	case f.ackWait < time.Second:
		return fmt.Sprintf("--ack-wait: must be at least 1s, got %s", f.ackWait)
	case f.into != "" && f.into != "inbox" && f.into != "river":
		return fmt.Sprintf("--into: must be inbox or river, got %q", f.into)
	case f.into != "" && cfg.InboxURL == "":
		return fmt.Sprintf("--into %s: MAILROOM_INBOX_URL (--inbox-url) names the database to store into; it is not set", f.into)
	case f.into != "" && (f.exec != "" || f.format != "line" || f.perLine != 0 || f.window != 0):
		return "--into stores tokens in a database: --exec, --format, --max-tokens-per-line and --dedup-window are for lines"
	case resend && f.into != "":
		return "--into: dead letters come from senders; re-send them to one (--exec, or the standard output)"
	case f.into == "" && f.migrate:
		return "--migrate: only with --into"
	case f.exec == "" && f.reports:
		return "--reports: only with --exec (the sender gets the descriptor to report on)"
	case f.maxDeliveries < 0:
		return fmt.Sprintf("--max-deliveries: must be >= 0, got %d", f.maxDeliveries)
	case f.stall < 0 || f.stopTimeout < time.Second || f.pinnedTTL < 2*time.Second:
		return "--stall-timeout must be >= 0, --stop-timeout at least 1s and --pinned-ttl at least 2s"
	}
	return ""
}

// subscriber makes the subscriber the flags describe, with its progress
// record and dead letters, writing to stdout unless a sender is run;
// resend: on the durable's dead letters.
func (f *subscribeFlags) subscriber(ctx context.Context, cfg *config.Config, js jetstream.JetStream, stdout io.Writer, log *slog.Logger, resend bool) (*subscriber.Subscriber, *subscriber.Lines, error) {
	lines := &subscriber.Lines{JSON: f.format == "json", MaxTokensPerLine: f.perLine, Out: stdout, Reports: f.reports, Log: log}
	c := subscriber.Config{
		Stream: cfg.Stream, Subject: cfg.Subject, Durable: f.durable, FromStart: f.fromStart, Action: f.action, Sink: lines, Log: log,
		AckWait: f.ackWait, MaxDeliveries: f.maxDeliveries, Pinned: true, PinnedTTL: f.pinnedTTL,
	}
	if resend {
		// The durable's dead letters, through a consumer of their own, once
		// each, until none is left.
		c.Stream, c.Subject = subscriber.DeadStream(cfg.Stream), subscriber.DeadSubject(cfg.Stream, f.durable)
		c.Durable, c.FromStart, c.UntilDrained = f.durable+"-resend", true, true
		c.MaxDeliveries = 0
	}
	var err error
	if c.Progress, err = subscriber.OpenProgress(ctx, js, cfg.Stream, c.Durable); err != nil {
		return nil, nil, fmt.Errorf("the subscriber keeps which batches are done in a key-value bucket beside the stream; allow it to make and use the bucket: %w", err)
	}
	if c.MaxDeliveries > 0 {
		dl, err := subscriber.OpenDeadLetters(ctx, js, cfg.Stream, f.durable)
		if err != nil {
			return nil, nil, fmt.Errorf("allow the subscriber to make and publish to the dead-letter stream, or run it with --max-deliveries 0: %w", err)
		}
		c.DeadLetters = dl
	}
	if out, ok := stdout.(*os.File); ok && f.exec == "" {
		pipe, _ := subscriber.OpenPipe(out)
		lines.SetOut(stdout, pipe)
	}
	if f.window > 0 {
		lines.Dedup = subscriber.NewDedup[string](f.window)
		if out, ok := stdout.(*os.File); ok && f.exec == "" {
			if st, err := out.Stat(); err == nil && st.Mode().IsRegular() {
				// Reopened for reading: the tokens a killed run wrote but
				// could not acknowledge are at the end of this file.
				if r, err := os.Open("/proc/self/fd/1"); err == nil {
					err = subscriber.SeedFromOutput(r, st.Size(), lines.Dedup)
					r.Close()
					if err != nil {
						log.Warn("cannot read earlier output", "err", err)
					}
				}
			}
		}
	}
	sub, err := subscriber.NewSubscriber(c)
	return sub, lines, err
}

// exitCodes parses a comma-separated list of exit codes.
func exitCodes(s string) ([]int, error) {
	var codes []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 0 || n > 255 {
			return nil, fmt.Errorf("%q is not an exit code (0-255)", f)
		}
		codes = append(codes, n)
	}
	return codes, nil
}

// stopped says, as a subscriber with a sender stops, how many messages
// its consumer still awaits an ack for: they are delivered again to the
// next subscriber, without the batches the record says are done.
func stopped(sub *subscriber.Subscriber, js jetstream.JetStream, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c := sub.Config()
	cons, err := js.Consumer(ctx, c.Stream, c.Durable)
	var info *jetstream.ConsumerInfo
	if err == nil {
		info, err = cons.Info(ctx)
	}
	switch {
	case err != nil:
		log.Warn("stopping: cannot ask the server what is still unacknowledged; whatever is comes again", "durable", c.Durable, "err", err)
	case info.NumAckPending > 0:
		log.Info("stopping: the server awaits acks for messages it will deliver to the next subscriber, without the batches recorded done", "durable", c.Durable, "messages", info.NumAckPending)
	}
}

// saysAway are the options that say at once when NATS goes away and when
// it is back (nothing else does while the server is away); not when this
// process closes the connection itself, at its end.
func saysAway(log *slog.Logger, server string) []nats.Option {
	return []nats.Option{
		nats.DisconnectErrHandler(func(c *nats.Conn, err error) {
			if !c.IsClosed() {
				log.Warn("NATS disconnected: nothing is delivered until it is back; reconnecting", "server", server, "err", err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			log.Warn("NATS reconnected: delivering again", "server", c.ConnectedUrlRedacted())
		}),
	}
}
