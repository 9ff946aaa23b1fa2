package subscriber

// The durable's record saved: before an ack or more for a serial reader
// (saveNow), whenever it changed (saver), over a late write of another
// subscriber's while this one is pinned: the machine's save talk).

import (
	"context"
	"errors"
	"fmt"
	"github.com/mailroom/tailer/publish/jsio"
	"github.com/mailroom/tailer/publish/subscriber/protocol"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

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
	_, err := s.talk(ctx, protocol.SaveDue{}, s.patientIO(msg))
	return err
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
	said := s.counts.setNoRoom(why)
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

// saver saves the record whenever it changed, one save at a time (in
// memory alone without a store), and reads the consumer's ack floor now
// and then so that the record forgets what the server will not deliver
// again. A save refused because another subscriber wrote while this one
// holds messages ends the consume (TalkEnded.StandBy).
func (s *Subscriber) saver(ctx context.Context, cancel context.CancelCauseFunc) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	failing := false
	var floorRead time.Time
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
		floor := readFloor(saveCtx, s.Consumer(), &floorRead)
		end, err := s.talk(saveCtx, protocol.SaveDue{Floor: floor}, s.onceIO())
		cancelSave()
		s.noRoom(err)
		switch {
		case end.StandBy:
			cancel(err)
			return
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

// readFloor reads cons's ack floor, at most once a second (read: when
// it was read last); 0 when it does not.
func readFloor(ctx context.Context, cons jetstream.Consumer, read *time.Time) uint64 {
	if cons == nil || time.Since(*read) < time.Second {
		return 0
	}
	*read = time.Now()
	info, err := cons.Info(ctx)
	if err != nil {
		return 0
	}
	return info.AckFloor.Stream
}

// save writes the record if it changed. It returns ErrTakenOver when
// another subscriber wrote it since this one read or wrote it, and the
// server no longer pins this one (the machine's save talk).
func (s *Subscriber) save(ctx context.Context) error {
	if s.cfg.Progress == nil {
		return nil
	}
	_, err := s.talk(ctx, protocol.SaveDue{}, s.onceIO())
	return err
}

// onceIO reads and writes once. With no store, the record is in memory
// alone: every write lands.
func (s *Subscriber) onceIO() recordIO {
	if s.cfg.Progress == nil {
		return recordIO{write: func(_ context.Context, _ *protocol.Progress, rev uint64) (uint64, error) { return rev, nil }}
	}
	return recordIO{
		load: s.cfg.Progress.Load,
		write: func(ctx context.Context, p *protocol.Progress, rev uint64) (uint64, error) {
			return s.cfg.Progress.Save(ctx, p, rev)
		},
	}
}

// recordIO is how a talk reads and writes the record: a claim waits for
// answers, keeping its delivery alive; a save tries once.
type recordIO struct {
	load  func(context.Context) (protocol.Progress, uint64, error)
	write func(ctx context.Context, p *protocol.Progress, rev uint64) (uint64, error)
}

// patientIO reads once and writes until the write lands, is refused, or
// the talk's ctx ends, msg kept from redelivery meanwhile (untilSaved). With no
// store, the record is in memory alone: every write lands.
func (s *Subscriber) patientIO(msg jetstream.Msg) recordIO {
	if s.cfg.Progress == nil {
		return s.onceIO()
	}
	return recordIO{
		load: s.cfg.Progress.Load,
		write: func(ctx context.Context, p *protocol.Progress, rev uint64) (uint64, error) {
			var newRev uint64
			err := s.untilSaved(ctx, msg, func(try context.Context) (err error) {
				newRev, err = s.cfg.Progress.Save(try, p, rev)
				return err
			})
			return newRev, err
		},
	}
}

// talk steps the machine with first and carries out what it is to do,
// each answered by stepping it again, until the talk ends. It returns how it
// ended, and ErrTakenOver for GiveBack and SaveRefused, the error that
// ended it for Waits and SaveFailed. The acks and naks a talk ends with
// are the caller's. One talk at a time: the keeper begins this one once
// the one under way ended.
func (s *Subscriber) talk(ctx context.Context, first protocol.Found, io recordIO) (protocol.TalkEnded, error) {
	var ioErr error
	// answer is what IO found, err the error it met: Unanswered then.
	answer := func(ev protocol.Found, err error) protocol.Found {
		if err != nil {
			ioErr = err
			return protocol.Unanswered{}
		}
		return ev
	}
	cmds := s.keep.step(first, opens)
	for len(cmds) > 0 {
		var ev protocol.Found
		switch c := cmds[0].(type) {
		case protocol.TalkEnded:
			return c, outcomeErr(c.Outcome, ioErr)
		case protocol.Load:
			p, rev, err := io.load(ctx)
			ev = answer(protocol.Loaded{Record: p, Rev: rev}, err)
		case protocol.Check:
			p := c.Record
			err := s.ofThisStream(ctx, &p)
			ev = answer(protocol.Checked{Record: p}, err)
		case protocol.Write:
			rev, err := io.write(ctx, &c.Record, c.Rev)
			if errors.Is(err, ErrTakenOver) {
				ev = protocol.WriteRefused{}
			} else {
				ev = answer(protocol.Wrote{Rev: rev}, err)
			}
		case protocol.AskPin:
			ev = protocol.PinIs{Pinned: s.serverPin(ctx)}
		}
		cmds = append(cmds[1:], s.keep.step(ev, inTalk)...)
	}
	if s.keep.stopped() {
		return protocol.TalkEnded{}, fmt.Errorf("consume %s: %w", s.cfg.Durable, ErrClosed)
	}
	return protocol.TalkEnded{}, fmt.Errorf("consume %s: the record's talk stopped without an end (a driver's slip)", s.cfg.Durable)
}

// outcomeErr is the error of a talk that ended with o, ioErr the error of
// the IO that ended it.
func outcomeErr(o protocol.TalkOutcome, ioErr error) error {
	switch o {
	case protocol.GiveBack, protocol.SaveRefused:
		return ErrTakenOver
	case protocol.Waits, protocol.SaveFailed:
		return ioErr
	}
	return nil
}

// step has the keeper step the machine with e, outside any talk.
func (s *Subscriber) step(e protocol.Found) []protocol.ToDo {
	return s.keep.step(e, outside)
}

// status is the machine's state, for counts and logs: none held once the
// subscriber is closed.
func (s *Subscriber) status() protocol.Status {
	st, _ := answerOf[protocol.Status](s.step(protocol.Look{}))
	return st
}

// record is where the durable's record says its subscribers got to.
func (s *Subscriber) record() protocol.RecordIs {
	r, _ := answerOf[protocol.RecordIs](s.step(protocol.RecordAt{}))
	return r
}

// answerOf is the answer of a step answered with one T: the zero T, and
// false, when no answer came (the subscriber closed).
func answerOf[T protocol.ToDo](cmds []protocol.ToDo) (T, bool) {
	var zero T
	if len(cmds) == 0 {
		return zero, false
	}
	t, ok := cmds[0].(T)
	return t, ok
}
