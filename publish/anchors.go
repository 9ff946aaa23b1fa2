package publish

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/publish/relay"
	"github.com/mailroom/tailer/publish/wire"
)

// anchors guards a Publisher's Anchors and its count of batch messages
// sent and stored: PubAcks note them, the stream checks read them.
type anchors struct {
	mu sync.Mutex
	a  relay.Anchors
	// sentN and ackedN count the session's batch messages sent and
	// acknowledged (PubAck in hand), settled signalled as each is;
	// appendedN those the stream did not hold before (not a duplicate).
	sentN, ackedN, appendedN uint64
	settled                  sync.Cond
}

// sent counts a batch message sent.
func (a *anchors) sent() {
	a.mu.Lock()
	a.sentN++
	a.mu.Unlock()
}

// stored notes msg, stored at seq (its PubAck), as the newest message,
// and the newest batch when it is one; duplicate: the stream held it
// before (its PubAck says so).
func (p *Publisher) stored(seq uint64, msg *nats.Msg, batch, duplicate bool) {
	a := wire.Anchor{Seq: seq, Mark: wire.Mark(msg.Subject, msg.Header, msg.Data)}
	p.anchors.mu.Lock()
	defer p.anchors.mu.Unlock()
	if seq >= p.anchors.a.Last.Seq {
		p.anchors.a.Last = a
	}
	if batch && seq >= p.anchors.a.Batch.Seq {
		p.anchors.a.Batch = a
	}
	if batch {
		p.anchors.ackedN++
		if !duplicate {
			p.anchors.appendedN++
		}
		if p.anchors.settled.L != nil {
			p.anchors.settled.Broadcast()
		}
	}
}

// Anchors returns the newest messages acknowledged so far (zero ones:
// none).
func (p *Publisher) Anchors() relay.Anchors {
	p.anchors.mu.Lock()
	defer p.anchors.mu.Unlock()
	return p.anchors.a
}

// MissingAnchors returns the anchors the stream no longer holds at their
// sequence (the message gone, or another there), read from the stream's
// leader, whatever removed them: whether its limits did is the relay's
// to judge.
func (p *Publisher) MissingAnchors(ctx context.Context, anchors []wire.Anchor) ([]wire.Anchor, error) {
	var missing []wire.Anchor
	for _, want := range anchors {
		if want.Seq == 0 {
			continue
		}
		msg, err := p.getMsg(ctx, want.Seq)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			missing = append(missing, want)
		case err != nil:
			return nil, fmt.Errorf("read message %d of stream %s: %w", want.Seq, p.name, err)
		case messageMark(msg) != want.Mark:
			missing = append(missing, want)
		}
	}
	return missing, nil
}
