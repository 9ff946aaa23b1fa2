package tailertest

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/publish/wire"
)

// StoredMessages returns every message the stream stores, oldest first.
func StoredMessages(ctx context.Context, s jetstream.Stream) ([]*jetstream.RawStreamMsg, error) {
	info, err := s.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("stream info: %w", err)
	}
	var msgs []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; info.State.LastSeq > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			return nil, fmt.Errorf("message %d: %w", seq, err)
		}
		msgs = append(msgs, m)
	}
	return msgs, nil
}

// TokenIDs returns the token ids a message's Mailroom-Token-Ids header
// lists, in body order.
func TokenIDs(m *jetstream.RawStreamMsg) ([]int64, error) {
	h := m.Header.Get(wire.HeaderTokenIDs)
	fields := strings.Split(h, ",")
	ids := make([]int64, len(fields))
	for i, f := range fields {
		id, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("message %d: %s %q: %w", m.Sequence, wire.HeaderTokenIDs, h, err)
		}
		ids[i] = id
	}
	return ids, nil
}

// TokenKeys returns the token keys a message's Mailroom-Token-Keys header
// lists, in body order.
func TokenKeys(m *jetstream.RawStreamMsg) []string {
	return strings.Split(m.Header.Get(wire.HeaderTokenKeys), ",")
}
