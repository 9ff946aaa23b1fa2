package wiretest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/publish/wire"
)

// StoredMessages returns every batch the stream stores, oldest first
// (session markers, and messages that are not the tailer's, left out).
func StoredMessages(ctx context.Context, s jetstream.Stream) ([]*jetstream.RawStreamMsg, error) {
	var c StreamCache
	return c.Messages(ctx, s)
}

// StreamCache reads a stream again and again, as a test polling it does,
// fetching only the messages it has not seen: a message a sequence number
// names never changes while the stream lives, and one get per stored
// message per poll is most of what a polling test costs. The zero value is
// ready to use; it is safe for concurrent use.
type StreamCache struct {
	mu      sync.Mutex
	created time.Time
	deleted int
	msgs    map[uint64]*jetstream.RawStreamMsg
}

// Messages returns every batch s stores, oldest first (session markers,
// and messages that are not the tailer's, left out). The messages are
// shared with later calls: callers must not change them.
func (c *StreamCache) Messages(ctx context.Context, s jetstream.Stream) ([]*jetstream.RawStreamMsg, error) {
	info, err := s.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("stream info: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.msgs == nil || !info.Created.Equal(c.created) || info.State.NumDeleted != c.deleted {
		// A stream deleted and made again numbers from 1 anew; one purged
		// by subject has gaps where messages were.
		c.created, c.deleted, c.msgs = info.Created, info.State.NumDeleted, map[uint64]*jetstream.RawStreamMsg{}
	}
	var msgs []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; info.State.LastSeq > 0 && seq <= info.State.LastSeq; seq++ {
		m := c.msgs[seq]
		if m == nil {
			m, err = s.GetMsg(ctx, seq)
			if errors.Is(err, jetstream.ErrMsgNotFound) && info.State.NumDeleted > 0 {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("message %d: %w", seq, err)
			}
			c.msgs[seq] = m
		}
		if wire.IsBatch(m.Header) {
			msgs = append(msgs, m)
		}
	}
	for seq := range c.msgs {
		if seq < info.State.FirstSeq {
			delete(c.msgs, seq)
		}
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
