package subscriber

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A cluster that cannot answer now is asked again until it does; a
// refusal ends the wait at once (issue 49's fault runs: a subscriber
// started while the bucket's leader was away exited, four times).
func TestUntilAnswered(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	away := []error{context.DeadlineExceeded, nats.ErrNoResponders, &jetstream.APIError{ErrorCode: 10008}, nats.ErrTimeout,
		// What a server says to a bucket opened while a node is down.
		&jetstream.APIError{ErrorCode: 10005, Description: "no suitable peers for placement, peer offline"}}
	tries := 0
	v, err := untilAnswered(ctx, func(context.Context) (int, error) {
		if tries++; tries <= len(away) {
			return 0, away[tries-1]
		}
		return 7, nil
	})
	if v != 7 || err != nil || tries != len(away)+1 {
		t.Fatalf("got %d, %v after %d tries", v, err, tries)
	}
	for _, refused := range []error{errors.New("permissions violation"), &jetstream.APIError{ErrorCode: 10005, Description: "no suitable peers for placement, tags not matched"}} {
		tries = 0
		if _, err := untilAnswered(ctx, func(context.Context) (int, error) { tries++; return 0, refused }); !errors.Is(err, refused) || tries != 1 {
			t.Fatalf("a refusal: %v after %d tries", err, tries)
		}
	}
}
