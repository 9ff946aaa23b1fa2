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
