package subscriber

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/publish/subscriber/protocol"
	"github.com/mailroom/tailer/publish/wire"
)

// handle takes a group of delivered messages: the batches of each not
// done before go to the Sink together.
func (s *Subscriber) handle(ctx context.Context, group []jetstream.Msg) error {
	var units []*Unit
	for i, msg := range group {
		us, err := s.take(ctx, msg)
		if err != nil {
			// Those not taken go back to the server at once too.
			for _, rest := range group[i+1:] {
				rest.Nak()
			}
			return err
		}
		units = append(units, us...)
	}
	if len(units) == 0 {
		return nil
	}
	return s.hand(ctx, units)
}

// take takes one delivered message: it returns the batches of it for the
// Sink, those not done before.
func (s *Subscriber) take(ctx context.Context, msg jetstream.Msg) ([]*Unit, error) {
	meta, err := msg.Metadata()
	if err != nil {
		return nil, fmt.Errorf("message metadata: %w", err)
	}
	seq := meta.Sequence.Stream
	mark := wire.Mark(msg.Subject(), msg.Headers(), msg.Data())
	if err := s.refresh(ctx, msg); err != nil {
		// Back to the server at once, with what this subscriber held.
		msg.Nak()
		return nil, err
	}
	s.noteDelivery(ctx, msg, meta, mark)
	b, err := Decode(msg.Headers(), msg.Data())
	if err != nil {
		return nil, s.unreadable(ctx, msg, seq, err)
	}
	if len(b.Tokens) == 0 {
		// A session marker: nothing for a sink.
		s.ackMsg(ctx, msg, seq)
		return nil, nil
	}
	lines := s.ofAction(b.Lines())
	tokens := make([]int, len(lines))
	for i, line := range lines {
		tokens[i] = len(line)
	}
	t, ok := answerOf[protocol.Taken](s.step(protocol.Offer{Seq: seq, Mark: mark, Tokens: tokens, Rules: protocol.Rules{MaxDeliveries: s.cfg.MaxDeliveries, DeadLetters: s.cfg.DeadLetters != nil}, Msg: msg}))
	if !ok {
		return nil, fmt.Errorf("consume %s: message %d: %w", s.cfg.Durable, seq, ErrClosed)
	}
	s.counts.skipped.Add(int64(t.Skipped))
	switch {
	case t.Ack:
		s.ackMsg(ctx, msg, seq)
		return nil, nil
	case t.Held == nil:
		// Held: the delivery in hand finishes it, and its ack, by stream
		// sequence, is this one's too.
		if s.cfg.Log != nil {
			s.cfg.Log.Info("delivered again while in hand: nothing handed again", "stream_seq", seq)
		}
		return nil, nil
	}
	units, dead := s.units(t.Held, meta, b, lines, t.Fates)
	for _, i := range dead {
		if err := s.deadLetter(ctx, t.Held, b, i, t.Attempts[i]); err != nil {
			return nil, err
		}
	}
	if len(units) == 0 {
		s.finish(ctx, t.Held)
	}
	return units, nil
}

// noteDelivery records a message delivered: the newest the durable's
// subscribers were given, where it stands in its subject's chain, and
// the counts.
func (s *Subscriber) noteDelivery(ctx context.Context, msg jetstream.Msg, meta *jetstream.MsgMetadata, mark string) {
	seq, again := meta.Sequence.Stream, meta.NumDelivered > 1
	f, _ := answerOf[protocol.Follows](s.step(protocol.Arrived{Seq: seq, Mark: mark, Subject: msg.Subject(), Header: msg.Headers(), Again: again}))
	s.counts.messages.Add(1)
	s.counts.lastDelivery.Store(time.Now().UnixNano())
	if again {
		s.counts.redelivered.Add(1)
	}
	if again && s.cfg.Log != nil {
		s.cfg.Log.Info("delivered again: a reader may have had its tokens before", "stream_seq", seq, "deliveries", meta.NumDelivered, "batches_done_before", f.DoneBefore)
	}
	check := GapCheck{JS: s.js, Stream: s.cfg.Stream, Durable: s.cfg.Durable, Pinned: s.pinsOne(), Sink: s.positioner, Log: s.cfg.Log}
	s.gaps.Note(ctx, check, msg.Headers(), f.Gap, func() { msg.InProgress() })
}

// ofAction are the tokens of each line of the subscriber's action (all
// of them without one).
func (s *Subscriber) ofAction(lines [][]SignedToken) [][]SignedToken {
	if s.cfg.Action == "" {
		return lines
	}
	out := make([][]SignedToken, len(lines))
	for i, line := range lines {
		for _, t := range line {
			if t.Action == s.cfg.Action {
				out[i] = append(out[i], t)
			}
		}
	}
	return out
}

// units are the units of h the Sink is to get (fates Hand) and the
// batches to set aside as dead letters (SetAside), as the core took h.
func (s *Subscriber) units(h *protocol.Held, meta *jetstream.MsgMetadata, b *Decoded, lines [][]SignedToken, fates []protocol.Fate) (units []*Unit, dead []int) {
	for i, fate := range fates {
		switch fate {
		case protocol.SetAside:
			dead = append(dead, i)
		case protocol.Hand:
			units = append(units, &Unit{Stream: meta.Stream, Seq: h.Seq, Durable: s.cfg.Durable, ID: b.ID, KeyID: b.KeyID, Line: i, Tokens: lines[i], h: h})
		}
	}
	return units, dead
}

// refresh rereads the record when another subscriber may have written it
// since: the server pinned this subscriber anew, or it was idle a while
// (it was a standby, or a subscriber before it on the durable died). What
// it read is claimed (claim) before anything is handed on.
func (s *Subscriber) refresh(ctx context.Context, msg jetstream.Msg) error {
	if s.cfg.Progress == nil {
		return nil
	}
	pin := msg.Headers().Get("Nats-Pin-Id")
	idle := time.Since(unixTime(s.counts.lastDelivery.Load()))
	if len(s.step(protocol.Delivered{Pin: pin, Idle: idle})) == 0 {
		return nil
	}
	// One talk at a time: no save of this subscriber's in flight
	// meanwhile, so the revision it compares with is its latest.
	_, err := s.talk(ctx, protocol.ClaimRecord{}, recordIO{
		load: func(ctx context.Context) (protocol.Progress, uint64, error) {
			return s.loadProgress(ctx, func() { msg.InProgress() })
		},
		write: func(ctx context.Context, p *protocol.Progress, rev uint64) (uint64, error) {
			return s.claim(ctx, msg, p, rev)
		},
	})
	if errors.Is(err, ErrTakenOver) {
		return fmt.Errorf("consume %s: %w", s.cfg.Durable, err)
	}
	return err
}

// ofThisStream holds a record another subscriber wrote against the
// stream, as the record loaded at the start is (checkRecord): one of
// another stream, left by a subscriber killed before it saved that it
// dropped it, is dropped, or its floor would have this one acknowledge
// the new stream's messages unwritten.
func (s *Subscriber) ofThisStream(ctx context.Context, p *protocol.Progress) error {
	if p.Last.Seq == 0 && p.Floor == 0 {
		return nil
	}
	at, err := s.atLast(ctx, s.js, p.Last)
	if err != nil {
		return err
	}
	if protocol.CheckRecord(at, false, s.cfg.FromStart, s.positioner != nil) == protocol.DropRecord {
		if s.cfg.Log != nil {
			s.cfg.Log.Warn("the durable's record read back is of another stream, or names no message: dropped", "durable", s.cfg.Durable,
				"record_last_seq", p.Last.Seq, "record_floor", p.Floor)
		}
		*p = protocol.Progress{}
	}
	return nil
}

// claim writes p, read at revision rev, back before this subscriber hands
// anything on, trying again while the bucket cannot answer (untilSaved). A read alone
// may be answered by a leader cut off from its cluster, or land just
// before the last save of the subscriber that delivered until now: the
// batches that save says are done were written again (issue 49's fault
// runs: 3 and 4 of one subscriber's batches at one fault). A write lands
// only on the record as it is: once it has, a save of the other's still
// on its way is refused (it stops handing on batches), and one that
// landed first fails this write (ErrTakenOver), and the record is read
// again.
func (s *Subscriber) claim(ctx context.Context, msg jetstream.Msg, p *protocol.Progress, rev uint64) (uint64, error) {
	var newRev uint64
	err := s.untilSaved(ctx, msg, func(try context.Context) (err error) {
		newRev, err = s.cfg.Progress.Save(try, p, rev)
		return err
	})
	return newRev, err
}

// hand gives units to the Sink. A serial reader gets them one at a time,
// the record saved before each while a batch done is unsaved.
func (s *Subscriber) hand(ctx context.Context, units []*Unit) error {
	if r := s.reader; r == nil || !r.serial() {
		return s.cfg.Sink.Hand(ctx, units, s.doneFunc())
	}
	for _, u := range units {
		if len(s.step(protocol.NextUnit{})) > 0 {
			// A message of many batches (a backlog's): what the reader
			// finished is saved before it gets more, so that a
			// subscriber that takes the message over skips it. Taken
			// over, or stopped while the save waited, this one gives its
			// reader nothing more: a batch written now would be read
			// unrecorded, beside the one the reader holds and the one
			// done and unsaved.
			if err := s.saveNow(ctx, u.h.Msg.(jetstream.Msg)); err != nil {
				return fmt.Errorf("consume %s: %w", s.cfg.Durable, err)
			}
		}
		if err := s.cfg.Sink.Hand(ctx, []*Unit{u}, s.doneFunc()); err != nil {
			return err
		}
	}
	return nil
}
