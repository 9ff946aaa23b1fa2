package sim

// The records' bucket: the durable's key, its value at a revision, written
// by compare-and-swap; the processes read and write it through the
// shipping subscriber.KVProgress (its retry over writes whose answer was
// lost included), which this model serves as a subscriber.RecordBucket.

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

var errUnanswered = errors.New("the bucket does not answer")

// kvModel is the durable's key in the records' bucket: a value and its
// revision; a write names the revision it replaces (0: none yet). Down,
// it answers nothing and nothing lands; losing answers, a write lands
// and its answer is lost on the way.
type kvModel struct {
	value     []byte
	rev, revs uint64
	downUntil time.Duration
	lostUntil time.Duration
	now       func() time.Duration
}

func (k *kvModel) down() bool { return k.now() < k.downUntil }

// Get is the value the bucket's leader holds (nil: none).
func (k *kvModel) Get(context.Context) ([]byte, uint64, error) {
	if k.down() || k.now() < k.lostUntil {
		return nil, 0, errUnanswered
	}
	return slices.Clone(k.value), k.rev, nil
}

// Put writes value at revision, as a JetStream key-value bucket's Create
// (revision 0) and Update do.
func (k *kvModel) Put(_ context.Context, value []byte, revision uint64) (uint64, error) {
	switch {
	case k.down():
		return 0, errUnanswered
	case revision == 0 && k.value != nil:
		return 0, jetstream.ErrKeyExists
	case revision != k.rev:
		return 0, jetstream.ErrKeyRevisionMismatch
	}
	k.revs++
	k.value, k.rev = slices.Clone(value), k.revs
	if k.now() < k.lostUntil {
		return 0, errUnanswered
	}
	return k.rev, nil
}
