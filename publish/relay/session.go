package relay

import (
	"errors"
	"github.com/mailroom/tailer/publish/wire"
	"time"
)

// readable is the refusal of a slot whose tokens cannot be read: a schema
// or a publication the tailer cannot read them through, or a stream that
// lacks inserts the publication did not carry.
func readable(schema, publication error, resyncNeeded bool, cause string) (Refusal, bool) {
	switch {
	case schema != nil:
		return Refusal{Fact: SchemaUnreadable, Err: schema}, true
	case publication != nil:
		return Refusal{Fact: PublicationProblem, Err: publication}, true
	case resyncNeeded && cause != "":
		return Refusal{Fact: ResyncNeeded, Err: &ResyncCause{Cause: cause}}, true
	case resyncNeeded:
		return Refusal{Fact: ResyncNeeded}, true
	}
	return Refusal{}, false
}

// ResyncCause is why the slot's stream lacks inserts for good, when it is
// not the publication: as the publication guard recorded it (a table
// attached to tokens holding rows).
type ResyncCause struct{ Cause string }

func (e *ResyncCause) Error() string { return e.Cause }

// inspected judges what the session found before it streams. Nothing is
// judged before the lease is held: a standby only learns that another
// process owns the slot.
func (r *Relay) inspected(ev Inspected) []Command {
	if !r.expect(inspecting) {
		return nil
	}
	r.rec, r.slot = ev.Record, ev.Slot
	if ref, ok := readable(ev.Schema, ev.Publication, ev.Record.ResyncNeeded, ev.Record.ResyncCause); ok {
		return r.refuse(ref)
	}
	switch {
	case ev.Record.HealAsked:
		// Not judged, nor held: tailer audit --heal takes the lease.
		return r.refuse(Refusal{Fact: HealAsked})
	case len(ev.Shared) > 0:
		// Before anything else of the slot is judged: what the other
		// schema's tailer did to it says nothing of this one's.
		return r.refuse(Refusal{Fact: SlotShared, Err: &SlotSharedError{Schemas: ev.Shared}})
	case r.rec.ResyncPending:
		return r.refuse(Refusal{Fact: ResyncPending})
	case r.rec.Refused.Fact != NoFact:
		// Said before, and kept: no look at the stream since can take it
		// back, only its way out.
		return r.refuse(r.rec.Refused)
	case r.slot.Present && r.slot.Foreign != nil:
		return r.fail(EndPostgres, r.slot.Foreign, 0)
	case r.slot.Present && r.slot.Lost:
		return r.refuse(Refusal{Fact: SlotLost})
	case r.slot.Present && r.rec.ConfirmLimit != 0 && r.slot.Confirmed > r.rec.ConfirmLimit:
		return r.refuse(Refusal{Fact: SlotAdvanced, Err: &SlotAdvancedError{Confirmed: r.slot.Confirmed, Limit: r.rec.ConfirmLimit}})
	case !r.slot.Present:
		// Made here only on a first start, when nothing says one
		// existed: otherwise the tokens committed since the old one was
		// last read are in no slot, and a new one would skip them.
		r.ph = readingHead
		return []Command{ReadHead{}}
	}
	return r.claim()
}

// headRead judges a missing slot by the stream's head.
func (r *Relay) headRead(ev HeadRead) []Command {
	if !r.expect(readingHead) {
		return nil
	}
	switch {
	case ev.Head.Foreign != nil:
		return r.refuse(Refusal{Fact: ForeignStream, Err: ev.Head.Foreign})
	case r.rec.Exists:
		return r.refuse(Refusal{Fact: SlotDropped})
	case ev.Head.LastSeq > 0:
		return r.refuse(Refusal{Fact: SlotUnrecorded})
	}
	r.ph = makingSlot
	return []Command{MakeSlot{}}
}

// claim starts streaming the slot and opens the stream.
func (r *Relay) claim() []Command {
	r.ph = claiming
	return []Command{Claim{}}
}

// errRecordMoved is a session that found the slot's record naming another
// incarnation once the slot streamed to it than when it read it.
var errRecordMoved = errors.New("the slot's record names another incarnation than when this session read it: another process acted on the slot meanwhile (this one was frozen, its lease lapsed)")

// claimed ties the stream to the slot's incarnation when no tailer has
// yet (a slot made by tailer migrate, or without a record at all): only
// an empty stream can be taken over, since batches already on it were
// published from some other slot and their positions mean nothing to
// this one.
func (r *Relay) claimed(ev Claimed) []Command {
	if !r.expect(claiming) {
		return nil
	}
	if ev.Record.Incarnation != r.rec.Incarnation {
		// A process frozen since it read the record, its lease lapsed
		// meanwhile: the slot is another's now (a resync made it again).
		return r.fail(EndLeaseLost, errRecordMoved, 0)
	}
	if ev.Record.Refused.Fact != NoFact {
		// Refused by another process meanwhile.
		return r.refuse(ev.Record.Refused)
	}
	if lim := ev.Record.ConfirmLimit; lim != 0 && ev.Confirmed > lim {
		// Advanced between the look at the slot and its stream's start.
		return r.refuse(Refusal{Fact: SlotAdvanced, Err: &SlotAdvancedError{Confirmed: ev.Confirmed, Limit: lim}})
	}
	// Judged as it is now: a process that lost its lease may have written
	// it since (what it saw of the stream).
	r.rec = ev.Record
	r.stream = ev.Head
	r.seen, r.judged, r.count = ev.Head.Seen, false, batchCount{}
	if r.rec.StreamName == ev.Head.Name && r.rec.Seen.Known {
		// What a tailer of the incarnation saw before, once its check
		// found nothing lost: messages gone since, while no tailer
		// looked, were removed meanwhile. Seen at a clean stop, its
		// batches are all there were until this session publishes.
		r.seen, r.judged = r.rec.Seen, true
		if r.rec.Seen.Quiet && !r.rec.Seen.Trims {
			r.count = batchCount{valid: true, batches: r.rec.Seen.Batches}
		}
	}
	if r.rec.Exists && r.rec.Bound {
		return r.checkStream()
	}
	switch {
	case ev.Head.Foreign != nil:
		return r.refuse(Refusal{Fact: ForeignStream, Err: ev.Head.Foreign})
	case ev.Head.LastSeq > 0:
		return r.refuse(Refusal{Fact: EarlierBatches})
	}
	r.ph = binding
	if !r.rec.Exists {
		return []Command{Adopt{}}
	}
	return []Command{Bind{}}
}

// checkStream refuses a stream that lost what the slot's incarnation
// published to it, which JetStream acknowledged whether or not a consumer
// had read it. It knows the stream by the messages stored on it: by this
// process's last session of the same incarnation and stream, or as the
// record keeps them (the newest a tailer found there, and the one last on
// it at the last clean stop). A stream whose server reports another
// creation time than recorded is the same while it holds them (the
// replicas of a stream each report their own time; a restore of all it
// held); with none, while it holds the message the session opened it at
// (opened); with neither, it was made again.
func (r *Relay) checkStream() []Command {
	if r.anchoredInc == r.rec.Incarnation && r.anchoredName == r.stream.Name {
		r.anchors, r.stored = r.anchored, r.anchoredStored
	}
	if r.rec.StreamName == r.stream.Name {
		r.anchors = r.anchors.with(Anchors{Batch: r.rec.Anchor, Last: r.rec.Stopped})
	}
	if r.rec.StreamName == r.stream.Name && r.rec.StreamCreated != r.stream.Created && r.anchors.with(r.stored).Unanchored() {
		return r.refuse(r.replaced(r.stream.Created, r.rec.StreamCreated))
	}
	r.ph = checking
	return []Command{LookAtStream{Anchors: append(r.anchors.all(r.stored), r.opened()...)}}
}

// opened is the stream's last message as the session opened it, to be
// looked for when nothing recorded names a message of the tailer's there.
func (r *Relay) opened() []wire.Anchor {
	if !r.anchors.with(r.stored).Unanchored() || r.stream.Last.Seq == 0 {
		return nil
	}
	return []wire.Anchor{r.stream.Last}
}

// streamChecked resumes on a stream that lost nothing.
func (r *Relay) streamChecked(ev StreamLook) []Command {
	if !r.expect(checking) {
		return nil
	}
	if ref, again, refused := r.lost(ev); refused {
		return r.refuse(ref)
	} else if again {
		// Nothing is on its way before the session publishes: this look
		// was quiet, and again is never asked here.
		return r.refuse(Refusal{Fact: StreamPurged, Err: &StreamLoss{Fact: StreamPurged, Stream: r.stream.Name, Since: r.rec.StreamSeq}})
	}
	r.anchors, r.stored = r.anchors.with(r.stored), Anchors{}
	var cmds []Command
	if r.rec.StreamName == r.stream.Name && r.rec.Seen != r.seen.recordable() {
		// What the stream holds now is what a tailer started after this
		// one is killed compares it with: a message removed meanwhile, a
		// batch this session is about to publish among them, is seen.
		r.recorded, r.recordedSeen = r.anchors.Last, r.seen.recordable()
		cmds = append(cmds, RecordAnchor{Anchor: r.anchors.Last, Seen: r.seen.recordable()})
	}
	if r.rec.Stopped.Seq != 0 {
		cmds = append(cmds, ClearStopped{})
	}
	r.ph = resuming
	return append(cmds, Resume{Owner: Owner{Incarnation: r.rec.Incarnation, Since: r.rec.StreamSeq, Legacy: r.rec.Legacy,
		After: r.slot.Confirmed, InFlight: r.inFlight()}})
}

// inFlight is how many messages a session keeps awaiting their PubAck:
// one on a stream of one replica, which stores one at a time (a second
// would only split the group and double the syncs); two on a replicated
// one, whose leader overlaps replication rounds.
func (r *Relay) inFlight() int {
	switch {
	case r.cfg.MaxInFlight > 0:
		return r.cfg.MaxInFlight
	case r.stream.Replicas > 1:
		return 2
	}
	return 1
}

// resumed streams once the stream is resumed.
func (r *Relay) resumed(ev Resumed) []Command {
	if !r.expect(resuming) {
		return nil
	}
	var foreign *ForeignStreamError
	var trimmed *WindowTrimmedError
	switch {
	case errors.As(ev.Err, &foreign):
		return r.refuse(Refusal{Fact: ForeignStream, Err: ev.Err})
	case errors.As(ev.Err, &trimmed):
		return r.refuse(Refusal{Fact: WindowTrimmed, Err: ev.Err})
	case ev.Err != nil:
		return r.fail(EndNATS, ev.Err, 0)
	}
	var cmds []Command
	if a := ev.Anchors.Last; a.Seq != 0 {
		// Kept before any batch is published: a stream restored from a
		// backup older than the markers does not hold them, whatever older
		// message it still holds (a resync's last).
		r.anchors = r.anchors.with(ev.Anchors)
		r.recorded, r.recordedSeen = a, r.seen.recordable()
		cmds = append(cmds, r.recordAnchor(a))
	}
	if ev.WAL < ev.Reach.Commit || r.reusedIDs {
		// The database is behind what the stream holds of it (a
		// restore): its new tokens can come at positions already
		// published, and their batches must not carry those batches' ids.
		cmds = append(cmds, UniqueIDs{})
	}
	r.ph, r.streamed, r.said, r.standingBy = streaming, true, "", false
	return append(cmds, Publish{})
}

// LookDue asks, while the session streams, for a look at what it reads
// through and at the stream (LookTaken), knowing it by Anchors, what the
// session stored on it so far.
type LookDue struct{ Anchors Anchors }

func (LookDue) event() {}

// NATSTrouble is a cause of NATS storing nothing found while a session
// streams (a full store, a denied publish).
type NATSTrouble struct{ Err error }

func (NATSTrouble) event() {}

// checking asks for a look while streaming: at the anchors the stream is
// known by, and at what the session stored since, which take their place
// once found beside them (a stream made again between a check and the
// session's first publishes holds the session's messages, not the ones
// it was known by).
func (r *Relay) checking(ev LookDue) []Command {
	if !r.expect(streaming) {
		return nil
	}
	r.stored, r.askedQuiet = ev.Anchors, false
	return []Command{LookAtStream{Anchors: r.anchors.all(ev.Anchors)}}
}

// checked stops a streaming session that can no longer read tokens or
// whose stream lost what it stored, and keeps the newest message found
// on the stream in the record.
func (r *Relay) checked(ev LookTaken) []Command {
	if !r.expect(streaming) {
		return nil
	}
	if ref, ok := readable(ev.Schema, ev.Publication, ev.ResyncNeeded, ev.ResyncCause); ok {
		return []Command{Stop{Refusal: ref}}
	}
	if ev.Refused.Fact != NoFact {
		return []Command{Stop{Refusal: ev.Refused}}
	}
	if ev.HealAsked {
		return []Command{Stop{Refusal: Refusal{Fact: HealAsked}}}
	}
	if ev.NATS != nil {
		return []Command{Stop{Refusal: Refusal{Fact: NATSStoresNothing, Err: ev.NATS}}}
	}
	if ref, again, refused := r.lost(ev.Stream); refused {
		return []Command{Stop{Refusal: ref}}
	} else if again && !r.askedQuiet {
		r.askedQuiet = true
		return []Command{LookAtStream{Anchors: r.anchors.all(r.stored), Quiet: true}}
	} else if again {
		// Asked quietly, and something was on its way all the same: the
		// next check looks again.
		return nil
	}
	r.anchors = r.anchors.with(r.stored)
	if a := r.anchors.Last; a.Seq != 0 && (a.Seq != r.recorded.Seq || r.seen.recordable() != r.recordedSeen) {
		r.recorded, r.recordedSeen = a, r.seen.recordable()
		return []Command{r.recordAnchor(a)}
	}
	return nil
}

// recordAnchor records a, the newest message stored on the stream, and
// the stream with it when the record names another (or another creation
// time): named with the markers, never before them, since a tailer killed
// in between, followed by another creation time (another replica
// answering), would find a record naming a stream with nothing to know it
// by, and refuse it.
func (r *Relay) recordAnchor(a wire.Anchor) RecordAnchor {
	rec := RecordAnchor{Anchor: a, Seen: r.seen.recordable()}
	if r.rec.StreamName != r.stream.Name || r.rec.StreamCreated != r.stream.Created {
		rec.Stream = StreamID{Name: r.stream.Name, Created: r.stream.Created}
		r.rec.StreamName, r.rec.StreamCreated = r.stream.Name, r.stream.Created
	}
	return rec
}

// natsTrouble stops a streaming session whose NATS stores nothing.
func (r *Relay) natsTrouble(ev NATSTrouble) []Command {
	if !r.expect(streaming) {
		return nil
	}
	return []Command{Stop{Refusal: Refusal{Fact: NATSStoresNothing, Err: ev.Err}}}
}

// ended says what a session's end means: the process to exit, the
// operator to wait for, another process to stand by for, or a failure to
// retry after a delay.
func (r *Relay) ended(ev Ended) []Command {
	if r.ph == streaming && r.rec.Incarnation != "" {
		// What the session stored since its last check is not known to
		// be on the stream it was known by: the next session looks for
		// both.
		r.anchored, r.anchoredStored, r.anchoredInc, r.anchoredName = r.anchors, ev.Anchors, r.rec.Incarnation, r.stream.Name
	}
	r.ph = idle
	switch ev.End {
	case EndStopped:
		return []Command{Exit{}}
	case EndStoppedUnpublished, EndConfig, EndStreamConfig:
		return []Command{Exit{Err: ev.Err}}
	case EndStartupConfig:
		if !r.streamed {
			return []Command{Exit{Err: ev.Err}}
		}
		return r.fail(EndPostgres, ev.Err, ev.Lasted)
	case EndRefused:
		return r.refuse(ev.Refusal)
	case EndFound:
		// None of these heals by trying again: each waits for the
		// operator's change (the schema, the publication) or its way out.
		return r.refuse(Refusal{Fact: ev.Found, Err: ev.Err})
	case EndLeaseHeld:
		say := !r.standingBy
		r.standingBy, r.said = true, ""
		return []Command{StandBy{Err: ev.Err, Say: say}, Wait{Delay: standbyDelay}}
	case EndReusedID:
		r.reusedIDs = true
	case EndBatchGone:
		// Removed by the limits of a stream that has them (a replay
		// they reached), or purged or deleted from one without.
		if r.seen.Trims || r.stream.Seen.Trims {
			return r.refuse(Refusal{Fact: WindowTrimmed, Err: ev.Err})
		}
		return r.refuse(Refusal{Fact: StreamLostAnchor, Err: ev.Err})
	case EndNATS:
		if ev.Cause != nil {
			return r.refuse(Refusal{Fact: NATSStoresNothing, Err: ev.Cause})
		}
	}
	return r.fail(ev.End, ev.Err, ev.Lasted)
}

// fail ends a session that failed, to be retried after a delay that
// doubles from minDelay to maxDelay (afresh after a session that lasted
// a while; NATS failures at most natsMaxDelay apart).
func (r *Relay) fail(kind EndKind, err error, lasted time.Duration) []Command {
	r.ph = idle
	r.said, r.standingBy = "", false
	if lasted > freshAfter {
		r.delay = minDelay
	}
	var cmds []Command
	if kind == EndNATS {
		r.delay = min(r.delay, natsMaxDelay)
		if r.natsFailed++; r.natsFailed == 2 {
			r.natsFailed = 0
			cmds = append(cmds, Reconnect{})
		}
	} else {
		r.natsFailed = 0
	}
	wait := r.delay
	r.delay = min(2*r.delay, maxDelay)
	return append(cmds, Wait{Delay: wait, Err: err, Say: true})
}

// refuse ends a session that cannot stream: the refusal said once,
// recorded for tailer status (until a resync, if it lasts), and looked at
// again every refusedDelay; resynced instead, where that is its way out
// and MAILROOM_AUTO_RESYNC allows it.
func (r *Relay) refuse(ref Refusal) []Command {
	r.standingBy, r.natsFailed = false, 0
	var cmds []Command
	if ref.Fact.MarksResyncNeeded() {
		cmds = append(cmds, MarkResyncNeeded{})
	}
	if r.cfg.AutoResync && ref.Fact.ResyncWayOut() {
		r.ph = resyncing
		return append(cmds, Resync{Refusal: ref})
	}
	r.ph = idle
	msg := ref.Error()
	say := msg != r.said
	r.said = msg
	r.delay = min(2*refusedDelay, maxDelay)
	return append(cmds, Refuse{Refusal: ref, Say: say}, Wait{Delay: refusedDelay})
}

// resynced waits for the next session, on the new slot or after the
// resync's failure.
func (r *Relay) resynced(ev Resynced) []Command {
	if !r.expect(resyncing) {
		return nil
	}
	r.ph = idle
	if ev.Err != nil {
		r.delay = min(2*refusedDelay, maxDelay)
		return []Command{Wait{Delay: refusedDelay, Err: ev.Err, Say: true}}
	}
	r.said = ""
	r.delay = 2 * minDelay
	return []Command{Wait{Delay: minDelay}}
}
