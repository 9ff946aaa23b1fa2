package wire

import (
	"strings"
	"testing"
)

func TestLineSafe(t *testing.T) {
	for field, want := range map[string]bool{
		"john@example.com":                   true,
		"":                                   true,
		strings.Repeat("a", 254):             true,
		strings.Repeat("a", 255):             false,
		strings.Repeat("é", 127):             true, // 254 bytes
		strings.Repeat("é", 128):             false,
		"a,b@example.com":                    false,
		"a@example.com\n2,x@evil,x,tok,1234": false,
		"a\r@example.com":                    false,
		"a\x00@example.com":                  false,
	} {
		if got := LineSafe(field); got != want {
			t.Errorf("LineSafe(%q) = %v, want %v", field, got, want)
		}
		if got := LineSafe([]byte(field)); got != want {
			t.Errorf("LineSafe([]byte(%q)) = %v, want %v", field, got, want)
		}
	}
}

// TestLineSafeRefusesBreaksAndControls: every character a line reader
// may split on or a mail header may carry is refused, wherever it stands
// in the field; the letters of other scripts are not.
func TestLineSafeRefusesBreaksAndControls(t *testing.T) {
	var unsafe []string
	for c := range 0x20 {
		unsafe = append(unsafe, string(rune(c)))
	}
	unsafe = append(unsafe, "\x7f", "\u0085", "\u2028", "\u2029", "\u0080", "\u009f",
		"\x85", "\xc2", "\xe2\x80", "\xff", "\xed\xa0\x80") // not UTF-8: a lone NEL byte, cut sequences, a surrogate
	for _, bad := range unsafe {
		for _, field := range []string{bad, "a" + bad + "@example.com", "login" + bad} {
			if LineSafe(field) || LineSafe([]byte(field)) {
				t.Errorf("LineSafe(%q) = true, want false", field)
			}
		}
	}
	for _, good := range []string{"jörg@example.com", "\u00a0x", "名前@例え.jp", "\u2027\u202a", "emoji\U0001F600", "~"} {
		if !LineSafe(good) || !LineSafe([]byte(good)) {
			t.Errorf("LineSafe(%q) = false, want true", good)
		}
	}
}

func BenchmarkLineSafe(b *testing.B) {
	fields := [][]byte{[]byte("someone.with.a.longer.name@example.com"), []byte("jörg.müller@example.de")}
	for b.Loop() {
		for _, f := range fields {
			if !LineSafe(f) {
				b.Fatal("refused")
			}
		}
	}
}

func TestParseFormat(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Format
		err  bool
	}{
		{"line", FormatLine, false},
		{"json", FormatJSON, false},
		{"", 0, true},
		{"JSON", 0, true},
		{"xml", 0, true},
	} {
		got, err := ParseFormat(tc.in)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("ParseFormat(%q) = %v, %v", tc.in, got, err)
		}
		if err == nil && got.String() != tc.in {
			t.Errorf("%v.String() = %q, want %q", got, got.String(), tc.in)
		}
	}
}
