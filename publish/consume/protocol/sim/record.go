package sim

import (
	"errors"
	"maps"
	"time"
)

// anchor names a message by its place and its content (wire.Anchor).
type anchor struct {
	seq  uint64
	mark string
}

// msgRec is what a record knows of one message (consume.MessageProgress).
type msgRec struct {
	mark     string
	batches  int
	done     map[int]bool
	attempts map[int]int
	acked    bool
}

// record is the durable's record (consume.Progress): the consumer's ack
// floor as last read, the messages above it, the newest given.
type record struct {
	floor uint64
	msgs  map[uint64]*msgRec
	last  anchor
}

func (r record) clone() record {
	c := record{floor: r.floor, last: r.last, msgs: make(map[uint64]*msgRec, len(r.msgs))}
	for seq, m := range r.msgs {
		mc := *m
		mc.done, mc.attempts = maps.Clone(m.done), maps.Clone(m.attempts)
		c.msgs[seq] = &mc
	}
	return c
}

// message is the record of the message of mark at seq, made anew when
// the one there is of other content or batches (Progress.message).
func (r *record) message(seq uint64, mark string, n int) *msgRec {
	if r.msgs == nil {
		r.msgs = map[uint64]*msgRec{}
	}
	m := r.msgs[seq]
	if m == nil || m.batches != n || m.mark != mark {
		m = &msgRec{mark: mark, batches: n, done: map[int]bool{}, attempts: map[int]int{}}
		r.msgs[seq] = m
	}
	return m
}

// saw notes the newest message given (Progress.saw).
func (r *record) saw(seq uint64, mark string) bool {
	if seq < r.last.seq {
		return false
	}
	r.last = anchor{seq, mark}
	return true
}

func (r *record) prune(floor uint64) {
	r.floor = max(r.floor, floor)
	for seq := range r.msgs {
		if seq <= r.floor {
			delete(r.msgs, seq)
		}
	}
}

// absorb adds what q knows to r (Progress.absorb).
func (r *record) absorb(q record) {
	if q.floor > r.floor {
		r.prune(q.floor)
	}
	if q.last.seq > r.last.seq {
		r.last = q.last
	}
	for seq, qm := range q.msgs {
		if seq <= r.floor {
			continue
		}
		rm := r.msgs[seq]
		if rm == nil {
			if r.msgs == nil {
				r.msgs = map[uint64]*msgRec{}
			}
			mc := *qm
			mc.done, mc.attempts = maps.Clone(qm.done), maps.Clone(qm.attempts)
			r.msgs[seq] = &mc
			continue
		}
		if rm.batches != qm.batches || rm.mark != qm.mark {
			continue
		}
		for i := range qm.done {
			rm.done[i] = true
		}
		rm.acked = rm.acked || qm.acked
		for i, n := range qm.attempts {
			rm.attempts[i] = max(rm.attempts[i], n)
		}
	}
}

var (
	errTaken      = errors.New("the record was written since (wrong last sequence)")
	errUnanswered = errors.New("the bucket does not answer")
)

// kvModel is the durable's key in the records' bucket: a value and its
// revision; a write names the revision it replaces.
type kvModel struct {
	rec       *record
	rev, revs uint64
	downUntil time.Duration
	now       func() time.Duration
}

func (k *kvModel) down() bool { return k.now() < k.downUntil }

func (k *kvModel) get() (record, uint64, error) {
	if k.down() {
		return record{}, 0, errUnanswered
	}
	if k.rec == nil {
		return record{}, k.rev, nil
	}
	return k.rec.clone(), k.rev, nil
}

func (k *kvModel) update(r record, rev uint64) (uint64, error) {
	if k.down() {
		return 0, errUnanswered
	}
	if rev != k.rev {
		return 0, errTaken
	}
	c := r.clone()
	k.revs++
	k.rec, k.rev = &c, k.revs
	return k.rev, nil
}
