package publish

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/publish/wire"
)

// messageMark is wire.Mark of a message read back.
func messageMark(m *jetstream.RawStreamMsg) string { return wire.Mark(m.Subject, m.Header, m.Data) }

// LastMark is the stream's last sequence and its message's mark (0 for an
// empty stream), read from the stream itself: where it stands once every
// publish of the session has its PubAck.
func (p *Publisher) LastMark(ctx context.Context) (uint64, string, error) {
	info, err := p.stream.Info(ctx)
	if err != nil {
		return 0, "", fmt.Errorf("read stream %s: %w", p.name, err)
	}
	seq := info.State.LastSeq
	if seq == 0 {
		return 0, "", nil
	}
	msg, err := p.getMsg(ctx, seq)
	if err != nil {
		return 0, "", fmt.Errorf("read message %d of stream %s: %w", seq, p.name, err)
	}
	return seq, messageMark(msg), nil
}

// Holds reports whether the stream holds, at seq, the message of mark
// (LastMark's), and every message since sequence since+1 that its
// configuration keeps: a stream made again from a backup of the one that
// had them.
func (p *Publisher) Holds(ctx context.Context, seq uint64, mark string, since uint64) (bool, error) {
	msg, err := p.getMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read message %d of stream %s: %w", seq, p.name, err)
	}
	if messageMark(msg) != mark {
		return false, nil
	}
	_, truncated, err := p.Lost(ctx, since)
	return err == nil && !truncated, err
}
