package jsio

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// RequestTimeout bounds a request to a stream's leader that has no
// deadline of its own: one that does not answer within it is being elected,
// frozen or cut off, and is asked again by the caller (issue 49: reads that
// waited 10 s for a frozen leader made stretches of 19-44 s without a line).
const RequestTimeout = 2 * time.Second

// GetMsg reads one message of stream from the stream's leader: the one at
// seq, or (seq 0) the last on lastBySubject. jetstream.ErrMsgNotFound when
// there is none.
//
// Not jetstream's Stream.GetMsg: on a stream that allows direct gets
// (allow_direct, which `nats stream add` sets by default and every
// key-value bucket has), that asks any replica, and a follower behind its
// leader answers with what it has. Both ends read back what decides what
// is published or written again (the tailer its stream, a subscriber its
// progress record), so a stale answer would repeat tokens without a word.
func GetMsg(ctx context.Context, nc *nats.Conn, stream string, seq uint64, lastBySubject string) (*jetstream.RawStreamMsg, error) {
	req := map[string]any{"seq": seq}
	if seq == 0 {
		req = map[string]any{"last_by_subj": lastBySubject}
	}
	body, _ := json.Marshal(req)
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, RequestTimeout)
		defer cancel()
	}
	reply, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, body)
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
			Code        int                 `json:"code"`
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
		// Typed, so that callers can tell a cluster that cannot answer now
		// (10008: a leader being elected) from a refusal.
		return nil, &jetstream.APIError{Code: resp.Error.Code, ErrorCode: resp.Error.ErrCode, Description: resp.Error.Description}
	case resp.Message == nil:
		return nil, errors.New("the server's answer to a message get holds no message")
	}
	m := &jetstream.RawStreamMsg{Subject: resp.Message.Subject, Sequence: resp.Message.Seq, Data: resp.Message.Data, Time: resp.Message.Time}
	if len(resp.Message.Hdrs) > 0 {
		if m.Header, err = nats.DecodeHeadersMsg(resp.Message.Hdrs); err != nil {
			return nil, fmt.Errorf("the headers of message %d: %w", m.Sequence, err)
		}
	}
	return m, nil
}

// API error codes with no constant in nats.go's jetstream:
// jsTemporarilyUnavailable is "JetStream system temporarily unavailable",
// jsNoPeers "no suitable peers for placement" (for a stream or a bucket
// made, or made again, with replicas).
const (
	jsTemporarilyUnavailable jetstream.ErrorCode = 10008
	jsNoPeers                jetstream.ErrorCode = 10005
)

// Unanswered reports whether err says the server could not answer for a
// stream now (a request or a PubAck timed out or found no responder,
// JetStream temporarily unavailable while a leader is elected or the
// server is cut off from its cluster, no peer to place replicas on while
// one is offline), as opposed to a refusal: asked again, maybe of another
// server, it answers once the cluster heals. (issue 49: subscribers
// started while a node was down exited, 19 times in a run, on "no
// suitable peers for placement, peer offline" as they opened their
// bucket.)
func Unanswered(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, jetstream.ErrAsyncPublishTimeout) ||
		TemporarilyUnavailable(err) || noPeerOnline(err)
}

// TemporarilyUnavailable reports whether err is the server saying its
// JetStream cannot answer now: a server cut off from its cluster says it
// to every request until the cut heals.
func TemporarilyUnavailable(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jsTemporarilyUnavailable
}

// noPeerOnline: no peer to place a replica on while one is offline.
func noPeerOnline(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jsNoPeers && strings.Contains(apiErr.Description, "peer offline")
}
