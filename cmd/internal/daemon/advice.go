package daemon

import (
	"cmp"
	"errors"
	"fmt"

	"github.com/mailroom/tailer/cmd/internal/config"
	"github.com/mailroom/tailer/decoder"
	"github.com/mailroom/tailer/publish"
	"github.com/mailroom/tailer/publish/relay"
	"github.com/mailroom/tailer/replication"
)

// What the operator can do about the conditions the lower packages report.
// The words name commands and settings, so they are said here, by the
// command layer, not by replication.

const resyncWayOut = "To go on: run `tailer resync`, which recreates the slot and publishes, once, every still-eligible token the stream lacks " +
	"(or set MAILROOM_AUTO_RESYNC=true to let tailer run do it)"

// resyncOrStream is resyncWayOut for a slot whose stream may be another
// database's.
const resyncOrStream = resyncWayOut + ", or use a stream of this database's own (MAILROOM_NATS_STREAM)"

// LostSlotMessage says what a lost slot means and how to recover, for
// logs, /readyz and tailer status.
func LostSlotMessage(s replication.SlotInfo) string {
	return s.LostReason() + ". The tailer will not recreate it by itself. To go on: stop every tailer run and run `tailer resync`, which recreates the slot and publishes, once, every still-eligible token the stream lacks " +
		"(or set MAILROOM_AUTO_RESYNC=true to let tailer run do it)"
}

// DroppedSlotMessage says that a slot this database recorded (made as
// made says) is gone.
func DroppedSlotMessage(slot, made string) string {
	return fmt.Sprintf("slot %s does not exist, but this database recorded it (%s): it was dropped, or this database is a copy or a restore of the one it was made in, "+
		"and the tokens committed since it was last read are in no slot. The tailer will not recreate it by itself. "+resyncOrStream, slot, made)
}

// UnrecordedSlotMessage says that the slot is missing while the stream
// holds batches of a slot this database has no record of.
func UnrecordedSlotMessage(slot, stream string, lastSeq uint64) string {
	return fmt.Sprintf("slot %s does not exist, but stream %s holds batches (last seq %d) of a slot this database has no record of: it was dropped, or this database is a copy. "+
		"The tailer will not recreate it by itself. "+resyncOrStream, slot, stream, lastSeq)
}

// EarlierBatchesMessage says that the stream holds batches the slot did
// not publish (made says when the slot was made).
func EarlierBatchesMessage(stream string, lastSeq uint64, slot, made string) string {
	return fmt.Sprintf("stream %s holds batches (last seq %d) that slot %s did not publish: %s. "+
		"They belong to an earlier slot, or to another copy of this database, and their positions would skip this slot's tokens. "+resyncOrStream, stream, lastSeq, slot, made)
}

// PublicationMessage says what is wrong with the publication and how to
// go on.
func PublicationMessage(e *replication.PublicationError) string {
	if e.Stale {
		return e.Error() + ". " + resyncWayOut
	}
	return e.Error() + fmt.Sprintf(". To go on: run `tailer migrate` (it creates the publication), "+
		"or ALTER PUBLICATION %s ADD TABLE %s and SET (publish = 'insert', publish_via_partition_root = true); then `tailer resync` publishes, once, the tokens inserted meanwhile", e.Publication, cmp.Or(e.Table, "tokens"))
}

// ForeignStreamMessage says whose batches the stream holds and how to go
// on.
func ForeignStreamMessage(e *relay.ForeignStreamError) string {
	return e.Error() + ", so the tailer does not stream. To go on from here, run `tailer resync`: it recreates the slot and publishes, once, every still-eligible token of this database that the stream lacks. " +
		"Or use a stream of this database (MAILROOM_NATS_STREAM) once the consumers have drained the old one"
}

// RelationMessage says what a tokens relation without the columns a token
// needs means, and how to go on: the inserts of that time cannot be read
// from the slot, so the slot is marked for a resync.
func RelationMessage(e *decoder.RelationError, publication string) string {
	return e.Error() + fmt.Sprintf(". The slot cannot read the inserts made meanwhile, however often it replays them. To go on: publish every column again "+
		"(ALTER PUBLICATION %s SET TABLE %s), then run `tailer resync`, which publishes, once, the tokens inserted meanwhile", publication, e.Relation)
}

// lostStreamWayOut is the way out of a stream that lost acknowledged
// batches.
const lostStreamWayOut = "To go on: run `tailer resync` while the tokens are still valid (15 minutes by default): it publishes, once, every still-eligible token the stream lacks; " +
	"tokens a consumer had already taken come again, so consumers drop them by token key"

// StreamLossMessage says what the stream lost, and the way out.
func StreamLossMessage(e *relay.StreamLoss) string {
	return e.Error() + ". " + lostStreamWayOut
}

// ActionMessage says why the tailer stops at a token of an action it does
// not know, and what to do.
func ActionMessage(e *decoder.ActionError) string {
	return e.Error() + ": nothing from it on is published or confirmed, so no token of it is skipped; run a tailer that knows the action (the token is then published where it stands), " +
		"or delete the token and take the value out of the type. The tailer checks again every few seconds and goes on by itself"
}

// WindowTrimmedMessage says why the tailer does not publish a replay whose
// messages the stream's limits removed, and the way out.
func WindowTrimmedMessage(e *relay.WindowTrimmedError) string {
	return e.Error() + ". Raise the stream's limits (or remove them: the tailer's own stream has none) so that they keep what the slot may replay and what consumers have yet to read. " + resyncWayOut
}

// ResyncNeededMessage says why tailer run waits for a resync although the
// publication carries token inserts again: cause, as the publication
// guard recorded it, or the publication.
func ResyncNeededMessage(slot, publication, cause string) string {
	if cause != "" {
		return fmt.Sprintf("%s: slot %s's stream lacks those tokens for good; streaming on would skip them. "+resyncWayOut, cause, slot)
	}
	return fmt.Sprintf("publication %s could not carry token inserts for a while, and slot %s's stream lacks the ones made then for good "+
		"(PostgreSQL decodes each change with the catalog as it was then); streaming on would skip them. "+resyncWayOut, publication, slot)
}

// SlotSharedMessage says why tailer run does not stream from a slot
// another schema's record names, and the way out.
func SlotSharedMessage(slot string, e *relay.SlotSharedError) string {
	return fmt.Sprintf("slot %s: %v. A slot serves one tailer of one schema: give this schema a MAILROOM_SLOT of its own (then tailer migrate makes it); the tailer goes on by itself once no other schema's record names this one", slot, e)
}

// SlotAdvancedMessage says why tailer run does not stream from a slot
// another process advanced, and the way out.
func SlotAdvancedMessage(slot string, e *relay.SlotAdvancedError) string {
	return fmt.Sprintf("slot %s: %v. A slot serves one tailer of one schema: give each schema a MAILROOM_SLOT of its own, stop whatever else reads or advances it, "+
		"then run `tailer resync`, which recreates the slot and publishes, once, every still-eligible token the stream lacks", slot, e)
}

// PendingResyncMessage says what a resync started and not finished means,
// for logs and /readyz.
func PendingResyncMessage(slot string) string {
	return fmt.Sprintf("a resync of slot %s was started and did not finish: the tokens of its snapshot are not all on the stream. "+
		"Run `tailer resync` again (or `tailer migrate`, when it was adopting a collector's database); tailer run waits until then", slot)
}

// Advise returns err with the way out appended when it is a refusal the
// operator resolves with a setting or a command (errors.As still finds
// the fact); any other err as it is.
func Advise(err error) error {
	var (
		fs  *replication.ForeignSlotError
		se  *publish.SubjectError
		fe  *replication.FailoverError
		way string
	)
	switch {
	case errors.As(err, &fe):
		return FailoverSettingError(err)
	case errors.As(err, &fs):
		way = "choose another slot name (MAILROOM_SLOT), or drop the other database's slot if it is no longer used"
	case errors.As(err, &se) && se.Marker:
		way = "add " + se.Configured + ".> to the stream's subjects"
	case errors.As(err, &se):
		way = "set MAILROOM_NATS_SUBJECT to a subject the stream takes, or add " + se.Subject + " to the stream's subjects"
	default:
		return err
	}
	return &advisedError{err: err, way: way}
}

// advisedError is a refusal with its way out.
type advisedError struct {
	err error
	way string
}

func (e *advisedError) Error() string { return e.err.Error() + ". To go on: " + e.way }
func (e *advisedError) Unwrap() error { return e.err }

// FailoverSettingError is MAILROOM_SLOT_FAILOVER refused by the server,
// with the way out.
func FailoverSettingError(err error) error {
	var fe *replication.FailoverError
	if errors.As(err, &fe) {
		err = fmt.Errorf("%w (after a failover, run tailer resync); set it to auto or false", err)
	}
	return &config.Error{Var: "MAILROOM_SLOT_FAILOVER", Err: err}
}
