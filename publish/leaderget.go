package publish

import (
	"context"
	"github.com/mailroom/tailer/publish/jsio"

	"github.com/nats-io/nats.go/jetstream"
)

// getMsg reads the stream's message at seq from the stream's leader
// (jsio.GetMsg says why not a direct get); jetstream.ErrMsgNotFound when
// it holds none there.
func (p *Publisher) getMsg(ctx context.Context, seq uint64) (*jetstream.RawStreamMsg, error) {
	return jsio.GetMsg(ctx, p.js.Conn(), p.name, seq, "")
}

// getLastMsgForSubject reads the last message on subject from the
// stream's leader.
func (p *Publisher) getLastMsgForSubject(ctx context.Context, subject string) (*jetstream.RawStreamMsg, error) {
	return jsio.GetMsg(ctx, p.js.Conn(), p.name, 0, subject)
}
