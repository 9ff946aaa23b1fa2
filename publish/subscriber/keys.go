package subscriber

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/publish/token"
	"github.com/mailroom/tailer/publish/wire"
)

// KeysSince reads the keys (token.AppendKey) of every token in stream's
// batches stored at or after since, up to sequence last (0: none), from
// their Mailroom-Token-Keys. A resync publishes only the tokens whose key
// is not among them. Tokens live minutes, so since (the oldest candidate's
// creation, less a margin for the two servers' clocks) bounds the read to a
// short window of the stream. Session markers are passed over; messages
// that are not the tailer's batches (another publisher's, or keys that are
// not keys) are set aside: counted in setAside, their content not taken
// for tokens on the stream.
func KeysSince(ctx context.Context, stream jetstream.Stream, since time.Time, last uint64) (keys *token.KeySet, setAside int, err error) {
	keys = &token.KeySet{}
	_, setAside, err = ReadKeys(ctx, stream, ReadBackConsumer, since, last, func(_ uint64, _ int, k string) { keys.Add(k) })
	if err != nil {
		return nil, 0, err
	}
	return keys, setAside, nil
}

// ReadKeys calls f with the stream sequence, batch (its index in the
// message, by Mailroom-Batch-Sizes) and key of every token in
// stream's batches stored at or after since, up to sequence last (0:
// none), read through the consumer name (made afresh, acknowledging
// nothing, removed after), and returns the first sequence it read (0:
// none); messages that are not the tailer's batches are set aside (see
// KeysSince). A delivery lost on the way is an error: its keys would be
// taken for missing.
func ReadKeys(ctx context.Context, stream jetstream.Stream, name string, since time.Time, last uint64, f func(seq uint64, batch int, key string)) (first uint64, setAside int, err error) {
	if last == 0 {
		return 0, 0, nil
	}
	var sname string
	if info := stream.CachedInfo(); info != nil {
		sname = info.Config.Name
	}
	cons, err := readBack(ctx, stream, name, since)
	if err != nil {
		return 0, 0, fmt.Errorf("read stream %s since %s: %w", sname, since.Format(time.RFC3339), err)
	}
	defer stream.DeleteConsumer(context.WithoutCancel(ctx), name)
	info, err := cons.Info(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("read stream %s: %w", sname, err)
	}
	if info.NumPending == 0 {
		return 0, 0, nil
	}
	it, err := cons.Messages()
	if err != nil {
		return 0, 0, fmt.Errorf("read stream %s: %w", sname, err)
	}
	defer it.Stop()
	for want := uint64(1); ; want++ {
		nctx, cancel := context.WithTimeout(ctx, readBackWait)
		msg, err := it.Next(jetstream.NextContext(nctx))
		cancel()
		if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			return 0, 0, fmt.Errorf("read stream %s: no delivery within %s with messages pending: the stream or its read-back consumer %s went away (deleted, made again) or the servers do not answer", sname, readBackWait, name)
		}
		if err != nil {
			return 0, 0, fmt.Errorf("read stream %s: %w", sname, err)
		}
		meta, err := msg.Metadata()
		if err != nil {
			return 0, 0, fmt.Errorf("read stream %s: %w", sname, err)
		}
		if meta.Sequence.Consumer != want {
			// Unacknowledged deliveries lost on the way (a connection
			// cut): their keys would be taken for missing, and their
			// tokens published again.
			return 0, 0, fmt.Errorf("read stream %s: delivery %d came where %d was due: messages lost on the way; run it again", sname, meta.Sequence.Consumer, want)
		}
		if first == 0 {
			first = meta.Sequence.Stream
		}
		h := msg.Headers()
		switch {
		case wire.IsMarker(h):
		case !wire.IsBatch(h) || !validKeys(h.Get(wire.HeaderTokenKeys)):
			setAside++
		default:
			batchOf := batchIndex(h.Get(wire.HeaderBatchSizes))
			for i, k := range strings.Split(h.Get(wire.HeaderTokenKeys), ",") {
				f(meta.Sequence.Stream, batchOf(i), k)
			}
		}
		if meta.Sequence.Stream >= last || meta.NumPending == 0 {
			return first, setAside, nil
		}
	}
}

// readBackWait bounds the wait for a delivery while the read-back
// consumer has messages pending, which a server that answers serves at
// once: a stream deleted under the read leaves a pull that waits on a
// consumer gone, which no error ends.
const readBackWait = 10 * time.Second

// ReadBackConsumer is the consumer KeysSince reads through: one of its
// own name, so that the tailer's NATS user may be allowed it and no
// subscriber's durable (infra/nats/nats.conf: it could edit, pull from
// and acknowledge any consumer of the stream when its read-back was an
// ordered consumer of a random name). One resync at a time holds the
// slot's lease, and so the name. An audit reads through AuditConsumer
// (tailer audit) or AuditRunConsumer (tailer run's own).
const (
	ReadBackConsumer = "tailer_resync"
	AuditConsumer    = "tailer_audit"
	AuditRunConsumer = "tailer_audit_run"
)

// readBack makes the consumer name afresh, from since, acknowledging
// nothing, headers alone; one a killed reader left is removed first (the
// server also removes it once idle).
func readBack(ctx context.Context, stream jetstream.Stream, name string, since time.Time) (jetstream.Consumer, error) {
	if err := stream.DeleteConsumer(ctx, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, err
	}
	return stream.CreateConsumer(ctx, jetstream.ConsumerConfig{
		Name:              name,
		Description:       "tailer: the keys on the stream, read back",
		HeadersOnly:       true,
		DeliverPolicy:     jetstream.DeliverByStartTimePolicy,
		OptStartTime:      &since,
		AckPolicy:         jetstream.AckNonePolicy,
		InactiveThreshold: time.Minute,
		MemoryStorage:     true,
	})
}

// validKeys reports whether a Mailroom-Token-Keys value is a list of keys.
func validKeys(v string) bool {
	for _, k := range strings.Split(v, ",") {
		if len(k) != token.KeyLen || strings.Trim(k, base64URL) != "" {
			return false
		}
	}
	return true
}

const base64URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

// batchIndex maps a token's place in a message to its batch's, by the
// message's Mailroom-Batch-Sizes (absent or unreadable: one batch).
func batchIndex(sizes string) func(i int) int {
	var ends []int
	total := 0
	for f := range strings.SplitSeq(sizes, ",") {
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return func(int) int { return 0 }
		}
		total += n
		ends = append(ends, total)
	}
	return func(i int) int {
		b, _ := slices.BinarySearch(ends, i+1)
		return b
	}
}
