package relay

import (
	"fmt"
	"github.com/mailroom/tailer/decoder/wal"
	"github.com/mailroom/tailer/publish/wire"
	"strings"
)

// Fact is what a refusal is about: why tailer run does not stream from
// the slot until the operator acts, or until what broke is put back.
type Fact uint8

// The facts. Each has a reason (the tailer_blocked label), and says
// whether it lasts until a resync whatever is found later (Lasting),
// whether a resync is its way out (ResyncWayOut), and whether the slot's
// stream lacks inserts for good once it was found (MarksResyncNeeded).
const (
	NoFact Fact = iota
	// SchemaUnreadable: a table or column the tailer reads changed in a
	// way it cannot read. It goes on by itself once changed back.
	SchemaUnreadable
	// UnknownAction: a token of an action the tailer does not know.
	UnknownAction
	// PublicationProblem: the publication cannot carry token inserts
	// (missing, without the tokens table, a row filter, a column list).
	PublicationProblem
	// PublicationStale: the publication was dropped and made again while
	// the slot had changes to decode: only a new slot can go past it.
	PublicationStale
	// RelationIncomplete: the stream described the tokens table without a
	// column a token needs.
	RelationIncomplete
	// ResyncNeeded: the slot's stream lacks inserts the publication did
	// not carry (the record says so).
	ResyncNeeded
	// ResyncPending: a resync started and did not finish.
	ResyncPending
	// SlotLost: the server invalidated the slot.
	SlotLost
	// SlotDropped: the slot is gone, and the database recorded it.
	SlotDropped
	// SlotUnrecorded: the slot is gone, and the stream holds batches of a
	// slot this database has no record of.
	SlotUnrecorded
	// EarlierBatches: the stream holds batches of an earlier slot, or of
	// another copy of the database, and the slot's incarnation has not
	// taken it over.
	EarlierBatches
	// ForeignStream: the stream's batches come from another database or
	// another incarnation of the slot.
	ForeignStream
	// StreamReplaced: the stream was deleted and made again (or restored
	// from an older backup): what it held is gone.
	StreamReplaced
	// StreamPurged: messages the slot's incarnation published were
	// purged from the stream.
	StreamPurged
	// StreamLostAnchor: the stream no longer holds, at its sequence, a
	// message this tailer stored on it.
	StreamLostAnchor
	// WindowTrimmed: the stream's limits removed a message the slot
	// replays the tokens of.
	WindowTrimmed
	// NATSStoresNothing: the NATS server stores no batch for a cause the
	// operator must remove (its store full, the tailer's user denied). It
	// goes on by itself once it stores again.
	NATSStoresNothing
	// SlotAdvanced: the slot is confirmed past the furthest position a
	// tailer of its record wrote down before confirming (another process
	// advanced it: a tailer of another schema with the same slot, or by
	// hand): the tokens committed in between never reached the stream.
	SlotAdvanced
	// SlotShared: the record of another mailroom schema of the database
	// names the slot too: a tailer of each would stream it through its own
	// publication and confirm past the other's tokens. It goes on once
	// one of them is given another slot.
	SlotShared
	// HealAsked: tailer audit --heal asked for the slot's lease, to
	// publish tokens the stream lacks without two writers on it: the
	// session lets go of it for a while, and streams again after.
	HealAsked
	numFacts
)

var factNames = [numFacts]string{"", "schema_unreadable", "unknown_action", "publication_problem", "publication_stale", "relation_incomplete",
	"resync_needed", "resync_pending", "slot_lost", "slot_dropped", "slot_unrecorded", "earlier_batches", "foreign_stream",
	"stream_replaced", "stream_purged", "stream_lost_anchor", "window_trimmed", "nats_stores_nothing", "slot_advanced", "slot_shared", "heal_asked"}

// String is the fact's name, as the slot's record keeps it.
func (f Fact) String() string {
	if f < numFacts {
		return factNames[f]
	}
	return fmt.Sprintf("fact(%d)", f)
}

// ParseFact is the fact of a name String gave; NoFact for any other.
func ParseFact(name string) Fact {
	for f, n := range factNames {
		if n == name && n != "" {
			return Fact(f)
		}
	}
	return NoFact
}

// Reasons of refusals: the label tailer_blocked has them under.
const (
	ReasonResync      = "resync"
	ReasonSchema      = "schema"
	ReasonPublication = "publication"
	ReasonStream      = "stream"
	ReasonNATS        = "nats"
	// ReasonSlotLost is said by tailer_slot_invalidated, not
	// tailer_blocked.
	ReasonSlotLost = "slot_lost"
)

// Reasons lists the reasons tailer_blocked has a series for.
var Reasons = []string{ReasonResync, ReasonSchema, ReasonPublication, ReasonStream, ReasonNATS}

// Reason is f's label.
func (f Fact) Reason() string {
	switch f {
	case SchemaUnreadable, UnknownAction, SlotShared:
		return ReasonSchema
	case PublicationProblem, PublicationStale, RelationIncomplete:
		return ReasonPublication
	case ResyncNeeded, ResyncPending, SlotDropped, SlotUnrecorded, EarlierBatches, SlotAdvanced, HealAsked:
		return ReasonResync
	case ForeignStream, StreamReplaced, StreamPurged, StreamLostAnchor, WindowTrimmed:
		return ReasonStream
	case NATSStoresNothing:
		return ReasonNATS
	case SlotLost:
		return ReasonSlotLost
	}
	return ""
}

// Lasting reports whether a refusal of f stands until a resync, whatever
// is found afterwards: acknowledged batches are gone from the stream, and
// no later look at the stream (a session of its own end changed the
// record, a new process, markers published over the gap) can say they
// came back (issue 63: a purge refused once, then streamed on 5 s later).
func (f Fact) Lasting() bool {
	switch f {
	case StreamReplaced, StreamPurged, StreamLostAnchor, WindowTrimmed, SlotAdvanced:
		return true
	}
	return false
}

// ResyncWayOut reports whether tailer resync is the way out of f, so
// that MAILROOM_AUTO_RESYNC may take it. The stream's losses are not:
// a resync publishes what the stream lacks again, and consumers that had
// taken it get it twice, which the operator must choose.
func (f Fact) ResyncWayOut() bool {
	switch f {
	case PublicationStale, ResyncNeeded, ResyncPending, SlotLost, SlotDropped, SlotUnrecorded, EarlierBatches, WindowTrimmed:
		return true
	}
	return false
}

// MarksResyncNeeded reports whether the slot's stream lacks token inserts
// for good once f was found: the publication could not carry them, and
// decoding them again leaves them out again (each change is decoded with
// the catalog as it was then).
func (f Fact) MarksResyncNeeded() bool {
	return f == PublicationProblem || f == RelationIncomplete
}

// Refusal is a refusal to stream: its fact, and what was found (whose
// words the command layer says, with the way out).
type Refusal struct {
	Fact Fact
	Err  error
}

func (r Refusal) Error() string {
	if r.Err == nil {
		return r.Fact.String()
	}
	return r.Err.Error()
}

// RecordedRefusal is a refusal read back from the slot's record: the words it
// was said with then.
type RecordedRefusal struct{ Said string }

func (r *RecordedRefusal) Error() string { return r.Said }

// StreamLoss is what the stream lost, as the checks found it.
type StreamLoss struct {
	Fact   Fact
	Stream string
	// Anchor is the message gone (StreamLostAnchor); Since the sequence
	// after which messages were purged, and Batches how many batch
	// messages went, when counted (StreamPurged); Created and Recorded
	// the stream's creation time and the one the slot published to
	// (StreamReplaced).
	Anchor            wire.Anchor
	Since             uint64
	Batches           uint64
	Created, Recorded string
}

func (e *StreamLoss) Error() string {
	var b strings.Builder
	switch e.Fact {
	case StreamLostAnchor:
		fmt.Fprintf(&b, "stream %s no longer holds message %d that this tailer stored on it (%s): it was deleted and made again, restored from an older backup, or purged (of the batches' subject alone too)", e.Stream, e.Anchor.Seq, e.Anchor.Mark)
	case StreamPurged:
		fmt.Fprintf(&b, "stream %s no longer holds messages this slot published after sequence %d, and its configuration removes none: it was purged", e.Stream, e.Since)
		if e.Batches > 0 {
			fmt.Fprintf(&b, " (%d batch messages gone)", e.Batches)
		}
	default:
		fmt.Fprintf(&b, "stream %s was deleted and made again (the server created it at %s; this slot published to one created at %s)", e.Stream, e.Created, e.Recorded)
	}
	b.WriteString(": the batches it held are gone, acknowledged by JetStream whether or not a consumer had read them")
	return b.String()
}

// SlotAdvancedError is a slot confirmed past the record's limit: how far
// it is confirmed, and the furthest a tailer of its record confirmed it.
type SlotAdvancedError struct {
	Confirmed, Limit wal.LSN
}

func (e *SlotAdvancedError) Error() string {
	return fmt.Sprintf("the slot is confirmed at %s, past %s, the furthest a tailer of this database's record of it confirmed it: another process advanced it "+
		"(a tailer of another schema configured with the same MAILROOM_SLOT, or pg_replication_slot_advance), and the tokens committed in between never reached the stream", e.Confirmed, e.Limit)
}

// SlotSharedError names the other schemas whose record names the slot.
type SlotSharedError struct {
	Schemas []string
}

func (e *SlotSharedError) Error() string {
	return fmt.Sprintf("the slot is recorded in schema %s too (its tailer_slot): a tailer of each schema would stream it through its own publication, and confirm it past the other's tokens",
		strings.Join(e.Schemas, ", "))
}
