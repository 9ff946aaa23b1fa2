package batch

import (
	"github.com/mailroom/tailer/decoder/wal"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/mailroom/tailer/decoder"
	"github.com/mailroom/tailer/decoder/action"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }

func tok(commit pglogrepl.LSN, idx uint32) *decoder.Token {
	return &decoder.Token{Pos: wal.Position{Commit: wal.LSN(commit), Index: idx}, ID: int64(commit)*1000 + int64(idx), Action: action.Activation}
}

func TestBatcherLimit(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	b := NewBatcher(3, 5*time.Second, c.now)
	var batches []*Batch
	for i := uint32(0); i < 7; i++ {
		if full := b.Add(tok(100, i)); full != nil {
			batches = append(batches, full)
		}
	}
	if len(batches) != 2 {
		t.Fatalf("got %d full batches, want 2", len(batches))
	}
	for i, bt := range batches {
		if len(bt.Tokens) != 3 || bt.Cut != CutLimit {
			t.Errorf("batch %d: %d tokens, cut %v", i, len(bt.Tokens), bt.Cut)
		}
		if bt.FirstSeq != uint64(3*i+1) || bt.LastSeq != uint64(3*i+3) {
			t.Errorf("batch %d: seq %d..%d", i, bt.FirstSeq, bt.LastSeq)
		}
		if bt.First().Index != uint32(3*i) || bt.Last().Index != uint32(3*i+2) {
			t.Errorf("batch %d: positions %v..%v", i, bt.First(), bt.Last())
		}
	}
	if b.Pending() != 1 || b.LastSeqs()[0] != 7 {
		t.Errorf("pending %d lastSeqs %v", b.Pending(), b.LastSeqs())
	}
}

func TestBatcherTimeout(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	b := NewBatcher(10, 5*time.Second, c.now)
	if _, ok := b.Deadline(); ok {
		t.Fatal("deadline without a batch")
	}
	b.Add(tok(1, 0))
	c.advance(4 * time.Second)
	b.Add(tok(1, 1))
	// The deadline counts from the first token, not the latest.
	if d, ok := b.Deadline(); !ok || !d.Equal(time.Unix(1005, 0)) {
		t.Fatalf("deadline = %v, %v", d, ok)
	}
	if got := b.CutExpired(c.t, nil); len(got) != 0 {
		t.Fatalf("cut %d batches before the timeout", len(got))
	}
	c.advance(time.Second)
	cut := b.CutExpired(c.t, nil)
	if len(cut) != 1 {
		t.Fatalf("cut %d batches at the timeout", len(cut))
	}
	bt := cut[0]
	if len(bt.Tokens) != 2 || bt.Cut != CutTimeout {
		t.Fatalf("batch = %d tokens, %v", len(bt.Tokens), bt.Cut)
	}
	if len(b.CutAll(CutShutdown, nil)) != 0 {
		t.Fatal("second cut returned a batch")
	}
	b.Recycle(bt)
	c.advance(time.Minute)
	b.Add(tok(2, 0))
	if d, _ := b.Deadline(); !d.Equal(c.t.Add(5 * time.Second)) {
		t.Fatalf("deadline of a new batch = %v", d)
	}
	if got := b.CutAll(CutShutdown, nil); len(got) != 1 || len(got[0].Tokens) != 1 || got[0].Tokens[0].Pos.Commit != 2 {
		t.Fatalf("recycled batch kept old tokens: %+v", got)
	}
}

func TestBatcherLanes(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	b := NewBatcher(2, 5*time.Second, c.now)
	b.SetLanes(ByAction)
	act := func(i uint32) *decoder.Token { return tok(1, i) }
	rec := func(i uint32) *decoder.Token {
		t := tok(1, i)
		t.Action = action.PasswordRecovery
		return t
	}
	if b.Add(act(0)) != nil || b.Add(rec(1)) != nil {
		t.Fatal("a lane was cut before its limit")
	}
	c.advance(time.Second)
	full := b.Add(rec(2))
	if full == nil || full.Lane != 1 || len(full.Tokens) != 2 || full.FirstSeq != 1 || full.LastSeq != 2 {
		t.Fatalf("recovery lane batch = %+v", full)
	}
	if seqs := b.LastSeqs(); seqs != (Seqs{1, 2}) {
		t.Fatalf("lane sequences = %v", seqs)
	}
	// The activation batch started first, so it sets the deadline.
	if d, _ := b.Deadline(); !d.Equal(time.Unix(1005, 0)) {
		t.Fatalf("deadline = %v", d)
	}
	b.Add(rec(3))
	c.advance(4 * time.Second)
	cut := b.CutExpired(c.t, nil)
	if len(cut) != 1 || cut[0].Lane != 0 || cut[0].Tokens[0].Pos.Index != 0 {
		t.Fatalf("expired = %+v", cut)
	}
	rest := b.CutAll(CutShutdown, nil)
	if len(rest) != 1 || rest[0].Lane != 1 || rest[0].FirstSeq != 3 {
		t.Fatalf("shutdown cut = %+v", rest)
	}
}

func TestTracker(t *testing.T) {
	type step struct {
		mark    *mark // record this mark, or
		done    Seqs  // ask what is confirmable with these done sequences
		want    pglogrepl.LSN
		waiting int
		// wantAt, when set, is ConfirmedAt after the step (Unix s).
		wantAt int64
	}
	m := func(lsn pglogrepl.LSN, seq uint64) *mark { return &mark{lsn: lsn, seq: Seqs{seq}} }
	// at is a commit or heartbeat at Unix second sec.
	at := func(lsn pglogrepl.LSN, seq uint64, sec int64) *mark {
		return &mark{lsn: lsn, seq: Seqs{seq}, at: sec * int64(time.Second)}
	}
	d := func(seq uint64) Seqs { return Seqs{seq} }
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"keepalive with nothing pending confirms at once", []step{
			{mark: m(0x200, 0)},
			{done: d(0), want: 0x200},
		}},
		{"transaction waits for its last token", []step{
			{mark: m(0x200, 5)}, // tx 1: tokens 1..5
			{mark: m(0x300, 9)}, // tx 2: tokens 6..9
			{done: d(4), want: 0x100, waiting: 2},
			{done: d(5), want: 0x200, waiting: 1},
			{done: d(8), want: 0x200, waiting: 1},
			{done: d(9), want: 0x300},
		}},
		{"keepalive after pending tokens waits for them", []step{
			{mark: m(0x200, 3)},
			{mark: m(0x900, 3)}, // supersedes 0x200: nothing new in between
			{done: d(2), want: 0x100, waiting: 1},
			{done: d(3), want: 0x900},
		}},
		{"transaction of only bad rows", []step{
			{mark: m(0x200, 2)},
			{mark: m(0x300, 2)}, // no good token: same sequence
			{done: d(2), want: 0x300},
		}},
		{"two lanes: a mark waits for both", []step{
			{mark: &mark{lsn: 0x200, seq: Seqs{3, 0}}},
			{mark: &mark{lsn: 0x300, seq: Seqs{3, 2}}},
			{done: Seqs{3, 0}, want: 0x200, waiting: 1},
			{done: Seqs{5, 1}, want: 0x200, waiting: 1},
			{done: Seqs{3, 2}, want: 0x300},
		}},
		{"marks out of order or old are ignored", []step{
			{mark: m(0x80, 0)},
			{mark: m(0x400, 1)},
			{mark: m(0x300, 2)},
			{done: d(2), want: 0x400},
		}},
		{"a time counts once its position is confirmable", []step{
			{mark: at(0x200, 5, 100)},
			{mark: at(0x300, 5, 103)}, // a heartbeat after the transaction
			{mark: at(0x400, 9, 110)},
			{done: d(4), want: 0x100, waiting: 2},
			{done: d(5), want: 0x300, waiting: 1, wantAt: 103},
			{mark: m(0x500, 9)}, // a keepalive lends no time
			{done: d(9), want: 0x500, wantAt: 110},
		}},
		{"a time at or before the newest mark goes with it", []step{
			{mark: at(0x200, 5, 100)},
			{mark: at(0x180, 5, 105)},
			{done: d(5), want: 0x200, wantAt: 105},
			{mark: at(0x100, 5, 107)}, // already confirmed
			{done: d(5), want: 0x200, wantAt: 107},
			{mark: at(0x300, 5, 104)}, // older than known: known stays
			{done: d(5), want: 0x300, wantAt: 107},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := NewTracker(0x100)
			for i, s := range tc.steps {
				if s.mark != nil {
					var at time.Time
					if s.mark.at != 0 {
						at = time.Unix(0, s.mark.at)
					}
					tr.Mark(s.mark.lsn, s.mark.seq, at)
					continue
				}
				if got := tr.Confirmable(s.done); got != s.want {
					t.Fatalf("step %d: Confirmable(%d) = %v, want %v", i, s.done, got, s.want)
				}
				if got := tr.Waiting(); got != s.waiting {
					t.Fatalf("step %d: Waiting = %d, want %d", i, got, s.waiting)
				}
				if got := tr.ConfirmedAt(); s.wantAt != 0 && !got.Equal(time.Unix(s.wantAt, 0)) {
					t.Fatalf("step %d: ConfirmedAt = %v, want %v", i, got, time.Unix(s.wantAt, 0))
				}
			}
		})
	}
}

func TestTrackerCompacts(t *testing.T) {
	tr := NewTracker(1)
	for i := uint64(1); i <= 100000; i++ {
		tr.Mark(pglogrepl.LSN(i*16), Seqs{i}, time.Time{})
		if i%3 == 0 {
			if got := tr.Confirmable(Seqs{i - 1}); got != pglogrepl.LSN((i-1)*16) {
				t.Fatalf("Confirmable(%d) = %v", i-1, got)
			}
		}
	}
	if tr.Waiting() != 2 { // marks 99999 and 100000
		t.Fatalf("waiting = %d", tr.Waiting())
	}
	if cap(tr.marks) > 4096 {
		t.Fatalf("marks grew to %d", cap(tr.marks))
	}
}

func BenchmarkBatcherAdd(b *testing.B) {
	bt := NewBatcher(1000, time.Second, nil)
	tk := tok(1, 0)
	b.ReportAllocs()
	for b.Loop() {
		if full := bt.Add(tk); full != nil {
			bt.Recycle(full)
		}
	}
}
