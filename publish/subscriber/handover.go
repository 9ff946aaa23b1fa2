package subscriber

import (
	"context"
	"errors"
	"fmt"
	"github.com/mailroom/tailer/publish/jsio"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/publish/subscriber/protocol"
	"github.com/mailroom/tailer/publish/wire"
)

// held is a message delivered and not yet acknowledged.
type held struct {
	msg jetstream.Msg
	seq uint64
	rec *protocol.MessageProgress
	// pending counts its batches not done.
	pending int
	// acking: every batch is done and the ack is on its way.
	acking bool
}

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
	s.mu.Lock()
	rec := s.prog.MessageAt(seq, mark, len(b.Sizes))
	lines := s.ofAction(b.Lines())
	inHand := slices.ContainsFunc(s.held, func(h *held) bool { return h.rec == rec && !h.acking })
	fates, acknowledge := protocol.Plan(protocol.Delivery{Seq: seq, Floor: s.prog.Floor, Acked: rec.Acked, Held: inHand, Batches: batchesOf(rec, lines)},
		protocol.Rules{MaxDeliveries: s.cfg.MaxDeliveries, DeadLetters: s.cfg.DeadLetters != nil})
	if acknowledge {
		s.stats.Skipped += rec.Batches
		s.mu.Unlock()
		s.ackMsg(ctx, msg, seq)
		return nil, nil
	}
	if fates == nil {
		// Held: the delivery in hand finishes it, and its ack, by stream
		// sequence, is this one's too.
		s.mu.Unlock()
		if s.cfg.Log != nil {
			s.cfg.Log.Info("delivered again while in hand: nothing handed again", "stream_seq", seq)
		}
		return nil, nil
	}
	h := &held{msg: msg, seq: seq, rec: rec}
	s.held = append(s.held, h)
	units, dead := s.units(h, meta, b, lines, fates)
	s.dirty = true
	s.mu.Unlock()
	for _, i := range dead {
		if err := s.deadLetter(ctx, h, b, i); err != nil {
			return nil, err
		}
	}
	if len(units) == 0 {
		s.finish(ctx, h)
	}
	return units, nil
}

// noteDelivery records a message delivered: the newest the durable's
// subscribers were given, where it stands in its subject's chain, and
// the counts.
func (s *Subscriber) noteDelivery(ctx context.Context, msg jetstream.Msg, meta *jetstream.MsgMetadata, mark string) {
	seq, again := meta.Sequence.Stream, meta.NumDelivered > 1
	s.mu.Lock()
	if s.prog.Saw(seq, mark) {
		s.dirty = true
	}
	var gap *wire.Gap
	if !wire.IsMarker(msg.Headers()) {
		gap = s.prog.Chain.Follow(msg.Subject(), seq, msg.Headers(), mark, again)
	}
	s.stats.Messages++
	s.stats.LastDelivery = time.Now()
	done := 0
	if again {
		s.stats.Redelivered++
		if m := s.prog.Messages[seq]; m != nil && m.Mark == mark {
			done = m.Done.Len()
		}
	}
	s.mu.Unlock()
	if again && s.cfg.Log != nil {
		s.cfg.Log.Info("delivered again: a reader may have had its tokens before", "stream_seq", seq, "deliveries", meta.NumDelivered, "batches_done_before", done)
	}
	s.gaps.Note(ctx, s.js, s.cfg.Stream, s.cfg.Durable, s.pinsOne(), s.positioner != nil, s.cfg.Log, msg.Headers(), gap, func() { msg.InProgress() })
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

// batchesOf is the message's batches as the plan sees them: what rec
// says of each, and its tokens for the sink.
func batchesOf(rec *protocol.MessageProgress, lines [][]SignedToken) []protocol.PlanBatch {
	out := make([]protocol.PlanBatch, len(lines))
	for i, line := range lines {
		out[i] = protocol.PlanBatch{Done: rec.Done.Has(i), Attempts: rec.Attempts[i], Tokens: len(line)}
	}
	return out
}

// units carries out the plan (fates) of b's batches: the units the Sink
// is to get and the batches to set aside as dead letters, each counted
// pending in h; a batch with nothing for the sink is done as it is.
// Called with s.mu held.
func (s *Subscriber) units(h *held, meta *jetstream.MsgMetadata, b *Decoded, lines [][]SignedToken, fates []protocol.Fate) (units []*Unit, dead []int) {
	for i, fate := range fates {
		switch fate {
		case protocol.DoneBefore:
			s.stats.Skipped++
		case protocol.SetAside:
			dead = append(dead, i)
			h.pending++
		case protocol.NothingForSink:
			h.rec.Done.Add(i)
		case protocol.Hand:
			h.pending++
			units = append(units, &Unit{Stream: meta.Stream, Seq: h.seq, Durable: s.cfg.Durable, ID: b.ID, KeyID: b.KeyID, Line: i, Tokens: lines[i], h: h})
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
	s.mu.Lock()
	stale := protocol.MustReread(pin != s.pinID, len(s.held) > 0, time.Since(s.stats.LastDelivery))
	s.pinID = pin
	s.mu.Unlock()
	if !stale {
		return nil
	}
	// No save of this subscriber's in flight meanwhile: the revision it
	// compares with is its latest.
	s.saveMu.Lock()
	defer s.saveMu.Unlock()
	for {
		p, newRev, err := s.loadProgress(ctx, func() { msg.InProgress() })
		if err != nil {
			return err
		}
		s.mu.Lock()
		theirs := newRev != s.rev
		s.mu.Unlock()
		if theirs {
			if err := s.ofThisStream(ctx, &p); err != nil {
				return err
			}
		}
		s.mu.Lock()
		holding := len(s.held) > 0
		decided := protocol.AfterReread(holding, newRev == s.rev)
		switch decided {
		case protocol.TakenOver:
			s.mu.Unlock()
			return fmt.Errorf("consume %s: %w", s.cfg.Durable, ErrTakenOver)
		case protocol.KeepOwn:
			// A record of another stream dropped since stays dropped:
			// read back, that one would skip this stream's messages at
			// its sequences.
			p = s.prog.Clone()
		case protocol.Merge:
			// What this subscriber finished and had not saved yet stays
			// known.
			p.Absorb(&s.prog)
		}
		s.mu.Unlock()
		rev, err := s.claim(ctx, msg, &p, newRev)
		if errors.Is(err, ErrTakenOver) {
			// Written since the read: read again.
			continue
		}
		if err != nil {
			return err
		}
		s.mu.Lock()
		s.rev = rev
		if decided == protocol.Merge {
			// The record written is this subscriber's from now on; with
			// KeepOwn it already was.
			s.prog = p
		}
		if !holding {
			s.dirty, s.doneUnsaved = false, 0
		}
		s.mu.Unlock()
		return nil
	}
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
		s.mu.Lock()
		behind := protocol.SaveFirst(true, s.doneUnsaved)
		s.mu.Unlock()
		if behind {
			// A message of many batches (a backlog's): what the reader
			// finished is saved before it gets more, so that a
			// subscriber that takes the message over skips it. Taken
			// over, or stopped while the save waited, this one gives its
			// reader nothing more: a batch written now would be read
			// unrecorded, beside the one the reader holds and the one
			// done and unsaved.
			if err := s.saveNow(ctx, u.h.msg); err != nil {
				return fmt.Errorf("consume %s: %w", s.cfg.Durable, err)
			}
		}
		if err := s.cfg.Sink.Hand(ctx, []*Unit{u}, s.doneFunc()); err != nil {
			return err
		}
	}
	return nil
}

// doneFunc is what a Sink calls with the units it finished, also after
// the Hand that gave them, and as the subscriber stops: a unit a sink
// finished is acknowledged all the same (reports that come as the
// sender ends; a commit that landed).
func (s *Subscriber) doneFunc() func(...*Unit) {
	ctx := context.WithoutCancel(s.life)
	return func(us ...*Unit) { s.done(ctx, us) }
}

// done marks units done and acknowledges the messages that are then
// complete.
func (s *Subscriber) done(ctx context.Context, units []*Unit) {
	s.mu.Lock()
	var complete []*held
	for _, u := range units {
		if u.done {
			continue
		}
		u.done = true
		u.h.rec.Finished(u.Line)
		s.stats.Batches++
		s.stats.LastDone = time.Now()
		s.dirty = true
		s.doneUnsaved++
		if u.h.pending--; u.h.pending == 0 {
			complete = append(complete, u.h)
		}
	}
	s.mu.Unlock()
	s.signal()
	s.finish(ctx, complete...)
}

// finish acknowledges messages all of whose batches are done, once the
// record says so, the acks' answers awaited side by side.
func (s *Subscriber) finish(ctx context.Context, hs ...*held) {
	var ready []*held
	s.mu.Lock()
	for _, h := range hs {
		if !h.acking && h.pending == 0 {
			h.acking = true
			ready = append(ready, h)
		}
	}
	s.mu.Unlock()
	if len(ready) == 0 {
		return
	}
	// Every batch of them is done: acknowledged even when taken over.
	s.saveNow(ctx, ready[0].msg)
	if len(ready) == 1 {
		s.acked(ctx, ready[0], s.ack(ctx, ready[0].msg))
	} else {
		var wg sync.WaitGroup
		for _, h := range ready {
			wg.Add(1)
			go func() { defer wg.Done(); s.acked(ctx, h, s.ack(ctx, h.msg)) }()
		}
		wg.Wait()
	}
	s.signal()
}

// acked notes h's ack and how the server answered it (err).
func (s *Subscriber) acked(ctx context.Context, h *held, err error) {
	s.mu.Lock()
	if i := slices.Index(s.held, h); i >= 0 {
		s.held = slices.Delete(s.held, i, i+1)
	}
	if err == nil {
		h.rec.Acked = true
		s.stats.Acked++
		s.dirty = true
	}
	s.mu.Unlock()
	if err != nil && ctx.Err() == nil && s.cfg.Log != nil {
		// Its batches are done, as the record says: delivered again,
		// the message is acknowledged without handing anything on.
		s.cfg.Log.Warn("ack not confirmed; the message will be delivered again, and not handed on again", "stream_seq", h.seq, "err", err)
	}
}

// ackMsg acknowledges a message that needs nothing from the reader.
func (s *Subscriber) ackMsg(ctx context.Context, msg jetstream.Msg, seq uint64) {
	if err := s.ack(ctx, msg); err != nil && ctx.Err() == nil && s.cfg.Log != nil {
		s.cfg.Log.Warn("ack not confirmed; the message will be delivered again", "stream_seq", seq, "err", err)
	}
	s.mu.Lock()
	s.stats.Acked++
	s.mu.Unlock()
}

// ack acknowledges msg and waits progressTry at most for the server to
// confirm it: a consumer's leader frozen or cut off does not answer, and
// the message, whose batches the record says are done, comes again and is
// acknowledged without a line, where waiting held up the next one.
func (s *Subscriber) ack(ctx context.Context, msg jetstream.Msg) error {
	try, cancel := context.WithTimeout(ctx, progressTry)
	defer cancel()
	return msg.DoubleAck(try)
}

// Outcome is how a reader ended, for ReaderEnded.
type Outcome int

const (
	// ReaderStopped: the subscriber stopped it; it may not have finished
	// what it held.
	ReaderStopped Outcome = iota
	// ReaderDone: it read to the end of its input and said it finished
	// everything (exited with a code that means done).
	ReaderDone
	// ReaderFailed: it failed with batches in hand; the oldest batch it
	// took and did not finish counts an attempt (see MaxDeliveries).
	ReaderFailed
	// ReaderTook: it ended on its own saying it finished what it took
	// (exit 0 before the end of its input): the batches it took whole
	// are done, the others delivered again.
	ReaderTook
)

// ReaderEnded ends the doubt about the batches a reader may have had when it
// ended: done if it said so (ReaderDone: a reader that reports has said so
// line by line, and only those lines are done), delivered again at once
// otherwise, the others of their messages remembered as done. It returns
// how many messages were handed back.
func (s *Subscriber) ReaderEnded(ctx context.Context, o Outcome) int {
	var failedOn *Unit
	inDoubt := false
	if r := s.reader; r != nil {
		failedOn, inDoubt = r.settle(o)
	}
	s.mu.Lock()
	if o == ReaderFailed && inDoubt {
		s.stats.ReaderFailures++
	}
	if u := failedOn; u != nil {
		u.h.rec.Failed(u.Line)
		s.dirty = true
	}
	// Every message in hand but those being acknowledged: some of their
	// batches may not even have been handed over.
	var nak []*held
	for _, h := range s.held {
		if !h.acking {
			nak = append(nak, h)
		}
	}
	s.held = slices.DeleteFunc(s.held, func(h *held) bool { return !h.acking })
	s.mu.Unlock()
	// Which batches are done, before the messages come again.
	if err := s.save(ctx); err != nil && s.cfg.Log != nil {
		s.cfg.Log.Warn("cannot save which batches are done; those of the messages handed back are written again", "durable", s.cfg.Durable, "err", err)
	}
	for _, h := range nak {
		h.msg.Nak()
	}
	return len(nak)
}

// unreadable sets aside a message that does not decode: delivering it again
// would not fix it.
func (s *Subscriber) unreadable(ctx context.Context, msg jetstream.Msg, seq uint64, err error) error {
	if s.cfg.Log != nil {
		s.cfg.Log.Error("a message that cannot be read", "subject", msg.Subject(), "stream_seq", seq, "err", err)
	}
	if s.cfg.DeadLetters != nil {
		dl := DeadLetter{Stream: s.cfg.Stream, Seq: seq, Batch: -1, Durable: s.cfg.Durable, Reason: "cannot be read: " + err.Error(),
			Deliveries: 1, Header: msg.Headers(), Body: msg.Data()}
		if err := s.cfg.DeadLetters.Put(ctx, dl); err != nil {
			return err
		}
		s.mu.Lock()
		s.stats.DeadLetters++
		s.mu.Unlock()
		if s.cfg.Log != nil {
			s.cfg.Log.Error("dead letter: set aside a message that cannot be read", "stream_seq", seq, "durable", s.cfg.Durable)
		}
	}
	// Off this consumer; it stays in the stream.
	return msg.Term()
}

// deadLetter sets batch i of h aside and marks it done.
func (s *Subscriber) deadLetter(ctx context.Context, h *held, b *Decoded, i int) error {
	hdr, body, err := batchMessage(b, i)
	if err != nil {
		return fmt.Errorf("dead letter of seq %d batch %d: %w", h.seq, i, err)
	}
	s.mu.Lock()
	n := h.rec.Attempts[i]
	s.mu.Unlock()
	reason := fmt.Sprintf("%d readers failed with this batch taken and not finished", n)
	dl := DeadLetter{Stream: s.cfg.Stream, Seq: h.seq, Batch: i, Durable: s.cfg.Durable, Reason: reason, Deliveries: n, Header: hdr, Body: body}
	if err := s.cfg.DeadLetters.Put(ctx, dl); err != nil {
		return err
	}
	if s.cfg.Log != nil {
		s.cfg.Log.Error("dead letter: set a batch aside; the batches behind it flow", "stream_seq", h.seq, "batch", i,
			"batch_id", b.ID, "tokens", b.Sizes[i], "deliveries", n, "durable", s.cfg.Durable)
	}
	s.mu.Lock()
	s.stats.DeadLetters++
	s.mu.Unlock()
	s.done(ctx, []*Unit{{h: h, Line: i}})
	return nil
}

// saveNow saves the record before msg is acknowledged or the reader given
// more of it. An ack the server confirmed is one replica's word: a
// consumer leader killed or cut off before it replicated it loses it, and
// the new leader delivers the message again, maybe to the other
// subscriber of a pinned pair, which skips the batches the durable's
// record says are done (issue 49's fault runs: messages of 126 and 178
// batches written again whole, the record's save waiting on a partitioned
// node). While the bucket cannot take the save, msg is kept and the save
// tried again; a save refused because another subscriber delivers now
// ends the wait, with ErrTakenOver (issue 49: a subscriber went on
// handing its reader a message's batches, 97 and 218 of them, for the
// second the saver took to notice, and the other wrote them again).
func (s *Subscriber) saveNow(ctx context.Context, msg jetstream.Msg) error {
	if s.cfg.Progress == nil {
		return nil
	}
	return s.untilSaved(ctx, msg, s.save)
}

// untilSaved calls save, each try given progressTry, until it lands, is
// refused as taken over, or ctx ends, msg kept from redelivery meanwhile.
// Waiting here, the consume loop hears no heartbeat: a server cut off
// from the bucket is left as the loop would leave it.
func (s *Subscriber) untilSaved(ctx context.Context, msg jetstream.Msg, save func(context.Context) error) error {
	var stranded Stranded
	for {
		try, cancel := context.WithTimeout(ctx, progressTry)
		err := save(try)
		cancel()
		s.noRoom(err)
		if err == nil || errors.Is(err, ErrTakenOver) || ctx.Err() != nil {
			return err
		}
		if jsio.Unanswered(err) && s.js != nil {
			stranded.Missed(s.js.Conn(), s.cfg.Log, s.cfg.Durable, "no answer to the save of which batches are done")
		}
		msg.InProgress()
		if !sleep(ctx, 250*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// noRoom keeps, and says once, a save the server refused for want of
// room (the record's bucket full, or the account's JetStream limits):
// retrying alone would say nothing while nothing goes on. A save that
// lands forgets it.
func (s *Subscriber) noRoom(err error) {
	why := ""
	if err != nil && jsio.NoRoom(err) {
		why = fmt.Sprintf("the server has no room for the durable's record of which batches are done (%s): grow its bucket (max_bytes) or the account's JetStream storage; "+
			"nothing more is handed on until a save lands", jsio.ServerWords(err))
	}
	s.mu.Lock()
	said := s.stats.NoRoom
	s.stats.NoRoom = why
	s.mu.Unlock()
	if why != "" && said == "" && s.cfg.Log != nil {
		s.cfg.Log.Error("cannot save which batches are done", "durable", s.cfg.Durable, "err", why)
	}
}

// signal tells the saver there is something to save.
func (s *Subscriber) signal() {
	if s.cfg.Progress == nil || s.kick == nil {
		return
	}
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// saver saves the record whenever it changed, one save at a time (when
// there is a store), and reads the consumer's ack floor now and then so
// that the record forgets what the server will not deliver again. A save refused because another
// subscriber wrote while this one holds messages ends Run.
func (s *Subscriber) saver(ctx context.Context, cancel context.CancelCauseFunc) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
		case <-tick.C:
		}
		if s.cfg.Progress == nil {
			// The record in memory forgets, all the same, what the
			// server will not deliver again.
			s.readFloor(ctx)
			continue
		}
		// A save under way completes as Run ends: one cut off may land
		// unheard, and the next must find it this subscriber's.
		saveCtx, cancelSave := context.WithTimeout(context.WithoutCancel(ctx), progressTry)
		s.readFloor(saveCtx)
		err := s.save(saveCtx)
		cancelSave()
		s.noRoom(err)
		switch {
		case errors.Is(err, ErrTakenOver):
			s.mu.Lock()
			holding := len(s.held) > 0
			s.mu.Unlock()
			if holding {
				cancel(err)
				return
			}
		case err != nil && !failing && ctx.Err() == nil:
			failing = true
			if s.cfg.Log != nil {
				s.cfg.Log.Warn("cannot save which batches are done; trying again", "durable", s.cfg.Durable, "err", err)
			}
		case err == nil:
			failing = false
		}
	}
}

// readFloor reads the consumer's ack floor, at most once a second.
func (s *Subscriber) readFloor(ctx context.Context) {
	cons := s.Consumer()
	s.mu.Lock()
	due := cons != nil && time.Since(s.floorRead) >= time.Second
	if due {
		s.floorRead = time.Now()
	}
	s.mu.Unlock()
	if !due {
		return
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return
	}
	s.mu.Lock()
	if f := info.AckFloor.Stream; f > s.prog.Floor {
		// Messages in hand are above the floor: they are not acknowledged.
		s.prog.Prune(f)
		s.dirty = true
	}
	s.mu.Unlock()
}

// save writes the record if it changed. It returns ErrTakenOver when
// another subscriber wrote it since this one read or wrote it, and the
// server no longer pins this one (saveOver).
func (s *Subscriber) save(ctx context.Context) error {
	if s.cfg.Progress == nil {
		return nil
	}
	s.saveMu.Lock()
	defer s.saveMu.Unlock()
	s.mu.Lock()
	if !s.dirty || s.takenOver {
		taken := s.takenOver
		s.mu.Unlock()
		if taken {
			return ErrTakenOver
		}
		return nil
	}
	p := s.prog.Clone()
	rev := s.rev
	s.dirty = false
	saving := s.doneUnsaved
	s.mu.Unlock()
	newRev, err := s.cfg.Progress.Save(ctx, &p, rev)
	if errors.Is(err, ErrTakenOver) && s.pinnedHere(ctx) {
		newRev, err = s.saveOver(ctx)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case errors.Is(err, ErrTakenOver):
		// Another subscriber delivers now. This one writes nothing more
		// into the record (each write would refuse the other's next save
		// and stop it delivering); what it finished and did not save is
		// what a fault costs.
		if len(s.held) > 0 {
			s.takenOver = true
		}
		return err
	case err != nil:
		s.dirty = true
		return err
	}
	s.rev = newRev
	s.doneUnsaved -= saving
	return nil
}

// saveOver saves the record over another subscriber's write while the
// server still pins this one: that write was the other's, landed late (a
// save it never heard back from, before it lost the pin), and the
// batches it says are done are done. So this subscriber takes them beside
// its own and goes on delivering, instead of standing by and having the
// batches it held written again (issue 49: most of what a cluster fault
// still cost). The one the server pins is the one that merges; the other
// writes nothing more once refused. The caller holds saveMu.
func (s *Subscriber) saveOver(ctx context.Context) (uint64, error) {
	cur, rev, err := s.cfg.Progress.Load(ctx)
	if err != nil {
		return 0, err
	}
	// Late, and of a stream since made again (the simulation: the
	// other, frozen as the stream went, saved the old record as it
	// woke): dropped, not absorbed.
	if err := s.ofThisStream(ctx, &cur); err != nil {
		return 0, err
	}
	s.mu.Lock()
	// In place: the messages in hand keep their records.
	s.prog.Absorb(&cur)
	p := s.prog.Clone()
	s.mu.Unlock()
	return s.cfg.Progress.Save(ctx, &p, rev)
}
