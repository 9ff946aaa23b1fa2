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
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/cmd/internal/config"
	"github.com/mailroom/tailer/cmd/internal/daemon"
	"github.com/mailroom/tailer/cmd/internal/subscriber"
	"github.com/mailroom/tailer/publish/consume"
)

func subscribe(ctx context.Context, args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) int {
	return subscribeAs(ctx, "subscribe", args, lookupEnv, stdout, stderr)
}

// subscribeAs is tailer subscribe, or, as "dead-letters resend", the same
// reading a durable's dead letters until none is left.
func subscribeAs(ctx context.Context, command string, args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) int {
	resend := command == "dead-letters resend"
	fs := flag.NewFlagSet("tailer "+command, flag.ContinueOnError)
	fs.SetOutput(stderr)
	durable := fs.String("durable", "", "durable consumer name (created if missing); required")
	format := fs.String("format", "line", "output: line (collector lines) or json")
	perLine := fs.Int("max-tokens-per-line", 0, "split a batch into lines of at most N tokens (the mailroom sender holds 10); 0 keeps one line per batch")
	fromStart := fs.Bool("from-start", false, "a new consumer starts at the stream's first message instead of the next one")
	action := fs.String("filter-action", "", "only tokens of this action: activation or password_recovery")
	window := fs.Int("dedup-window", 0, "drop tokens whose key (a hash of the secret, never reused) was among the last N written (0: off); with stdout a file, also those at its end")
	ackWait := fs.Duration("ack-wait", 30*time.Second, "how long the server waits for an ack before redelivering, for a new consumer")
	execCmd := fs.String("exec", "", "start this command (sh -c) as the sender, its standard input the lines; start it again when it exits, giving it what it had not finished; on SIGTERM close its input once it has taken all of it")
	reports := fs.Bool("reports", false, "with --exec: the sender writes each line it finished, as it was given, to file descriptor 3 (MAILROOM_REPORT_FD); only reported lines are done, so it may read ahead as far as it likes")
	doneExit := fs.String("done-exit", "0", "with --exec: exit codes that mean the sender finished what it was given, when it exits after the end of its input (the mailroom sender: 0,1)")
	transientExit := fs.String("transient-exit", "75", "with --exec: exit codes that mean the sender could not work for a reason not the batch's (75: EX_TEMPFAIL); they count no delivery against it")
	maxDeliveries := fs.Int("max-deliveries", 5, "set a batch aside on the dead-letter stream once this many senders failed with it taken and not finished (0: never)")
	stall := fs.Duration("stall-timeout", 2*time.Minute, "/readyz fails once the sender has had lines waiting this long without taking or finishing any (0: never)")
	stopTimeout := fs.Duration("stop-timeout", 30*time.Second, "with --exec: how long a stopping subscriber waits for the sender to finish its input before stopping its process group")
	pinnedTTL := fs.Duration("pinned-ttl", 10*time.Second, "for a new consumer: the subscriber it delivers to (one at a time) hands over to a standby once it has not asked for messages this long")
	healthAddr := fs.String("health-addr", "", "serve /healthz, /readyz (consuming, the server answers for the consumer, the sender not stalled; says active or standby) and /metrics on this address, for tailer health --http-addr; empty: none")
	into := fs.String("into", "", "store the tokens in the database at MAILROOM_INBOX_URL, exactly once, instead of writing lines: inbox (table mailroom_inbox) or river (River jobs of kind mailroom_token)")
	migrateInto := fs.Bool("migrate", false, "with --into: first make the inbox table (inbox), or apply River's migrations (river)")
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
			config.Load("tailer "+command+" --durable NAME [options]", subVars, []string{"-h"}, lookupEnv, stderr)
			return exitOK
		}
		return exitConfig
	}
	cfg, _, code := loadConfig(command+" --durable NAME [options]", subVars, shared, lookupEnv, stderr)
	if cfg == nil {
		return code
	}
	bad := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "tailer "+command+": "+format+"\n", a...)
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
	case *into != "" && *into != "inbox" && *into != "river":
		return bad("--into: must be inbox or river, got %q", *into)
	case *into != "" && cfg.InboxURL == "":
		return bad("--into %s: MAILROOM_INBOX_URL (--inbox-url) names the database to store into; it is not set", *into)
	case *into != "" && (*execCmd != "" || *format != "line" || *perLine != 0 || *window != 0):
		return bad("--into stores tokens in a database: --exec, --format, --max-tokens-per-line and --dedup-window are for lines")
	case resend && *into != "":
		return bad("--into: dead letters come from senders; re-send them to one (--exec, or the standard output)")
	case *into == "" && *migrateInto:
		return bad("--migrate: only with --into")
	case *execCmd == "" && *reports:
		return bad("--reports: only with --exec (the sender gets the descriptor to report on)")
	case *maxDeliveries < 0:
		return bad("--max-deliveries: must be >= 0, got %d", *maxDeliveries)
	case *stall < 0 || *stopTimeout < time.Second || *pinnedTTL < 2*time.Second:
		return bad("--stall-timeout must be >= 0, --stop-timeout at least 1s and --pinned-ttl at least 2s")
	}
	done, err := exitCodes(*doneExit)
	if err != nil {
		return bad("--done-exit: %v", err)
	}
	transient, err := exitCodes(*transientExit)
	if err != nil {
		return bad("--transient-exit: %v", err)
	}
	log := daemon.NewLogger("text", "info", stderr)
	var resent []uint64
	url := cfg.NATSURL
	if url == "" {
		url = nats.DefaultURL
	}
	nc, err := nats.Connect(url, append(cfg.NATSOptions(), nats.Name("tailer subscribe"), nats.MaxReconnects(-1))...)
	if err != nil {
		fmt.Fprintf(stderr, "tailer %s: MAILROOM_NATS_URL: cannot connect to %s: %v\n", command, config.RedactURL(url), err)
		return exitConfig
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		fmt.Fprintf(stderr, "tailer %s: %v\n", command, err)
		return exitFailure
	}
	if *into != "" {
		durable := consume.Durable{Stream: cfg.Stream, Subject: cfg.Subject, Name: *durable, FromStart: *fromStart, Action: *action, AckWait: *ackWait}
		return subscribeInto(ctx, cfg, *into, *migrateInto, durable, js, *healthAddr, stderr, log)
	}
	sub := &consume.Subscriber{
		Stream: cfg.Stream, Subject: cfg.Subject, Durable: *durable, FromStart: *fromStart,
		Action: *action, JSON: *format == "json", MaxTokensPerLine: *perLine, Out: stdout, Log: log,
		AckWait: *ackWait, Reports: *reports, MaxDeliveries: *maxDeliveries, Pinned: true, PinnedTTL: *pinnedTTL,
	}
	if resend {
		// The durable's dead letters, through a consumer of their own, once
		// each, until none is left.
		sub.Stream, sub.Subject = consume.DeadStream(cfg.Stream), consume.DeadSubject(cfg.Stream, *durable)
		sub.Durable, sub.FromStart, sub.UntilDrained, sub.Pinned = *durable+"-resend", true, true, false
		*maxDeliveries, sub.MaxDeliveries = 0, 0
		var mu sync.Mutex
		sub.OnAck = func(seq uint64) { mu.Lock(); resent = append(resent, seq); mu.Unlock() }
	}
	if sub.Progress, err = consume.OpenProgress(ctx, js, cfg.Stream, sub.Durable); err != nil {
		log.Error("subscribe failed: the subscriber keeps which batches are done in a key-value bucket beside the stream; allow it to make and use the bucket", "err", err)
		return exitFailure
	}
	if *maxDeliveries > 0 {
		dl, err := consume.OpenDeadLetters(ctx, js, cfg.Stream, *durable)
		if err != nil {
			log.Error("subscribe failed: allow the subscriber to make and publish to the dead-letter stream, or run it with --max-deliveries 0", "err", err)
			return exitFailure
		}
		sub.DeadLetters = dl
	}
	// A reader gone is an error to handle (its batches handed back), not
	// a signal that ends the process before it can.
	signal.Ignore(syscall.SIGPIPE)
	if f, ok := stdout.(*os.File); ok && *execCmd == "" {
		pipe, _ := consume.OpenPipe(f)
		sub.SetOut(stdout, pipe)
	}
	if *window > 0 {
		sub.Dedup = consume.NewDedup[string](*window)
		if f, ok := stdout.(*os.File); ok && *execCmd == "" {
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
	if *healthAddr != "" {
		probe := &subscriber.Probe{Stream: cfg.Stream, Durable: *durable, JS: js, Consuming: sub.Consuming, Stats: sub.Stats}
		if *stall > 0 {
			probe.Stalled = func() bool { return sub.Stalled(*stall) }
		}
		stop, err := subscriber.Serve(*healthAddr, probe)
		if err != nil {
			return bad("--health-addr: %v", err)
		}
		defer stop()
	}
	if *execCmd != "" {
		sender := &subscriber.Sender{Command: *execCmd, Reports: *reports, DoneExit: done, TransientExit: transient,
			StopTimeout: *stopTimeout, Stdout: stdout, Stderr: stderr, Log: log}
		err = sender.Run(ctx, sub, js)
		stopped(sub, js, log)
	} else {
		err = sub.Run(ctx, js)
		outcome := consume.ReaderStopped
		if errors.Is(err, consume.ErrReaderGone) {
			outcome = consume.ReaderFailed
		}
		if n := sub.Settle(context.Background(), outcome); n > 0 {
			log.Info("lines the reader may not have finished are delivered again", "messages", n)
		}
	}
	unpin, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	sub.Unpin(unpin, js)
	if resend && err == nil {
		err = purgeResent(unpin, js, cfg.Stream, *durable, resent, log)
	}
	cancel()
	if st := sub.Stats(); st.Redelivered > 0 {
		log.Info("messages delivered more than once", "messages", st.Redelivered, "batches_done_before", st.Skipped)
	}
	switch {
	case errors.Is(err, consume.ErrReaderGone):
		log.Error("the reader of the lines is gone", "err", err)
		return exitFailure
	case errors.Is(err, consume.ErrTakenOver):
		log.Error("another subscriber of the durable delivers now; this one stops (start it again to stand by)", "err", err)
		return exitFailure
	case err != nil:
		log.Error("subscribe failed", "err", err)
		return exitFailure
	}
	return exitOK
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
func stopped(sub *consume.Subscriber, js jetstream.JetStream, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cons, err := js.Consumer(ctx, sub.Stream, sub.Durable)
	var info *jetstream.ConsumerInfo
	if err == nil {
		info, err = cons.Info(ctx)
	}
	switch {
	case err != nil:
		log.Warn("stopping: cannot ask the server what is still unacknowledged; whatever is comes again", "durable", sub.Durable, "err", err)
	case info.NumAckPending > 0:
		log.Info("stopping: the server awaits acks for messages it will deliver to the next subscriber, without the batches recorded done", "durable", sub.Durable, "messages", info.NumAckPending)
	}
}
