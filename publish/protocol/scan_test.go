package protocol

import (
	"errors"
	"testing"
)

// mapReader is a stream in memory for Scan.
type mapReader map[uint64]Stored

func (r mapReader) At(seq uint64) (Stored, bool, error) {
	m, ok := r[seq]
	return m, ok, nil
}

func (r mapReader) LastOn(subject string) (Stored, bool, error) {
	var best Stored
	for _, m := range r {
		if m.Subject == subject && m.Seq > best.Seq {
			best = m
		}
	}
	return best, best.Seq != 0, nil
}

// put adds messages to r at their sequences.
func (r mapReader) put(ms ...Stored) mapReader {
	for _, m := range ms {
		r[m.Seq] = m
	}
	return r
}

const inc = "i1"

func marker(seq uint64, after LSN, floor uint64) Stored {
	return Stored{Seq: seq, Subject: "m", Kind: Marker, Incarnation: inc, FenceN: 1, FenceK: 1, InFlight: 1, After: after, Floor: floor}
}

func batchAt(seq uint64, commit LSN) Stored {
	return Stored{Seq: seq, Subject: "b", Kind: Batch, Incarnation: inc, First: Position{Commit: commit}, Last: Position{Commit: commit}, Keys: "k"}
}

// A slot confirmed less far than when the last session started (a
// restored database, a lost confirmation) is scanned back, marker by
// marker, to a session that started from its position or before: the
// batches between are in its window.
func TestScanBehindTheLastMarkers(t *testing.T) {
	stream := mapReader{}.put(
		marker(1, 0x100, 1), batchAt(2, 0x110), batchAt(3, 0x120),
		Stored{Seq: 4, Subject: "other"},
		marker(5, 0x120, 3), batchAt(6, 0x130))
	s := Stream{Name: "S", LastSeq: 6, Marker: "m", Data: []string{"b"}}
	for _, tc := range []struct {
		after    LSN
		messages int
		strays   int
	}{{0x100, 3, 1}, {0x120, 2, 1}, {0x125, 1, 1}} {
		w, prev, err := Scan(stream, s, Owner{Incarnation: inc, After: tc.after})
		if err != nil || prev == nil || prev.Seq != 5 {
			t.Fatalf("after %s: %v, last marker %v", tc.after, err, prev)
		}
		if w.Messages != tc.messages || w.Strays != tc.strays {
			t.Errorf("after %s: window of %d messages, %d strays; want %d, %d", tc.after, w.Messages, w.Strays, tc.messages, tc.strays)
		}
	}
	// A gap within: passed over on a stream without limits, a trimmed
	// window on one with them.
	delete(stream, 3)
	if w, _, err := Scan(stream, s, Owner{Incarnation: inc, After: 0x100}); err != nil || w.Messages != 2 {
		t.Errorf("a gap on a stream without limits: %v, %d messages", err, w.Messages)
	}
	s.Limited, s.Limits = true, "max_msgs=5"
	var trimmed *WindowTrimmedError
	if _, _, err := Scan(stream, s, Owner{Incarnation: inc, After: 0x100}); !errors.As(err, &trimmed) || trimmed.Seq != 3 {
		t.Errorf("a gap on a stream with limits: %v", err)
	}
	// Another incarnation's marker back there: the stream is not its.
	s.Limited = false
	stream.put(Stored{Seq: 1, Subject: "m", Kind: Marker, Incarnation: "i0", After: 0x100})
	var foreign *ForeignStreamError
	if _, _, err := Scan(stream, s, Owner{Incarnation: inc, After: 0x100}); !errors.As(err, &foreign) {
		t.Errorf("another incarnation's marker: %v", err)
	}
	// Before the owner took the stream over, nothing is read.
	if w, _, err := Scan(stream, s, Owner{Incarnation: inc, After: 0x100, Since: 6}); err != nil || w.Messages != 0 {
		t.Errorf("a stream owned from its end: %v, %d messages", err, w.Messages)
	}
}
