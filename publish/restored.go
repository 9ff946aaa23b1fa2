package publish

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/publish/relay"
	"github.com/mailroom/tailer/publish/wire"
)

// messageMark is wire.Mark of a message read back.
func messageMark(m *jetstream.RawStreamMsg) string { return wire.Mark(m.Subject, m.Header, m.Data) }

// LastMark is the stream's last message, by its sequence and mark (zero
// for an empty stream), and what the stream holds, read from the stream
// itself: where it stands once every publish of the session has its
// PubAck.
func (p *Publisher) LastMark(ctx context.Context) (wire.Anchor, relay.Seen, error) {
	info, err := p.stream.Info(ctx, jetstream.WithSubjectFilter(">"))
	if err != nil {
		return wire.Anchor{}, relay.Seen{}, fmt.Errorf("read stream %s: %w", p.name, err)
	}
	seen, seq := p.seenOf(info), info.State.LastSeq
	if seq == 0 {
		return wire.Anchor{}, seen, nil
	}
	msg, err := p.getMsg(ctx, seq)
	if err != nil {
		return wire.Anchor{}, seen, fmt.Errorf("read message %d of stream %s: %w", seq, p.name, err)
	}
	return wire.Anchor{Seq: seq, Mark: messageMark(msg)}, seen, nil
}
