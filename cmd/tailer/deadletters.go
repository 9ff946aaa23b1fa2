package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/mailroom/tailer/cmd/internal/config"
	"github.com/mailroom/tailer/cmd/internal/natsconn"
	"github.com/mailroom/tailer/publish/subscriber"
)

func (x *cli) deadLettersCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "dead-letters",
		Short: "list or re-send the batches a durable's senders kept failing on",
		Long: `The batches set aside for a durable once --max-deliveries senders failed
with them: list them, or deliver them again, once each.`,
		Args: func(c *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef("unknown command %q for %q: give list or resend", args[0], c.CommandPath())
			}
			return nil
		},
		RunE: func(c *cobra.Command, _ []string) error {
			return usagef("give list or resend (tailer dead-letters --help)")
		},
	}
	list := &cobra.Command{
		Use:   "list --durable NAME",
		Short: "the batches set aside for durable NAME: where they came from, how many senders failed on them, and why",
	}
	durable := list.Flags().String("durable", "", "the durable consumer whose dead letters to list; required")
	load := x.settings(list, subVars, false)
	resend := &cobra.Command{
		Use:   "resend --durable NAME",
		Short: "deliver them again, once each, as tailer subscribe would (to the standard output, or --exec a sender), and remove each once done",
	}
	f, loadResend := x.bindSubscribe(resend)
	c.AddCommand(x.leaf(list, func(c *cobra.Command, _ []string) int {
		cfg, err := load()
		if err != nil {
			return exitConfig
		}
		return listDeadLetters(c.Context(), cfg, *durable, x.stdout, x.stderr)
	}), x.leaf(resend, func(c *cobra.Command, _ []string) int {
		cfg, err := loadResend()
		if err != nil {
			return exitConfig
		}
		return subscribeAs(c.Context(), c.CommandPath(), f, cfg, x.stdout, x.stderr)
	}))
	return c
}

// listDeadLetters prints the dead letters of durable.
func listDeadLetters(ctx context.Context, cfg *config.Config, durable string, stdout, stderr io.Writer) int {
	if durable == "" {
		fmt.Fprintln(stderr, "tailer dead-letters list: --durable: the consumer whose dead letters to list is required")
		return exitConfig
	}
	url := natsconn.URL(cfg)
	nc, err := nats.Connect(url, append(cfg.NATSOptions(), nats.Name("tailer dead-letters"))...)
	if err != nil {
		fmt.Fprintf(stderr, "tailer dead-letters list: cannot connect to NATS at %s (%s): %v\n", config.RedactURL(url), natsconn.Source(cfg), err)
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
	list, err := subscriber.ListDeadLetters(ctx, js, cfg.Stream, durable)
	if err != nil {
		fmt.Fprintf(stderr, "tailer dead-letters list: %v\n", err)
		return exitFailure
	}
	if len(list) == 0 && noSuchConsumer(ctx, js, cfg.Stream, durable) {
		fmt.Fprintf(stderr, "tailer dead-letters list: stream %s has no consumer %s and no dead letters of it: check --durable (nats consumer ls %s lists them)\n", cfg.Stream, durable, cfg.Stream)
		return exitConfig
	}
	for _, l := range list {
		fmt.Fprintf(stdout, "%d\t%s\t%s seq %d batch %d\t%d tokens\t%d deliveries\t%s\n",
			l.At, l.Time.UTC().Format(time.RFC3339), l.Stream, l.Seq, l.Batch, l.Tokens, l.Deliveries, l.Reason)
	}
	fmt.Fprintf(stderr, "%d dead letters of durable %s on stream %s\n", len(list), durable, subscriber.DeadStream(cfg.Stream))
	return exitOK
}

// removeResent removes the dead letters the resend consumer has
// acknowledged, and says how many are left.
func removeResent(ctx context.Context, js jetstream.JetStream, stream, durable string, resend jetstream.Consumer, log *slog.Logger) error {
	if resend == nil {
		return nil
	}
	removed, left, err := subscriber.RemoveResent(ctx, js, stream, durable, resend)
	if err != nil {
		return err
	}
	if left > 0 {
		log.Warn("dead letters left: not delivered by this resend (set aside after it drained, or unreadable); tailer dead-letters list shows them", "removed", removed, "left", left)
		return nil
	}
	log.Info("dead letters delivered and removed", "removed", removed, "left", left)
	return nil
}

// noSuchConsumer reports whether the server says stream has no consumer
// durable (an error that is not that says nothing).
func noSuchConsumer(ctx context.Context, js jetstream.JetStream, stream, durable string) bool {
	_, err := js.Consumer(ctx, stream, durable)
	return errors.Is(err, jetstream.ErrConsumerNotFound)
}
