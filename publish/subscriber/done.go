package subscriber

// A batch done: the message acknowledged once all its batches are, a
// reader's end settled, a batch or a message that cannot be read set
// aside.

import (
	"context"
	"fmt"
	"github.com/mailroom/tailer/publish/subscriber/protocol"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

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
	var batches []protocol.HeldBatch
	for _, u := range units {
		// A sink may say a unit is done twice (a report, then the
		// reader's end): once counts.
		if u.done.Swap(true) {
			continue
		}
		s.counts.batches.Add(1)
		s.counts.lastDone.Store(time.Now().UnixNano())
		batches = append(batches, protocol.HeldBatch{Held: u.h, Line: u.Line})
	}
	cmds := s.step(protocol.Done{Batches: batches})
	s.signal()
	for _, c := range cmds {
		if f, ok := c.(protocol.Finish); ok {
			s.finish(ctx, f.Msgs...)
		}
	}
}

// finish acknowledges messages all of whose batches are done, once the
// record says so (the machine's Complete talk), the acks' answers
// awaited side by side.
func (s *Subscriber) finish(ctx context.Context, hs ...*protocol.Held) {
	if len(hs) == 0 {
		return
	}
	end, _ := s.talk(ctx, protocol.Complete{Msgs: hs}, s.patientIO(msgOf(hs[0])))
	if end.Outcome != protocol.Acking {
		return
	}
	var wg sync.WaitGroup
	for _, h := range end.Acks {
		wg.Add(1)
		go func() { defer wg.Done(); s.acked(ctx, h, s.ack(ctx, msgOf(h))) }()
	}
	wg.Wait()
	s.signal()
}

// msgOf is the delivery h was taken from.
func msgOf(h *protocol.Held) jetstream.Msg { return h.Msg.(jetstream.Msg) }

// acked notes h's ack and how the server answered it (err).
func (s *Subscriber) acked(ctx context.Context, h *protocol.Held, err error) {
	s.step(protocol.Acked{Held: h, OK: err == nil})
	if err == nil {
		s.counts.acked.Add(1)
	}
	if err != nil && ctx.Err() == nil && s.cfg.Log != nil {
		// Its batches are done, as the record says: delivered again,
		// the message is acknowledged without handing anything on.
		s.cfg.Log.Warn("ack not confirmed; the message will be delivered again, and not handed on again", "stream_seq", h.Seq, "err", err)
	}
}

// ackMsg acknowledges a message that needs nothing from the reader.
func (s *Subscriber) ackMsg(ctx context.Context, msg jetstream.Msg, seq uint64) {
	if err := s.ack(ctx, msg); err != nil && ctx.Err() == nil && s.cfg.Log != nil {
		s.cfg.Log.Warn("ack not confirmed; the message will be delivered again", "stream_seq", seq, "err", err)
	}
	s.counts.acked.Add(1)
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
	return s.readerEnded(ctx, o, false)
}

// readerEnded is ReaderEnded, of a subscriber that stands by (standBy)
// or not.
func (s *Subscriber) readerEnded(ctx context.Context, o Outcome, standBy bool) int {
	var failedOn *Unit
	inDoubt := false
	if r := s.reader; r != nil {
		failedOn, inDoubt = r.settle(o)
	}
	var blame *protocol.HeldBatch
	if u := failedOn; u != nil {
		blame = &protocol.HeldBatch{Held: u.h, Line: u.Line}
	}
	if o == ReaderFailed && inDoubt {
		s.counts.readerFailures.Add(1)
	}
	// Which batches are done is saved before the messages come again.
	end, err := s.talk(ctx, protocol.HandBack{Blame: blame, StandBy: standBy}, s.onceIO())
	if err != nil && s.cfg.Log != nil {
		s.cfg.Log.Warn("cannot save which batches are done; those of the messages handed back are written again", "durable", s.cfg.Durable, "err", err)
	}
	for _, h := range end.Naks {
		msgOf(h).Nak()
	}
	return len(end.Naks)
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
		s.counts.deadLetters.Add(1)
		if s.cfg.Log != nil {
			s.cfg.Log.Error("dead letter: set aside a message that cannot be read", "stream_seq", seq, "durable", s.cfg.Durable)
		}
	}
	// Off this consumer; it stays in the stream.
	return msg.Term()
}

// deadLetter sets batch i of h aside, n readers having failed with it,
// and marks it done.
func (s *Subscriber) deadLetter(ctx context.Context, h *protocol.Held, b *Decoded, i, n int) error {
	hdr, body, err := batchMessage(b, i)
	if err != nil {
		return fmt.Errorf("dead letter of seq %d batch %d: %w", h.Seq, i, err)
	}
	reason := fmt.Sprintf("%d readers failed with this batch taken and not finished", n)
	dl := DeadLetter{Stream: s.cfg.Stream, Seq: h.Seq, Batch: i, Durable: s.cfg.Durable, Reason: reason, Deliveries: n, Header: hdr, Body: body}
	if err := s.cfg.DeadLetters.Put(ctx, dl); err != nil {
		return err
	}
	if s.cfg.Log != nil {
		s.cfg.Log.Error("dead letter: set a batch aside; the batches behind it flow", "stream_seq", h.Seq, "batch", i,
			"batch_id", b.ID, "tokens", b.Sizes[i], "deliveries", n, "durable", s.cfg.Durable)
	}
	s.counts.deadLetters.Add(1)
	s.done(ctx, []*Unit{{h: h, Line: i}})
	return nil
}
