package action

import (
	"os"
	"regexp"
	"strconv"
	"testing"
)

// The table fits what reads it: labels told apart, codes within the
// column, lanes within the batcher's arrays.
func TestActionsTable(t *testing.T) {
	if len(Actions) > Max {
		t.Fatalf("%d actions, at most %d", len(Actions), Max)
	}
	seen := map[string]bool{}
	for i, s := range Actions {
		a := Action(i + 1)
		switch {
		case s.Label == "" || seen[s.Label]:
			t.Fatalf("action %d: label %q empty or twice", a, s.Label)
		case s.CodeLen < 0 || s.CodeLen > MaxCodeLen:
			t.Fatalf("%s: code of %d bytes, the column holds %d", s.Label, s.CodeLen, MaxCodeLen)
		case s.Prefix == "" || s.Status == "":
			t.Fatalf("%s: no prefix or status", s.Label)
		}
		seen[s.Label] = true
		if got, err := Parse(s.Label); got != a || err != nil {
			t.Fatalf("Parse(%q) = %d, %v", s.Label, got, err)
		}
		if got, ok := ParseNumber(strconv.Itoa(int(a))); got != a || !ok || a.Lane() != i {
			t.Fatalf("action %d: number parsed as %d, lane %d", a, got, a.Lane())
		}
	}
	for _, bad := range []string{"0", "01", "+1", "", strconv.Itoa(len(Actions) + 1)} {
		if _, ok := ParseNumber(bad); ok {
			t.Fatalf("ParseNumber(%q) took it", bad)
		}
	}
	if _, err := Parse("magic"); err == nil {
		t.Fatal("an unknown label parsed")
	}
}

// docs/tokens.md's table of actions is this table.
func TestDocsListEveryAction(t *testing.T) {
	doc, err := os.ReadFile("../../docs/tokens.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| (\\d+) \\| `([a-z_]+)` \\| `([^ ]+) ‖ secret( ‖ code)?` \\| (none|\\d+ characters) \\| `([a-z_]+)` \\|$")
	rows := row.FindAllStringSubmatch(string(doc), -1)
	if len(rows) != len(Actions) {
		t.Fatalf("docs/tokens.md lists %d actions, the table has %d", len(rows), len(Actions))
	}
	for i, r := range rows {
		s := Actions[i]
		code := "none"
		if s.CodeLen > 0 {
			code = strconv.Itoa(s.CodeLen) + " characters"
		}
		if r[1] != strconv.Itoa(i+1) || r[2] != s.Label || r[3] != s.Prefix || (r[4] != "") != (s.CodeLen > 0) || r[5] != code || r[6] != s.Status {
			t.Fatalf("docs/tokens.md row %q; the table has %+v as action %d", r[0], s, i+1)
		}
	}
}
