package inbox

import (
	"fmt"
	"slices"
	"testing"

	"github.com/mailroom/tailer/publish/consume"
)

// Parts of about n tokens, cut between lines, that together give every
// token once, at the line number it has in the whole message.
func TestSplit(t *testing.T) {
	for _, tc := range []struct {
		sizes []int
		n     int
		parts int
	}{
		{[]int{3}, 10, 1},
		{[]int{10, 10, 10}, 30, 1},
		{[]int{10, 10, 10}, 10, 3},
		{[]int{10, 10, 10}, 15, 2},
		{[]int{1000, 1, 1}, 10, 2},
		{[]int{4, 4, 4, 4, 4}, 7, 3},
		{[]int{1, 1, 1, 1, 1, 1, 1}, 3, 3},
	} {
		t.Run(fmt.Sprint(tc.sizes, tc.n), func(t *testing.T) {
			b := &consume.Decoded{ID: "b", KeyID: "k", Sizes: tc.sizes}
			type place struct {
				key  string
				line int
			}
			var want []place
			for line, k := range tc.sizes {
				for j := range k {
					key := fmt.Sprintf("%d.%d", line, j)
					b.Tokens = append(b.Tokens, consume.SignedToken{Key: key})
					want = append(want, place{key, line})
				}
			}
			parts := split(b, tc.n)
			if len(parts) != tc.parts {
				t.Fatalf("%d parts, want %d", len(parts), tc.parts)
			}
			var got []place
			for _, p := range parts {
				if p.ID != b.ID || p.KeyID != b.KeyID {
					t.Fatalf("part %q/%q, want the message's batch id and key id", p.ID, p.KeyID)
				}
				if len(p.Tokens) == 0 {
					t.Fatal("an empty part")
				}
				for line, toks := range p.Lines() {
					for _, tok := range toks {
						got = append(got, place{tok.Key, line})
					}
				}
			}
			if !slices.Equal(got, want) {
				t.Fatalf("parts give %v, want %v", got, want)
			}
		})
	}
}
