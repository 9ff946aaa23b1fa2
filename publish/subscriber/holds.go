package subscriber

import (
	"context"
	"errors"
	"fmt"
	"github.com/mailroom/tailer/publish/jsio"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/publish/subscriber/protocol"
	"github.com/mailroom/tailer/publish/wire"
)

// ErrStreamChanged: the stream does not hold, at a sequence a reader
// recorded, what the reader read there. A sequence number names a place
// only in the stream it came from: the stream was deleted and made again,
// restored from an older backup, or purged.
var ErrStreamChanged = errors.New("the stream does not hold the message read there")

// StreamHolds reports whether stream holds at seq a message for which
// match is true, read from the stream's leader (jsio.GetMsg). A message
// gone is false; a server that cannot answer now (a leader being
// elected, a node away) is asked again until ctx ends.
func StreamHolds(ctx context.Context, js jetstream.JetStream, stream string, seq uint64, match func(*jetstream.RawStreamMsg) bool, log *slog.Logger) (bool, error) {
	for delay := 250 * time.Millisecond; ; delay = min(2*delay, 5*time.Second) {
		msg, err := jsio.GetMsg(ctx, js.Conn(), stream, seq, "")
		switch {
		case err == nil:
			return match(msg), nil
		case errors.Is(err, jetstream.ErrMsgNotFound):
			return false, nil
		case ctx.Err() != nil:
			return false, fmt.Errorf("read message %d of stream %s: %w", seq, stream, err)
		}
		if delay == 250*time.Millisecond && log != nil {
			log.Warn("cannot read back the message a reader recorded; trying again", "stream", stream, "stream_seq", seq, "err", err)
		}
		if !sleep(ctx, delay) {
			return false, fmt.Errorf("read message %d of stream %s: %w", seq, stream, err)
		}
	}
}

// HoldsMark is a match for StreamHolds: the message of mark (wire.Mark).
func HoldsMark(mark string) func(*jetstream.RawStreamMsg) bool {
	return func(m *jetstream.RawStreamMsg) bool { return wire.Mark(m.Subject, m.Header, m.Data) == mark }
}

// HoldsKey is a match for StreamHolds: a message that carries the token
// of key.
func HoldsKey(key string) func(*jetstream.RawStreamMsg) bool {
	return func(m *jetstream.RawStreamMsg) bool {
		return slices.Contains(strings.Split(m.Header.Get(wire.HeaderTokenKeys), ","), key)
	}
}

// checkRecord holds the durable's record against the stream: a record is
// of the stream that holds, at the sequence the record saw last, the
// message it saw there, whichever replica answers and whatever the
// stream's creation time says. A record of another stream is dropped when
// the consumer is on the server (its own position is this stream's),
// FromStart asks for this stream from its first message, or the Sink
// keeps a record of its own (Positioner), which says where to go on; with
// the consumer to be made otherwise it is refused, naming the ways on:
// its sequences would skip this stream's messages.
func (s *Subscriber) checkRecord(ctx context.Context, js jetstream.JetStream, missing bool) error {
	rec := s.record()
	last, floor := rec.Last, rec.Floor
	if last.Seq == 0 && floor == 0 {
		return nil
	}
	at, err := s.atLast(ctx, js, last)
	if err != nil {
		return err
	}
	switch protocol.CheckRecord(at, missing, s.cfg.FromStart, s.positioner != nil) {
	case protocol.KeepRecord:
		return nil
	case protocol.RefuseRecord:
		return fmt.Errorf("consumer %s on stream %s: %w: the durable's subscribers last read sequence %d, which now holds another message or none (the stream was deleted and made again, restored from an older backup, or purged); "+
			"start the subscriber with --from-start to deliver this stream from its first message (tokens a resync published again come again, but for those in --dedup-window), or make the consumer by hand at the sequence you know",
			s.cfg.Durable, s.cfg.Stream, ErrStreamChanged, last.Seq)
	}
	switch {
	case s.cfg.Log == nil:
	case at == protocol.Unanchored:
		s.cfg.Log.Info("the durable's record names no message, only an ack floor, which names a place in no stream in particular: dropped",
			"durable", s.cfg.Durable, "record_floor", floor, "consumer_missing", missing)
	default:
		how := "the consumer on the server goes on from its own position"
		if missing {
			how = "the consumer is made at the stream's first message (--from-start)"
		}
		s.cfg.Log.Warn("the durable's record is of another stream (deleted and made again, restored or purged): dropped; "+how,
			"durable", s.cfg.Durable, "record_last_seq", last.Seq)
	}
	s.step(protocol.RecordDropped{})
	return nil
}

// atLast is what the stream holds at the sequence the record saw last.
func (s *Subscriber) atLast(ctx context.Context, js jetstream.JetStream, last wire.Anchor) (protocol.HeldAtLast, error) {
	if last.Seq == 0 {
		return protocol.Unanchored, nil
	}
	same, err := StreamHolds(ctx, js, s.cfg.Stream, last.Seq, HoldsMark(last.Mark), s.cfg.Log)
	if err != nil || same {
		return protocol.SameMessage, err
	}
	gone, err := removed(ctx, js, s.cfg.Stream, last.Seq)
	if err != nil || gone {
		return protocol.Removed, err
	}
	return protocol.OtherMessage, nil
}

// removed reports whether stream no longer holds a message at seq and
// goes on beyond it: the message there was removed (by a limit, a purge,
// of its subject too, or a delete) and no other took its place, as a
// stream made again would have; the chain of the messages after it
// tells whether what was removed had been read.
func removed(ctx context.Context, js jetstream.JetStream, stream string, seq uint64) (bool, error) {
	_, err := jsio.GetMsg(ctx, js.Conn(), stream, seq, "")
	if !errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, nil
	}
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return false, fmt.Errorf("stream %s: %w", stream, err)
	}
	return st.CachedInfo().State.LastSeq > seq, nil
}

// untilAnswered calls open, each try given a few seconds, until it returns
// anything but an error of a cluster that cannot answer now, or ctx ends:
// a subscriber started (or started again by its supervisor) while a node
// or a leader is away waits for the cluster instead of exiting.
func untilAnswered[T any](ctx context.Context, open func(context.Context) (T, error)) (T, error) {
	for delay := 250 * time.Millisecond; ; delay = min(2*delay, 2*time.Second) {
		try, cancel := context.WithTimeout(ctx, 5*time.Second)
		v, err := open(try)
		cancel()
		if err == nil || !jsio.Unanswered(err) || ctx.Err() != nil || !sleep(ctx, delay) {
			return v, err
		}
	}
}
