package wire

import (
	"slices"
	"testing"
)

// Indexes appended one by one read back the same, runs folded.
func TestTraceTokens(t *testing.T) {
	for _, idx := range [][]int{{0}, {0, 1, 2}, {3, 5, 6, 7, 9}, {1, 2, 4, 5}, {10, 11, 12, 20}} {
		var v []byte
		last := -1
		for _, i := range idx {
			v, last = AppendTokenIndex(v, last, i), i
		}
		var back []int
		if err := TraceTokens(string(v), 21, func(i int) { back = append(back, i) }); err != nil || !slices.Equal(back, idx) {
			t.Errorf("%v -> %q -> %v, %v", idx, v, back, err)
		}
	}
	for _, bad := range []string{"", "a", "-1", "3-2", "0-21", "21", "1,,2", "1-2-3", "0x1"} {
		if err := TraceTokens(bad, 21, func(int) {}); err == nil {
			t.Errorf("TraceTokens(%q) accepted", bad)
		}
	}
}

func FuzzTraceTokens(f *testing.F) {
	f.Add("0-9,12", 20)
	f.Add("3", 4)
	f.Fuzz(func(t *testing.T, v string, n int) {
		if n < 0 || n > 1<<16 {
			return
		}
		_ = TraceTokens(v, n, func(i int) {
			if i < 0 || i >= n {
				t.Fatalf("%q: index %d of %d", v, i, n)
			}
		})
	})
}
