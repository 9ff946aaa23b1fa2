package publish

import (
	"encoding/binary"
	"runtime"
	"strings"
	"testing"

	"github.com/mailroom/tailer/decoder"
	"github.com/mailroom/tailer/publish/token"
)

// tokens are n tokens of their own secrets.
func tokens(n int) []decoder.Token {
	toks := make([]decoder.Token, n)
	for i := range toks {
		binary.LittleEndian.PutUint64(toks[i].Secret[:], uint64(i)+1)
	}
	return toks
}

// windowOf is the window of toks, in messages of 1,000 as the stream holds
// them.
func windowOf(toks []decoder.Token) *window {
	w := &window{}
	var keys []string
	for i := range toks {
		keys = append(keys, string(token.AppendKey(nil, &toks[i].Secret)))
		if len(keys) == 1000 || i == len(toks)-1 {
			w.add(stored{kind: kindBatch, seq: uint64(i), keys: strings.Join(keys, ",")})
			keys = keys[:0]
		}
	}
	return w
}

// The window knows every token of its messages, each once, and no other;
// a key that is none is left out.
func TestWindowKeys(t *testing.T) {
	toks := tokens(2500)
	w := windowOf(toks)
	w.add(stored{kind: kindBatch, seq: 9999, keys: string(token.AppendKey(nil, &toks[7].Secret)) + ",not-a-key"})
	p := &Publisher{window: *w}
	if _, n, _, _, _ := p.Window(); n != 2500 {
		t.Fatalf("%d tokens in the window, want 2500", n)
	}
	for i := range toks {
		if !p.OnStream(&toks[i]) {
			t.Fatalf("token %d not found", i)
		}
	}
	var other decoder.Token
	other.Secret[31] = 0xff
	if p.OnStream(&other) {
		t.Fatal("a token of no message found")
	}
}

// BenchmarkWindowMemory measures what a resume keeps a token of the
// window in (issue 47), beside a map of the keys' strings, as Resume kept
// them before: bytes a token, live heap after a collection.
func BenchmarkWindowMemory(b *testing.B) {
	const n = 1_000_000
	live := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	toks := tokens(n)
	for range b.N {
		base := live()
		w := windowOf(toks)
		w.keys.Len() // sorted, as Resume leaves it
		b.ReportMetric(float64(live()-base)/n, "window-bytes/token")
		runtime.KeepAlive(w)
		w = nil
		base = live()
		m := make(map[string]struct{})
		for i := range toks {
			m[string(token.AppendKey(nil, &toks[i].Secret))] = struct{}{}
		}
		b.ReportMetric(float64(live()-base)/n, "map-bytes/token")
		runtime.KeepAlive(m)
	}
}
