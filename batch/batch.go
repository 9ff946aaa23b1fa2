// Package batch cuts the stream of decoded tokens into batches by limit and
// timeout, and keeps the books of which WAL positions may be confirmed to
// the replication slot.
//
// Every token gets a sequence number in commit order. A batch covers a
// contiguous range of them, and batches finish (are published or skipped) in
// order, so "everything up to sequence N is done" is a single number. WAL
// positions are recorded as marks (LSN, last sequence before it): a
// transaction's end LSN, or a keepalive's server position. A mark becomes
// confirmable once its sequence is done. Tokens that could not be decoded get
// no sequence number, so they never hold a mark back.
package batch

import (
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/mailroom/tailer/decoder"
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

// Batch is a run of consecutive tokens in commit order.
type Batch struct {
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
func (b *Batch) First() decoder.Position { return b.Tokens[0].Pos }
func (b *Batch) Last() decoder.Position  { return b.Tokens[len(b.Tokens)-1].Pos }

// Batcher accumulates tokens and cuts a batch when it holds limit tokens or
// when timeout has passed since its first token. It is owned by one
// goroutine.
type Batcher struct {
	limit   int
	timeout time.Duration
	now     func() time.Time

	cur     *Batch
	nextSeq uint64
	free    chan *Batch
}

// NewBatcher returns a Batcher. Batches given back with Recycle are reused,
// so that a steady stream allocates no new token slices.
func NewBatcher(limit int, timeout time.Duration, now func() time.Time) *Batcher {
	if now == nil {
		now = time.Now
	}
	return &Batcher{limit: limit, timeout: timeout, now: now, nextSeq: 1, free: make(chan *Batch, 64)}
}

// Add appends a copy of t and reports whether the batch reached the limit;
// the caller then calls Cut(CutLimit).
func (b *Batcher) Add(t *decoder.Token) (full bool) {
	if b.cur == nil {
		select {
		case b.cur = <-b.free:
		default:
			b.cur = &Batch{Tokens: make([]decoder.Token, 0, min(b.limit, 4096))}
		}
		b.cur.FirstSeq = b.nextSeq
		b.cur.Started = b.now()
	}
	b.cur.Tokens = append(b.cur.Tokens, *t)
	b.cur.LastSeq = b.nextSeq
	b.nextSeq++
	return len(b.cur.Tokens) >= b.limit
}

// LastSeq returns the sequence number of the newest token added.
func (b *Batcher) LastSeq() uint64 { return b.nextSeq - 1 }

// Pending returns the number of tokens in the open batch.
func (b *Batcher) Pending() int {
	if b.cur == nil {
		return 0
	}
	return len(b.cur.Tokens)
}

// Deadline returns when the open batch must be cut, and false when there is
// no open batch.
func (b *Batcher) Deadline() (time.Time, bool) {
	if b.cur == nil {
		return time.Time{}, false
	}
	return b.cur.Started.Add(b.timeout), true
}

// Cut closes the open batch and returns it, or nil when it is empty.
func (b *Batcher) Cut(reason CutReason) *Batch {
	out := b.cur
	b.cur = nil
	if out != nil {
		out.Cut = reason
	}
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
// which position may be confirmed. It is owned by one goroutine; the done
// sequence number it is given may come from another.
type Tracker struct {
	confirmed pglogrepl.LSN
	marks     []mark
	head      int
}

type mark struct {
	lsn pglogrepl.LSN
	seq uint64
}

// NewTracker starts at the slot's confirmed position.
func NewTracker(start pglogrepl.LSN) *Tracker {
	return &Tracker{confirmed: start}
}

// Mark records that every row before lsn has been seen and that the newest
// token among them has sequence number seq. Marks must come in WAL order;
// one at or below the newest is ignored.
func (t *Tracker) Mark(lsn pglogrepl.LSN, seq uint64) {
	if n := len(t.marks); n > t.head {
		last := &t.marks[n-1]
		if lsn <= last.lsn {
			return
		}
		if last.seq == seq {
			// Nothing new to wait for between the two marks: the later one
			// supersedes the earlier.
			last.lsn = lsn
			return
		}
	} else if lsn <= t.confirmed {
		return
	}
	if t.head > 0 && t.head == len(t.marks) {
		t.marks, t.head = t.marks[:0], 0
	}
	t.marks = append(t.marks, mark{lsn: lsn, seq: seq})
}

// Confirmable returns the newest position whose every token has a sequence
// number at or below done.
func (t *Tracker) Confirmable(done uint64) pglogrepl.LSN {
	for t.head < len(t.marks) && t.marks[t.head].seq <= done {
		t.confirmed = t.marks[t.head].lsn
		t.head++
	}
	if t.head > 1024 && t.head*2 > len(t.marks) {
		n := copy(t.marks, t.marks[t.head:])
		t.marks, t.head = t.marks[:n], 0
	}
	return t.confirmed
}

// Waiting returns the number of marks not yet confirmable.
func (t *Tracker) Waiting() int { return len(t.marks) - t.head }
