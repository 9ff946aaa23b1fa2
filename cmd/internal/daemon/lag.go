package daemon

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mailroom/tailer/replication"
)

// lagSample is the last look at the slot.
type lagSample struct {
	at   time.Time
	slot replication.SlotInfo
	err  error
}

// sampleSlot looks at the slot every LagInterval for the lag metrics and
// /readyz, on a connection of its own. It works in standby too: the slot's
// lag is what operators care about, whoever holds it. While this tailer
// streams, it also checks that the tokens can still be read (the schema,
// the publication): a publication that no longer carries token inserts
// makes the slot's stream silently empty of them, so the session is ended
// at once rather than left to confirm WAL it saw no token in; and that the
// stream still holds what the slot published to it (a purge leaves the
// stream's sequence where it was, so the session's publishes go on).
func (d *Daemon) sampleSlot(ctx context.Context) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	ticker := time.NewTicker(d.cfg.LagInterval)
	defer ticker.Stop()
	failing := false
	for {
		var err error
		if conn == nil {
			conn, err = connectQuery(ctx, d.cfg.DatabaseURL)
		}
		var s replication.SlotInfo
		if err == nil {
			s, err = replication.Slot(ctx, conn, d.cfg.Slot)
			if err != nil && !errors.Is(err, replication.ErrNoSlot) {
				conn.Close(context.Background())
				conn = nil
			}
		}
		if ctx.Err() != nil {
			return
		}
		d.lag.Store(&lagSample{at: time.Now(), slot: s, err: err})
		if err == nil {
			d.metrics.slotSample(s)
			if stop := d.stopSession.Load(); stop != nil {
				var blocked *blockedError
				rerr := d.checkReadable(ctx, conn)
				if check := d.streamCheck.Load(); rerr == nil && check != nil {
					rerr = (*check)(ctx)
				}
				if errors.As(rerr, &blocked) {
					(*stop)(blocked)
				}
			}
		}
		// A configuration error at startup is the session loop's to
		// report, as the one line before exit.
		if err != nil && !failing && (d.streamed() || startupConfigError(err) == nil) {
			d.log.Warn("cannot sample the slot's lag", "err", err)
		}
		failing = err != nil
		d.metrics.setReady(d.readiness().Ready)
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}
