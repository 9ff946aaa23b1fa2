package subscriber

// Binding to the durable: its record read (again, after standing by), the
// consumer looked up or made where the record or the sink says it was.

import (
	"context"
	"errors"
	"fmt"
	"github.com/mailroom/tailer/publish/jsio"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/publish/subscriber/protocol"
	"github.com/mailroom/tailer/publish/wire"
)

// standBy lets go of what a subscriber that no longer delivers held: its
// messages handed back at once (not kept alive by in-progress acks, which
// would leave the durable's other subscribers nothing to deliver while
// they wait on them), the batches its reader may have had delivered again
// by the one that delivers now; then it reads the durable's record again
// and goes on as a standby, delivering once the server pins it again.
func (s *Subscriber) standBy(ctx context.Context, why error) error {
	s.counts.stoodBy.Add(1)
	unsaved := s.status().DoneUnsaved
	s.loaded.Store(false)
	// Taken over, the record moved on without this subscriber: it saves
	// nothing of the messages it lets go (each write would refuse the
	// next save of the one that delivers now). What it finished stays
	// true: pinned again, it does not write those batches again (issue
	// 49's fault runs: a subscriber that lost its pin with a batch done
	// and unsaved, pinned again a moment later, wrote it again itself).
	n := s.readerEnded(ctx, ReaderStopped, true)
	if s.cfg.Log != nil {
		s.cfg.Log.Warn("this subscriber no longer delivers: what it held goes to the one that does; standing by", "durable", s.cfg.Durable, "messages_let_go", n,
			"batches_done_unsaved", unsaved, "why", why)
	}
	return s.load(ctx)
}

// loadProgress reads the record, trying again while the server cannot be
// asked (a NATS node lost, a leader being elected), and calling wait
// before each pause; a record that does not parse is an error at once.
// Each try is given progressTry, as each save is: a read asked of a frozen
// leader went unanswered for 10 s before it was asked again (issue 49:
// stretches of 19-44 s without a line while the bucket's leader moved).
func (s *Subscriber) loadProgress(ctx context.Context, wait func()) (protocol.Progress, uint64, error) {
	load := func() (protocol.Progress, uint64, error) {
		try, cancel := context.WithTimeout(ctx, progressTry)
		defer cancel()
		return s.cfg.Progress.Load(try)
	}
	p, rev, err := load()
	var stranded Stranded
	for delay := 250 * time.Millisecond; err != nil && !errors.Is(err, ErrUnreadableProgress) && ctx.Err() == nil; delay = min(2*delay, 2*time.Second) {
		if delay == 250*time.Millisecond && s.cfg.Log != nil {
			s.cfg.Log.Warn("cannot read which batches are done; trying again", "durable", s.cfg.Durable, "err", err)
		}
		if jsio.TemporarilyUnavailable(err) && s.js != nil {
			// Its server is cut off from the cluster, and says so to every
			// read until the cut heals (a standby waited out a 60 s
			// partition so). A read that goes unanswered is not counted:
			// moving on those flipped the pinned pair at every election
			// of the bucket's leader (issue 49's fault run 19).
			stranded.Missed(s.js.Conn(), s.cfg.Log, s.cfg.Durable, "the record's read answered 'JetStream temporarily unavailable'")
		}
		wait()
		select {
		case <-ctx.Done():
		case <-time.After(delay):
		}
		p, rev, err = load()
	}
	return p, rev, err
}

// progressTry is how long one read or save of the durable's record may
// take before it is tried again.
const progressTry = 2 * time.Second

// load reads the record, unless there is no store or it is read
// already: the machine's reload, with what the subscriber finished
// before it stood by kept over it.
func (s *Subscriber) load(ctx context.Context) error {
	if s.cfg.Progress == nil {
		return nil
	}
	if s.loaded.Load() {
		return nil
	}
	if _, err := s.talk(ctx, protocol.Reload{}, recordIO{load: func(ctx context.Context) (protocol.Progress, uint64, error) {
		return s.loadProgress(ctx, func() {})
	}}); err != nil {
		return err
	}
	s.loaded.Store(true)
	return nil
}

// consumer looks the durable up, making it if missing: where the record
// says it was when there is one (lost is true when Run was bound to it
// and saw it go), as configured otherwise.
func (s *Subscriber) consumer(ctx context.Context, js jetstream.JetStream, lost bool) (jetstream.Consumer, error) {
	if c := s.Consumer(); c != nil && !lost {
		// The same one for the next sender: it holds the pin the server
		// gave this subscriber, which a consumer looked up anew would not
		// (and would wait PinnedTTL for).
		return c, nil
	}
	_, pending := s.pulls()
	d := Durable{Stream: s.cfg.Stream, Subject: s.cfg.Subject, Name: s.cfg.Durable, FromStart: s.cfg.FromStart, Action: s.cfg.Action,
		AckWait: s.cfg.AckWait, MaxAckPending: pending, Pinned: s.cfg.Pinned, PinnedTTL: s.cfg.PinnedTTL}
	_, err := LookUp(ctx, js, s.cfg.Stream, s.cfg.Durable, s.cfg.Log)
	missing := errors.Is(err, jetstream.ErrConsumerNotFound)
	if err := s.checkRecord(ctx, js, missing); err != nil {
		return nil, err
	}
	if missing {
		rec := s.record()
		switch protocol.MakeAt(rec.Last.Seq != 0, s.positioner != nil) {
		case protocol.AfterFloor:
			d.StartSeq = rec.Floor + 1
			if s.cfg.Log != nil {
				s.cfg.Log.Warn("the consumer was not on the server: made again where its subscribers had got to, after the last message acknowledged",
					"durable", s.cfg.Durable, "start_seq", d.StartSeq)
			}
		default:
			if err := s.fromSink(ctx, js, &d, lost); err != nil {
				return nil, err
			}
		}
	}
	cons, err := d.Ensure(ctx, js)
	if err != nil {
		return nil, err
	}
	s.seedAtFloor(cons)
	s.cons.Store(&cons)
	if s.cfg.Pinned && !s.pinsOne() && s.cfg.Log != nil {
		s.cfg.Log.Warn("the consumer does not pin one subscriber (made before, or the server is older than 2.11): a second subscriber on it would interleave; delete it to have it made again pinned",
			"durable", s.cfg.Durable)
	}
	return cons, nil
}

// fromSink sets where a consumer missing, of which the subscriber has no
// record, is made: where the Sink's own record says the durable got to
// (Positioner), at that message, not after it (a sink may have stored
// part of it); from the stream's first message when the stream no longer
// holds that message there, or with FromStart; otherwise a consumer Run
// was bound to (lost) is refused: nothing says where it was.
func (s *Subscriber) fromSink(ctx context.Context, js jetstream.JetStream, d *Durable, lost bool) error {
	at, ok, err := s.sinkPosition(ctx)
	if err != nil {
		return err
	}
	if ok {
		if ok, err = StreamHolds(ctx, js, s.cfg.Stream, at.Seq, at.holds, s.cfg.Log); err != nil {
			return err
		}
		if !ok && s.cfg.Log != nil {
			s.cfg.Log.Warn("the stream does not hold what the durable stored from it (deleted and made again, restored or purged): reading it from its first message; the tokens stored before add nothing",
				"durable", s.cfg.Durable, "stored_seq", at.Seq, "batch_id", at.BatchID)
		}
		d.FromStart = d.FromStart || !ok
	}
	if s.positioner != nil {
		s.step(protocol.FollowAfresh{})
	}
	switch {
	case ok:
		s.seed(at)
		d.StartSeq = at.Seq
		if s.cfg.Log != nil {
			s.cfg.Log.Warn("the consumer was not on the server: made again at the last message the sink holds a token of",
				"durable", s.cfg.Durable, "start_seq", d.StartSeq)
		}
	case lost && !d.FromStart:
		return fmt.Errorf("consumer %s on stream %s: %w: start a subscriber with --from-start to deliver what the stream holds again (the tokens a sink of its own stored add nothing), or make the consumer by hand at the position you know", s.cfg.Durable, s.cfg.Stream, ErrPositionUnknown)
	}
	return nil
}

// sinkPosition is where the Sink's own record says the durable got to.
func (s *Subscriber) sinkPosition(ctx context.Context) (Stored, bool, error) {
	p := s.positioner
	if p == nil {
		return Stored{}, false, nil
	}
	return p.Position(ctx, s.cfg.Stream, s.cfg.Durable)
}

// seed starts the chain, when nothing is known of it, at at: the last
// message the durable stored; not with an action: messages without its
// tokens store nothing, and the last one stored says nothing of those
// after it.
func (s *Subscriber) seed(at Stored) {
	if s.cfg.Action == "" {
		s.step(protocol.SeedChain{At: wire.Anchor{Seq: at.Seq, Mark: wire.IDMark(at.BatchID)}})
	}
}

// seedAtFloor starts the chain of a sink that keeps its own record, with
// an action, at the consumer's ack floor, when nothing is known of it:
// every message up to it was handled, stored or holding none of the
// action's tokens, which the sink cannot say (seed).
func (s *Subscriber) seedAtFloor(cons jetstream.Consumer) {
	if s.positioner == nil || s.cfg.Action == "" {
		return
	}
	s.step(protocol.SeedChain{At: wire.Anchor{Seq: cons.CachedInfo().AckFloor.Stream}})
}
