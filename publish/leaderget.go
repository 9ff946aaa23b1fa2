package publish

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// getMsg reads the stream's message at seq from the stream's leader;
// jetstream.ErrMsgNotFound when it holds none there.
//
// Not Stream.GetMsg: on a stream that allows direct gets (allow_direct,
// which an operator's `nats stream add` sets by default), that asks any
// replica, and a follower behind its leader answers with what it has.
// What the tailer reads back (its last message, the messages that cover
// a replay, the record of a clean stop) decides what it publishes again:
// a stale answer would publish tokens twice without a word.
func (p *Publisher) getMsg(ctx context.Context, seq uint64) (*jetstream.RawStreamMsg, error) {
	return p.leaderGet(ctx, map[string]any{"seq": seq})
}

// getLastMsgForSubject reads the last message on subject from the
// stream's leader, as getMsg does.
func (p *Publisher) getLastMsgForSubject(ctx context.Context, subject string) (*jetstream.RawStreamMsg, error) {
	return p.leaderGet(ctx, map[string]any{"last_by_subj": subject})
}

func (p *Publisher) leaderGet(ctx context.Context, req map[string]any) (*jetstream.RawStreamMsg, error) {
	body, _ := json.Marshal(req)
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
	}
	reply, err := p.js.Conn().RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+p.name, body)
	if err != nil {
		return nil, err
	}
	var resp struct {
		Message *struct {
			Subject string    `json:"subject"`
			Seq     uint64    `json:"seq"`
			Hdrs    []byte    `json:"hdrs"`
			Data    []byte    `json:"data"`
			Time    time.Time `json:"time"`
		} `json:"message"`
		Error *struct {
			ErrCode     jetstream.ErrorCode `json:"err_code"`
			Description string              `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(reply.Data, &resp); err != nil {
		return nil, fmt.Errorf("the server's answer to a message get: %w", err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrCode == jetstream.JSErrCodeMessageNotFound:
		return nil, jetstream.ErrMsgNotFound
	case resp.Error != nil:
		return nil, fmt.Errorf("%s (error %d)", resp.Error.Description, resp.Error.ErrCode)
	case resp.Message == nil:
		return nil, fmt.Errorf("the server's answer to a message get holds no message")
	}
	m := &jetstream.RawStreamMsg{Subject: resp.Message.Subject, Sequence: resp.Message.Seq, Data: resp.Message.Data, Time: resp.Message.Time}
	if len(resp.Message.Hdrs) > 0 {
		if m.Header, err = nats.DecodeHeadersMsg(resp.Message.Hdrs); err != nil {
			return nil, fmt.Errorf("the headers of message %d: %w", m.Sequence, err)
		}
	}
	return m, nil
}
