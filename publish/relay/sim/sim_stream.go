package sim

// A simulated process streaming: reading the slot's tokens, sending them
// to the stream's model in lanes, taking its PubAcks in order, and
// confirming the slot past what was acknowledged.

import (
	"errors"
	"fmt"
	"github.com/mailroom/tailer/decoder/wal"
	"github.com/mailroom/tailer/publish/wire"
	"strings"

	"github.com/mailroom/tailer/publish/relay"
)

// stream does one unit of a streaming session's work: an answer from the
// stream taken, a transaction read from the slot, a message sent, or the
// slot confirmed.
func (p *simProc) stream() bool {
	s := p.s
	if s == nil || !s.streaming {
		return false
	}
	if s.stopped != nil {
		p.cmds = append(p.cmds, p.relay.Step(relay.Ended{End: relay.EndRefused, Refusal: *s.stopped, Lasted: p.w.now - s.start, Anchors: s.anchors})...)
		return true
	}
	if !p.w.holdsLease(p) {
		p.cmds = append(p.cmds, p.relay.Step(p.ended(relay.EndLeaseLost, errors.New("the lease was lost")))...)
		return true
	}
	switch {
	case len(s.acks) > 0:
		p.takeAck()
	case s.queued() > 0 && s.pending < max(s.inFlight, 1):
		p.send()
	case s.queued() < 4 && p.read():
	default:
		return p.confirm()
	}
	return true
}

// takeAck takes the stream's answer to the session's oldest message.
func (p *simProc) takeAck() {
	w, s := p.w, p.s
	a := s.acks[0]
	s.acks = s.acks[1:]
	s.pending--
	switch {
	case a.err != nil:
		p.cmds = append(p.cmds, p.relay.Step(p.ended(relay.EndNATS, a.err))...)
		return
	case a.dup:
		// publish.Publisher.CheckDuplicate: the message the PubAck names
		// must be there, holding the batch's tokens.
		held, ok := w.stream.at(a.seq)
		if !ok {
			p.cmds = append(p.cmds, p.relay.Step(p.ended(relay.EndBatchGone, errors.New("duplicate PubAck names a sequence the stream no longer holds")))...)
			return
		}
		if held.Keys != a.m.Keys {
			p.cmds = append(p.cmds, p.relay.Step(p.ended(relay.EndReusedID, errors.New("reused id")))...)
			return
		}
	}
	s.anchors.Last = wire.Anchor{Seq: a.seq, Mark: a.m.mark()}
	s.anchors.Batch = s.anchors.Last
	if !a.dup {
		s.stored++
	}
	for _, k := range strings.Split(a.m.Keys, ",") {
		w.acked[k] = true
	}
	for _, k := range strings.Split(a.m.Keys, ",") {
		s.left[s.commitOf[k]]--
	}
}

// read reads the slot's next transaction, skipping the tokens the stream
// holds (Window.Has); false when there is none.
func (p *simProc) read() bool {
	w, s := p.w, p.s
	for _, t := range w.db.replay(s.readUpTo) {
		s.readUpTo = t.commit
		s.order = append(s.order, t.commit)
		if !t.inSlot {
			continue
		}
		for _, k := range t.toks {
			on, err := s.window.Has(k.pos, k.raw, func(seq uint64) (string, error) {
				m, ok := w.stream.at(seq)
				if !ok {
					return "", errStreamGone
				}
				return m.Keys, nil
			})
			if err != nil {
				p.cmds = append(p.cmds, p.relay.Step(p.ended(relay.EndNATS, err))...)
				return true
			}
			if on {
				w.acked[k.key] = true
				continue
			}
			lane := laneOf(k)
			s.lanes[lane] = append(s.lanes[lane], k)
			s.left[t.commit]++
			s.commitOf[k.key] = t.commit
		}
		return true
	}
	return false
}

// laneSubjects are the lanes' subjects (per action, as
// MAILROOM_PER_ACTION has them).
var laneSubjects = [2]string{"b", "c"}

// laneOf is the lane of a token: by its key, as an action would part them.
func laneOf(k simTok) int { return int(k.raw[0] & 1) }

// queued is how many tokens wait in the lanes.
func (s *simSession) queued() int { return len(s.lanes[0]) + len(s.lanes[1]) }

// send publishes the next tokens (up to three) of the lane holding the
// most as a message on its way: a lane's batch is cut when full, so the
// lanes' messages go out in no order of their positions.
func (p *simProc) send() {
	w, s := p.w, p.s
	lane := 0
	if len(s.lanes[1]) > len(s.lanes[0]) {
		lane = 1
	}
	n := min(3, len(s.lanes[lane]))
	toks := s.lanes[lane][:n]
	s.lanes[lane] = s.lanes[lane][n:]
	keys := make([]string, n)
	for i, k := range toks {
		keys[i] = k.key
	}
	m := msg{Published: relay.Published{Is: relay.Batch, Subject: laneSubjects[lane], Origin: w.db.origin.String(), Incarnation: s.rec.Incarnation,
		First: toks[0].pos, Last: toks[n-1].pos, Keys: strings.Join(keys, ",")}}
	m.id = toks[0].pos.String() + "-" + toks[n-1].pos.String()
	if s.unique {
		m.id += fmt.Sprintf("@%d", s.id)
	}
	w.net = append(w.net, &flight{s: s, m: m, expect: s.next, stream: s.chained})
	s.next++
	s.pending++
}

// confirm confirms the slot past every transaction whose tokens are all
// acknowledged or skipped, and past the WAL's end when none waits.
func (p *simProc) confirm() bool {
	w, s := p.w, p.s
	to := wal.LSN(0)
	for len(s.order) > 0 && s.left[s.order[0]] <= 0 {
		to = s.order[0]
		delete(s.left, s.order[0])
		s.order = s.order[1:]
	}
	if len(s.order) == 0 && s.queued() == 0 && s.pending == 0 && s.readUpTo >= w.db.txEnd() {
		to = max(to, w.db.wal())
	}
	if to > w.db.slot.confirmed {
		// The record's limit first, under the lease (Lease.SetConfirmLimit).
		w.db.rec.ConfirmLimit = max(w.db.rec.ConfirmLimit, to)
		w.db.confirm(to)
		return true
	}
	return false
}
