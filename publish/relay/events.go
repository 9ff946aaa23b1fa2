package relay

import (
	"github.com/mailroom/tailer/decoder/wal"
	"github.com/mailroom/tailer/publish/wire"
	"time"
)

// Event is what a session found, or what happened to it.
type Event interface{ event() }

// Start asks for a session (the process started, or a wait is over).
type Start struct{}

// Opened: the session holds the slot's lease and its connections.
type Opened struct{}

// Inspected is what the session found before it streams: a schema or a
// publication the tailer cannot read tokens through (nil: none), the
// slot's record and the slot.
type Inspected struct {
	Schema, Publication error
	Record              SlotRecord
	Slot                Slot
	// Shared are the other schemas of the database whose record names
	// the slot.
	Shared []string
}

// HeadRead is the stream's head, read for a slot that is missing.
type HeadRead struct{ Head StreamHead }

// SlotMade: the slot was made, with its record.
type SlotMade struct {
	Record SlotRecord
	Slot   Slot
}

// Claimed: the slot streams to the session, and the stream was opened;
// Record is the slot's record as read then.
type Claimed struct {
	Head   StreamHead
	Record SlotRecord
	// Confirmed is the slot's confirmed position read once it streams to
	// the session: where its stream starts, which no other process can
	// move from then on.
	Confirmed wal.LSN
}

// Bound: the record now binds the stream to the slot's incarnation.
type Bound struct{ Record SlotRecord }

// StreamLook is the stream as a check found it: the creation time its
// server reports, what it holds (and whether its configuration removes
// messages then: Seen.Trims), every anchor it was asked about that it no
// longer holds at its sequence (whatever removed it), and how many batch
// messages the session had stored on it (PubAck in hand) when it looked.
type StreamLook struct {
	Created string
	Seen    Seen
	Missing []wire.Anchor
	Stored  uint64
}

// Resumed is the scan of the stream and the session's markers: Err is a
// *ForeignStreamError, a *WindowTrimmedError or any other failure (nil:
// resumed); Reach is the furthest position the stream holds of the slot,
// WAL the server's current position, Anchors what the markers stored.
type Resumed struct {
	Err     error
	Reach   wal.Position
	WAL     wal.LSN
	Anchors Anchors
}

// LookTaken is a look taken while the session streams: a schema or a
// publication the tailer can no longer read tokens through, a record
// that says the stream lacks inserts, or that another process refused
// the slot meanwhile (NoFact: not), a cause of NATS storing nothing (nil:
// none), and the stream as its check found it.
type LookTaken struct {
	Schema, Publication, NATS error
	ResyncNeeded              bool
	ResyncCause               string
	// HealAsked: tailer audit --heal waits for the slot's lease.
	HealAsked bool
	Refused   Refusal
	Stream    StreamLook
}

// EndKind is how a session ended, as the driver tells it from the
// session's errors.
type EndKind uint8

const (
	// EndStopped: the process stops (SIGTERM), everything published.
	EndStopped EndKind = iota
	// EndStoppedUnpublished: the process stops with tokens read and not
	// published; they stay in the slot.
	EndStoppedUnpublished
	// EndRefused: the session stopped on a refusal this Relay made while
	// it streamed (Stop; Ended.Refusal).
	EndRefused
	// EndFound: the session found a fact about the tokens' way that the
	// Relay judges (Ended.Found: a schema or a publication it cannot read
	// through, a relation or an action it cannot decode, the slot lost).
	EndFound
	// EndLeaseLost: another process took the lease.
	EndLeaseLost
	// EndLeaseHeld: another process holds the slot; this one stands by.
	EndLeaseHeld
	// EndPostgres and EndNATS: a failure of either, retried.
	EndPostgres
	EndNATS
	// EndReusedID: a PubAck said the stream holds other tokens under a
	// batch's id (a restored database): retried, naming batches apart.
	EndReusedID
	// EndBatchGone: a PubAck said the stream had a batch under its id,
	// at a sequence it no longer holds (JetStream remembers ids past
	// their messages): the stream lost it.
	EndBatchGone
	// EndStartupConfig: a setting the operator must fix (a password, a
	// certificate), final only before the first session streamed.
	EndStartupConfig
	// EndConfig: a setting the server cannot honour; EndStreamConfig: a
	// stream the tailer cannot publish to. Both final.
	EndConfig
	EndStreamConfig
)

// Ended is how a session ended: its kind, the error it ended with, the
// refusal it stopped on (EndRefused) or the fact it found (EndFound), how
// long it lasted, and what it stored on the stream.
type Ended struct {
	End     EndKind
	Err     error
	Refusal Refusal
	Found   Fact
	Lasted  time.Duration
	Anchors Anchors
	// Cause, on an EndNATS, is what keeps NATS from storing anything that
	// the operator must remove (a full store, a denied publish), when one
	// is known.
	Cause error
}

// Resynced is a resync's end (nil: the slot was recreated and its
// snapshot published).
type Resynced struct{ Err error }

func (Start) event()      {}
func (Opened) event()     {}
func (Inspected) event()  {}
func (HeadRead) event()   {}
func (SlotMade) event()   {}
func (Claimed) event()    {}
func (Bound) event()      {}
func (StreamLook) event() {}
func (Resumed) event()    {}
func (LookTaken) event()  {}
func (Ended) event()      {}
func (Resynced) event()   {}

// Command is what the relay asks its driver to do.
type Command interface{ command() }

// Open takes the slot's lease and opens the session's connections.
type Open struct{}

// Inspect reads the schema and the publication checks, the slot's record
// and the slot (Inspected).
type Inspect struct{}

// ReadHead opens the stream and reads its head (HeadRead).
type ReadHead struct{}

// MakeSlot makes the slot, on a first start (SlotMade).
type MakeSlot struct{}

// Claim records the publication the slot is read through, starts
// streaming the slot and opens the stream (Claimed).
type Claim struct{}

// Adopt records a new incarnation for a slot no tailer recorded making,
// beside an empty stream; Bind records that the incarnation owns the
// stream from its start (Bound).
type Adopt struct{}
type Bind struct{}

// LookAtStream looks at the stream (StreamLook): whether it holds
// each of Anchors, at its sequence.
type LookAtStream struct {
	Anchors []wire.Anchor
	// Quiet asks for a look with nothing of the session's on its way to
	// the stream (Seen.Quiet): its figures and the batches stored are
	// then of one moment, and tell whether messages gone were batches.
	Quiet bool
}

// ClearStopped forgets where the stream stood at the last clean stop:
// this session publishes from now on.
type ClearStopped struct{}

// Resume scans the stream and publishes the session's markers
// (Resumed), for Owner (its Origin the driver's).
type Resume struct{ Owner Owner }

// UniqueIDs makes the session's batch ids unique to it: the stream holds
// batches past this server's WAL, or of other tokens under ids of this
// session's (a restored database).
type UniqueIDs struct{}

// Publish starts the data path: the slot's replay, published; what
// waited for the operator is cleared.
type Publish struct{}

// RecordAnchor keeps in the slot's record the newest message the session
// stored and found on the stream, and what the stream held, for a tailer
// started after this one is killed.
// With Stream set, the stream the incarnation publishes to is recorded
// in the same write (its anchor and what it held, of another stream, are
// forgotten first): a session's first markers and the stream they name
// are kept together, so that no record names a stream with nothing
// stored on it to know it by.
type RecordAnchor struct {
	Anchor wire.Anchor
	Seen   Seen
	Stream StreamID
}

// StreamID is a stream as the record names it: its name and the creation
// time its server reported ("": not to be recorded).
type StreamID struct{ Name, Created string }

// Stop ends the streaming session with Refusal.
type Stop struct{ Refusal Refusal }

// MarkResyncNeeded records that the slot's stream lacks token inserts for
// good: tailer run streams from it again only after a resync.
type MarkResyncNeeded struct{}

// Refuse says the session cannot stream: the refusal is recorded for
// tailer status, lasting until a resync when Refusal.Fact.Lasting, and
// said on /readyz and in tailer_blocked. Say: the refusal is new, and
// said in the log.
type Refuse struct {
	Refusal Refusal
	Say     bool
}

// Reconnect moves the NATS connection to another server of its URL list:
// two sessions in a row ended on the one it is connected to (a node cut
// off from its cluster still answers pings, so the client stays with it).
type Reconnect struct{}

// Resync recreates the slot from a snapshot (MAILROOM_AUTO_RESYNC), with
// the session's lease (Resynced).
type Resync struct{ Refusal Refusal }

// StandBy: another process owns the slot. Say: newly so.
type StandBy struct {
	Err error
	Say bool
}

// Wait ends the session; the next starts after Delay (the driver adds
// jitter). Err is why (nil: a resync, or a refusal said already), Say
// whether to say it.
type Wait struct {
	Delay time.Duration
	Err   error
	Say   bool
}

// Exit ends the process with Err (nil: a clean stop).
type Exit struct{ Err error }

func (Open) command()             {}
func (Inspect) command()          {}
func (ReadHead) command()         {}
func (MakeSlot) command()         {}
func (Claim) command()            {}
func (Adopt) command()            {}
func (Bind) command()             {}
func (LookAtStream) command()     {}
func (ClearStopped) command()     {}
func (Resume) command()           {}
func (UniqueIDs) command()        {}
func (Publish) command()          {}
func (RecordAnchor) command()     {}
func (Stop) command()             {}
func (Refuse) command()           {}
func (MarkResyncNeeded) command() {}
func (Reconnect) command()        {}
func (Resync) command()           {}
func (StandBy) command()          {}
func (Wait) command()             {}
func (Exit) command()             {}
