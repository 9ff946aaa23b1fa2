package subscriber

import (
	"context"
	"github.com/mailroom/tailer/publish/subscriber/protocol"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Sink is where a Subscriber hands on the batches of the messages it is
// delivered: lines to a file or a sender (Lines), rows of the consumer's
// database or River jobs (package inbox), or a sink of one's own. The
// Subscriber does the rest, one way for every sink: the durable and its
// pulls, the chain from message to message, which batches are done, the
// acks (a message once each of its batches is done), redelivery, dead
// letters and standbys.
type Sink interface {
	// Hand hands us on, in stream order, and calls done with each unit
	// once it is out of reach of a crash (written to a file, taken by the
	// reader and followed, reported finished, committed): at once or
	// later, from any goroutine. A unit never done is delivered again.
	// An error ends the Subscriber's Run.
	Hand(ctx context.Context, us []*Unit, done func(...*Unit)) error
}

// Unit is one batch of a delivered message as a Sink gets it: the tokens
// of the subscriber's action, and where they are on the stream.
type Unit struct {
	// Stream and Seq are the message's place; Durable the consumer it
	// was delivered to.
	Stream  string
	Seq     uint64
	Durable string
	// ID and KeyID are the message's batch id and signing key id.
	ID, KeyID string
	// Line is the batch's place in the message, from 0.
	Line   int
	Tokens []SignedToken

	h    *protocol.Held
	done atomic.Bool
}

// Puller is a Sink that says how many messages it takes at once: Pull
// messages pulled and handed together, up to Pending delivered and not
// yet acknowledged. A Sink without it gets one message at a time, and
// holds two.
type Puller interface {
	Pulls() (pull, pending int)
}

// Positioner is a Sink that keeps its own record of what the durable
// stored (a database holds it): Position, where the durable got to, is
// where a consumer gone from the server, with no record of the
// Subscriber's (Progress) to say where it was, is made again; Holds, a
// token of the message at seq with id batchID stored, closes a gap
// before the message that follows it (its subscriber died before its
// record of progress said so, and the stream lost it since).
type Positioner interface {
	Position(ctx context.Context, stream, durable string) (at Stored, ok bool, err error)
	Holds(ctx context.Context, stream, durable string, seq uint64, batchID string) (bool, error)
}

// Stored is a message a durable stored a token of, by its place on the
// stream and by its content: the message's id and one token's key. The
// place counts only where the stream still holds that content there.
type Stored struct {
	Seq          uint64
	BatchID, Key string
}

// holds matches the message at at.Seq of a stream against at's content.
func (at Stored) holds(m *jetstream.RawStreamMsg) bool {
	return m.Header.Get(nats.MsgIdHdr) == at.BatchID && HoldsKey(at.Key)(m)
}

// reader is a Sink whose reader can end holding batches in doubt (Lines):
// the Subscriber settles them as the reader ended (ReaderEnded).
type reader interface {
	// watch looks after the reader while a consume runs (busy: a message
	// is being handed over), ending it with ErrReaderGone.
	watch(ctx context.Context, cancel context.CancelCauseFunc, busy func() bool)
	// settle ends the doubt as o says, and forgets what was handed: done
	// what the reader finished, and failedOn the oldest unit it took and
	// did not finish (nil: none); held reports whether it had any.
	settle(o Outcome) (failedOn *Unit, held bool)
	// inDoubt counts the units handed and not done; unsettled reports
	// whether some wait for the reader to say it finished them by
	// waiting for more.
	inDoubt() (n int, unsettled bool)
	// forget drops what was handed, of a consumer that is gone.
	forget()
	// serial reports whether the reader takes one unit at a time, each
	// done once it has taken the next (a pipe's): the record of what is
	// done is then saved before it gets a unit while one done is
	// unsaved, so that a subscriber taking over skips it.
	serial() bool
}

// Units are b's batches as a Sink gets them, of the message at seq of
// stream, delivered to durable ("" for a service's own consumer): for a
// service that consumes the stream itself and stores with a sink's code.
func (b *Decoded) Units(stream string, seq uint64, durable string) []*Unit {
	lines := b.Lines()
	us := make([]*Unit, 0, len(lines))
	for i, line := range lines {
		if len(line) > 0 {
			us = append(us, &Unit{Stream: stream, Seq: seq, Durable: durable, ID: b.ID, KeyID: b.KeyID, Line: i, Tokens: line})
		}
	}
	return us
}
