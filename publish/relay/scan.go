package relay

import "fmt"

// legacyInFlight is the most messages a tailer from before session markers
// kept awaiting their PubAck with its settings at their defaults; a stream
// it wrote without markers is fenced at least this wide.
const legacyInFlight = 2

// Reader reads the stream's messages for Scan, from the stream's leader.
// Its errors end the scan.
type Reader interface {
	// At returns the message at seq; false when the stream no longer
	// holds it.
	At(seq uint64) (Published, bool, error)
	// LastOn returns the last message on subject; false when there is
	// none.
	LastOn(subject string) (Published, bool, error)
}

// Stream is what Scan knows of the stream before reading it.
type Stream struct {
	Name    string
	LastSeq uint64
	// Limited says the stream's configuration removes old messages
	// (max_msgs, max_bytes, max_msgs_per_subject); Limits names them.
	Limited bool
	Limits  string
	// Marker is the session markers' subject, Data the subjects batches
	// can be on.
	Marker string
	Data   []string
}

// WindowTrimmedError is a stream whose limits removed a message the
// session replays the tokens of (published, not yet confirmed to the
// slot): which of those tokens the stream had is gone with it, and
// publishing them again would repeat them.
type WindowTrimmedError struct {
	Stream string
	Seq    uint64
	Limits string
}

func (e *WindowTrimmedError) Error() string {
	return fmt.Sprintf("stream %s's limits (%s) removed message %d, which holds tokens the slot replays: publishing them again would repeat the ones it had, and a consumer that had not read them lost them",
		e.Stream, e.Limits, e.Seq)
}

// scanner is one Scan.
type scanner struct {
	r Reader
	s Stream
	o Owner
	w *Window
}

// Scan finds the window of o's session: every message since o.Since of
// o's incarnation covering a position at or after o.After. It returns it
// with the stream's last marker, of whatever session (nil: none). A
// message of since o.Since that is not o's is a *ForeignStreamError; one
// gone from a stream whose limits remove messages, a
// *WindowTrimmedError.
//
// What the session skips is decided by token key, from the messages the
// stream holds, never by a position alone: a killed session's publish
// that landed late, a refused message whose successor was accepted, or a
// restored database whose new tokens reuse positions the stream's batches
// came from all make the last message's position lie.
//
// Every session's messages come after its markers, and a complete set of
// markers keeps every earlier session's publishes out, so after the last
// complete markers each subject's batches cover positions in order: the
// scan goes back from the stream's end only until each subject shows a
// batch before o.After. The markers then say where the window before them
// starts (their floor) for a slot confirmed at least as far as theirs
// was; for one confirmed less far (a restored database, a crash that lost
// the slot's last confirmation) the scan reads on, marker by marker,
// until one was written for a position at or before o.After. Without
// markers (a stream written by an older tailer) it goes back as after
// complete markers, which holds unless a late publish reordered the
// stream: then it may read too little, and a token may be published
// twice, never skipped.
func Scan(r Reader, s Stream, o Owner) (*Window, *Published, error) {
	sc := &scanner{r: r, s: s, o: o, w: &Window{}}
	var prev *Published
	if m, ok, err := r.LastOn(s.Marker); err != nil {
		return nil, nil, err
	} else if ok && m.Is == Marker {
		prev = &m
	}
	if s.LastSeq <= o.Since {
		return sc.w, prev, nil
	}
	// The last session's messages: after its markers.
	regionStart := o.Since
	var mine *Published
	if prev != nil && prev.Seq > o.Since {
		if err := CheckOwner(s.Name, *prev, o); err != nil {
			return nil, nil, err
		}
		mine, regionStart = prev, prev.Seq
	}
	if err := sc.afterMarkers(regionStart, mine != nil && mine.FenceN < mine.FenceK); err != nil {
		return nil, nil, err
	}
	if err := sc.beforeMarkers(mine); err != nil {
		return nil, nil, err
	}
	return sc.w, prev, nil
}

// inWindow says whether m holds tokens the session replays.
func (sc *scanner) inWindow(m Published) bool {
	return m.Is == Batch && !m.Resync && m.Last.Commit >= sc.o.After
}

// visit takes m into the window when it is the owner's and in it.
func (sc *scanner) visit(m Published) error {
	if m.Is == Other {
		sc.w.Strays++
		return nil
	}
	if err := CheckOwner(sc.s.Name, m, sc.o); err != nil {
		return err
	}
	if sc.inWindow(m) {
		sc.w.Add(m)
	}
	return nil
}

// afterMarkers reads back from the stream's end to regionStart (the last
// session's markers), until each subject shows a batch before the window;
// whole reads all of it: only stragglers of earlier sessions can follow
// incomplete markers, in no order to go by.
func (sc *scanner) afterMarkers(regionStart uint64, whole bool) error {
	pending := map[string]bool{}
	for _, subject := range sc.s.Data {
		m, ok, err := sc.r.LastOn(subject)
		if err != nil {
			return err
		}
		if !ok || m.Seq <= regionStart {
			continue
		}
		if m.Is == Other || sc.inWindow(m) {
			pending[subject] = true
		} else if m.Resync {
			// A resync's batch last on a subject is the owner's though the
			// window needs nothing of it: another incarnation's, its
			// markers purged, is the stream of a resync this database
			// (put back from a copy older than it) never had (make sim
			// seed 1366910510). A session's stale publish of an earlier
			// incarnation, landed after a resync, is the known duplicate.
			if err := CheckOwner(sc.s.Name, m, sc.o); err != nil {
				return err
			}
		}
	}
	for seq := sc.s.LastSeq; seq > regionStart && (whole || len(pending) > 0); seq-- {
		m, ok, err := sc.read(seq)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		if err := sc.visit(m); err != nil {
			return err
		}
		if m.Is == Batch && !sc.inWindow(m) {
			delete(pending, m.Subject)
		}
	}
	return nil
}

// beforeMarkers visits the messages before the last session's markers
// (mine) that the markers say the window may hold, and, for a slot
// confirmed less far than when that session started, further back, marker
// by marker, to one of a session that started from there or before.
func (sc *scanner) beforeMarkers(mine *Published) error {
	for m := mine; m != nil; {
		if m.After <= sc.o.After {
			for seq := max(m.Floor, sc.o.Since+1); seq < m.Seq; seq++ {
				s, ok, err := sc.read(seq)
				if err != nil {
					return err
				}
				if ok {
					if err := sc.visit(s); err != nil {
						return err
					}
				}
			}
			return nil
		}
		next := m
		m = nil
		for seq := next.Seq - 1; seq > sc.o.Since; seq-- {
			s, ok, err := sc.read(seq)
			if err != nil {
				return err
			}
			if !ok {
				continue
			}
			if s.Is == Marker {
				if err := CheckOwner(sc.s.Name, s, sc.o); err != nil {
					return err
				}
				m = &s
				break
			}
			if err := sc.visit(s); err != nil {
				return err
			}
		}
	}
	return nil
}

// read is Reader.At for the scan: a message gone from a stream whose
// limits remove messages is a *WindowTrimmedError (its tokens may be past
// the slot's confirmed position, a session killed before it confirmed
// them, and which of them the stream had is gone with it); gone from one
// without limits, passed over (purges are the stream checks' to find).
func (sc *scanner) read(seq uint64) (Published, bool, error) {
	m, ok, err := sc.r.At(seq)
	if err == nil && !ok && sc.s.Limited {
		return Published{}, false, &WindowTrimmedError{Stream: sc.s.Name, Seq: seq, Limits: sc.s.Limits}
	}
	return m, ok, err
}

// Fence says how many markers a session starts with, and the floor they
// carry: as many as the most messages any session before may have left
// on their way (its own bound, read from its markers: prev, the stream's
// last marker), so that each such message expects a sequence the markers
// move the stream past, and is refused whenever it arrives. A stream
// written without markers (lastSeq > 0, prev nil) is fenced as wide as an
// older tailer kept in flight. The floor is the window's first sequence,
// or, with none, the one after the stream's last.
func Fence(o Owner, w *Window, prev *Published, lastSeq uint64) (k int, floor uint64) {
	k = max(o.InFlight, 1)
	switch {
	case prev != nil && prev.FenceN < prev.FenceK:
		// Its markers did not all land: what they were to keep out
		// still may come.
		k = max(k, prev.InFlight, prev.FenceK)
	case prev != nil:
		k = max(k, prev.InFlight)
	case lastSeq > 0:
		k = max(k, legacyInFlight)
	}
	floor = w.Floor
	if floor == 0 {
		floor = lastSeq + 1
	}
	return k, floor
}
