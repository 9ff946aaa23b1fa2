package consume

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/publish/wire"
)

// held is a message delivered and not yet acknowledged.
type held struct {
	msg jetstream.Msg
	seq uint64
	rec *MessageProgress
	// pending counts its batches not done.
	pending int
	// acking: every batch is done and the ack is on its way.
	acking bool
}

// unit is one batch of a message as the reader gets it.
type unit struct {
	h     *held
	index int
	data  []byte
	keys  []string
	lines []string
	// end is Subscriber.written once the unit was written.
	end      int64
	reported int
	done     bool
}

// handle takes one delivered message: the batches not done before are
// rendered as lines and handed to the reader.
func (s *Subscriber) handle(ctx context.Context, msg jetstream.Msg) error {
	meta, err := msg.Metadata()
	if err != nil {
		return fmt.Errorf("message metadata: %w", err)
	}
	seq := meta.Sequence.Stream
	mark := wire.Mark(msg.Subject(), msg.Headers(), msg.Data())
	if err := s.refresh(ctx, msg); err != nil {
		// Back to the server at once, with what this subscriber held.
		msg.Nak()
		return err
	}
	s.noteDelivery(ctx, msg, meta, mark)
	b, err := Decode(msg.Headers(), msg.Data())
	if err != nil {
		return s.unreadable(ctx, msg, seq, err)
	}
	if len(b.Tokens) == 0 {
		// A session marker: nothing for a reader.
		s.ackMsg(ctx, msg, seq)
		return nil
	}
	s.mu.Lock()
	rec := s.prog.message(seq, mark, len(b.Sizes))
	if seq <= s.prog.Floor || rec.Acked || rec.Done.Len() == rec.Batches {
		s.stats.Skipped += rec.Batches
		s.mu.Unlock()
		// Done before: its ack was lost, or the consumer was made again
		// below it.
		s.ackMsg(ctx, msg, seq)
		return nil
	}
	h := &held{msg: msg, seq: seq, rec: rec}
	s.held = append(s.held, h)
	units, dead := s.units(h, b)
	s.dirty = true
	s.mu.Unlock()
	for _, i := range dead {
		if err := s.deadLetter(ctx, h, b, i); err != nil {
			return err
		}
	}
	if len(units) == 0 {
		s.finish(ctx, h)
		return nil
	}
	return s.hand(ctx, units)
}

// noteDelivery records a message delivered: the newest the durable's
// subscribers were given, where it stands in its subject's chain, and
// the counts.
func (s *Subscriber) noteDelivery(ctx context.Context, msg jetstream.Msg, meta *jetstream.MsgMetadata, mark string) {
	seq, again := meta.Sequence.Stream, meta.NumDelivered > 1
	s.mu.Lock()
	if s.prog.saw(seq, mark) {
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
	if again && s.Log != nil {
		s.Log.Info("delivered again: a reader may have had its tokens before", "stream_seq", seq, "deliveries", meta.NumDelivered, "batches_done_before", done)
	}
	s.gaps.Note(ctx, s.js, s.Stream, s.Durable, s.Log, msg.Headers(), gap, func() { msg.InProgress() })
}

// units are the batches of b the reader is to get, and those to set aside
// as dead letters, each counted pending in h; a batch done before, or
// with nothing left for this reader, is not. Called with s.mu held.
func (s *Subscriber) units(h *held, b *Decoded) (units []*unit, dead []int) {
	rec := h.rec
	for i, line := range b.Lines() {
		if rec.Done.Has(i) {
			s.stats.Skipped++
			continue
		}
		if s.MaxDeliveries > 0 && s.DeadLetters != nil && rec.Attempts[i] >= s.MaxDeliveries {
			dead = append(dead, i)
			h.pending++
			continue
		}
		u := s.render(h, i, b.ID, line, h.seq)
		if u == nil {
			// Nothing of it for this reader: done as it is.
			rec.Done.Add(i)
			continue
		}
		h.pending++
		units = append(units, u)
	}
	return units, dead
}

// refresh rereads the record when another subscriber may have written it
// since: the server pinned this subscriber anew, or it was idle a while
// (it was a standby, or a subscriber before it on the durable died). What
// it read is claimed (claim) before anything is handed on.
func (s *Subscriber) refresh(ctx context.Context, msg jetstream.Msg) error {
	if s.Progress == nil {
		return nil
	}
	pin := msg.Headers().Get("Nats-Pin-Id")
	s.mu.Lock()
	stale := pin != s.pinID || len(s.held) == 0 && time.Since(s.stats.LastDelivery) > time.Second
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
		holding, mine := len(s.held) > 0, newRev == s.rev
		switch {
		case holding && !mine:
			s.mu.Unlock()
			// Messages in hand while another subscriber wrote: it
			// delivers them now.
			return fmt.Errorf("consume %s: %w", s.Durable, ErrTakenOver)
		case mine:
			// Nobody wrote since this subscriber did: its record is the
			// record, with what it decided since (a record of another
			// stream dropped: read back, that one would skip this
			// stream's messages at its sequences).
			p = s.prog.clone()
		default:
			// What this subscriber finished and had not saved yet stays
			// known.
			p.absorb(&s.prog)
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
		if !mine {
			s.prog = p
		}
		if !holding {
			s.dirty, s.doneUnsaved = false, 0
		}
		s.mu.Unlock()
		return nil
	}
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
func (s *Subscriber) claim(ctx context.Context, msg jetstream.Msg, p *Progress, rev uint64) (uint64, error) {
	var newRev uint64
	err := s.untilSaved(ctx, msg, func(try context.Context) (err error) {
		newRev, err = s.Progress.Save(try, p, rev)
		return err
	})
	return newRev, err
}

// render makes the lines of batch i of a message; nil when none is left
// for the reader (other actions, dropped by the dedup window or unsafe).
// Called with s.mu held.
func (s *Subscriber) render(h *held, i int, id string, tokens []SignedToken, seq uint64) *unit {
	keep := make([]SignedToken, 0, len(tokens))
	for _, t := range tokens {
		if s.Action != "" && t.Action != s.Action {
			continue
		}
		if s.Dedup != nil && s.Dedup.Contains(t.Key) {
			continue
		}
		if !s.JSON && (!wire.LineSafe(t.Email) || !wire.LineSafe(t.Login)) {
			// The sender would misparse the line: every other token of
			// it would be lost, or a crafted field would forge rows.
			if s.Log != nil {
				s.Log.Warn("token not written: its email or login holds a comma, CR, LF or NUL, or exceeds 254 bytes", "reason", "unsafe_field", "token_id", t.ID, "stream_seq", seq)
			}
			continue
		}
		keep = append(keep, t)
	}
	if len(keep) == 0 {
		return nil
	}
	u := &unit{h: h, index: i}
	n := s.MaxTokensPerLine
	if n <= 0 {
		n = len(keep)
	}
	for start := 0; start < len(keep); start += n {
		part := keep[start:min(start+n, len(keep))]
		at := len(u.data)
		if s.JSON {
			// Marshalling plain strings and numbers does not fail.
			u.data, _ = AppendJSON(u.data, id, part)
		} else {
			u.data = AppendLine(u.data, part)
		}
		u.lines = append(u.lines, string(u.data[at:]))
		u.data = append(u.data, '\n')
		for _, t := range part {
			u.keys = append(u.keys, t.Key)
		}
	}
	return u
}

// hand writes units to the reader, as Out's kind asks.
func (s *Subscriber) hand(ctx context.Context, units []*unit) error {
	switch {
	case s.Reports:
		// The reader says what it finished: write all, it may read ahead.
		var buf []byte
		s.mu.Lock()
		if s.lines == nil {
			s.lines = make(map[string][]*unit)
		}
		for _, u := range units {
			buf = append(buf, u.data...)
			s.written += int64(len(u.data))
			u.end = s.written
			s.handed = append(s.handed, u)
			for _, l := range u.lines {
				s.lines[l] = append(s.lines[l], u)
			}
		}
		s.mu.Unlock()
		return s.write(buf)
	case s.Pipe != nil:
		for _, u := range units {
			s.mu.Lock()
			behind := s.doneUnsaved >= maxDoneUnsaved
			s.mu.Unlock()
			if behind {
				// A message of many batches (a backlog's): what the
				// reader finished is saved before it gets more, so that
				// a subscriber that takes the message over skips it.
				// Taken over, or stopped while the save waited, this
				// one gives its reader nothing more: a batch written now
				// would be read unrecorded, beside the one the reader
				// holds and the one done and unsaved.
				if err := s.saveNow(ctx, u.h.msg); err != nil {
					return fmt.Errorf("consume %s: %w", s.Durable, err)
				}
			}
			s.mu.Lock()
			s.written += int64(len(u.data))
			u.end = s.written
			s.handed = append(s.handed, u)
			s.mu.Unlock()
			if err := s.write(u.data); err != nil {
				return err
			}
			if err := s.Pipe.Taken(ctx); err != nil {
				return fmt.Errorf("hand lines over: %w", err)
			}
			// The reader took this batch: it is done with those before.
			s.mu.Lock()
			before := slices.Clone(s.handed[:slices.Index(s.handed, u)])
			s.mu.Unlock()
			s.done(ctx, before)
		}
		return nil
	default:
		var buf []byte
		for _, u := range units {
			buf = append(buf, u.data...)
		}
		s.mu.Lock()
		s.handed = append(s.handed, units...)
		s.mu.Unlock()
		if err := s.write(buf); err != nil {
			return err
		}
		// The lines are out: only now may the server forget them.
		s.done(ctx, units)
		return nil
	}
}

func (s *Subscriber) write(buf []byte) error {
	if _, err := s.Out.Write(buf); err != nil {
		if errors.Is(err, syscall.EPIPE) {
			err = ErrReaderGone
		}
		return fmt.Errorf("write lines: %w", err)
	}
	return nil
}

// done marks units done and acknowledges the messages that are then
// complete.
func (s *Subscriber) done(ctx context.Context, units []*unit) {
	s.mu.Lock()
	var complete []*held
	for _, u := range units {
		if u.done {
			continue
		}
		u.done = true
		if i := slices.Index(s.handed, u); i >= 0 {
			s.handed = slices.Delete(s.handed, i, i+1)
		}
		u.h.rec.Done.Add(u.index)
		delete(u.h.rec.Attempts, u.index)
		if s.Dedup != nil {
			for _, k := range u.keys {
				s.Dedup.Seen(k)
			}
		}
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

// finish acknowledges messages all of whose batches are done.
func (s *Subscriber) finish(ctx context.Context, hs ...*held) {
	for _, h := range hs {
		s.mu.Lock()
		if h.acking || h.pending > 0 {
			s.mu.Unlock()
			continue
		}
		h.acking = true
		s.mu.Unlock()
		// Every batch of it is done: acknowledged even when taken over.
		s.saveNow(ctx, h.msg)
		err := s.ack(ctx, h.msg)
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
		if err != nil && ctx.Err() == nil && s.Log != nil {
			// Its batches are done, as the record says: delivered again,
			// the message is acknowledged without a line written.
			s.Log.Warn("ack not confirmed; the message will be delivered again, and not written again", "stream_seq", h.seq, "err", err)
		}
		s.signal()
	}
}

// ackMsg acknowledges a message that needs nothing from the reader.
func (s *Subscriber) ackMsg(ctx context.Context, msg jetstream.Msg, seq uint64) {
	if err := s.ack(ctx, msg); err != nil && ctx.Err() == nil && s.Log != nil {
		s.Log.Warn("ack not confirmed; the message will be delivered again", "stream_seq", seq, "err", err)
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

// Outcome is how a reader ended, for Settle.
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
)

// Settle ends the doubt about the batches a reader may have had when it
// ended: done if it said so (ReaderDone: a reader that reports has said so
// line by line, and only those lines are done), delivered again at once
// otherwise, the others of their messages remembered as done. It returns
// how many messages were handed back.
func (s *Subscriber) Settle(ctx context.Context, o Outcome) int {
	s.mu.Lock()
	handed := slices.Clone(s.handed)
	unread := int64(0)
	if s.Pipe != nil {
		unread = int64(s.Pipe.Unread())
	}
	taken := s.written - unread
	s.mu.Unlock()
	if o == ReaderDone && !s.Reports {
		s.done(ctx, handed)
		handed = nil
	}
	s.mu.Lock()
	if o == ReaderFailed && len(handed) > 0 {
		s.stats.ReaderFailures++
		// The oldest batch the reader took whole and did not finish: a
		// reader that keeps failing on one batch fails there first.
		for _, u := range handed {
			if u.end <= taken || s.Pipe == nil {
				if u.h.rec.Attempts == nil {
					u.h.rec.Attempts = make(map[int]int)
				}
				u.h.rec.Attempts[u.index]++
				s.dirty = true
				break
			}
		}
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
	s.handed, s.lines, s.written = nil, nil, 0
	s.mu.Unlock()
	// Which batches are done, before the messages come again.
	if err := s.save(ctx); err != nil && s.Log != nil {
		s.Log.Warn("cannot save which batches are done; those of the messages handed back are written again", "durable", s.Durable, "err", err)
	}
	for _, h := range nak {
		h.msg.Nak()
	}
	return len(nak)
}

// ReadReports reads the reader's reports until r ends: each a line it
// finished, as it was given (without its newline). A batch is done once
// each of its lines is reported.
func (s *Subscriber) ReadReports(ctx context.Context, r io.Reader) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	unknown := 0
	for sc.Scan() {
		line := strings.TrimSuffix(sc.Text(), "\r")
		s.mu.Lock()
		q := s.lines[line]
		var finished []*unit
		if len(q) == 0 {
			unknown++
		} else {
			u := q[0]
			if len(q) == 1 {
				delete(s.lines, line)
			} else {
				s.lines[line] = q[1:]
			}
			if u.reported++; u.reported == len(u.lines) {
				finished = append(finished, u)
			}
		}
		s.mu.Unlock()
		if unknown == 1 && len(q) == 0 && s.Log != nil {
			s.Log.Warn("the sender reported a line it was not given (or twice); ignored", "durable", s.Durable)
		}
		s.done(ctx, finished)
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read the sender's reports: %w", err)
	}
	return nil
}

// unreadable sets aside a message that does not decode: delivering it again
// would not fix it.
func (s *Subscriber) unreadable(ctx context.Context, msg jetstream.Msg, seq uint64, err error) error {
	if s.Log != nil {
		s.Log.Error("a message that cannot be read", "subject", msg.Subject(), "stream_seq", seq, "err", err)
	}
	if s.DeadLetters != nil {
		dl := DeadLetter{Stream: s.Stream, Seq: seq, Batch: -1, Durable: s.Durable, Reason: "cannot be read: " + err.Error(),
			Deliveries: 1, Header: msg.Headers(), Body: msg.Data()}
		if err := s.DeadLetters.Put(ctx, dl); err != nil {
			return err
		}
		s.mu.Lock()
		s.stats.DeadLetters++
		s.mu.Unlock()
		if s.Log != nil {
			s.Log.Error("dead letter: set aside a message that cannot be read", "stream_seq", seq, "durable", s.Durable)
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
	dl := DeadLetter{Stream: s.Stream, Seq: h.seq, Batch: i, Durable: s.Durable, Reason: reason, Deliveries: n, Header: hdr, Body: body}
	if err := s.DeadLetters.Put(ctx, dl); err != nil {
		return err
	}
	if s.Log != nil {
		s.Log.Error("dead letter: set a batch aside; the batches behind it flow", "stream_seq", h.seq, "batch", i,
			"batch_id", b.ID, "tokens", b.Sizes[i], "deliveries", n, "durable", s.Durable)
	}
	s.mu.Lock()
	s.stats.DeadLetters++
	s.mu.Unlock()
	s.done(ctx, []*unit{{h: h, index: i}})
	return nil
}

// maxDoneUnsaved is how many batches a reader may finish before the
// record that says so is saved, within a message of many: one, so that a
// fault costs a subscriber at most that batch, the one its reader holds
// and the one in its pipe (issue 49 asks for two). With 4, a pinned pair under cluster faults
// wrote up to 6-9 batches again at one fault. The price, a save per
// batch of a backlog's many-batch messages: a reader that takes lines as
// fast as they come gets 680-700 batches a second against 3,400-3,700
// with 4 (BenchmarkSubscriberPipeBacklog, docs/bench); a sender that
// mails each line spends longer on it than the save.
const maxDoneUnsaved = 1

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
	if s.Progress == nil {
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
		if err == nil || errors.Is(err, ErrTakenOver) || ctx.Err() != nil {
			return err
		}
		if wire.Unanswered(err) && s.js != nil {
			stranded.Missed(s.js.Conn(), s.Log, s.Durable, "no answer to the save of which batches are done")
		}
		msg.InProgress()
		if !sleep(ctx, 250*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// signal tells the saver there is something to save.
func (s *Subscriber) signal() {
	if s.Progress == nil || s.kick == nil {
		return
	}
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// saver saves the record whenever it changed, one save at a time, and
// reads the consumer's ack floor now and then so that the record forgets
// what the server will not deliver again. A save refused because another
// subscriber wrote while this one holds messages ends Run.
func (s *Subscriber) saver(ctx context.Context, cancel context.CancelCauseFunc) {
	if s.Progress == nil {
		return
	}
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
		// A save under way completes as Run ends: one cut off may land
		// unheard, and the next must find it this subscriber's.
		saveCtx, cancelSave := context.WithTimeout(context.WithoutCancel(ctx), progressTry)
		s.readFloor(saveCtx)
		err := s.save(saveCtx)
		cancelSave()
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
			if s.Log != nil {
				s.Log.Warn("cannot save which batches are done; trying again", "durable", s.Durable, "err", err)
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
		s.prog.prune(f)
		s.dirty = true
	}
	s.mu.Unlock()
}

// save writes the record if it changed. It returns ErrTakenOver when
// another subscriber wrote it since this one read or wrote it, and the
// server no longer pins this one (saveOver).
func (s *Subscriber) save(ctx context.Context) error {
	if s.Progress == nil {
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
	p := s.prog.clone()
	rev := s.rev
	s.dirty = false
	saving := s.doneUnsaved
	s.mu.Unlock()
	newRev, err := s.Progress.Save(ctx, &p, rev)
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
	cur, rev, err := s.Progress.Load(ctx)
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	// In place: the messages in hand keep their records.
	s.prog.absorb(&cur)
	p := s.prog.clone()
	s.mu.Unlock()
	return s.Progress.Save(ctx, &p, rev)
}

// clone copies p deeply.
func (p *Progress) clone() Progress {
	c := *p
	c.Messages = make(map[uint64]*MessageProgress, len(p.Messages))
	for seq, m := range p.Messages {
		mc := *m
		mc.Done = slices.Clone(m.Done)
		mc.Attempts = maps.Clone(m.Attempts)
		c.Messages[seq] = &mc
	}
	c.Chain.Subjects = maps.Clone(p.Chain.Subjects)
	return c
}
