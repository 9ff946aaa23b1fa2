package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
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
