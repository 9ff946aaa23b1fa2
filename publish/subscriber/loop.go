package subscriber

// The consume loop: the pulls, the groups of messages handed on together,
// and what looks after a consume beside its messages (heartbeats, the
// end of a drain); a consumer found gone.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/publish/subscriber/protocol"
	"github.com/mailroom/tailer/publish/wire"
)

// errConsumerLost: the server no longer has the consumer.
var errConsumerLost = errors.New("the consumer is gone from the server")

// consume reads messages from cons until ctx is done, the reader is gone,
// or the consumer is lost (errConsumerLost).
func (s *Subscriber) consume(ctx context.Context, cons jetstream.Consumer) error {
	pull, _ := s.pulls()
	iter, err := cons.Messages(pullOpts(cons, pull)...)
	if err != nil {
		return fmt.Errorf("consume %s: %w", s.cfg.Durable, err)
	}
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(runCtx, iter.Stop)
	defer stop()
	s.consuming.Store(true)
	defer s.consuming.Store(false)
	if s.cfg.Log != nil {
		s.cfg.Log.Info("consuming", "stream", s.cfg.Stream, "durable", s.cfg.Durable, "action", s.cfg.Action, "sink", fmt.Sprintf("%T", s.cfg.Sink))
	}
	var wg sync.WaitGroup
	defer func() { cancel(nil); wg.Wait() }()
	s.keep.carry(s.duties(runCtx, cons))
	defer s.keep.carry(duties{})
	s.watch(runCtx, cons, cancel, &wg)
	var stranded Stranded
	// next is an error the gathering of a group met, taken as Next's.
	var next error
	for {
		var msg jetstream.Msg
		err := next
		if next = nil; err == nil {
			msg, err = iter.Next()
		}
		if err != nil {
			if cause := context.Cause(runCtx); errors.Is(cause, ErrReaderGone) {
				return fmt.Errorf("write lines: %w", cause)
			} else if errors.Is(cause, errPinLost) {
				return cause
			}
			if runCtx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			if Lost(runCtx, cons, err) {
				return s.lost(err)
			}
			// The iterator asks again by itself: a consumer whose leader is
			// being elected (a cluster losing a node) misses heartbeats for
			// a while.
			if errors.Is(err, jetstream.ErrNoHeartbeat) {
				if !s.missCounts(runCtx) {
					continue
				}
				if s.cfg.Log != nil {
					s.cfg.Log.Warn("no heartbeat from the consumer; asking again", "durable", s.cfg.Durable, "server", s.js.Conn().ConnectedServerName())
				}
				stranded.Missed(s.js.Conn(), s.cfg.Log, s.cfg.Durable, "no heartbeat from the consumer")
				continue
			}
			return fmt.Errorf("consume %s: %w", s.cfg.Durable, err)
		}
		stranded.Heard()
		s.handling.Store(true)
		var group []jetstream.Msg
		group, next = gather(iter, msg, pull)
		err = s.handle(runCtx, group)
		s.handling.Store(false)
		if err != nil {
			if cause := context.Cause(runCtx); errors.Is(cause, ErrReaderGone) {
				return fmt.Errorf("write lines: %w", cause)
			} else if errors.Is(cause, errPinLost) {
				return cause
			}
			if runCtx.Err() != nil && ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
}

// pullOpts are the options of cons's pulls, of pull messages each.
func pullOpts(cons jetstream.Consumer, pull int) []jetstream.PullMessagesOpt {
	cfg := cons.CachedInfo().Config
	ttl := time.Duration(0)
	if cfg.PriorityPolicy == jetstream.PriorityPolicyPinned {
		ttl = cfg.PinnedTTL
	}
	opts := []jetstream.PullMessagesOpt{jetstream.PullMaxMessages(pull), jetstream.PullExpiry(protocol.PullExpiry(ttl))}
	if cfg.PriorityPolicy == jetstream.PriorityPolicyPinned {
		opts = append(opts, jetstream.PullPriorityGroup(PriorityGroup))
	}
	return opts
}

// gather is msg and the messages the iterator holds already, up to pull
// messages and groupTokens tokens (by Mailroom-Count), handed on
// together: a sink that stores them in one transaction (inbox.DB) pays a
// commit and an ack round trip for the group, not for each of a drain's
// messages. It returns the iterator's error that ended the gathering, but
// for the wait for more running out.
func gather(iter jetstream.MessagesContext, msg jetstream.Msg, pull int) ([]jetstream.Msg, error) {
	group := []jetstream.Msg{msg}
	tokens := count(msg)
	for tokens < groupTokens && len(group) < pull {
		m, err := iter.Next(jetstream.NextMaxWait(time.Millisecond))
		if errors.Is(err, nats.ErrTimeout) {
			return group, nil
		}
		if err != nil {
			return group, err
		}
		group = append(group, m)
		tokens += count(m)
	}
	return group, nil
}

// count is how many tokens msg says it carries.
func count(msg jetstream.Msg) int {
	n, _ := strconv.Atoi(msg.Headers().Get(wire.HeaderCount))
	return n
}

// groupTokens bounds the tokens of the messages gathered into one group.
// A sink that stores a group in transactions (inbox.DB, in up to four)
// pays less a token for larger ones: River's insert in parts of 2,000
// tokens against 500 (the measurements are at inbox's pullBatch).
const groupTokens = 8000

// watch starts, on wg, what looks after a consume beside its messages
// and the keeper's duties: the pipe's reader, the end of a drain, the
// pin's watch.
func (s *Subscriber) watch(ctx context.Context, cons jetstream.Consumer, cancel context.CancelCauseFunc, wg *sync.WaitGroup) {
	if r := s.reader; r != nil {
		wg.Add(1)
		go func() { defer wg.Done(); r.watch(ctx, cancel, s.handling.Load) }()
	}
	if s.cfg.UntilDrained {
		wg.Add(1)
		go func() { defer wg.Done(); s.untilDrained(ctx, cons, cancel) }()
	}
	if cons.CachedInfo().Config.PriorityPolicy == jetstream.PriorityPolicyPinned {
		wg.Add(1)
		go func() { defer wg.Done(); s.watchPin(ctx, cancel) }()
	}
}

// LookUp looks the consumer up, waiting for the stream when it is not
// there yet (a subscriber started before the tailer made it).
func LookUp(ctx context.Context, js jetstream.JetStream, stream, durable string, log *slog.Logger) (jetstream.Consumer, error) {
	cons, err := lookUpAnswered(ctx, js, stream, durable)
	for waited := false; errors.Is(err, jetstream.ErrStreamNotFound); waited = true {
		if !waited && log != nil {
			log.Warn("the stream is not there yet; waiting for it", "stream", stream)
		}
		if !sleep(ctx, 2*time.Second) {
			return nil, fmt.Errorf("consumer %s on stream %s: %w", durable, stream, err)
		}
		cons, err = lookUpAnswered(ctx, js, stream, durable)
	}
	return cons, err
}

// lookUpAnswered looks the consumer up, asking again while the cluster
// cannot answer (a leader being elected, a node frozen): a subscriber
// that asks then waits instead of exiting (issue 49: "consumer pair on
// stream MAILROOM: context deadline exceeded" while a node was frozen).
func lookUpAnswered(ctx context.Context, js jetstream.JetStream, stream, durable string) (jetstream.Consumer, error) {
	return untilAnswered(ctx, func(ctx context.Context) (jetstream.Consumer, error) { return js.Consumer(ctx, stream, durable) })
}

// Lost reports whether err, from an iterator of cons's messages, means the
// server no longer has the consumer: deleted, or its heartbeats missing
// and the server saying it does not know it. A consumer whose leader is
// being elected misses heartbeats for a while too, and is not lost.
func Lost(ctx context.Context, cons jetstream.Consumer, err error) bool {
	switch {
	case errors.Is(err, jetstream.ErrConsumerDeleted), errors.Is(err, jetstream.ErrConsumerNotFound):
		return true
	case errors.Is(err, jetstream.ErrNoHeartbeat):
		_, ierr := cons.Info(ctx)
		return errors.Is(ierr, jetstream.ErrConsumerNotFound)
	}
	return false
}

func (s *Subscriber) lost(err error) error {
	if s.cfg.Log != nil {
		s.cfg.Log.Error("the consumer is gone from the server", "durable", s.cfg.Durable, "err", err)
	}
	return errConsumerLost
}

// untilDrained stops consuming once the consumer has delivered everything
// and every batch in hand was handed over, a pipe's reader settled what it
// was handed by waiting for more, and every message whose batches are all
// done has its ack answered: what is still in doubt then (a reader that
// reports) is settled as the subscriber stops.
func (s *Subscriber) untilDrained(ctx context.Context, cons jetstream.Consumer, cancel context.CancelCauseFunc) {
	for sleep(ctx, 250*time.Millisecond) {
		info, err := cons.Info(ctx)
		if err != nil {
			continue
		}
		// A pipe's reader has the last batches in doubt until it waits
		// for more (settleIdle): ended before, it would have them
		// delivered again. The machine adds the messages held, and those
		// being acknowledged (protocol.Drained says why).
		inDoubt := false
		if r := s.reader; r != nil {
			_, inDoubt = r.inDoubt()
		}
		look := protocol.DrainLook{Drain: protocol.Drain{Handling: s.handling.Load(), InDoubt: inDoubt,
			Pending: int(info.NumPending), AckPending: info.NumAckPending}}
		if len(s.step(look)) > 0 {
			if s.cfg.Log != nil {
				s.cfg.Log.Info("drained: nothing left to deliver", "durable", s.cfg.Durable, "ack_pending", info.NumAckPending,
					"delivered_stream_seq", info.Delivered.Stream, "ack_floor_stream_seq", info.AckFloor.Stream)
			}
			cancel(nil)
			return
		}
	}
}

// duties are what the keeper carries out during a consume of cons
// (ctx): the heartbeat, every third of the consumer's own ack wait (the
// one the server redelivers after, whatever this subscriber was started
// with: issue 62, a durable made with --ack-wait 3s, run without the
// flag, had every token written 2-4 times); the pin's keepalive, on a
// consumer that pins.
func (s *Subscriber) duties(ctx context.Context, cons jetstream.Consumer) duties {
	cfg := cons.CachedInfo().Config
	d := duties{
		heartbeat:  protocol.InProgressEvery(cfg.AckWait, s.cfg.AckWait, DefaultAckWait),
		inProgress: func(h *protocol.Held) { msgOf(h).InProgress() },
	}
	if cfg.PriorityPolicy == jetstream.PriorityPolicyPinned {
		d.keepPin = protocol.KeepPinEvery(cfg.PinnedTTL)
		d.keepPinIO = func(pin string) { s.keepPin(ctx, pin, d.keepPin) }
	}
	return d
}
