package audit

import (
	"slices"

	"github.com/mailroom/tailer/publish/token"
)

// Row is a token of the database as the audit reads it: what decides
// whether the tailer should have published it. Times are epoch seconds,
// as the schema keeps them.
type Row struct {
	ID  int64
	Key token.RawKey
	// Created and Expires are the token's; Consumed when HasConsumed.
	Created, Expires int64
	Consumed         int64
	HasConsumed      bool
	// StatusFits: its account's status fits its action now;
	// StatusChanged is when that status was set (0: never changed).
	StatusFits    bool
	StatusChanged int64
	// LineSafe: its email and login may go into a line.
	LineSafe bool
	// Decoded: its transaction ended before the slot's restart point
	// (older than its catalog_xmin): the slot has confirmed past it.
	Decoded bool
}

// Verdict is what the audit can say of a token the stream may lack.
type Verdict uint8

const (
	// Expected: it was eligible when its batch was cut, whenever within
	// the grace after its creation that was: it must be on the stream.
	Expected Verdict = iota
	// NotEligible: it was not (expired at birth, its status never fit,
	// unsafe for a line): the tailer skipped it, as it should.
	NotEligible
	// Undecided: its state changed within the grace (expired, consumed,
	// its account's status changed): whether it was eligible when its
	// batch was cut is not known, and its absence proves nothing.
	Undecided
)

// Judge says whether t was eligible when the tailer cut its batch, some
// time from its creation through cutBy (epoch seconds: the batch timeout
// and the lag after it), for a stream of lines (lines) or of JSON.
func Judge(t Row, cutBy int64, lines bool) Verdict {
	switch {
	case lines && !t.LineSafe:
		return NotEligible
	case t.Expires <= t.Created:
		return NotEligible
	case t.Expires <= cutBy, t.HasConsumed && t.Consumed <= cutBy:
		return Undecided
	case t.StatusChanged != 0 && t.StatusChanged >= t.Created:
		// Changed since the token was made: what it was when the batch
		// was cut is not kept.
		return Undecided
	case !t.StatusFits:
		return NotEligible
	}
	return Expected
}

// Counts are the keys read back from the stream, and how many times each
// is there: kept as a sorted array of raw keys (16 bytes a token, a
// million tokens 16 MB), not a map of strings.
type Counts struct {
	keys   []token.RawKey
	sorted bool
}

// Add counts key k (token.AppendKey's form); false when k is no key.
func (c *Counts) Add(k string) bool {
	raw, ok := token.ParseRawKey(k)
	if ok {
		c.keys, c.sorted = append(c.keys, raw), false
	}
	return ok
}

// Of is how many times key k was read.
func (c *Counts) Of(k token.RawKey) int {
	c.sort()
	i, ok := slices.BinarySearchFunc(c.keys, k, compare)
	if !ok {
		return 0
	}
	n := 0
	for ; i+n < len(c.keys) && c.keys[i+n] == k; n++ {
	}
	return n
}

// Len is how many keys were read, each as often as read.
func (c *Counts) Len() int { return len(c.keys) }

func (c *Counts) sort() {
	if !c.sorted {
		slices.SortFunc(c.keys, compare)
		c.sorted = true
	}
}

func compare(a, b token.RawKey) int {
	for i := range a {
		if a[i] != b[i] {
			return int(a[i]) - int(b[i])
		}
	}
	return 0
}

// Tally is the comparison of the database's tokens with the stream's
// keys: how many were judged (Checked: expected and found), and the ids of
// those expected and missing, on the stream twice, or in the durable's
// delivery missing.
type Tally struct {
	Read, Checked, NotEligible, Undecided int
	Missing, Twice                        []int64
	// Delivered and Undelivered: of the tokens on the stream, the ones the
	// durable delivered and the ones it did not (when asked).
	Delivered   int
	Undelivered []int64
}

// Count judges row, whose batch was cut by cutBy, against the stream's
// keys (and the durable's, when delivered is not nil), adding to the
// tally.
func (t *Tally) Count(row Row, cutBy int64, lines bool, stream *Counts, delivered *Counts) {
	t.Read++
	n := stream.Of(row.Key)
	if n > 1 {
		t.Twice = append(t.Twice, row.ID)
	}
	switch v := Judge(row, cutBy, lines); {
	case n > 0:
		t.Checked++
		if delivered != nil {
			if delivered.Of(row.Key) > 0 {
				t.Delivered++
			} else {
				t.Undelivered = append(t.Undelivered, row.ID)
			}
		}
	case v == Expected:
		t.Missing = append(t.Missing, row.ID)
	case v == Undecided:
		t.Undecided++
	default:
		t.NotEligible++
	}
}
