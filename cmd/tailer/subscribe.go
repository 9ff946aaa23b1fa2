package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/cmd/internal/config"
	"github.com/mailroom/tailer/cmd/internal/daemon"
	"github.com/mailroom/tailer/publish/consume"
)

func subscribe(ctx context.Context, args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tailer subscribe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	durable := fs.String("durable", "", "durable consumer name (created if missing); required")
	format := fs.String("format", "line", "output: line (collector lines) or json")
	perLine := fs.Int("max-tokens-per-line", 0, "split a batch into lines of at most N tokens (the mailroom sender holds 10); 0 keeps one line per batch")
	fromStart := fs.Bool("from-start", false, "a new consumer starts at the stream's first message instead of the next one")
	action := fs.String("filter-action", "", "only tokens of this action: activation or password_recovery")
	window := fs.Int("dedup-window", 0, "drop tokens whose key (a hash of the secret, never reused) was among the last N written (0: off); with stdout a file, also those at its end")
	ackWait := fs.Duration("ack-wait", 30*time.Second, "how long the server waits for an ack before redelivering, for a new consumer")
	execCmd := fs.String("exec", "", "start this command (sh -c) as the sender, its standard input the lines; restart it when it exits, giving it again what it had not done with; on SIGTERM close its input once it has taken all of it, and acknowledge if it exits 0")
	healthAddr := fs.String("health-addr", "", "serve /healthz and /readyz (consuming, and the server answers for the consumer) on this address, for tailer health --http-addr; empty: none")
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
			config.Load("tailer subscribe --durable NAME [options]", subVars, []string{"-h"}, lookupEnv, stderr)
			return exitOK
		}
		return exitConfig
	}
	cfg, _, code := loadConfig("subscribe --durable NAME [options]", subVars, shared, lookupEnv, stderr)
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
	case *into != "" && *into != "inbox" && *into != "river":
		return bad("--into: must be inbox or river, got %q", *into)
	case *into != "" && cfg.InboxURL == "":
		return bad("--into %s: MAILROOM_INBOX_URL (--inbox-url) names the database to store into; it is not set", *into)
	case *into != "" && (*execCmd != "" || *format != "line" || *perLine != 0 || *window != 0):
		return bad("--into stores tokens in a database: --exec, --format, --max-tokens-per-line and --dedup-window are for lines")
	case *into == "" && *migrateInto:
		return bad("--migrate: only with --into")
	}
	log := daemon.NewLogger("text", "info", stderr)
	sub := &consume.Subscriber{
		Stream: cfg.Stream, Subject: cfg.Subject, Durable: *durable, FromStart: *fromStart,
		Action: *action, JSON: *format == "json", MaxTokensPerLine: *perLine, Out: stdout, Log: log,
		AckWait: *ackWait,
	}
	// A reader gone is an error to handle (its messages handed back), not
	// a signal that ends the process before it can.
	signal.Ignore(syscall.SIGPIPE)
	if f, ok := stdout.(*os.File); ok && *execCmd == "" {
		sub.Pipe, _ = consume.OpenPipe(f)
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
	if *into != "" {
		durable := consume.Durable{Stream: cfg.Stream, Subject: cfg.Subject, Name: *durable, FromStart: *fromStart, Action: *action, AckWait: *ackWait}
		return subscribeInto(ctx, cfg, *into, *migrateInto, durable, js, *healthAddr, stderr, log)
	}
	if *healthAddr != "" {
		stop, err := serveSubscriberHealth(*healthAddr, sub.Consuming, sub.Stream, sub.Durable, js)
		if err != nil {
			return bad("--health-addr: %v", err)
		}
		defer stop()
	}
	if *execCmd != "" {
		return runSender(ctx, sub, js, *execCmd, stdout, stderr, log)
	}
	err = sub.Run(ctx, js)
	if n := sub.Settle(context.Background(), false); n > 0 {
		log.Info("lines the reader may not have done with are delivered again", "messages", n)
	}
	if sub.Redelivered > 0 {
		log.Info("messages delivered more than once", "messages", sub.Redelivered)
	}
	if errors.Is(err, consume.ErrReaderGone) {
		log.Error("the reader of the lines is gone", "err", err)
		return exitFailure
	}
	if err != nil {
		log.Error("subscribe failed", "err", err)
		return exitFailure
	}
	return exitOK
}

// senderStopTimeout bounds how long a stopping subscriber waits for its
// sender to finish the lines it was given.
const senderStopTimeout = 30 * time.Second

// runSender runs the sender command with the lines on its standard input,
// restarting it whenever it exits and handing back what it may not have
// done with, until ctx is done: then its input is closed once it has taken
// all of it, and what it was given is acknowledged if it saw the end and
// exits 0.
func runSender(ctx context.Context, sub *consume.Subscriber, js jetstream.JetStream, command string, stdout, stderr io.Writer, log *slog.Logger) int {
	for restart := time.Duration(0); ; {
		acked := sub.Acked
		r, w, err := os.Pipe()
		if err != nil {
			log.Error("subscribe failed", "err", fmt.Errorf("pipe to the sender: %w", err))
			return exitFailure
		}
		cmd := exec.Command("sh", "-c", command)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = r, stdout, stderr
		if err := cmd.Start(); err != nil {
			r.Close()
			w.Close()
			log.Error("subscribe failed", "err", fmt.Errorf("start the sender: %w", err))
			return exitFailure
		}
		r.Close()
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		sub.Out = w
		sub.Pipe, _ = consume.OpenPipe(w)
		err = sub.Run(ctx, js)
		if ctx.Err() != nil {
			// Stopping: the sender gets the end of its input and finishes.
			// Its exit 0 says it did what it was given only if it read all
			// of it and was still there to see the end: a sender that
			// exited 0 on its own (head -n K) left the lines still in the
			// pipe, or the ones it read ahead, undone.
			stop, cancel := context.WithTimeout(context.Background(), senderStopTimeout)
			sawEnd := sub.Pipe.Taken(stop) == nil && !sub.Pipe.Gone()
			w.Close()
			var code error
			select {
			case code = <-exited:
			case <-stop.Done():
				cmd.Process.Kill()
				code = <-exited
			}
			cancel()
			sub.Settle(context.Background(), sawEnd && code == nil)
			if !sawEnd || code != nil {
				log.Info("stopping: the sender did not read to the end of its input and exit 0", "exit", code)
			}
			return stopped(sub, js, log)
		}
		w.Close()
		if !errors.Is(err, consume.ErrReaderGone) {
			cmd.Process.Kill()
			<-exited
			sub.Settle(context.Background(), false)
			log.Error("subscribe failed", "err", err)
			return exitFailure
		}
		code := <-exited
		n := sub.Settle(context.Background(), false)
		// A sender that got through a message is started again at once;
		// one that did not (a wrong command, say) is given time.
		if sub.Acked > acked {
			restart = 0
		} else {
			restart = min(max(2*restart, 250*time.Millisecond), 10*time.Second)
		}
		log.Warn("the sender exited: starting it again, with the lines it may not have done with", "exit", code, "messages_again", n, "in", restart)
		select {
		case <-ctx.Done():
			return stopped(sub, js, log)
		case <-time.After(restart):
		}
	}
}

// stopped says, as a subscriber with a sender stops, how many messages
// its consumer still awaits an ack for: they are delivered again to the
// next subscriber. Handed back by a sender that exited before the stop,
// pulled but never written, or written to a sender that did not finish:
// asking the server counts them all.
func stopped(sub *consume.Subscriber, js jetstream.JetStream, log *slog.Logger) int {
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
		log.Info("stopping: lines a sender may not have done with are delivered again", "durable", sub.Durable, "messages", info.NumAckPending)
	}
	return exitOK
}

// serveSubscriberHealth serves /healthz (the process answers) and /readyz:
// the subscriber is bound to its consumer (a sender between two starts is
// not) and the server answers for that consumer now, so a NATS outage or a
// deleted consumer shows.
func serveSubscriberHealth(addr string, consuming func() bool, stream, durable string, js jetstream.JetStream) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if !consuming() {
			http.Error(w, "not ready: not consuming", http.StatusServiceUnavailable)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		c, err := js.Consumer(ctx, stream, durable)
		if err == nil {
			var info *jetstream.ConsumerInfo
			if info, err = c.Info(ctx); err == nil {
				fmt.Fprintf(w, "ready: consumer %s, %d pending, %d awaiting ack\n", durable, info.NumPending, info.NumAckPending)
				return
			}
		}
		http.Error(w, "not ready: consumer "+durable+": "+err.Error(), http.StatusServiceUnavailable)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	return func() { srv.Close() }, nil
}
