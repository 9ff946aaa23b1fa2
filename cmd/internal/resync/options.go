package resync

import (
	"log/slog"

	"github.com/mailroom/tailer/cmd/internal/config"
	"github.com/mailroom/tailer/publish"
)

// OptionsFor are the settings of a resync of cfg's slot; by names what
// resyncs, for the slot's record.
func OptionsFor(cfg *config.Config, log *slog.Logger, by string) (Options, error) {
	if err := cfg.RequireKey(); err != nil {
		return Options{}, err
	}
	return Options{
		DatabaseURL: cfg.DatabaseURL,
		Schema:      cfg.Schema,
		Slot:        cfg.Slot,
		Publication: cfg.Publication,
		Destination: publish.Destination{Name: cfg.Stream, Subject: cfg.Subject, Replicas: cfg.Replicas, PerAction: cfg.PerAction, PubAckTimeout: cfg.PubAckTimeout},
		Signer:      cfg.Keys.Signer(),
		Format:      cfg.Format,
		BatchLimit:  cfg.BatchLimit,
		MaxInFlight: cfg.MaxInFlight,
		MaxBatches:  cfg.MaxBatches,
		By:          by,
		Failover:    cfg.SlotFailover,
		Log:         log,
	}, nil
}

// Log logs what the resync did, as msg.
func (r Report) Log(log *slog.Logger, msg string) {
	args := []any{"slot", r.Slot, "incarnation", r.Incarnation, "consistent_point", r.ConsistentPoint.String(), "eligible", r.Eligible,
		"already_on_stream", r.OnStream, "published", r.Published, "messages", r.Messages,
		"unsafe_field", r.Unsafe, "skipped", r.Skipped, "expired_unpublished", r.Expired, "set_aside", r.SetAside, "stream_seq", r.StreamSeq}
	if r.Cutover != nil {
		args = append(args, "collector_last_seq", r.Cutover.LastSeq)
	}
	log.Info(msg, args...)
}
