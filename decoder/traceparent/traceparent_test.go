package traceparent

import (
	"testing"
)

const (
	traceA = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	traceB = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
)

func TestValid(t *testing.T) {
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
		if got := Valid(tc.v); got != tc.ok {
			t.Errorf("Valid(%q) = %v, want %v", tc.v, got, tc.ok)
		}
	}
}

func FuzzValid(f *testing.F) {
	f.Add(traceA)
	f.Add(traceB)
	f.Add("00-00000000000000000000000000000000-00f067aa0ba902b7-01")
	f.Fuzz(func(t *testing.T, v string) {
		if !Valid(v) {
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
