package sim

// The records' bucket: the durable's record (protocol.Progress, the
// subscriber's own) at a revision, written by compare-and-swap.

import (
	"errors"
	"time"

	"github.com/mailroom/tailer/publish/subscriber/protocol"
)

var (
	errTaken      = errors.New("the record was written since (wrong last sequence)")
	errUnanswered = errors.New("the bucket does not answer")
)

// kvModel is the durable's key in the records' bucket: a value and its
// revision; a write names the revision it replaces.
type kvModel struct {
	rec       *protocol.Progress
	rev, revs uint64
	downUntil time.Duration
	now       func() time.Duration
}

func (k *kvModel) down() bool { return k.now() < k.downUntil }

func (k *kvModel) get() (protocol.Progress, uint64, error) {
	if k.down() {
		return protocol.Progress{}, 0, errUnanswered
	}
	if k.rec == nil {
		return protocol.Progress{}, k.rev, nil
	}
	return k.rec.Clone(), k.rev, nil
}

func (k *kvModel) update(r protocol.Progress, rev uint64) (uint64, error) {
	if k.down() {
		return 0, errUnanswered
	}
	if rev != k.rev {
		return 0, errTaken
	}
	c := r.Clone()
	k.revs++
	k.rec, k.rev = &c, k.revs
	return k.rev, nil
}
