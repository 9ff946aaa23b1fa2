package config

import (
	"log/slog"

	"github.com/mailroom/tailer/publish"
	"github.com/mailroom/tailer/publish/resync"
)

// ResyncOptions are the settings of a resync of c's slot; by names what
// resyncs, for the slot's record.
func (c *Config) ResyncOptions(log *slog.Logger, by string) (resync.Options, error) {
	if err := c.RequireKey(); err != nil {
		return resync.Options{}, err
	}
	return resync.Options{
		DatabaseURL: c.DatabaseURL,
		Schema:      c.Schema,
		Slot:        c.Slot,
		Publication: c.Publication,
		Destination: publish.Destination{Name: c.Stream, Subject: c.Subject, Replicas: c.Replicas, PerAction: c.PerAction, PubAckTimeout: c.PubAckTimeout},
		Signer:      c.Keys.Signer(),
		Format:      c.Format,
		BatchLimit:  c.BatchLimit,
		MaxInFlight: c.MaxInFlight,
		MaxBatches:  c.MaxBatches,
		By:          by,
		Failover:    c.SlotFailover,
		Log:         log,
	}, nil
}
