package main

// tailer audit: every eligible token of a window, by content, against the
// stream and what a durable delivered; --heal publishes what is missing.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/mailroom/tailer/cmd/internal/config"
	"github.com/mailroom/tailer/cmd/internal/daemon"
	"github.com/mailroom/tailer/cmd/internal/natsconn"
	"github.com/mailroom/tailer/publish/audit"
	"github.com/mailroom/tailer/publish/resync"
	"github.com/mailroom/tailer/publish/subscriber"
	"github.com/mailroom/tailer/publish/subscriber/inbox"
	"github.com/mailroom/tailer/publish/wire"
	"github.com/mailroom/tailer/replication"
)

// auditFlags are tailer audit's own flags.
type auditFlags struct {
	since, durable, into, lines string
	grace, wait                 time.Duration
	asJSON, heal, acknowledge   bool
}

func (x *cli) auditCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "audit",
		Short: "check by content that every token eligible in a window is on the stream (and in what a durable delivered); exit 1 naming the ids of any missing",
		Long: `Read the database from one snapshot and the stream from the window's start,
and compare them by token key: every token created in the window that was
eligible when the slot confirmed past it must be on the stream, once. With
--durable, every token of the messages that durable acknowledged must be in
what it delivered: --into inbox|river, the consumer's database; --lines
FILE, a pipe's output; neither, what its subscriber's record says done. Changes nothing, but with --heal, which publishes
once the missing tokens still eligible (a tailer run streaming from the
slot lets go of it meanwhile), and --acknowledge, which clears what tailer
run's audit found. Exit 0: nothing missing; 1: something missing, or the
audit could not finish (it says why); 2: bad input.`,
	}
	f := &auditFlags{}
	fs := c.Flags()
	fs.StringVar(&f.since, "since", "15m", "the window's start: a duration before now (15m, 24h) or an RFC 3339 time; its end is where the slot is confirmed, less --grace")
	fs.DurationVar(&f.grace, "grace", time.Minute, "how long after its creation a token's batch may have been cut: within it, a token's expiry, consumption or account change leaves it undecided")
	fs.DurationVar(&f.wait, "wait", 30*time.Second, "how long to wait for the slot to be confirmed past the audit's snapshot: until then a token the stream lacks is pending, not missing, unless its transaction ended before the slot's restart point")
	fs.StringVar(&f.durable, "durable", "", "also check what this durable consumer delivered: by its subscriber's record of the batches done (a pipe or --exec sender), or its output with --into or --lines")
	fs.StringVar(&f.into, "into", "", "the durable stores into the consumer's database: inbox or river (MAILROOM_INBOX_URL)")
	fs.StringVar(&f.lines, "lines", "", "the durable feeds a pipe whose output is this `file` of lines")
	fs.BoolVar(&f.asJSON, "json", false, "print the report as JSON (also on every error: {\"ok\": false, \"error\": ...})")
	fs.BoolVar(&f.heal, "heal", false, "publish, once, the missing tokens still eligible, as tailer resync does")
	fs.BoolVar(&f.acknowledge, "acknowledge", false, "clear what tailer run's audit found missing (on /readyz and in tailer status) without publishing it")
	load := x.settings(c, config.For(config.Resync|config.Audit), false)
	return x.leaf(c, func(c *cobra.Command, _ []string) int {
		cfg, err := load()
		if err != nil {
			return x.auditFailed(f.asJSON, err, exitConfig)
		}
		if msg := f.check(cfg); msg != "" {
			fmt.Fprintf(x.stderr, "tailer audit: %s\n", msg)
			return x.auditFailed(f.asJSON, errors.New(msg), exitConfig)
		}
		return x.audit(c.Context(), cfg, f)
	})
}

// auditFailed prints err as --json asks, and returns code.
func (x *cli) auditFailed(asJSON bool, err error, code int) int {
	if asJSON {
		json.NewEncoder(x.stdout).Encode(map[string]any{"ok": false, "error": err.Error()})
	}
	return code
}

// check names what is wrong with the flags ("": nothing).
func (f *auditFlags) check(cfg *config.Config) string {
	switch {
	case f.into != "" && f.into != "inbox" && f.into != "river":
		return fmt.Sprintf("--into %q: want inbox or river", f.into)
	case f.durable == "" && (f.into != "" || f.lines != ""):
		return "--into and --lines need --durable NAME"
	case f.into != "" && cfg.InboxURL == "":
		return "--into needs MAILROOM_INBOX_URL, the consumer's database"
	case f.wait <= 0 || f.grace < 0:
		return "--wait must be positive and --grace not negative"
	case f.heal && f.acknowledge:
		return "--heal and --acknowledge: choose one (--heal clears what it published)"
	}
	if _, err := f.start(time.Now()); err != nil {
		return "--since: " + err.Error()
	}
	if f.heal {
		if err := cfg.RequireKey(); err != nil {
			return "--heal publishes tokens: " + err.Error()
		}
	}
	return ""
}

// start is the window's start --since says, at now.
func (f *auditFlags) start(now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(f.since); err == nil {
		if d <= 0 {
			return time.Time{}, errors.New("a duration must be positive")
		}
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, f.since)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is neither a duration (15m, 24h) nor an RFC 3339 time", f.since)
	}
	return t, nil
}

// audit is tailer audit with its settings.
func (x *cli) audit(ctx context.Context, cfg *config.Config, f *auditFlags) int {
	log := daemon.NewLogger(cfg.LogFormat, cfg.LogLevel, x.stderr)
	rep, err := x.runAudit(ctx, cfg, f, log)
	var cfgErr *config.Error
	switch {
	case errors.As(err, &cfgErr):
		return x.auditFailed(f.asJSON, err, exitCode(x.stderr, "audit", log, err))
	case err != nil:
		if !errors.Is(err, audit.ErrIncomplete) {
			err = fmt.Errorf("%w: %w", audit.ErrIncomplete, err)
		}
		fmt.Fprintf(x.stderr, "tailer audit: %v\n", err)
		return x.auditFailed(f.asJSON, err, exitFailure)
	case f.acknowledge:
		log.Info("what the audit found missing is acknowledged: no longer said on /readyz nor by tailer status", "slot", cfg.Slot)
		return exitOK
	}
	return x.auditReport(rep, f, cfg)
}

// runAudit connects, audits, and heals or acknowledges as asked. What
// keeps it from PostgreSQL or NATS (down, away) leaves it incomplete;
// wrong credentials are a configuration error.
func (x *cli) runAudit(ctx context.Context, cfg *config.Config, f *auditFlags, log *slog.Logger) (audit.Report, error) {
	conn, err := replication.Open(ctx, cfg.DatabaseURL, "tailer audit", nil)
	if err != nil {
		return audit.Report{}, connectError(err, cfg)
	}
	defer conn.Close(context.Background())
	if f.acknowledge {
		return audit.Report{}, replication.ClearAuditMissing(ctx, cfg.InSchema(conn), cfg.Slot)
	}
	nc, _, shutdown, err := natsconn.Connect(cfg, log, natsconn.Share, nats.Name("tailer audit"))
	if errors.Is(err, nats.ErrNoServers) || errors.Is(err, nats.ErrTimeout) {
		return audit.Report{}, fmt.Errorf("NATS did not answer: %w", errors.Unwrap(err))
	}
	if err != nil {
		return audit.Report{}, err
	}
	defer shutdown()
	js, err := jetstream.New(nc)
	if err != nil {
		return audit.Report{}, err
	}
	stream, err := js.Stream(ctx, cfg.Stream)
	if err != nil {
		return audit.Report{}, fmt.Errorf("stream %s: %w", cfg.Stream, err)
	}
	opts, closeDurable, err := f.options(ctx, cfg, js)
	if err != nil {
		return audit.Report{}, err
	}
	defer closeDurable()
	rep, err := audit.Audit(ctx, conn, stream, opts)
	if err != nil {
		return rep, err
	}
	if f.heal && len(rep.Missing) > 0 {
		if err := heal(ctx, cfg, log, nc, rep.Missing); err != nil {
			return rep, fmt.Errorf("heal: %w", err)
		}
	}
	return rep, nil
}

// options are the audit's, with the durable's output opened (closed by
// the function returned).
func (f *auditFlags) options(ctx context.Context, cfg *config.Config, js jetstream.JetStream) (audit.Options, func(), error) {
	since, _ := f.start(time.Now())
	opts := audit.Options{Schema: cfg.Schema, Slot: cfg.Slot, Since: since, Grace: f.grace, Lines: cfg.Format == wire.FormatLine,
		ClockSkew: 10 * time.Second, Consumer: subscriber.AuditConsumer, ConfirmWait: f.wait}
	floor := audit.Floor{JS: js, Stream: cfg.Stream, Durable: f.durable}
	switch {
	case f.lines != "":
		opts.Durable = audit.Lines{Floor: floor, Path: f.lines}
	case f.durable != "" && f.into == "":
		opts.Durable = audit.Record{Floor: floor, Consumer: subscriber.AuditConsumer}
	case f.into != "":
		pool, err := inbox.Connect(ctx, cfg.InboxURL)
		if err != nil {
			return opts, nil, &config.Error{Var: "MAILROOM_INBOX_URL", Err: err}
		}
		opts.Durable = audit.Inbox{Floor: floor, Pool: pool, Schema: cfg.InboxSchema, River: f.into == "river"}
		return opts, pool.Close, nil
	}
	return opts, func() {}, nil
}

// heal publishes the missing tokens under the slot's lease: a tailer run
// streaming from the slot is asked to let go of it meanwhile (it looks
// every MAILROOM_LAG_INTERVAL), and streams again after.
func heal(ctx context.Context, cfg *config.Config, log *slog.Logger, nc *nats.Conn, ids []int64) error {
	opts, err := cfg.ResyncOptions(log, "tailer audit --heal")
	if err != nil {
		return err
	}
	rep, err := resync.HealAsking(ctx, nc, opts, ids, "tailer audit", leaseWait+cfg.LagInterval)
	if err != nil {
		return leaseRefusal(err, "audit --heal")
	}
	log.Info("healed: the missing tokens still eligible are published once", "asked", len(ids), "eligible", rep.Eligible,
		"already_on_stream", rep.OnStream, "published", rep.Published, "messages", rep.Messages, "stream_seq", rep.StreamSeq)
	return nil
}

// auditReport prints rep, and returns the exit code: 1 when something is
// missing.
func (x *cli) auditReport(rep audit.Report, f *auditFlags, cfg *config.Config) int {
	ok := len(rep.Missing) == 0 && len(rep.Undelivered) == 0 && len(rep.Pending) == 0
	if f.asJSON {
		enc := json.NewEncoder(x.stdout)
		enc.SetIndent("", "  ")
		enc.Encode(struct {
			OK bool `json:"ok"`
			audit.Report
			Healed bool `json:"healed,omitempty"`
		}{ok, rep, f.heal && len(rep.Missing) > 0})
	} else {
		w := x.stdout
		fmt.Fprintf(w, "window          tokens created %s .. %s (the slot confirmed past them, less %s)\n", rep.Since.UTC().Format(time.RFC3339), rep.Until.UTC().Format(time.RFC3339), f.grace)
		fmt.Fprintf(w, "stream          %s, sequences %d .. %d read (%d messages not the tailer's set aside)\n", cfg.Stream, rep.StreamFirst, rep.StreamLast, rep.SetAside)
		fmt.Fprintf(w, "tokens          %d read: %d on the stream, %d not eligible, %d undecided, %d trimmed by the stream's limits\n", rep.Read, rep.Checked, rep.NotEligible, rep.Undecided, rep.Trimmed)
		fmt.Fprintf(w, "missing         %d%s\n", len(rep.Missing), idList(rep.Missing))
		if !rep.Settled && rep.Until.After(rep.Since) {
			fmt.Fprintf(w, "pending         %d%s: not on the stream, and the slot (confirmed to %s) has not confirmed past the audit's snapshot (%s): tailer run is behind or stopped; run the audit again once it streams\n",
				len(rep.Pending), idList(rep.Pending), rep.Confirmed, rep.Snapshot)
		}
		fmt.Fprintf(w, "twice           %d%s\n", len(rep.Twice), idList(rep.Twice))
		if f.durable != "" {
			fmt.Fprintf(w, "durable         %s acknowledged through sequence %d: %d delivered, %d missing%s\n", f.durable, rep.Through, rep.Delivered, len(rep.Undelivered), idList(rep.Undelivered))
		}
		if f.heal && len(rep.Missing) > 0 {
			fmt.Fprintf(w, "healed          the missing tokens still eligible are published once\n")
		}
	}
	if !ok {
		return exitFailure
	}
	return exitOK
}

// idList is ": id, id, ..." (the first 50), or "".
func idList(ids []int64) string {
	if len(ids) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString(" (token ids ")
	for i, id := range ids {
		if i == 50 {
			fmt.Fprintf(&b, ", and %d more", len(ids)-50)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.FormatInt(id, 10))
	}
	b.WriteString(")")
	return b.String()
}
