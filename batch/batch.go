package batch

import (
	"github.com/mailroom/tailer/decoder/wal"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/mailroom/tailer/decoder"
	"github.com/mailroom/tailer/decoder/action"
)

// CutReason says why a batch was cut.
type CutReason uint8

const (
	CutLimit CutReason = iota
	CutTimeout
	CutShutdown
)

func (r CutReason) String() string {
	switch r {
	case CutLimit:
		return "limit"
	case CutTimeout:
		return "timeout"
	case CutShutdown:
		return "shutdown"
	}
	return "unknown"
}

// MaxLanes is the most lanes a Batcher splits tokens into: one for each
// token action (ByAction).
const MaxLanes = action.Max

// Seqs holds one sequence number per lane.
type Seqs [MaxLanes]uint64

// Batch is a run of consecutive tokens of one lane in commit order.
type Batch struct {
	Lane   int
	Tokens []decoder.Token
	// FirstSeq and LastSeq are the sequence numbers of the first and last
	// token.
	FirstSeq, LastSeq uint64
	Cut               CutReason
	// Started is when the first token arrived.
	Started time.Time
}

// First and Last return the WAL positions of the batch's first and last
// token.
func (b *Batch) First() wal.Position { return b.Tokens[0].Pos }
func (b *Batch) Last() wal.Position  { return b.Tokens[len(b.Tokens)-1].Pos }

// Batcher accumulates tokens and cuts a batch when it holds limit tokens or
// when timeout has passed since its first token; each lane has its own open
// batch. It is owned by one goroutine.
type Batcher struct {
	limit   int
	timeout time.Duration
	now     func() time.Time
	lane    func(*decoder.Token) int

	cur     [MaxLanes]*Batch
	lastSeq Seqs
	free    chan *Batch
}

// NewBatcher returns a Batcher with one lane. Batches given back with
// Recycle are reused, so that a steady stream allocates no new token slices.
func NewBatcher(limit int, timeout time.Duration, now func() time.Time) *Batcher {
	if now == nil {
		now = time.Now
	}
	return &Batcher{limit: limit, timeout: timeout, now: now, lane: func(*decoder.Token) int { return 0 }, free: make(chan *Batch, 64)}
}

// ByAction gives each action a lane of its own, in action.Actions' order.
func ByAction(t *decoder.Token) int { return t.Action.Lane() }

// SetLanes makes the Batcher split tokens with lane (which must return
// 0..MaxLanes-1). Call it before adding tokens.
func (b *Batcher) SetLanes(lane func(*decoder.Token) int) { b.lane = lane }

// Add appends a copy of t and returns the batch it completed (limit reached),
// or nil.
func (b *Batcher) Add(t *decoder.Token) *Batch {
	l := b.lane(t)
	cur := b.cur[l]
	if cur == nil {
		select {
		case cur = <-b.free:
		default:
			cur = &Batch{Tokens: make([]decoder.Token, 0, min(b.limit, 4096))}
		}
		cur.Lane = l
		cur.FirstSeq = b.lastSeq[l] + 1
		cur.Started = b.now()
		b.cur[l] = cur
	}
	b.lastSeq[l]++
	cur.Tokens = append(cur.Tokens, *t)
	cur.LastSeq = b.lastSeq[l]
	if len(cur.Tokens) >= b.limit {
		return b.cut(l, CutLimit)
	}
	return nil
}

// LastSeqs returns each lane's newest sequence number.
func (b *Batcher) LastSeqs() Seqs { return b.lastSeq }

// Pending returns the number of tokens in the open batches.
func (b *Batcher) Pending() int {
	n := 0
	for _, c := range b.cur {
		if c != nil {
			n += len(c.Tokens)
		}
	}
	return n
}

// Deadline returns when the first open batch must be cut, and false when no
// batch is open.
func (b *Batcher) Deadline() (time.Time, bool) {
	var d time.Time
	for _, c := range b.cur {
		if c != nil {
			if cd := c.Started.Add(b.timeout); d.IsZero() || cd.Before(d) {
				d = cd
			}
		}
	}
	return d, !d.IsZero()
}

// CutExpired cuts the open batches whose timeout has passed at now and
// returns them in lane order.
func (b *Batcher) CutExpired(now time.Time, out []*Batch) []*Batch {
	for l, c := range b.cur {
		if c != nil && !now.Before(c.Started.Add(b.timeout)) {
			out = append(out, b.cut(l, CutTimeout))
		}
	}
	return out
}

// CutAll cuts every open batch (shutdown).
func (b *Batcher) CutAll(reason CutReason, out []*Batch) []*Batch {
	for l, c := range b.cur {
		if c != nil {
			out = append(out, b.cut(l, reason))
		}
	}
	return out
}

func (b *Batcher) cut(l int, reason CutReason) *Batch {
	out := b.cur[l]
	b.cur[l] = nil
	out.Cut = reason
	return out
}

// Recycle gives a finished batch back for reuse. It is safe to call from
// any goroutine.
func (b *Batcher) Recycle(bt *Batch) {
	bt.Tokens = bt.Tokens[:0]
	select {
	case b.free <- bt:
	default:
	}
}

// Tracker records WAL positions against token sequence numbers and answers
// which position may be confirmed, and how recent the newest time known to
// lie before it is. It is owned by one goroutine; the done sequence number
// it is given may come from another.
type Tracker struct {
	confirmed pglogrepl.LSN
	// confirmedAt is the newest time (Unix ns) of a mark at or before
	// confirmed: everything committed before it is confirmed.
	confirmedAt int64
	marks       []mark
	head        int
}

type mark struct {
	lsn pglogrepl.LSN
	seq Seqs
	// at is when the WAL before lsn was written, as far as known (a
	// commit's or a heartbeat's time, Unix ns); 0 for a keepalive.
	at int64
}

// NewTracker starts at the slot's confirmed position.
func NewTracker(start pglogrepl.LSN) *Tracker {
	return &Tracker{confirmed: start}
}

// Mark records that every row before lsn has been seen and that the newest
// tokens among them have the sequence numbers seq; at, when not zero, is a
// time everything committed before lies before lsn (a commit's, a
// heartbeat's). Marks come in WAL order: one at or below the newest only
// lends it its time.
func (t *Tracker) Mark(lsn pglogrepl.LSN, seq Seqs, at time.Time) {
	var ns int64
	if !at.IsZero() {
		ns = at.UnixNano()
	}
	if n := len(t.marks); n > t.head {
		last := &t.marks[n-1]
		if lsn <= last.lsn {
			last.at = max(last.at, ns)
			return
		}
		if last.seq == seq {
			// Nothing new to wait for between the two marks: the later one
			// supersedes the earlier.
			last.lsn, last.at = lsn, max(last.at, ns)
			return
		}
	} else if lsn <= t.confirmed {
		t.confirmedAt = max(t.confirmedAt, ns)
		return
	}
	if t.head > 0 && t.head == len(t.marks) {
		t.marks, t.head = t.marks[:0], 0
	}
	t.marks = append(t.marks, mark{lsn: lsn, seq: seq, at: ns})
}

// Confirmable returns the newest position whose every token has a sequence
// number at or below done in its lane.
func (t *Tracker) Confirmable(done Seqs) pglogrepl.LSN {
	for t.head < len(t.marks) && t.marks[t.head].seq.doneBy(done) {
		t.confirmed = t.marks[t.head].lsn
		t.confirmedAt = max(t.confirmedAt, t.marks[t.head].at)
		t.head++
	}
	if t.head > 1024 && t.head*2 > len(t.marks) {
		n := copy(t.marks, t.marks[t.head:])
		t.marks, t.head = t.marks[:n], 0
	}
	return t.confirmed
}

// ConfirmedAt is the newest time known to lie before the position
// Confirmable last returned (zero when none is known): everything
// committed before it may be confirmed.
func (t *Tracker) ConfirmedAt() time.Time {
	if t.confirmedAt == 0 {
		return time.Time{}
	}
	return time.Unix(0, t.confirmedAt)
}

func (s Seqs) doneBy(done Seqs) bool {
	for l := range s {
		if s[l] > done[l] {
			return false
		}
	}
	return true
}

// Waiting returns the number of marks not yet confirmable.
func (t *Tracker) Waiting() int { return len(t.marks) - t.head }
