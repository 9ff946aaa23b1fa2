package protocol

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mailroom/tailer/publish/wire"
)

// Batches is a set of batch indices of one message, written as ranges
// ("0-3,7"): the batches of a message its reader finished.
type Batches []span

// span is an inclusive range of batch indices.
type span struct{ lo, hi int }

// Has reports whether i is in the set.
func (b Batches) Has(i int) bool {
	_, found := slices.BinarySearchFunc(b, i, func(s span, i int) int {
		switch {
		case s.hi < i:
			return -1
		case s.lo > i:
			return 1
		}
		return 0
	})
	return found
}

// Add puts i in the set.
func (b *Batches) Add(i int) {
	if b.Has(i) {
		return
	}
	s := *b
	k, _ := slices.BinarySearchFunc(s, i, func(s span, i int) int { return s.lo - i })
	s = slices.Insert(s, k, span{i, i})
	// Join with the neighbours the new index touches.
	if k+1 < len(s) && s[k+1].lo == i+1 {
		s[k].hi = s[k+1].hi
		s = slices.Delete(s, k+1, k+2)
	}
	if k > 0 && s[k-1].hi == i-1 {
		s[k-1].hi = s[k].hi
		s = slices.Delete(s, k, k+1)
	}
	*b = s
}

// Len is the number of indices in the set.
func (b Batches) Len() int {
	n := 0
	for _, s := range b {
		n += s.hi - s.lo + 1
	}
	return n
}

func (b Batches) String() string {
	var sb strings.Builder
	for i, s := range b {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(strconv.Itoa(s.lo))
		if s.hi != s.lo {
			sb.WriteByte('-')
			sb.WriteString(strconv.Itoa(s.hi))
		}
	}
	return sb.String()
}

// MarshalText writes the ranges.
func (b Batches) MarshalText() ([]byte, error) { return []byte(b.String()), nil }

// UnmarshalText parses ranges as String writes them.
func (b *Batches) UnmarshalText(text []byte) error {
	p, err := ParseBatches(string(text))
	if err != nil {
		return err
	}
	*b = p
	return nil
}

// maxBatches bounds the batches of a message a record may speak of: the
// tailer groups at most MAILROOM_MAX_BATCHES_PER_MESSAGE (1,000 by
// default) into one message.
const maxBatches = 1 << 20

// ParseBatches parses "0-3,7": ascending, non-overlapping ranges of
// indices below 2^20.
func ParseBatches(s string) (Batches, error) {
	if s == "" {
		return nil, nil
	}
	var out Batches
	for _, f := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(f, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 || a >= maxBatches || lo != strconv.Itoa(a) {
			return nil, fmt.Errorf("batches %q: %q is not a batch index", s, lo)
		}
		z := a
		if isRange {
			if z, err = strconv.Atoi(hi); err != nil || z <= a || z >= maxBatches || hi != strconv.Itoa(z) {
				return nil, fmt.Errorf("batches %q: %q is not a range of batch indices", s, f)
			}
		}
		if n := len(out); n > 0 && a <= out[n-1].hi+1 {
			return nil, fmt.Errorf("batches %q: ranges out of order or touching at %q", s, f)
		}
		out = append(out, span{a, z})
	}
	return out, nil
}

// Progress is what a subscriber remembers of a durable consumer beyond
// what the server does: which batches of the messages it holds are done,
// how often a reader failed on a batch, and where the consumer was. The
// server acknowledges whole messages; a message of the tailer holds up to
// MAILROOM_MAX_BATCHES_PER_MESSAGE batches, so without this record a
// reader that dies would cost every batch of the messages it held, and a
// consumer lost with its server would start again from nowhere.
//
// A record says the format of its writer (Version) and the oldest format
// a reader must know to use it (Needs); both are absent from records of
// format 1, so that the release before them, which knows no such field,
// reads this release's records too. A reader takes fields it does not
// know and drops them when it writes the record back: a release that
// adds a field whose loss would skip or repeat a batch raises Needs,
// and a reader of an older format refuses that record, naming the way
// back (ErrRecordAhead), rather than act on part of it.
type Progress struct {
	// Version is the format of the release that wrote the record (0: 1).
	Version int `json:"version,omitempty"`
	// Needs is the oldest format a reader must know to use the record
	// (0: 1).
	Needs int `json:"needs,omitempty"`
	// Last is the newest message the durable's subscribers were given, by
	// its place and its content: the record is of the stream that holds
	// that message there, not of any stream of the name (see the subscriber's
	// consumer).
	Last wire.Anchor `json:"last,omitzero"`
	// Chain is the newest batch message given on each subject, which the
	// next one there must follow (wire.HeaderPrev).
	Chain wire.Chain `json:"chain,omitempty"`
	// StreamCreated is read from records written before Last and not
	// used: a server's creation time differs between the replicas of a
	// restored stream, and names no content.
	StreamCreated time.Time `json:"stream_created,omitzero"`
	// Floor is the consumer's acknowledgement floor as last read from the
	// server (a stream sequence): every message up to it is done.
	Floor uint64 `json:"floor"`
	// Messages are the messages above Floor the subscriber worked on, by
	// stream sequence.
	Messages map[uint64]*MessageProgress `json:"messages,omitempty"`
}

// MessageProgress is what is known about one message.
type MessageProgress struct {
	// Mark is the message's wire.Mark: the record of another message at
	// the same sequence (of a stream made again) does not apply to it.
	Mark string `json:"mark,omitempty"`
	// Batches is how many batches the message holds.
	Batches int `json:"batches"`
	// Done are the batches its readers finished (or set aside as dead
	// letters).
	Done Batches `json:"done,omitempty"`
	// Acked: the server confirmed the message's acknowledgement.
	Acked bool `json:"acked,omitempty"`
	// Attempts counts, by batch, the readers that failed with the batch
	// taken and not finished.
	Attempts map[int]int `json:"attempts,omitempty"`
}

// Finished notes batch i done: its failures no longer count.
func (m *MessageProgress) Finished(i int) {
	m.Done.Add(i)
	delete(m.Attempts, i)
}

// Failed counts a reader that failed with batch i taken and not
// finished.
func (m *MessageProgress) Failed(i int) {
	if m.Attempts == nil {
		m.Attempts = make(map[int]int)
	}
	m.Attempts[i]++
}

// MessageAt returns the record of the message of mark at seq, made for a
// message of n batches if there is none.
func (p *Progress) MessageAt(seq uint64, mark string, n int) *MessageProgress {
	if p.Messages == nil {
		p.Messages = make(map[uint64]*MessageProgress)
	}
	m := p.Messages[seq]
	if m == nil || m.Batches != n || m.Mark != "" && m.Mark != mark {
		// A record that disagrees on the content or the batch count is
		// not this message's: start over rather than skip batches on its
		// word.
		m = &MessageProgress{Mark: mark, Batches: n}
		p.Messages[seq] = m
	}
	m.Mark = mark
	return m
}

// Saw notes the message of mark at seq as the newest one given to the
// durable's subscribers, if it is.
func (p *Progress) Saw(seq uint64, mark string) bool {
	if seq < p.Last.Seq {
		return false
	}
	p.Last = wire.Anchor{Seq: seq, Mark: mark}
	return true
}

// Prune forgets the messages at or below the floor.
func (p *Progress) Prune(floor uint64) {
	p.Floor = max(p.Floor, floor)
	for seq := range p.Messages {
		if seq <= p.Floor {
			delete(p.Messages, seq)
		}
	}
}

// Absorb adds to p what q knows and p does not: a batch done, a message
// acknowledged, a reader's failure, the newest message given. Each is a
// fact that stays true, so two subscribers' records of one durable
// merge without either losing what it finished. A message q records with
// other content (mark) or batches than p is left as p has it. It
// reports whether p changed.
func (p *Progress) Absorb(q *Progress) bool {
	changed := false
	if q.Floor > p.Floor {
		p.Prune(q.Floor)
		changed = true
	}
	if q.Last.Seq > p.Last.Seq {
		p.Last, changed = q.Last, true
	}
	changed = p.Chain.Absorb(q.Chain) || changed
	for seq, qm := range q.Messages {
		if seq <= p.Floor {
			continue
		}
		pm := p.Messages[seq]
		if pm == nil {
			mc := *qm
			mc.Done, mc.Attempts = slices.Clone(qm.Done), maps.Clone(qm.Attempts)
			if p.Messages == nil {
				p.Messages = make(map[uint64]*MessageProgress)
			}
			p.Messages[seq], changed = &mc, true
			continue
		}
		if pm.Batches != qm.Batches || pm.Mark != "" && qm.Mark != "" && pm.Mark != qm.Mark {
			continue
		}
		for i := range qm.Batches {
			if qm.Done.Has(i) && !pm.Done.Has(i) {
				pm.Done.Add(i)
				changed = true
			}
		}
		if qm.Acked && !pm.Acked {
			pm.Acked, changed = true, true
		}
		for i, n := range qm.Attempts {
			if n > pm.Attempts[i] {
				if pm.Attempts == nil {
					pm.Attempts = make(map[int]int)
				}
				pm.Attempts[i], changed = n, true
			}
		}
	}
	return changed
}

// Clone copies p deeply.
func (p *Progress) Clone() Progress {
	c := *p
	c.Messages = make(map[uint64]*MessageProgress, len(p.Messages))
	for seq, m := range p.Messages {
		mc := *m
		mc.Done = slices.Clone(m.Done)
		mc.Attempts = maps.Clone(m.Attempts)
		c.Messages[seq] = &mc
	}
	c.Chain.Subjects = maps.Clone(p.Chain.Subjects)
	return c
}

// maxRecordBytes bounds a stored record: a subscriber holds a few
// messages at a time.
const maxRecordBytes = 1 << 20

// ParseProgress reads a stored record, rejecting one that cannot be a
// subscriber's.
func ParseProgress(data []byte) (Progress, error) {
	var p Progress
	if len(data) > maxRecordBytes {
		return p, fmt.Errorf("progress record: %d bytes, more than %d", len(data), maxRecordBytes)
	}
	if err := json.Unmarshal(data, &p); err != nil {
		return Progress{}, fmt.Errorf("progress record: %w", err)
	}
	if p.Needs > RecordFormat {
		return Progress{}, fmt.Errorf("progress record of format %d: %w: it needs a reader of format %d, and this tailer subscribe reads format %d; run this durable's subscribers from the release that wrote it, or a later one", max(p.Version, p.Needs), ErrRecordAhead, p.Needs, RecordFormat)
	}
	for seq, m := range p.Messages {
		switch {
		case m == nil:
			return Progress{}, fmt.Errorf("progress record: message %d: null", seq)
		case seq == 0:
			return Progress{}, errors.New("progress record: message at sequence 0")
		case m.Batches <= 0 || m.Batches > maxBatches:
			return Progress{}, fmt.Errorf("progress record: message %d: %d batches", seq, m.Batches)
		case len(m.Done) > 0 && m.Done[len(m.Done)-1].hi >= m.Batches:
			return Progress{}, fmt.Errorf("progress record: message %d: batches %s done of %d", seq, m.Done, m.Batches)
		}
		for i, n := range m.Attempts {
			if i < 0 || i >= m.Batches || n < 0 {
				return Progress{}, fmt.Errorf("progress record: message %d: %d attempts at batch %d of %d", seq, n, i, m.Batches)
			}
		}
	}
	return p, nil
}

// RecordFormat is the format of the durable's record this release writes,
// and the newest it reads whole.
const RecordFormat = 1

// ErrRecordAhead is a record written by a release whose format this one
// cannot honour (Progress.Needs past RecordFormat).
var ErrRecordAhead = errors.New("the durable's record was written by a later release of tailer subscribe")
