package publish

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/publish/protocol"
	"github.com/mailroom/tailer/publish/wire"
)

// Anchors are the newest message this process had acknowledged on the
// stream, and the newest batch (protocol.Anchors): a stream deleted and
// made again, restored from an older backup or purged (the batches'
// subject alone too, which leaves the markers and the first sequence
// where they were) does not hold them.
type Anchors = protocol.Anchors

// anchors guards a Publisher's Anchors: PubAcks note them, the stream
// checks read them.
type anchors struct {
	mu sync.Mutex
	a  Anchors
}

// stored notes msg, stored at seq (its PubAck), as the newest message,
// and the newest batch when it is one.
func (p *Publisher) stored(seq uint64, msg *nats.Msg, batch bool) {
	a := protocol.Anchor{Seq: seq, Mark: wire.Mark(msg.Subject, msg.Header, msg.Data)}
	p.anchors.mu.Lock()
	defer p.anchors.mu.Unlock()
	if seq >= p.anchors.a.Last.Seq {
		p.anchors.a.Last = a
	}
	if batch && seq >= p.anchors.a.Batch.Seq {
		p.anchors.a.Batch = a
	}
}

// Anchors returns the newest messages acknowledged so far (zero ones:
// none).
func (p *Publisher) Anchors() Anchors {
	p.anchors.mu.Lock()
	defer p.anchors.mu.Unlock()
	return p.anchors.a
}

// MissingAnchor returns the first of anchors the stream no longer holds (its
// message gone, or another at its sequence), read from the stream's
// leader; zero when it holds them all. On a stream whose limits remove
// old messages, one below the stream's first sequence went by those
// limits, and counts as held.
func (p *Publisher) MissingAnchor(ctx context.Context, anchors []protocol.Anchor) (protocol.Anchor, error) {
	for _, want := range anchors {
		if want.Seq == 0 {
			continue
		}
		msg, err := p.getMsg(ctx, want.Seq)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			if trimmed, err := p.trimmed(ctx, want.Seq); err != nil || !trimmed {
				return want, err
			}
		case err != nil:
			return protocol.Anchor{}, fmt.Errorf("read message %d of stream %s: %w", want.Seq, p.name, err)
		case messageMark(msg) != want.Mark:
			return want, nil
		}
	}
	return protocol.Anchor{}, nil
}

// trimmed reports whether the stream's limits removed the message at seq:
// the stream has limits, and its first sequence is past seq.
func (p *Publisher) trimmed(ctx context.Context, seq uint64) (bool, error) {
	if !p.limited {
		return false, nil
	}
	s, err := p.js.Stream(ctx, p.name)
	if err != nil {
		return false, fmt.Errorf("stream %s: %w", p.name, err)
	}
	return s.CachedInfo().State.FirstSeq > seq, nil
}
