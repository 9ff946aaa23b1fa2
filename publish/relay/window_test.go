package relay

import (
	"encoding/binary"
	"errors"
	"github.com/mailroom/tailer/decoder/wal"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/mailroom/tailer/publish/token"
)

// tok is a token: its secret and its position.
type tok struct {
	secret [token.SecretSize]byte
	pos    wal.Position
}

func (t *tok) key() token.RawKey { return token.RawKeyOf(&t.secret) }

// tokens are n tokens of their own secrets, in transactions of 100.
func tokens(n int) []tok {
	toks := make([]tok, n)
	for i := range toks {
		binary.LittleEndian.PutUint64(toks[i].secret[:], uint64(i)+1)
		toks[i].pos = wal.Position{Commit: wal.LSN(0x1000 + 0x10*(i/100)), Index: uint32(i % 100)}
	}
	return toks
}

// windowOf is the window of toks as a stream holds them: two lanes (the
// even tokens and the odd ones), each in messages of per tokens, the
// lanes' messages landing in turn, so that their spans overlap. It
// returns the window and each message's keys by sequence.
func windowOf(toks []tok, per int) (*Window, map[uint64]string) {
	w := &Window{}
	stream := map[uint64]string{}
	var lanes [2][]int
	for i := range toks {
		lanes[i%2] = append(lanes[i%2], i)
	}
	seq := uint64(0)
	for start := 0; start < len(lanes[0]); start += per {
		for _, lane := range lanes {
			if start >= len(lane) {
				continue
			}
			part := lane[start:min(start+per, len(lane))]
			keys := make([]string, len(part))
			for j, i := range part {
				keys[j] = string(token.AppendKey(nil, &toks[i].secret))
			}
			seq++
			m := Published{Is: Batch, Seq: seq, Keys: strings.Join(keys, ","), First: toks[part[0]].pos, Last: toks[part[len(part)-1]].pos}
			stream[seq] = m.Keys
			w.Add(m)
		}
	}
	return w, stream
}

// reader reads the keys of a message of stream, counting the reads.
func reader(stream map[uint64]string, reads *int) func(uint64) (string, error) {
	return func(seq uint64) (string, error) {
		*reads++
		keys, ok := stream[seq]
		if !ok {
			return "", errors.New("no such message")
		}
		return keys, nil
	}
}

// The window finds every token of its messages by the message whose span
// holds the token's position, and no other token; replayed in order, each
// message is read once, one held at a time for each lane; out of order,
// still every token.
func TestWindowKeys(t *testing.T) {
	toks := tokens(2500)
	w, stream := windowOf(toks, 100)
	if w.Tokens != 2500 || w.Messages != len(stream) || w.Floor != 1 || w.Max != toks[2499].pos {
		t.Fatalf("%d tokens in %d messages from %d to %v, want 2500 in %d from 1 to %v", w.Tokens, w.Messages, w.Floor, w.Max, len(stream), toks[2499].pos)
	}
	reads := 0
	read := reader(stream, &reads)
	has := func(tk *tok) bool {
		t.Helper()
		ok, err := w.Has(tk.pos, tk.key(), read)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	for i := range toks {
		if !has(&toks[i]) {
			t.Fatalf("token %d not found", i)
		}
	}
	if reads != len(stream) || len(w.chains) != 2 {
		t.Fatalf("%d reads of %d messages in %d runs, want each read once, in two runs", reads, len(stream), len(w.chains))
	}
	for i := len(toks) - 1; i >= 0; i -= 7 {
		if !has(&toks[i]) {
			t.Fatalf("token %d not found, looked up out of order", i)
		}
	}
	// Another token at a position the window covers, and one past it.
	other := toks[1234]
	other.secret[31] = 0xff
	if has(&other) {
		t.Fatal("a token of no message found")
	}
	other.pos.Commit += 0x100000
	if has(&other) {
		t.Fatal("a token past the window found")
	}
	// A message gone from the stream between the scan and the replay.
	if _, err := (&Window{all: w.all, Max: w.Max}).Has(toks[0].pos, toks[0].key(), reader(nil, &reads)); err == nil {
		t.Fatal("a message that cannot be read is no error")
	}
	if ok, err := (&Window{}).Has(toks[0].pos, toks[0].key(), reader(stream, &reads)); ok || err != nil {
		t.Fatalf("an empty window holds a token: %v, %v", ok, err)
	}
}

// A message of a tailer before the first-position header covers every
// position up to its last: its tokens are found wherever they are.
func TestWindowWithoutFirstPositions(t *testing.T) {
	toks := tokens(300)
	w, stream := windowOf(toks, 50)
	for i := range w.all {
		w.all[i].first = wal.Position{}
	}
	reads := 0
	for i := range toks {
		ok, err := w.Has(toks[i].pos, toks[i].key(), reader(stream, &reads))
		if err != nil || !ok {
			t.Fatalf("token %d: found %v, %v", i, ok, err)
		}
	}
}

// BenchmarkWindowMemory measures what a resume keeps of a window of a
// million tokens (issue 47), in messages of 10,000 as a backlog's group
// commit makes them: bytes a token, live heap after a collection, once
// scanned and at its largest during the replay; beside every key held,
// as a resume kept them before the keys were read back as the replay
// reached them.
func BenchmarkWindowMemory(b *testing.B) {
	const n = 1_000_000
	live := func() int64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return int64(m.HeapAlloc)
	}
	toks := tokens(n)
	for range b.N {
		w, stream := windowOf(toks, 5000)
		found := slices.Clone(w.all)
		w = nil
		base := live()
		// What the scan keeps: the spans.
		scanned := &Window{}
		for _, sp := range found {
			scanned.Add(Published{Is: Batch, Seq: sp.seq, First: sp.first, Last: sp.last, Keys: stream[sp.seq]})
		}
		b.ReportMetric(float64(live()-base)/n, "scanned-bytes/token")
		reads, peak := 0, int64(0)
		for i := 0; i < n; i += 997 {
			scanned.Has(toks[i].pos, toks[i].key(), reader(stream, &reads))
			if i%(100*997) == 0 {
				peak = max(peak, live()-base)
			}
		}
		b.ReportMetric(float64(peak)/n, "replay-bytes/token")
		runtime.KeepAlive(scanned)
		scanned = nil
		base = live()
		var all token.KeySet
		for _, keys := range stream {
			for k := range strings.SplitSeq(keys, ",") {
				all.Add(k)
			}
		}
		all.Len()
		b.ReportMetric(float64(live()-base)/n, "all-keys-bytes/token")
		runtime.KeepAlive(&all)
		runtime.KeepAlive(stream)
	}
}
