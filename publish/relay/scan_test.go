package relay

import (
	"errors"
	"fmt"
	"github.com/mailroom/tailer/decoder/wal"
	"testing"
)

// mapReader is a stream in memory for Scan.
type mapReader map[uint64]Published

func (r mapReader) At(seq uint64) (Published, bool, error) {
	m, ok := r[seq]
	return m, ok, nil
}

func (r mapReader) LastOn(subject string) (Published, bool, error) {
	var best Published
	for _, m := range r {
		if m.Subject == subject && m.Seq > best.Seq {
			best = m
		}
	}
	return best, best.Seq != 0, nil
}

// put adds messages to r at their sequences.
func (r mapReader) put(ms ...Published) mapReader {
	for _, m := range ms {
		r[m.Seq] = m
	}
	return r
}

const inc = "i1"

func marker(seq uint64, after wal.LSN, floor uint64) Published {
	return Published{Seq: seq, Subject: "m", Is: Marker, Incarnation: inc, FenceN: 1, FenceK: 1, InFlight: 1, After: after, Floor: floor}
}

func batchAt(seq uint64, commit wal.LSN) Published {
	return Published{Seq: seq, Subject: "b", Is: Batch, Incarnation: inc, First: wal.Position{Commit: commit}, Last: wal.Position{Commit: commit}, Keys: "k"}
}

// A slot confirmed less far than when the last session started (a
// restored database, a lost confirmation) is scanned back, marker by
// marker, to a session that started from its position or before: the
// batches between are in its window.
func TestScanBehindTheLastMarkers(t *testing.T) {
	stream := mapReader{}.put(
		marker(1, 0x100, 1), batchAt(2, 0x110), batchAt(3, 0x120),
		Published{Seq: 4, Subject: "other"},
		marker(5, 0x120, 3), batchAt(6, 0x130))
	s := Stream{Name: "S", LastSeq: 6, Marker: "m", Data: []string{"b"}}
	for _, tc := range []struct {
		after    wal.LSN
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
	stream.put(Published{Seq: 1, Subject: "m", Is: Marker, Incarnation: "i0", After: 0x100})
	var foreign *ForeignStreamError
	if _, _, err := Scan(stream, s, Owner{Incarnation: inc, After: 0x100}); !errors.As(err, &foreign) {
		t.Errorf("another incarnation's marker: %v", err)
	}
	// Before the owner took the stream over, nothing is read.
	if w, _, err := Scan(stream, s, Owner{Incarnation: inc, After: 0x100, Since: 6}); err != nil || w.Messages != 0 {
		t.Errorf("a stream owned from its end: %v, %d messages", err, w.Messages)
	}
}

// countingReader is a mapReader that keeps the sequences read.
type countingReader struct {
	mapReader
	read []uint64
}

func (r *countingReader) At(seq uint64) (Published, bool, error) {
	r.read = append(r.read, seq)
	return r.mapReader.At(seq)
}

// The scan reads back from the stream's end only until each subject shows
// a batch before the window, then what the last markers say the window
// holds before them: every message of the window, and no more. A late
// publish can land a batch of the window behind one before it: the
// markers' floor still finds it, and after incomplete markers the whole
// region after them is read.
func TestScanReadsWhatTheWindowNeeds(t *testing.T) {
	complete := marker(3, 0x120, 1)
	incomplete := complete
	incomplete.FenceK = 2
	for _, tc := range []struct {
		name    string
		stream  mapReader
		o       Owner
		window  []uint64
		read    string
		lastSeq uint64
	}{
		{"a late batch behind one before the window", mapReader{}.put(batchAt(1, 0x130), batchAt(2, 0x110), complete, batchAt(4, 0x140)),
			Owner{Incarnation: inc, After: 0x120}, []uint64{1, 4}, "[4 1 2]", 4},
		{"after complete markers", mapReader{}.put(complete, batchAt(4, 0x130), batchAt(5, 0x110), batchAt(6, 0x140)),
			Owner{Incarnation: inc, After: 0x120}, []uint64{6}, "[6 5 1 2]", 6},
		{"after incomplete markers", mapReader{}.put(incomplete, batchAt(4, 0x130), batchAt(5, 0x110), batchAt(6, 0x140)),
			Owner{Incarnation: inc, After: 0x120}, []uint64{4, 6}, "[6 5 4 1 2]", 6},
		{"markers at the owner's start", mapReader{}.put(batchAt(1, 0x110), marker(2, 0x100, 1), batchAt(3, 0x130)),
			Owner{Incarnation: inc, After: 0x120, Since: 2}, []uint64{3}, "[3]", 3},
		{"owned from the stream's end", mapReader{}.put(batchAt(1, 0x130), marker(2, 0x100, 1)),
			Owner{Incarnation: inc, After: 0x120, Since: 2}, nil, "[]", 2},
		{"back to a marker at the owner's start", mapReader{}.put(marker(2, 0x100, 1), batchAt(3, 0x110), marker(4, 0x130, 5), batchAt(5, 0x140)),
			Owner{Incarnation: inc, After: 0x100, Since: 2}, []uint64{3, 5}, "[5 3]", 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &countingReader{mapReader: tc.stream}
			w, _, err := Scan(r, Stream{Name: "S", LastSeq: tc.lastSeq, Marker: "m", Data: []string{"b"}}, tc.o)
			if err != nil {
				t.Fatal(err)
			}
			var window []uint64
			for seq := uint64(1); seq <= tc.lastSeq; seq++ {
				for _, sp := range w.all {
					if sp.seq == seq {
						window = append(window, seq)
					}
				}
			}
			if fmt.Sprint(window) != fmt.Sprint(tc.window) || fmt.Sprint(r.read) != tc.read {
				t.Errorf("window %v, read %v; want %v, read %s", window, r.read, tc.window, tc.read)
			}
		})
	}
}

// A resync's batch last on a subject past the incarnation's first is its
// own, though the window holds nothing of it: a later incarnation's resync
// batch, its markers purged, read by a session of a database put back
// from a copy older than that resync, is refused, not published again
// beside (make sim seed 1366910510: a token twice on the stream).
func TestScanRefusesALaterIncarnationsResyncBatch(t *testing.T) {
	later := batchAt(3, 0x110)
	later.Incarnation, later.Resync = "i3", true
	stream := mapReader{}.put(later)
	s := Stream{Name: "S", LastSeq: 3, Marker: "m", Data: []string{"b"}}
	_, _, err := Scan(stream, s, Owner{Incarnation: inc, Since: 1, After: 0x100})
	var foreign *ForeignStreamError
	if !errors.As(err, &foreign) {
		t.Fatalf("Scan = %v, want the stream refused as another incarnation's", err)
	}
	later.Incarnation = inc
	if _, _, err := Scan(mapReader{}.put(later), s, Owner{Incarnation: inc, Since: 1, After: 0x100}); err != nil {
		t.Fatalf("the incarnation's own resync batch: %v", err)
	}
	// A frozen session's publish of an earlier incarnation, landed after
	// the resync that made this one: the known duplicate, no refusal.
	stale := batchAt(3, 0x90)
	stale.Incarnation = "i0"
	if _, _, err := Scan(mapReader{}.put(stale), s, Owner{Incarnation: inc, Since: 1, After: 0x100}); err != nil {
		t.Fatalf("a stale publish of an earlier incarnation: %v", err)
	}
}
