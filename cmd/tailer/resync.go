package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/mailroom/tailer/cmd/internal/config"
	"github.com/mailroom/tailer/cmd/internal/daemon"
	"github.com/mailroom/tailer/cmd/internal/natsconn"
	"github.com/mailroom/tailer/publish/resync"
	"github.com/mailroom/tailer/replication"
)

func (x *cli) resyncCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "resync",
		Short: "recreate a lost or dropped slot and publish, once, every still-eligible token the stream lacks",
		Long: `Recreate a lost or dropped replication slot from a snapshot, and publish,
once, every still-eligible token the stream lacks (compared by key with
what is on the stream). Run it with the same settings as tailer run; with
MAILROOM_NATS_URL unset it uses the embedded server of the tailer run on
MAILROOM_DATA_DIR.`,
	}
	load := x.settings(c, resyncVars, true)
	return x.leaf(c, func(c *cobra.Command, _ []string) int {
		cfg, err := load()
		if err != nil {
			return exitConfig
		}
		return resyncSlot(c.Context(), cfg, x.stderr)
	})
}

// resyncSlot is tailer resync: under the slot's lease, the slot made again
// from a snapshot and the tokens the stream lacks published once.
func resyncSlot(ctx context.Context, cfg *config.Config, stderr io.Writer) int {
	log := daemon.NewLogger(cfg.LogFormat, cfg.LogLevel, stderr)
	lease, err := replication.AcquireLease(ctx, cfg.DatabaseURL, cfg.Slot, replication.LeaseOptions{Application: "tailer resync", Wait: leaseWait})
	if err != nil {
		return exitCode(stderr, "resync", log, leaseRefusal(err, "resync"))
	}
	defer lease.Release()
	rep, err := runResync(ctx, cfg, log, lease, "tailer resync", nil)
	if err != nil {
		return exitCode(stderr, "resync", log, daemon.Advise(err))
	}
	rep.Log(log, resynced(ctx, cfg))
	return exitOK
}

// resynced is what to do after a resync: start tailer run, unless one is
// connected, waiting for the slot, which goes on by itself.
func resynced(ctx context.Context, cfg *config.Config) string {
	conn, err := replication.Open(ctx, cfg.DatabaseURL, "tailer resync", nil)
	if err != nil {
		return "slot resynced: start tailer run (if none runs: none could be looked for)"
	}
	defer conn.Close(context.Background())
	if pids, err := replication.TailerRuns(ctx, conn); err == nil && len(pids) > 0 {
		return fmt.Sprintf("slot resynced: the tailer run connected (backend pid %v) streams from it by itself", pids)
	}
	return "slot resynced: start tailer run"
}

// runResync recreates cfg's slot from a snapshot and publishes what the
// stream lacks (see package resync), with the lease held.
func runResync(ctx context.Context, cfg *config.Config, log *slog.Logger, lease *replication.Lease, by string, cutover *replication.Cutover) (resync.Report, error) {
	opts, err := cfg.ResyncOptions(log, by)
	if err != nil {
		return resync.Report{}, err
	}
	opts.Cutover = cutover
	nc, _, shutdown, err := natsconn.Connect(cfg, log, natsconn.Share, nats.Name("tailer resync"))
	if err != nil {
		return resync.Report{}, err
	}
	defer shutdown()
	return resync.Run(ctx, lease, nc, opts)
}

// wantFailover decides, for the server behind q, whether the slot is made
// a failover slot (MAILROOM_SLOT_FAILOVER).
func wantFailover(ctx context.Context, q replication.Querier, mode string) (bool, error) {
	major, err := replication.ServerMajor(ctx, q)
	if err != nil {
		return false, err
	}
	failover, err := replication.WantFailover(mode, major)
	if err != nil {
		return false, daemon.FailoverSettingError(err)
	}
	return failover, nil
}
