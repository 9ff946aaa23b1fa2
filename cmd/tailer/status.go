package main

// tailer status and tailer health: what an operator or a container
// healthcheck asks a running installation.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/mailroom/tailer/decoder/wal"
	"io"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/mailroom/tailer/cmd/internal/config"
	"github.com/mailroom/tailer/cmd/internal/daemon"
	"github.com/mailroom/tailer/cmd/internal/natsconn"
	"github.com/mailroom/tailer/publish/join"
	"github.com/mailroom/tailer/publish/relay"
	"github.com/mailroom/tailer/replication"
)

// statusReport is the --json output of tailer status.
type statusReport struct {
	Slot         string `json:"slot"`
	Active       bool   `json:"active"`
	ActivePID    int32  `json:"active_pid"`
	ConfirmedLSN string `json:"confirmed_flush_lsn"`
	RestartLSN   string `json:"restart_lsn"`
	CurrentLSN   string `json:"current_wal_lsn"`
	LagBytes     int64  `json:"lag_bytes"`
	// LagSeconds is now minus ConfirmedThrough: how far behind in time
	// the slot's confirmed position is, growing while no tailer moves it
	// (null when no tailer recorded it).
	LagSeconds       *float64   `json:"lag_seconds"`
	ConfirmedThrough *time.Time `json:"confirmed_through"`
	RetainedBytes    int64      `json:"retained_bytes"`
	WALStatus        string     `json:"wal_status"`
	Lost             string     `json:"lost,omitempty"`
	// Missing: the slot does not exist.
	Missing bool `json:"missing,omitempty"`
	// InactiveSince, Failover and Synced come from PostgreSQL 17+:
	// inactive_since is null while streamed or on older servers.
	InactiveSince *time.Time `json:"inactive_since"`
	Failover      bool       `json:"failover"`
	Synced        bool       `json:"synced"`
	// Owner is the process holding the slot's lease ("" when none).
	Owner         string `json:"owner"`
	Incarnation   string `json:"incarnation"`
	CreatedBy     string `json:"created_by"`
	ResyncPending bool   `json:"resync_pending"`
	// ResyncNeeded: the slot's stream lacks token inserts the publication
	// could not carry; tailer run waits for tailer resync.
	ResyncNeeded bool `json:"resync_needed"`
	// Blocked is why tailer run waits for the operator, as it recorded it;
	// Problems what status finds itself (the schema, the publication).
	Blocked string `json:"blocked,omitempty"`
	// Refused is a refusal that lasts until a resync, as tailer run
	// recorded it (the stream lost what it had acknowledged).
	Refused string `json:"refused,omitempty"`
	// PublicationGuard: an event trigger runs this schema's guard, which
	// marks the slot for a resync in the transaction of a publication
	// change, in every session (it takes a superuser to install);
	// PublicationGuardOriginOnly: one runs it, but not in sessions with
	// session_replication_role = replica.
	PublicationGuard           bool     `json:"publication_guard"`
	PublicationGuardOriginOnly bool     `json:"publication_guard_origin_only,omitempty"`
	Problems                   []string `json:"problems,omitempty"`
	// AuditMissing: how many tokens audits found missing from the stream,
	// not healed nor acknowledged; AuditThrough, how far tailer run's
	// audit got (the tokens created before it are audited).
	AuditMissing   int64      `json:"audit_missing"`
	AuditThrough   *time.Time `json:"audit_through"`
	Stream         string     `json:"stream"`
	StreamMessages *uint64    `json:"stream_messages"`
	StreamLastSeq  *uint64    `json:"stream_last_seq"`
	StreamReplicas *int       `json:"stream_replicas"`
	StreamError    string     `json:"stream_error,omitempty"`
	MaxLagBytes    int64      `json:"max_lag_bytes"`
	OK             bool       `json:"ok"`
}

func (x *cli) statusCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "status",
		Short: "show the slot, its lag and the stream; exit 1 when nothing streams or the lag passes its limits",
		Long: `Show the replication slot, who holds it, its lag in bytes and in time, the
schema and publication checks, and the stream. Exit 1 when a problem is
found: no tailer has held the slot for MAILROOM_MAX_UNHELD_SECONDS, the lag
passes MAILROOM_MAX_LAG or MAILROOM_MAX_LAG_SECONDS, the slot is missing.`,
	}
	asJSON := c.Flags().Bool("json", false, "print the report as JSON (also on every error: {\"ok\": false, \"error\": ...})")
	load := x.settings(c, statusVars, false)
	return x.leaf(c, func(c *cobra.Command, _ []string) int {
		cfg, err := load()
		if err != nil {
			if *asJSON {
				json.NewEncoder(x.stdout).Encode(map[string]any{"ok": false, "error": err.Error()})
			}
			return exitConfig
		}
		return status(c.Context(), cfg, *asJSON, x.stdout, x.stderr)
	})
}

// status is tailer status with its settings.
func status(ctx context.Context, cfg *config.Config, asJSON bool, stdout, stderr io.Writer) int {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	rep, err := collectStatus(ctx, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "tailer status: %v\n", err)
		if asJSON {
			json.NewEncoder(stdout).Encode(map[string]any{"ok": false, "error": err.Error()})
		}
		var cfgErr *config.Error
		if errors.As(err, &cfgErr) {
			return exitConfig
		}
		return exitFailure
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(rep)
	} else {
		rep.writeText(stdout)
	}
	if !rep.OK {
		return exitFailure
	}
	return exitOK
}

// collectStatus gathers what tailer status reports: the slot, its lease
// and record, the schema and publication checks, and the stream.
func collectStatus(ctx context.Context, cfg *config.Config) (statusReport, error) {
	conn, err := replication.Open(ctx, cfg.DatabaseURL, "tailer status", nil)
	if err != nil {
		return statusReport{}, connectError(err, cfg)
	}
	defer conn.Close(context.Background())
	slot, err := replication.Slot(ctx, conn, cfg.Slot)
	missing := errors.Is(err, replication.ErrNoSlot)
	if err != nil && !missing {
		return statusReport{}, err
	}
	if missing {
		// Said, and what the tailer recorded about it (the record outlives
		// the slot) said too.
		slot.Name = cfg.Slot
	}
	rep := statusReport{Missing: missing,
		Slot: slot.Name, Active: slot.Active, ActivePID: slot.ActivePID,
		ConfirmedLSN: slot.ConfirmedFlush.String(), RestartLSN: slot.RestartLSN.String(), CurrentLSN: slot.CurrentLSN.String(),
		LagBytes: slot.LagBytes(), RetainedBytes: slot.RetainedBytes(), Stream: cfg.Stream, MaxLagBytes: cfg.MaxLag,
	}
	rep.WALStatus, rep.Failover, rep.Synced = slot.WALStatus, slot.Failover, slot.Synced
	if through, ok, err := replication.ConfirmedThrough(ctx, cfg.InSchema(conn), cfg.Slot); err != nil {
		return statusReport{}, err
	} else if ok {
		lag := max(time.Since(through), 0).Seconds()
		rep.ConfirmedThrough, rep.LagSeconds = &through, &lag
	}
	if !slot.InactiveSince.IsZero() {
		rep.InactiveSince = &slot.InactiveSince
	}
	if slot.Lost() {
		rep.Lost = daemon.LostSlotMessage(slot)
	}
	if h, held, err := replication.LeaseHolder(ctx, conn, cfg.Slot); err != nil {
		return statusReport{}, err
	} else if held {
		rep.Owner = h.String()
	}
	rec, err := replication.LoadRecord(ctx, cfg.InSchema(conn), cfg.Slot)
	if err != nil {
		return statusReport{}, err
	}
	rep.fromRecord(rec)
	guard, err := replication.GuardOf(ctx, conn, cfg.Schema)
	if err != nil {
		return statusReport{}, err
	}
	rep.PublicationGuard, rep.PublicationGuardOriginOnly = guard == replication.GuardAlways, guard == replication.GuardOriginOnly
	for _, err := range []error{join.CheckSchema(ctx, conn, cfg.Schema), replication.CheckPublication(ctx, cfg.InSchema(conn), cfg.Publication)} {
		var pubErr *replication.PublicationError
		switch {
		case errors.As(err, &pubErr):
			rep.Problems = append(rep.Problems, daemon.PublicationMessage(pubErr))
		case err != nil:
			rep.Problems = append(rep.Problems, err.Error())
		}
	}
	rep.judgeStreaming(cfg, slot, rec)
	rep.OK = !missing && rep.LagBytes <= cfg.MaxLag && !slot.Lost() && !rec.ResyncPending && !rec.ResyncNeeded && rep.Blocked == "" && rep.Refused == "" && len(rep.Problems) == 0
	if info, err := streamInfo(ctx, cfg); err != nil {
		rep.StreamError = err.Error()
		if cfg.NATSURL == "" {
			rep.StreamError += " (" + natsconn.Source(cfg) + ")"
		}
	} else {
		rep.StreamMessages, rep.StreamLastSeq, rep.StreamReplicas = &info.State.Msgs, &info.State.LastSeq, &info.Config.Replicas
	}
	return rep, nil
}

// fromRecord adds what the slot's record says: its incarnation, a resync
// pending or needed, what blocks or refused it, what the audit found.
func (rep *statusReport) fromRecord(rec replication.Record) {
	if !rec.Exists {
		return
	}
	rep.Incarnation, rep.CreatedBy, rep.ResyncPending = rec.Incarnation, rec.CreatedBy+" at "+rec.CreatedAt.UTC().Format(time.RFC3339), rec.ResyncPending
	rep.ResyncNeeded = rec.ResyncNeeded
	if rec.Blocked != "" {
		rep.Blocked = "since " + rec.BlockedAt.UTC().Format(time.RFC3339) + ": " + rec.Blocked
	}
	if rec.Refused != "" {
		rep.Refused = "since " + rec.RefusedAt.UTC().Format(time.RFC3339) + ", until a resync: " + rec.Refused
	}
	if rep.AuditMissing = rec.AuditMissingCount; rep.AuditMissing > 0 {
		rep.Problems = append(rep.Problems, daemon.AuditMissingMessage(rec.AuditMissingCount, rec.AuditMissingAt, rec.AuditMissing))
	}
	if !rec.AuditThrough.IsZero() {
		rep.AuditThrough = &rec.AuditThrough
	}
}

// judgeStreaming adds to the problems what says nothing streams: a
// missing slot (naming the way out), no tailer holding the slot for longer
// than MAILROOM_MAX_UNHELD_SECONDS (or ever), a lag in time past
// MAILROOM_MAX_LAG_SECONDS.
func (rep *statusReport) judgeStreaming(cfg *config.Config, slot replication.SlotInfo, rec replication.Record) {
	switch {
	case rep.Missing && rec.Exists:
		rep.Problems = append(rep.Problems, daemon.DroppedSlotMessage(rep.Slot, rec.CreatedBy))
		// The record's time is the lost slot's: no lag to tell.
		rep.LagSeconds, rep.ConfirmedThrough = nil, nil
		return
	case rep.Missing:
		rep.Problems = append(rep.Problems, fmt.Sprintf("slot %s does not exist: tailer migrate makes it (or tailer run, on a first start)", rep.Slot))
		return
	case rec.ConfirmLimit != 0 && slot.ConfirmedFlush > rec.ConfirmLimit && rec.RefusedFact == "":
		// The slot was read before the record: a tailer writes the limit
		// down before it confirms past it.
		rep.Problems = append(rep.Problems, daemon.SlotAdvancedMessage(rep.Slot, &relay.SlotAdvancedError{Confirmed: wal.LSN(slot.ConfirmedFlush), Limit: wal.LSN(rec.ConfirmLimit)}))
	}
	if rep.Owner == "" && rep.Blocked == "" {
		// A tailer run that waits for the operator says why (BLOCKED), and
		// holds the slot only while it looks again: "start tailer run"
		// would be the wrong way out.
		switch {
		case rep.LagSeconds == nil:
			rep.Problems = append(rep.Problems, fmt.Sprintf("no tailer holds slot %s, and none has recorded streaming from it: start tailer run", rep.Slot))
		case *rep.LagSeconds > cfg.MaxUnheld.Seconds():
			rep.Problems = append(rep.Problems, fmt.Sprintf("no tailer holds slot %s, and none has confirmed anything for %.0f s (MAILROOM_MAX_UNHELD_SECONDS %.0f): start tailer run, or see why it stopped",
				rep.Slot, *rep.LagSeconds, cfg.MaxUnheld.Seconds()))
		}
	}
	if rep.LagSeconds != nil && *rep.LagSeconds > cfg.MaxLagSeconds.Seconds() {
		rep.Problems = append(rep.Problems, fmt.Sprintf("the lag in time is %.0f s, more than MAILROOM_MAX_LAG_SECONDS %.0f: see docs/operations.md, 'When the lag in seconds grows'",
			*rep.LagSeconds, cfg.MaxLagSeconds.Seconds()))
	}
}

// writeText writes the report as tailer status prints it.
func (rep *statusReport) writeText(w io.Writer) {
	if rep.Missing {
		fmt.Fprintf(w, "slot            %s: MISSING, the replication slot does not exist\n", rep.Slot)
	} else {
		fmt.Fprintf(w, "slot            %s (active=%v pid=%d failover=%v synced=%v)\n", rep.Slot, rep.Active, rep.ActivePID, rep.Failover, rep.Synced)
	}
	if rep.InactiveSince != nil {
		fmt.Fprintf(w, "inactive since  %s (%s ago)\n", rep.InactiveSince.UTC().Format(time.RFC3339), time.Since(*rep.InactiveSince).Round(time.Second))
	}
	fmt.Fprintf(w, "confirmed LSN   %s\nrestart LSN     %s\ncurrent LSN     %s\n", rep.ConfirmedLSN, rep.RestartLSN, rep.CurrentLSN)
	fmt.Fprintf(w, "lag             %d bytes (%s), max %s\n", rep.LagBytes, human(rep.LagBytes), human(rep.MaxLagBytes))
	if rep.LagSeconds != nil {
		fmt.Fprintf(w, "lag in time     %.1f s: every token committed before %s is confirmed\n", *rep.LagSeconds, rep.ConfirmedThrough.UTC().Format(time.RFC3339Nano))
	} else {
		fmt.Fprintf(w, "lag in time     unknown yet: tailer run records how far the slot is confirmed every few seconds while it streams\n")
	}
	fmt.Fprintf(w, "retained WAL    %d bytes (%s), wal_status %s\n", rep.RetainedBytes, human(rep.RetainedBytes), rep.WALStatus)
	if rep.Lost != "" {
		fmt.Fprintf(w, "LOST            %s\n", rep.Lost)
	}
	owner := rep.Owner
	if owner == "" {
		owner = "none: no tailer holds the slot's lease"
	}
	fmt.Fprintf(w, "owner           %s\n", owner)
	switch {
	case rep.Incarnation == "":
		fmt.Fprintf(w, "incarnation     none recorded (tailer run adopts the slot only beside an empty stream)\n")
	case rep.ResyncPending:
		fmt.Fprintf(w, "incarnation     %s, created by %s: RESYNC PENDING (run tailer resync)\n", rep.Incarnation, rep.CreatedBy)
	case rep.ResyncNeeded:
		fmt.Fprintf(w, "incarnation     %s, created by %s: RESYNC NEEDED, the stream lacks inserts the publication did not carry (run tailer resync)\n", rep.Incarnation, rep.CreatedBy)
	default:
		fmt.Fprintf(w, "incarnation     %s, created by %s\n", rep.Incarnation, rep.CreatedBy)
	}
	if rep.Blocked != "" {
		fmt.Fprintf(w, "BLOCKED         %s\n", rep.Blocked)
	}
	if rep.Refused != "" {
		fmt.Fprintf(w, "REFUSED         %s\n", rep.Refused)
	}
	for _, p := range rep.Problems {
		fmt.Fprintf(w, "PROBLEM         %s\n", p)
	}
	if rep.AuditThrough != nil {
		fmt.Fprintf(w, "audited         every token created before %s, by content (%d missing)\n", rep.AuditThrough.UTC().Format(time.RFC3339), rep.AuditMissing)
	}
	switch {
	case rep.PublicationGuard:
		fmt.Fprintf(w, "publication     guarded: a change that stops it carrying token inserts marks the slot for a resync as it is made\n")
	case rep.PublicationGuardOriginOnly:
		fmt.Fprintf(w, "publication     guarded, but not in sessions with session_replication_role = replica: a change made there and undone between two checks goes unseen (a superuser's `tailer migrate` enables the guard always)\n")
	default:
		fmt.Fprintf(w, "publication     checked every MAILROOM_LAG_INTERVAL only: a change undone between two checks goes unseen (a superuser's `tailer migrate` installs the guard)\n")
	}
	if rep.StreamError != "" {
		fmt.Fprintf(w, "stream          %s: %s\n", rep.Stream, rep.StreamError)
	} else {
		fmt.Fprintf(w, "stream          %s: %d messages, last seq %d, %d replicas\n", rep.Stream, *rep.StreamMessages, *rep.StreamLastSeq, *rep.StreamReplicas)
	}
}

func streamInfo(ctx context.Context, cfg *config.Config) (*jetstream.StreamInfo, error) {
	nc, err := nats.Connect(natsconn.URL(cfg), append(cfg.NATSOptions(), nats.Name("tailer status"), nats.Timeout(5*time.Second))...)
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
