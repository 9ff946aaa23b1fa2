package relay

import (
	"github.com/mailroom/tailer/decoder/wal"
	"github.com/mailroom/tailer/publish/wire"
	"slices"
	"time"
)

// Settings is a Relay's settings, fixed for its life.
type Settings struct {
	// Stream is the stream the relay publishes to.
	Stream string
	// AutoResync lets the relay resync the slot itself where a resync is
	// a refusal's way out (Fact.ResyncWayOut).
	AutoResync bool
	// MaxInFlight is the most messages a session keeps awaiting their
	// PubAck; 0 chooses by the stream's replicas.
	MaxInFlight int
}

// Anchors are the newest message a process stored on the stream (a batch
// or a session marker, each with an id of its own), and the newest batch.
// A stream is the one the tailer published to while it holds them, at
// their sequences, whichever replica answers and whatever creation time
// it reports.
type Anchors struct {
	Last, Batch wire.Anchor
}

// Unanchored reports whether nothing was stored yet to know the stream by.
func (a Anchors) Unanchored() bool { return a.Last.Seq == 0 && a.Batch.Seq == 0 }

// all are a's anchors, and b's not among them, each once (zero ones
// left out).
func (a Anchors) all(b Anchors) []wire.Anchor {
	var out []wire.Anchor
	for _, x := range []wire.Anchor{a.Batch, a.Last, b.Batch, b.Last} {
		if x.Seq != 0 && !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	return out
}

// with is a and b together: the newer of each.
func (a Anchors) with(b Anchors) Anchors {
	if b.Last.Seq > a.Last.Seq {
		a.Last = b.Last
	}
	if b.Batch.Seq > a.Batch.Seq {
		a.Batch = b.Batch
	}
	return a
}

// SlotRecord is the slot's record (the table tailer_slot), as a session read
// it.
type SlotRecord struct {
	Exists bool
	// Incarnation is new each time a tailer command makes the slot.
	Incarnation string
	// Bound: the incarnation owns the stream from StreamSeq on.
	Bound     bool
	StreamSeq uint64
	// Legacy: the slot predates incarnations.
	Legacy                      bool
	ResyncPending, ResyncNeeded bool
	// ResyncCause says why the stream lacks inserts, when the publication
	// guard recorded a cause other than the publication ("": none).
	ResyncCause string
	// StreamName and StreamCreated: the stream the incarnation publishes
	// to, and when its server created it.
	StreamName, StreamCreated string
	// Anchor is the newest message a tailer of the incarnation found on the
	// stream, and Seen what the stream held then; Stopped, where the
	// stream stood at the last clean stop.
	Anchor, Stopped wire.Anchor
	Seen            Seen
	// Refused is a refusal that lasts until a resync (NoFact: none).
	Refused Refusal
	// ConfirmLimit is the furthest position a tailer of the record may
	// have confirmed the slot to, written before it did (0: none written).
	ConfirmLimit wal.LSN
	// HealAsked: tailer audit --heal waits for the slot's lease (asked
	// within the last minute).
	HealAsked bool
}

// Slot is the replication slot, as a session found it.
type Slot struct {
	Present, Lost bool
	// Confirmed is the slot's confirmed position: a session replays every
	// token past it.
	Confirmed wal.LSN
	// Foreign is why the slot is not the tailer's to stream from (another
	// database's, another plugin's); nil when it is.
	Foreign error
}

// Seen is what a stream held when it was looked at: its first and last
// sequences, how many messages within them were gone (JetStream's
// FirstSeq, LastSeq and NumDeleted) and how many were batches (on the
// batches' subjects), and whether its configuration then removed old
// messages (Trims: limits that discard the oldest, or a per-subject limit
// that does; not max_msgs or max_bytes with discard new, which refuse
// new ones instead). While the configuration removes no message, every
// message gone was removed by someone. Quiet: no message of the tailer's
// was on its way then (a look with publishing held, or at a clean stop),
// so that the batches it counted are all the tailer had stored. Known
// says it was looked at (a record without one has it false).
type Seen struct {
	Known       bool
	First, Last uint64
	Deleted     int
	Batches     uint64
	Trims       bool
	// Keeps is the most messages a stream that trims keeps, when a limit
	// of messages alone makes it trim (max_msgs, discard old); 0: no such
	// bound (a limit of bytes, of messages per subject, or none).
	Keeps uint64
	Quiet bool
}

// holds is how many messages the stream held when it was seen.
func (s Seen) holds() uint64 {
	if !s.held() {
		return 0
	}
	return s.Last - s.First + 1 - uint64(s.Deleted)
}

// recordable is s as the record keeps it while a session streams: not
// quiet, since the session publishes on after it (only a clean stop, or
// a resync's end, records a quiet one).
func (s Seen) recordable() Seen {
	s.Quiet = false
	return s
}

// held reports whether the stream held a message when it was seen.
func (s Seen) held() bool { return s.First != 0 && s.Last >= s.First }

// StreamHead is the stream as a session opened it.
type StreamHead struct {
	Name, Created string
	LastSeq       uint64
	// Last is the stream's last message as the session opened it, by its
	// place and content (zero: none, or removed as it was read): with
	// nothing of the tailer's recorded to know the stream by, a stream
	// that still holds it is the one opened, whatever creation time
	// another replica reports.
	Last     wire.Anchor
	Replicas int
	// Seen is what it held, and whether its configuration removes old
	// messages.
	Seen Seen
	// Foreign says the stream's last message was published from another
	// database than this one (nil: not).
	Foreign error
}

// phase is where a session stands.
type phase uint8

const (
	idle phase = iota
	opening
	inspecting
	readingHead
	makingSlot
	claiming
	binding
	checking
	resuming
	streaming
	resyncing
)

// Relay is tailer run's protocol across its sessions: Step takes what a
// session found and returns what to do. It is not safe for concurrent
// use: its caller steps it from one goroutine at a time.
type Relay struct {
	cfg Settings
	ph  phase
	// The session's: what it found so far.
	rec    SlotRecord
	slot   Slot
	stream StreamHead
	// anchors are what the session knows the stream by; anchored, those
	// of the last session of this process, with its incarnation and
	// stream.
	anchors Anchors
	// anchored are the last session's anchors and what it stored after
	// its last check, with its incarnation and stream.
	anchored, anchoredStored  Anchors
	anchoredInc, anchoredName string
	// seen is what the stream last held as the session saw it, or as the
	// record says a tailer of the incarnation saw it; judged: a check
	// found it lost nothing then (the record's was too), so that what is
	// gone since is judged against it alone.
	seen   Seen
	judged bool
	// count is a quiet look the batches are counted from: how many the
	// stream held then, and how many the session had stored (valid: one
	// was taken since the configuration last removed messages).
	count batchCount
	// askedQuiet: the check while streaming asked for a quiet look.
	askedQuiet bool
	// stored are what the session stored since its last check: known by
	// the stream once a check found them beside the anchors.
	stored Anchors
	// recorded is the anchor last kept in the record, with what the
	// stream held then.
	recorded     wire.Anchor
	recordedSeen Seen
	// reusedIDs: a session met a PubAck of a reused id.
	reusedIDs bool
	// said is the refusal said last, standing that another process owns
	// the slot was said; delay is the retry's.
	said       string
	standingBy bool
	delay      time.Duration
	// streamed: a session of this process streamed; natsFailed counts
	// the sessions in a row that ended on NATS.
	streamed   bool
	natsFailed int
}

// New returns a Relay of cfg.
func New(cfg Settings) *Relay {
	return &Relay{cfg: cfg, delay: minDelay}
}

// Retry delays: a failure is retried after minDelay, doubling to
// maxDelay; NATS failures at most natsMaxDelay apart (a cluster heals a
// lost node or leader within seconds); a refusal is looked at again every
// refusedDelay, a lease held by another every standbyDelay.
const (
	minDelay     = 250 * time.Millisecond
	maxDelay     = 30 * time.Second
	natsMaxDelay = 2 * time.Second
	refusedDelay = 5 * time.Second
	standbyDelay = time.Second
	// freshAfter: a session that lasted this long starts the backoff
	// afresh.
	freshAfter = time.Minute
)

// Step takes ev and returns the commands it calls for, in order.
func (r *Relay) Step(ev Event) []Command {
	switch ev := ev.(type) {
	case Start:
		return r.start()
	case Opened:
		r.ph = inspecting
		return []Command{Inspect{}}
	case Inspected:
		return r.inspected(ev)
	case HeadRead:
		return r.headRead(ev)
	case SlotMade:
		r.rec, r.slot = ev.Record, ev.Slot
		return r.claim()
	case Claimed:
		return r.claimed(ev)
	case Bound:
		r.rec = ev.Record
		return r.checkStream()
	case StreamLook:
		return r.streamChecked(ev)
	case Resumed:
		return r.resumed(ev)
	case LookDue:
		return r.checking(ev)
	case LookTaken:
		return r.checked(ev)
	case NATSTrouble:
		return r.natsTrouble(ev)
	case Ended:
		return r.ended(ev)
	case Resynced:
		return r.resynced(ev)
	}
	return nil
}

// start begins a session, unless one runs.
func (r *Relay) start() []Command {
	if r.ph != idle {
		return nil
	}
	r.ph = opening
	r.rec, r.slot, r.stream, r.anchors, r.stored, r.seen, r.judged, r.count = SlotRecord{}, Slot{}, StreamHead{}, Anchors{}, Anchors{}, Seen{}, false, batchCount{}
	return []Command{Open{}}
}

// expect reports whether the session waits in ph: an event that comes in
// another (a check's result after the session ended) is passed over.
func (r *Relay) expect(ph phase) bool { return r.ph == ph }
