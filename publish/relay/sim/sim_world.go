package sim

import (
	"errors"
	"fmt"
	"github.com/mailroom/tailer/publish/wire"
	"strings"
	"time"

	"github.com/mailroom/tailer/publish/relay"
)

// The simulation's world: the database, the stream, the network between
// tailer processes and the stream, the processes and the time. Each
// process steps the real Relay and carries its commands out against the
// models, as the daemon does against the servers.

// flight is a publish on its way to the stream: it lands when the
// schedule delivers it, whatever became of the session that sent it.
type flight struct {
	s      *simSession
	m      msg
	expect int64
	// stream is the stream it was chained to: its expected sequence
	// names a place in that one alone.
	stream *streamModel
}

// ackOf is what the stream answered a flight.
type ackOf struct {
	m   msg
	seq uint64
	dup bool
	err error
}

// world is the simulated system.
type world struct {
	db     *dbModel
	stream *streamModel
	procs  []*simProc
	net    []*flight
	now    time.Duration
	// lease is the process holding the slot's lease, until leaseUntil
	// when it is frozen.
	lease      *simProc
	leaseUntil time.Duration
	made       int
	tokens     int
	incarns    int
	sessions   int
	// acked are the tokens a PubAck acknowledged, or that a session found
	// on the stream; trimmed, the ones the stream's limits removed; gone,
	// the ones a fault removed since they last landed.
	acked, trimmed, gone map[string]bool
	// strayDup are the tokens a publish chained to a stream since made
	// again or restored landed on the new one (see deliver); skipped, the
	// ones another process advanced the slot past.
	strayDup, skipped map[string]bool
	// causes says a fault that calls for a refusal happened: a refusal
	// without one is a tailer that stopped for nothing.
	causes bool
	// resyncs counts the resyncs; writes the refusals written to the
	// record, refusedAt the count when the standing one was.
	resyncs, writes, refusedAt int
	// limited: the stream's limits removed a message: a replay they
	// reached is refused (WindowTrimmed).
	limited bool
	// lost: acknowledged batches of the slot's incarnation are gone from
	// the stream since the last resync (what a refusal must stand for).
	lost bool
	// resyncSeq is the stream's last sequence as the last resync ended:
	// a batch before it, past where a failover branched, is the resync's
	// to answer for.
	resyncSeq uint64
	// backups are the stream's backups, dbSnaps the database's; backupAt,
	// anchorWrites when each was taken.
	backups  []*streamModel
	backupAt []int
	// anchorWrites counts the anchors recorded; unseen are the tokens a
	// stream restored from a backup taken since the last one lost.
	anchorWrites int
	unseen       map[string]bool
	dbSnaps      []*dbModel
	trace        []string
	// closing says whether a publish still on its way as its session
	// ends reaches the server (the schedule's draw).
	closing func() bool
}

func newWorld(maxMsgs int) *world {
	w := &world{acked: map[string]bool{}, trimmed: map[string]bool{}, gone: map[string]bool{}, strayDup: map[string]bool{}, skipped: map[string]bool{}, unseen: map[string]bool{}}
	w.db = newDB(&w.tokens, &w.incarns)
	w.db.makeSlot()
	w.db.newIncarnation(false, 0)
	// tailer migrate made the slot and named the publication.
	w.db.published = true
	w.stream = newStream("MAILROOM", maxMsgs, &w.made)
	return w
}

func (w *world) say(format string, a ...any) {
	w.trace = append(w.trace, fmt.Sprintf("%6.1fs ", w.now.Seconds())+fmt.Sprintf(format, a...))
}

// deliver lands the i-th flight on the stream, and gives its session the
// answer if it still waits for it.
func (w *world) deliver(i int) {
	f := w.net[i]
	w.net = append(w.net[:i], w.net[i+1:]...)
	seq, dup, err := w.put(f.m, f.expect)
	if err == nil && !dup && f.stream != w.stream {
		// Chained to a stream since made again or restored, whose
		// sequences it happened to match: a known duplicate (docs/faults.md).
		for _, k := range strings.Split(f.m.Keys, ",") {
			w.strayDup[k] = true
		}
	}
	w.say("flight %s (expect %d) of session %d: seq %d dup %v err %v", f.m.id, f.expect, f.s.id, seq, dup, err)
	if f.s.live() {
		f.s.acks = append(f.s.acks, ackOf{m: f.m, seq: seq, dup: dup, err: err})
	}
}

// put publishes m, expecting the stream's last sequence at expect,
// keeping what the stream's limits removed. A token lands again only
// after a fault removed it, or by a resync the operator asked for: one
// its limits removed, a consumer may have read (a replay they reached
// must be refused).
func (w *world) put(m msg, expect int64) (uint64, bool, error) {
	before, held := w.stream.keys(), len(w.stream.msgs)
	seq, dup, err := w.stream.publish(m, expect)
	w.limited = w.limited || err == nil && !dup && len(w.stream.msgs) <= held
	if err == nil && !dup && m.Is == relay.Batch && m.Keys != "" && !m.Resync {
		for _, k := range strings.Split(m.Keys, ",") {
			if w.trimmed[k] && !w.gone[k] {
				panic(fmt.Sprintf("token %s landed again after the stream's limits removed it", k))
			}
			delete(w.gone, k)
		}
	}
	w.noteTrimmed(before)
	return seq, dup, err
}

// noteTrimmed keeps the keys the stream's limits removed since before.
func (w *world) noteTrimmed(before map[string]int) {
	if !w.stream.trims() {
		return
	}
	after := w.stream.keys()
	for k := range before {
		if after[k] == 0 {
			w.trimmed[k] = true
		}
	}
}

// holdsLease reports whether p holds the slot's lease now.
func (w *world) holdsLease(p *simProc) bool {
	if w.lease != nil && w.lease != p && w.lease.frozen && w.now >= w.leaseUntil {
		// A frozen holder's connection times out.
		w.lease = nil
	}
	return w.lease == p
}

// takeLease gives p the lease if nobody holds it.
func (w *world) takeLease(p *simProc) bool {
	if w.lease != nil && !w.holdsLease(p) {
		return false
	}
	w.lease = p
	return true
}

// resync is tailer resync (or MAILROOM_AUTO_RESYNC's): a new slot and
// incarnation, and every eligible token the stream lacks published, once.
func (w *world) resync() {
	w.resyncs++
	defer func() { w.resyncSeq = w.stream.last }()
	w.db.makeSlot()
	w.db.newIncarnation(false, 0)
	// Its session's markers first, as every session's.
	o := relay.Owner{Origin: w.db.origin, Incarnation: w.db.rec.Incarnation, Since: w.stream.last, InFlight: 1}
	var prev *relay.Published
	if m, ok := w.stream.lastOn("b._session"); ok && m.Is == relay.Marker {
		prev = &m
	}
	k, floor := relay.Fence(o, &relay.Window{}, prev, w.stream.last)
	for i := 1; i <= k; i++ {
		m := msg{Published: relay.Published{Is: relay.Marker, Subject: "b._session", Origin: w.db.origin.String(), Incarnation: o.Incarnation,
			FenceN: i, FenceK: k, InFlight: 1, Floor: floor}}
		*w.db.tokens++
		m.id = fmt.Sprintf("%s%d", wire.MarkerID, *w.db.tokens)
		if _, _, err := w.put(m, int64(w.stream.last)); err != nil {
			panic(err)
		}
	}
	on := w.stream.keys()
	var keys []string
	for _, t := range w.db.txs {
		for _, k := range t.toks {
			if on[k.key] == 0 {
				keys = append(keys, k.key)
			}
		}
	}
	var anchor wire.Anchor
	for len(keys) > 0 {
		n := min(3, len(keys))
		m := msg{Published: relay.Published{Is: relay.Batch, Subject: "b", Origin: w.db.origin.String(), Incarnation: w.db.rec.Incarnation, Keys: strings.Join(keys[:n], ","), Resync: true}}
		*w.db.tokens++
		m.id = fmt.Sprintf("resync-%d", *w.db.tokens)
		seq, _, err := w.put(m, int64(w.stream.last))
		if err != nil {
			panic(err)
		}
		anchor = wire.Anchor{Seq: seq, Mark: m.mark()}
		for _, k := range keys[:n] {
			w.acked[k] = true
		}
		keys = keys[n:]
	}
	// The incarnation owns the stream past what is on it now, and knows
	// it by its last message (FinishResync).
	if m, ok := w.stream.msgs[w.stream.last]; ok {
		anchor = wire.Anchor{Seq: m.Seq, Mark: m.mark()}
	}
	w.anchorWrites++
	r := &w.db.rec
	seen := w.seen()
	seen.Quiet = true
	r.Bound, r.StreamSeq, r.StreamName, r.StreamCreated, r.Anchor, r.Seen = true, w.stream.last, w.stream.name, w.stream.created(), anchor, seen
	r.ConfirmLimit = w.db.slot.confirmed
	w.lost = false
	w.say("resync: incarnation %s, stream seq %d", w.db.rec.Incarnation, w.stream.last)
}

// errStreamGone is a session's stream gone under it between two reads.
var errStreamGone = errors.New("a message of the window left the stream")

// holdsRecord reports whether the stream holds, at their sequences, the
// messages the slot's record knows it by (its anchor and where the last
// clean stop left it): a tailer that judges it by the record alone finds
// nothing missing.
func (w *world) holdsRecord() bool {
	for _, a := range []wire.Anchor{w.db.rec.Anchor, w.db.rec.Stopped} {
		if m, ok := w.stream.msgs[a.Seq]; a.Seq != 0 && (!ok || m.mark() != a.Mark) {
			return false
		}
	}
	return true
}

// seen is what the stream holds, as its info says.
func (w *world) seen() relay.Seen { return w.stream.seen() }
