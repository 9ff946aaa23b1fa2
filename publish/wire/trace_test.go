package wire

import (
	"slices"
	"testing"
)

const (
	traceA = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	traceB = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
)

func TestValidTraceparent(t *testing.T) {
	for _, tc := range []struct {
		v  string
		ok bool
	}{
		{traceA, true},
		{traceB, true},
		{"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", false},  // another version
		{"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", false},  // upper case
		{"00-00000000000000000000000000000000-00f067aa0ba902b7-01", false},  // zero trace id
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", false},  // zero parent
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g", false},  // not hex
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-", false}, // too long
		{"00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01", false},  // separator
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", true},   // not sampled
		{"", false},
		{"ab,c\r\n" + traceA[6:], false},
	} {
		if got := ValidTraceparent(tc.v); got != tc.ok {
			t.Errorf("ValidTraceparent(%q) = %v, want %v", tc.v, got, tc.ok)
		}
	}
}

func FuzzValidTraceparent(f *testing.F) {
	f.Add(traceA)
	f.Add(traceB)
	f.Add("00-00000000000000000000000000000000-00f067aa0ba902b7-01")
	f.Fuzz(func(t *testing.T, v string) {
		if !ValidTraceparent(v) {
			return
		}
		// What is carried into headers and logs holds nothing but the
		// format's characters.
		for _, c := range v {
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || c == '-') {
				t.Fatalf("%q accepted with %q", v, c)
			}
		}
	})
}

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
