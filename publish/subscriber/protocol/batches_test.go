package protocol_test

import (
	"encoding/json"
	"github.com/mailroom/tailer/publish/subscriber/protocol"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestBatches(t *testing.T) {
	for _, tc := range []struct {
		add  []int
		want string
	}{
		{nil, ""},
		{[]int{0}, "0"},
		{[]int{3, 1, 2}, "1-3"},
		{[]int{0, 2, 4}, "0,2,4"},
		{[]int{0, 2, 1, 5, 4, 7}, "0-2,4-5,7"},
		{[]int{9, 9, 8, 0}, "0,8-9"},
	} {
		var b protocol.Batches
		for _, i := range tc.add {
			b.Add(i)
		}
		if got := b.String(); got != tc.want {
			t.Errorf("add %v: %q, want %q", tc.add, got, tc.want)
		}
		if b.Len() != len(uniq(tc.add)) {
			t.Errorf("add %v: Len %d", tc.add, b.Len())
		}
		back, err := protocol.ParseBatches(tc.want)
		if err != nil || back.String() != tc.want {
			t.Errorf("ParseBatches(%q) = %v, %v", tc.want, back, err)
		}
	}
	for _, bad := range []string{"-1", "1-1", "3-2", "2,1", "0-2,3", "0,0", "a", "1-", "01", "1048576", "0-1048576", ",", "0,,1"} {
		if b, err := protocol.ParseBatches(bad); err == nil {
			t.Errorf("ParseBatches(%q) = %v, want an error", bad, b)
		}
	}
	// Against a plain set, at random.
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		var b protocol.Batches
		set := map[int]bool{}
		for range rng.IntN(40) {
			i := rng.IntN(30)
			b.Add(i)
			set[i] = true
		}
		for i := range 31 {
			if b.Has(i) != set[i] {
				t.Fatalf("%s: Has(%d) = %v", b, i, b.Has(i))
			}
		}
	}
}

func uniq(s []int) []int {
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}

// FuzzParseProgress reads arbitrary records: no panic; what it accepts
// has its batches within its messages and writes back to a record that
// reads the same.
func FuzzParseProgress(f *testing.F) {
	f.Add([]byte(`{"stream_created":"2026-11-25T10:00:00Z","floor":7,"messages":{"8":{"batches":3,"done":"0-1","attempts":{"2":4}},"9":{"batches":1,"done":"0","acked":true}}}`))
	f.Add([]byte(`{"floor":0}`))
	f.Add([]byte(`{"messages":{"1":{"batches":2,"done":"2"}}}`))
	f.Add([]byte(`{"messages":{"1":null}}`))
	f.Add([]byte(`{"messages":{"1":{"batches":2,"attempts":{"5":1}}}}`))
	f.Add([]byte(`{"extra":1}`))
	f.Add([]byte(`{"version":2,"needs":1,"floor":3,"later":{"x":1},"messages":{"4":{"batches":1,"later":[]}}}`))
	f.Add([]byte(`{"version":3,"needs":2}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := protocol.ParseProgress(data)
		if err != nil {
			return
		}
		for seq, m := range p.Messages {
			for i := range m.Batches + 1 {
				if m.Done.Has(i) && i >= m.Batches {
					t.Fatalf("message %d: batch %d of %d done", seq, i, m.Batches)
				}
			}
		}
		out, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		again, err := protocol.ParseProgress(out)
		if err != nil {
			t.Fatalf("%s does not read back: %v", out, err)
		}
		if out2, _ := json.Marshal(again); string(out2) != string(out) {
			t.Fatalf("%s reads back as %s", out, out2)
		}
	})
}

// FuzzParseBatches: no panic; what it accepts writes back the same.
func FuzzParseBatches(f *testing.F) {
	for _, s := range []string{"", "0", "0-3,7", "1-1", "2,1", "0,0-1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b, err := protocol.ParseBatches(s)
		if err != nil {
			return
		}
		if b.String() != s {
			t.Fatalf("%q reads as %q", s, b.String())
		}
	})
}
