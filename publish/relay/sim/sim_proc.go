package sim

import (
	"errors"
	"fmt"
	"github.com/mailroom/tailer/decoder/wal"
	"github.com/mailroom/tailer/publish/wire"
	"time"

	"github.com/mailroom/tailer/publish/relay"
)

// simProc is a tailer run process: a Relay, and what carries its
// commands out against the models.
type simProc struct {
	w      *world
	id     int
	relay  *relay.Relay
	alive  bool
	frozen bool
	// cmds are the relay's commands still to carry out; wake is when the
	// next session starts (between sessions).
	cmds []relay.Command
	wake time.Duration
	s    *simSession
	// exited says the relay told the process to exit; refused, the
	// refusal it said last (nil once it streams).
	exited  bool
	refused *relay.Refusal
	// refusedAt counts the resyncs before the refusal: one said before the
	// last resync is not yet said again of the new incarnation.
	refusedAt int
}

// simSession is a session of a process.
type simSession struct {
	p      *simProc
	id     int
	start  time.Duration
	rec    relay.SlotRecord
	head   relay.StreamHead
	window *relay.Window
	owner  relay.Owner
	// next is the sequence the next publish expects last, on chained,
	// the stream its markers were stored on.
	next      int64
	chained   *streamModel
	inFlight  int
	unique    bool
	streaming bool
	anchors   relay.Anchors
	acks      []ackOf
	pending   int
	// stored counts the batch messages the session added to the stream
	// (PubAcks taken, not duplicates).
	stored   uint64
	readUpTo wal.LSN
	left     map[wal.LSN]int
	// commitOf is each token's transaction, read.
	commitOf map[string]wal.LSN
	order    []wal.LSN
	// lanes are the tokens read and not yet sent, by lane (subject):
	// each lane's batches go out in order, the lanes' in any.
	lanes      [2][]simTok
	stopped    *relay.Refusal
	markersErr error
	// claimedAt is the record's writes when the session read it last.
	claimedAt int
	// cut: the database server restarted under the session.
	cut bool
}

// live reports whether s is its process's running session.
func (s *simSession) live() bool { return s.p.alive && s.p.s == s }

// newProc is process id, of MaxInFlight inFlight.
func newProc(w *world, id, inFlight int) *simProc {
	return &simProc{w: w, id: id, relay: relay.New(relay.Settings{Stream: "MAILROOM", MaxInFlight: inFlight}), alive: true}
}

// runnable reports whether stepping p does anything.
func (p *simProc) runnable() bool {
	if !p.alive || p.frozen || p.exited {
		return false
	}
	return len(p.cmds) > 0 || p.s != nil || p.w.now >= p.wake
}

// step moves p on by one command, or one unit of its data path, and
// reports whether it did anything.
func (p *simProc) step() bool {
	if !p.runnable() {
		return false
	}
	if len(p.cmds) == 0 && p.s == nil {
		p.s = &simSession{p: p, start: p.w.now, left: map[wal.LSN]int{}, commitOf: map[string]wal.LSN{}}
		p.w.sessions++
		p.s.id = p.w.sessions
		p.cmds = p.relay.Step(relay.Start{})
		return true
	}
	if p.s.cut {
		p.cmds = p.relay.Step(p.ended(relay.EndPostgres, errors.New("the database server restarted")))
		p.s.cut = false
		return true
	}
	if len(p.cmds) > 0 {
		cmd := p.cmds[0]
		p.cmds = p.cmds[1:]
		p.carry(cmd)
		return true
	}
	return p.stream()
}

// carry carries cmd out, stepping the relay with what it found.
func (p *simProc) carry(cmd relay.Command) {
	w, s := p.w, p.s
	w.say("process %d: %T %+v", p.id, cmd, cmd)
	switch c := cmd.(type) {
	case relay.Wait:
		p.endSession()
		p.wake = w.now + c.Delay
		return
	case relay.Exit:
		p.endSession()
		p.exited = true
		return
	case relay.Publish:
		// A process whose lease lapsed while it was frozen goes on until it
		// notices (the lease's watch): its publishes change no record.
		// One refused by another after this session read the record stops
		// at its next check.
		if w.db.rec.Refused.Fact != relay.NoFact && w.db.rec.Incarnation == s.rec.Incarnation && w.holdsLease(p) && w.refusedAt <= s.claimedAt {
			panic(fmt.Sprintf("session %d streams while the record refuses the slot until a resync: %v", s.id, w.db.rec.Refused))
		}
		s.streaming, p.refused = true, nil
		w.say("session %d of process %d streams from %s (incarnation %s)", s.id, p.id, w.db.slot.confirmed, s.rec.Incarnation)
		return
	}
	if ev := p.do(cmd); ev != nil {
		p.cmds = append(p.cmds, p.relay.Step(ev)...)
	}
}

// endSession lets go of the session: its lease, its answers to come.
// Its publisher closes: what it sent reaches the server now, or never
// (the connection's last bytes); the schedule chooses.
func (p *simProc) endSession() {
	w := p.w
	if w.lease == p {
		w.lease = nil
	}
	for i := 0; i < len(w.net); {
		if w.net[i].s != p.s {
			i++
			continue
		}
		if w.closing != nil && w.closing() {
			w.deliver(i)
			continue
		}
		w.net = append(w.net[:i], w.net[i+1:]...)
	}
	p.s = nil
	p.cmds = nil
}

// ended steps the relay with a session's end.
func (p *simProc) ended(kind relay.EndKind, err error) relay.Event {
	return relay.Ended{End: kind, Err: err, Lasted: p.w.now - p.s.start, Anchors: p.s.anchors}
}

// do carries out a command that finds something.
func (p *simProc) do(cmd relay.Command) relay.Event {
	w, s := p.w, p.s
	switch c := cmd.(type) {
	case relay.Open:
		if !w.takeLease(p) {
			return p.ended(relay.EndLeaseHeld, errors.New("the lease is held"))
		}
		return relay.Opened{}
	case relay.Inspect:
		s.rec = w.db.rec
		ev := relay.Inspected{Publication: w.db.publicationErr(), Record: s.rec}
		if sl := w.db.slot; sl != nil {
			ev.Slot = relay.Slot{Present: true, Lost: sl.lost, Confirmed: sl.confirmed}
		}
		return ev
	case relay.ReadHead:
		return relay.HeadRead{Head: p.head()}
	case relay.MakeSlot:
		w.db.makeSlot()
		w.db.newIncarnation(true, 0)
		s.rec = w.db.rec
		return relay.SlotMade{Record: s.rec, Slot: relay.Slot{Present: true, Confirmed: w.db.slot.confirmed}}
	case relay.Claim:
		return p.claim()
	case relay.Adopt:
		w.db.newIncarnation(true, 0)
		s.rec = w.db.rec
		return relay.Bound{Record: s.rec}
	case relay.Bind:
		p.write(func(r *relay.SlotRecord) { r.Bound, r.StreamSeq = true, 0 })
		return relay.Bound{Record: s.rec}
	case relay.LookAtStream:
		return p.look(c)
	case relay.Resume:
		return p.resume(c.Owner)
	}
	p.write1(cmd)
	return nil
}

// write changes the record, as of the session's incarnation.
func (p *simProc) write(change func(*relay.SlotRecord)) {
	w, s := p.w, p.s
	if w.db.rec.Incarnation == s.rec.Incarnation {
		change(&w.db.rec)
		s.rec = w.db.rec
	}
}

// write1 carries out a command that finds nothing.
func (p *simProc) write1(cmd relay.Command) {
	w, s := p.w, p.s
	switch c := cmd.(type) {
	case relay.ClearStopped:
		p.write(func(r *relay.SlotRecord) { r.Stopped = wire.Anchor{} })
	case relay.UniqueIDs:
		s.unique = true
	case relay.RecordAnchor:
		p.record(c)
	case relay.MarkResyncNeeded:
		w.db.rec.ResyncNeeded = true
	case relay.Refuse:
		if c.Refusal.Fact.Lasting() {
			if _, recorded := c.Refusal.Err.(*relay.RecordedRefusal); !recorded {
				p.write(func(r *relay.SlotRecord) {
					if r.Refused.Fact == relay.NoFact {
						r.Refused = relay.Refusal{Fact: c.Refusal.Fact, Err: &relay.RecordedRefusal{Said: c.Refusal.Error()}}
						w.writes++
						w.refusedAt = w.writes
					}
				})
			}
		}
		p.refused, p.refusedAt = &c.Refusal, w.resyncs
		w.say("session %d refused: %v", s.id, c.Refusal)
	case relay.StandBy:
		// Another process owns the slot: this one refuses nothing.
		p.refused = nil
	case relay.Resync:
		w.resync()
		p.cmds = append(p.cmds, p.relay.Step(relay.Resynced{})...)
	}
}

// head is the stream's head as the session opens it.
func (p *simProc) head() relay.StreamHead {
	w := p.w
	h := relay.StreamHead{Name: w.stream.name, Created: w.stream.created(), LastSeq: w.stream.last, Replicas: len(w.stream.replicas),
		Seen: w.seen()}
	if m, ok := w.stream.at(w.stream.last); ok {
		h.Foreign = relay.CheckOrigin(w.stream.name, m, w.db.origin)
		mark, _ := w.stream.mark(w.stream.last)
		h.Last = wire.Anchor{Seq: w.stream.last, Mark: mark}
	}
	return h
}

// claim records the publication, starts the slot and opens the stream.
func (p *simProc) claim() relay.Event {
	w, s := p.w, p.s
	if w.db.slot == nil {
		// Dropped since the session looked (START_REPLICATION fails).
		return p.ended(relay.EndPostgres, errors.New("replication slot does not exist"))
	}
	if w.db.slot.lost {
		return relay.Ended{End: relay.EndFound, Found: relay.SlotLost}
	}
	w.db.published = true
	s.head = p.head()
	s.readUpTo = w.db.slot.confirmed
	s.claimedAt = w.writes
	return relay.Claimed{Head: s.head, Record: w.db.rec, Confirmed: w.db.slot.confirmed}
}

// look is the stream as a check finds it: quiet (Seen.Quiet) when it
// asks and nothing of the session's is on its way or unanswered (a
// session that has not published yet, or whose publishes are all
// answered); the anchors gone, whatever removed them.
func (p *simProc) look(c relay.LookAtStream) relay.Event {
	w, s := p.w, p.s
	ev := relay.StreamLook{Created: w.stream.created(), Seen: w.seen(), Stored: s.stored}
	ev.Seen.Quiet = (c.Quiet || !s.streaming) && s.pending == 0 && len(s.acks) == 0
	for _, want := range c.Anchors {
		if mark, ok := w.stream.mark(want.Seq); want.Seq != 0 && (!ok || mark != want.Mark) {
			ev.Missing = append(ev.Missing, want)
		}
	}
	if !s.streaming {
		w.say("look %+v: %+v (stream first %d last %d msgs %d)", c, ev, w.stream.first, w.stream.last, len(w.stream.msgs))
		return ev
	}
	ck := relay.LookTaken{Publication: w.db.publicationErr(), Stream: ev}
	if w.db.rec.Incarnation == s.rec.Incarnation {
		ck.ResyncNeeded, ck.ResyncCause, ck.Refused = w.db.rec.ResyncNeeded, w.db.rec.ResyncCause, w.db.rec.Refused
	}
	return ck
}

// resume scans the stream and publishes the session's markers.
func (p *simProc) resume(o relay.Owner) relay.Event {
	w, s := p.w, p.s
	o.Origin = w.db.origin
	s.owner, s.inFlight = o, o.InFlight
	{
		// Chained to the last sequence the session opened the stream at:
		// a stream made again since is not resumed on.
		win, prev, err := relay.Scan(modelReader{w.stream}, relay.Stream{Name: w.stream.name, LastSeq: s.head.LastSeq, Limited: w.stream.trims(),
			Limits: "max_msgs", Marker: "b._session", Data: laneSubjects[:]}, o)
		if err != nil {
			return relay.Resumed{Err: err}
		}
		k, floor := relay.Fence(o, win, prev, s.head.LastSeq)
		next := int64(s.head.LastSeq)
		ok := true
		for i := 1; i <= k; i++ {
			m := msg{Published: relay.Published{Is: relay.Marker, Subject: "b._session", Origin: w.db.origin.String(), Incarnation: o.Incarnation,
				FenceN: i, FenceK: k, InFlight: max(o.InFlight, 1), After: o.After, Floor: floor}}
			*w.db.tokens++
			m.id = fmt.Sprintf("%s%d", wire.MarkerID, *w.db.tokens)
			seq, _, err := w.put(m, next)
			if err != nil {
				ok = false
				break
			}
			s.anchors.Last = wire.Anchor{Seq: seq, Mark: m.mark()}
			next++
		}
		if ok {
			win.Fence = k
			s.window, s.next, s.chained = win, next, w.stream
			return relay.Resumed{Reach: win.Max, WAL: w.db.wal(), Anchors: s.anchors}
		}
	}
	return p.ended(relay.EndNATS, errors.New("the stream moved on without the session"))
}

// check is the periodic look while streaming (the slot sampler's).
func (p *simProc) check() {
	s := p.s
	if s == nil || !s.streaming || s.stopped != nil || len(p.cmds) > 0 {
		return
	}
	cmds := p.relay.Step(relay.LookDue{Anchors: s.anchors})
	for len(cmds) > 0 {
		cmd := cmds[0]
		cmds = cmds[1:]
		switch c := cmd.(type) {
		case relay.LookAtStream:
			cmds = append(cmds, p.relay.Step(p.look(c))...)
		case relay.Stop:
			s.stopped = &c.Refusal
		case relay.RecordAnchor:
			p.record(c)
		}
	}
}

// record keeps the newest batch found on the stream, and what the stream
// held (SetAnchor).
func (p *simProc) record(c relay.RecordAnchor) {
	p.w.anchorWrites++
	p.write(func(r *relay.SlotRecord) {
		if id := c.Stream; id.Name != "" {
			if r.StreamName != id.Name {
				r.Anchor = wire.Anchor{}
			}
			r.StreamName, r.StreamCreated = id.Name, id.Created
		}
		if c.Anchor.Seq > r.Anchor.Seq {
			r.Anchor = c.Anchor
		}
		r.Seen = c.Seen
	})
}
