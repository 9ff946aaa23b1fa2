package daemon

import (
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/mailroom/tailer/decoder"
	"github.com/mailroom/tailer/publish/join"
	"github.com/mailroom/tailer/publish/relay"
	"github.com/mailroom/tailer/replication"
)

// refused says a refusal the relay made: on /readyz and in
// tailer_blocked, in the slot's record for tailer status (and, when it
// lasts until a resync, as such), and in the log when it is new.
func (d *Daemon) refused(x *run, c relay.Refuse) {
	msg := d.words(x, c.Refusal)
	f := c.Refusal.Fact
	lost := f.Reason() == relay.ReasonSlotLost
	if !lost {
		d.blocked.Store(&msg)
		d.metrics.setBlocked(f.Reason())
		if err := replication.SetBlocked(x.ctx, x.db(), d.cfg.Slot, msg); err != nil {
			d.log.Warn("cannot record why the tailer waits", "err", err)
		}
	}
	if _, recorded := c.Refusal.Err.(*relay.RecordedRefusal); f.Lasting() && !recorded && x.rec.Exists {
		if err := replication.SetRefused(x.ctx, x.db(), &x.rec, f.String(), msg); err != nil {
			d.log.Warn("cannot record that the slot is refused until a resync; a tailer started next looks at the stream again", "err", err)
		}
	}
	if !c.Say {
		return
	}
	switch f {
	case relay.HealAsked:
		d.log.Info(msg)
	case relay.NATSStoresNothing:
		d.log.Error("NATS stores no batches: the tailer confirms nothing and goes on by itself once it does", "err", msg)
	default:
		d.log.Error("replication slot cannot be streamed from", "err", msg)
	}
}

// standBy says that another process owns the slot.
func (d *Daemon) standBy(c relay.StandBy) {
	var held *replication.LeaseHeldError
	why := "slot " + d.cfg.Slot + " is in use by another process (pg_stat_replication)"
	if errors.As(c.Err, &held) {
		why = held.Error()
	}
	why = "standing by: " + why
	d.standby.Store(&why)
	if c.Say {
		d.log.Info("standing by: another process owns the slot; taking over when it lets go", "slot", d.cfg.Slot, "owner", ownerOf(held))
	}
}

// ownerOf names the holder of the lease for the standby's log line.
func ownerOf(held *replication.LeaseHeldError) string {
	if held == nil {
		return "a replication connection that does not hold the lease"
	}
	return held.Holder.String()
}

// waiting says why the session ended, when it is a failure to retry.
func (d *Daemon) waiting(c relay.Wait) {
	if c.Err == nil {
		return
	}
	d.standby.Store(nil)
	if c.Say {
		d.log.Error("session ended; retrying", "err", c.Err, "retry_in", c.Delay)
	}
}

// reconnect moves the NATS connection to another server of the URL list
// (relay.Reconnect); with one server there is none to move to.
func (d *Daemon) reconnect(nc *nats.Conn) {
	if len(nc.Servers()) < 2 {
		return
	}
	d.log.Warn("two sessions in a row ended on the NATS server this tailer is connected to (cut off from its cluster, or the stream's leader away): connecting to another",
		"server", nc.ConnectedServerName())
	if err := nc.ForceReconnect(); err != nil {
		d.log.Warn("cannot reconnect to another NATS server", "err", err)
	}
}

// words are what a refusal is said with: what was found, and the way out.
func (d *Daemon) words(x *run, ref relay.Refusal) string {
	var (
		recorded *relay.RecordedRefusal
		pub      *replication.PublicationError
		relation *decoder.RelationError
		action   *decoder.ActionError
		foreign  *relay.ForeignStreamError
		trimmed  *relay.WindowTrimmedError
		loss     *relay.StreamLoss
		schema   *join.SchemaError
		advanced *relay.SlotAdvancedError
		shared   *relay.SlotSharedError
		cause    *relay.ResyncCause
	)
	cfg := d.cfg
	switch err := ref.Err; {
	case errors.As(err, &recorded):
		return recorded.Said
	case errors.As(err, &pub):
		return PublicationMessage(pub)
	case errors.As(err, &relation):
		return RelationMessage(relation, cfg.Publication)
	case errors.As(err, &action):
		return ActionMessage(action)
	case errors.As(err, &foreign):
		return ForeignStreamMessage(foreign)
	case errors.As(err, &trimmed):
		return WindowTrimmedMessage(trimmed)
	case errors.As(err, &loss):
		return StreamLossMessage(loss)
	case errors.As(err, &schema):
		return schema.Error()
	case errors.As(err, &advanced):
		return SlotAdvancedMessage(cfg.Slot, advanced)
	case errors.As(err, &shared):
		return SlotSharedMessage(cfg.Slot, shared)
	case errors.As(err, &cause):
		return ResyncNeededMessage(cfg.Slot, cfg.Publication, cause.Cause)
	}
	switch ref.Fact {
	case relay.HealAsked:
		return "letting go of slot " + cfg.Slot + " for tailer audit --heal, which publishes the tokens an audit found missing: streaming again once it is done"
	case relay.ResyncNeeded:
		return ResyncNeededMessage(cfg.Slot, cfg.Publication, "")
	case relay.ResyncPending:
		return PendingResyncMessage(cfg.Slot)
	case relay.SlotLost:
		msg := LostSlotMessage(x.slot)
		if ref.Err != nil {
			msg += " (" + ref.Err.Error() + ")"
		}
		return msg
	case relay.SlotDropped:
		return DroppedSlotMessage(cfg.Slot, x.rec.Describe())
	case relay.SlotUnrecorded:
		return UnrecordedSlotMessage(cfg.Slot, cfg.Stream, x.head.LastSeq)
	case relay.EarlierBatches:
		made := "no tailer command recorded making it (made by hand, or by an older tailer)"
		if x.rec.Exists {
			made = "it was made after them (" + x.rec.Describe() + ")"
		}
		return EarlierBatchesMessage(cfg.Stream, x.head.LastSeq, cfg.Slot, made)
	}
	if ref.Err != nil {
		return ref.Err.Error()
	}
	return fmt.Sprintf("refused: %s", ref.Fact)
}
