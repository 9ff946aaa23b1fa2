package consume

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// KeysSince reads the keys (wire.AppendKey) of every token in stream's
// messages stored at or after since, up to sequence last (0: none). A
// resync publishes only the tokens whose key is not among them. Tokens live
// minutes, so since (the oldest candidate's creation, less a margin for the
// two servers' clocks) bounds the read to a short window of the stream.
func KeysSince(ctx context.Context, stream jetstream.Stream, since time.Time, last uint64) (map[string]struct{}, error) {
	keys := make(map[string]struct{})
	if last == 0 {
		return keys, nil
	}
	var name string
	if info := stream.CachedInfo(); info != nil {
		name = info.Config.Name
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartTimePolicy,
		OptStartTime:  &since,
	})
	if err != nil {
		return nil, fmt.Errorf("read stream %s since %s: %w", name, since.Format(time.RFC3339), err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("read stream %s: %w", name, err)
	}
	if info.NumPending == 0 {
		return keys, nil
	}
	it, err := cons.Messages()
	if err != nil {
		return nil, fmt.Errorf("read stream %s: %w", name, err)
	}
	defer it.Stop()
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return nil, fmt.Errorf("read stream %s: %w", name, err)
		}
		meta, err := msg.Metadata()
		if err != nil {
			return nil, fmt.Errorf("read stream %s: %w", name, err)
		}
		b, err := Decode(msg.Headers(), msg.Data())
		if err != nil {
			// Its tokens cannot be told apart from the ones to publish.
			return nil, fmt.Errorf("stream %s, message %d on %s: %w", name, meta.Sequence.Stream, msg.Subject(), err)
		}
		for _, t := range b.Tokens {
			keys[t.Key] = struct{}{}
		}
		if meta.Sequence.Stream >= last || meta.NumPending == 0 {
			return keys, nil
		}
	}
}
