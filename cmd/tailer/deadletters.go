package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/cmd/internal/config"
	"github.com/mailroom/tailer/cmd/internal/natsconn"
	"github.com/mailroom/tailer/publish/consume"
)

const deadLettersUsage = `Usage:
  tailer dead-letters list --durable NAME
      the batches set aside for durable NAME: where they came from, how
      many senders failed on them, and why
  tailer dead-letters resend --durable NAME [tailer subscribe options]
      deliver them again, once each, as tailer subscribe would (to the
      standard output, or --exec a sender), and remove each once done
`

// deadLetters lists or re-sends a durable's dead letters.
func deadLetters(ctx context.Context, args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) int {
	if len(args) == 0 || (args[0] != "list" && args[0] != "resend") {
		fmt.Fprint(stderr, deadLettersUsage)
		return exitConfig
	}
	if args[0] == "resend" {
		return subscribeAs(ctx, "dead-letters resend", args[1:], lookupEnv, stdout, stderr)
	}
	fs := flag.NewFlagSet("tailer dead-letters list", flag.ContinueOnError)
	fs.SetOutput(stderr)
	durable := fs.String("durable", "", "the durable consumer whose dead letters to list; required")
	var own, shared []string
	for i := 1; i < len(args); i++ {
		if name := strings.TrimLeft(strings.SplitN(args[i], "=", 2)[0], "-"); name == "durable" && strings.HasPrefix(args[i], "-") {
			own = append(own, args[i])
			if !strings.Contains(args[i], "=") && i+1 < len(args) {
				i++
				own = append(own, args[i])
			}
			continue
		}
		shared = append(shared, args[i])
	}
	if err := fs.Parse(own); err != nil {
		return exitConfig
	}
	cfg, _, code := loadConfig("dead-letters list --durable NAME", subVars, shared, lookupEnv, stderr)
	if cfg == nil {
		return code
	}
	if *durable == "" {
		fmt.Fprintln(stderr, "tailer dead-letters list: --durable: the consumer whose dead letters to list is required")
		return exitConfig
	}
	url := natsconn.URL(cfg)
	nc, err := nats.Connect(url, append(cfg.NATSOptions(), nats.Name("tailer dead-letters"))...)
	if err != nil {
		fmt.Fprintf(stderr, "tailer dead-letters list: MAILROOM_NATS_URL: cannot connect to %s: %v\n", config.RedactURL(url), err)
		return exitConfig
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		fmt.Fprintf(stderr, "tailer dead-letters list: %v\n", err)
		return exitFailure
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	list, err := consume.ListDeadLetters(ctx, js, cfg.Stream, *durable)
	if err != nil {
		fmt.Fprintf(stderr, "tailer dead-letters list: %v\n", err)
		return exitFailure
	}
	if len(list) == 0 && noSuchConsumer(ctx, js, cfg.Stream, *durable) {
		fmt.Fprintf(stderr, "tailer dead-letters list: stream %s has no consumer %s and no dead letters of it: check --durable (nats consumer ls %s lists them)\n", cfg.Stream, *durable, cfg.Stream)
		return exitConfig
	}
	for _, l := range list {
		fmt.Fprintf(stdout, "%d\t%s\t%s seq %d batch %d\t%d tokens\t%d deliveries\t%s\n",
			l.At, l.Time.UTC().Format(time.RFC3339), l.Stream, l.Seq, l.Batch, l.Tokens, l.Deliveries, l.Reason)
	}
	fmt.Fprintf(stderr, "%d dead letters of durable %s on stream %s\n", len(list), *durable, consume.DeadStream(cfg.Stream))
	return exitOK
}

// purgeResent removes the dead letters a resend delivered: those its
// reader finished (a dead letter that cannot be read stays).
func purgeResent(ctx context.Context, js jetstream.JetStream, stream, durable string, resent []uint64, log *slog.Logger) error {
	name := consume.DeadStream(stream)
	st, err := js.Stream(ctx, name)
	if err != nil {
		return fmt.Errorf("dead-letter stream %s: %w", name, err)
	}
	for _, seq := range resent {
		if err := st.DeleteMsg(ctx, seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return fmt.Errorf("remove dead letter %d, re-sent: %w", seq, err)
		}
	}
	left, err := consume.CountDeadLetters(ctx, js, stream, durable)
	if err != nil {
		return err
	}
	log.Info("re-sent dead letters", "resent", len(resent), "left", left)
	return nil
}

// noSuchConsumer reports whether the server says stream has no consumer
// durable (an error that is not that says nothing).
func noSuchConsumer(ctx context.Context, js jetstream.JetStream, stream, durable string) bool {
	_, err := js.Consumer(ctx, stream, durable)
	return errors.Is(err, jetstream.ErrConsumerNotFound)
}
