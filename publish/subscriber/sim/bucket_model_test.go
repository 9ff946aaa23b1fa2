package sim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"pgregory.net/rapid"

	"github.com/mailroom/tailer/internal/testutil/natstest"
	"github.com/mailroom/tailer/publish/subscriber"
)

// outcome is what a read or a write of the record's key came to, as the
// shipping KVProgress tells outcomes apart: landed at a revision, refused
// because the key moved on, or failed otherwise.
func outcome(value []byte, rev uint64, err error) string {
	switch {
	case err == nil:
		return fmt.Sprintf("ok rev %d value %q", rev, value)
	case errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists):
		return "refused: the key moved on"
	}
	return "failed: " + err.Error()
}

// The bucket's model answers each read and compare-and-swap write as a
// real nats-server's key-value bucket does, through the RecordBucket the
// subscriber ships: the same revisions, the same values, a write at a
// stale revision (or a create over a value) refused alike.
func TestBucketModelAgreesWithJetStream(t *testing.T) {
	_, js := natstest.JetStream(t)
	ctx := context.Background()
	n := 0
	rapid.Check(t, func(rt *rapid.T) {
		n++
		kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: fmt.Sprintf("b%d", n), History: 1})
		if err != nil {
			rt.Fatal(err)
		}
		real := subscriber.JetStreamKey(kv, js, "durable")
		model := &kvModel{now: func() time.Duration { return 0 }}
		for i, steps := 0, rapid.IntRange(1, 12).Draw(rt, "steps"); i < steps; i++ {
			if rapid.Bool().Draw(rt, "read") {
				rv, rr, re := real.Get(ctx)
				mv, mr, me := model.Get(ctx)
				if got, want := outcome(mv, mr, me), outcome(rv, rr, re); got != want {
					rt.Fatalf("step %d, read: the model says %s, the server %s", i, got, want)
				}
				continue
			}
			value := []byte(fmt.Sprintf(`{"w":%d}`, i))
			rev := uint64(rapid.IntRange(0, int(model.rev)+1).Draw(rt, "revision"))
			rr, re := real.Put(ctx, value, rev)
			mr, me := model.Put(ctx, value, rev)
			if got, want := outcome(nil, mr, me), outcome(nil, rr, re); got != want {
				rt.Fatalf("step %d, write at revision %d: the model says %s, the server %s", i, rev, got, want)
			}
		}
		rv, _, _ := real.Get(ctx)
		if mv, _, _ := model.Get(ctx); !bytes.Equal(mv, rv) {
			rt.Fatalf("the model holds %q, the server %q", mv, rv)
		}
	})
}
