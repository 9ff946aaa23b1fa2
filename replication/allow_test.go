package replication

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
)

// A position is confirmed only once BeforeConfirm allowed it; one within
// what it allowed last is not asked again (a limit written ahead is
// written once, not at every status of an idle tailer); a refusal keeps
// the last allowed.
func TestConfirmAllowed(t *testing.T) {
	var asked []pglogrepl.LSN
	fail := false
	r := &Receiver{allowed: 100, opts: StreamOptions{StatusInterval: time.Second,
		BeforeConfirm: func(_ context.Context, at pglogrepl.LSN) (pglogrepl.LSN, error) {
			asked = append(asked, at)
			if fail {
				return 0, errors.New("the lease is no longer held")
			}
			return at + 50, nil
		}}}
	for _, tc := range []struct {
		confirmed, want pglogrepl.LSN
		fails           bool
	}{
		{90, 90, false},   // behind what was allowed: not asked
		{120, 120, false}, // asked: allowed up to 170
		{160, 160, false}, // within it: not asked
		{200, 170, true},  // asked, refused: the last allowed
		{200, 200, false}, // asked again, allowed up to 250
	} {
		fail = tc.fails
		if got := r.allow(tc.confirmed); got != tc.want {
			t.Errorf("allow(%d) = %d, want %d", tc.confirmed, got, tc.want)
		}
	}
	if want := []pglogrepl.LSN{120, 200, 200}; len(asked) != len(want) || asked[0] != want[0] || asked[1] != want[1] || asked[2] != want[2] {
		t.Fatalf("asked for %v, want %v", asked, want)
	}
}
