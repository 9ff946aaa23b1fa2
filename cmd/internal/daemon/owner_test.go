package daemon

import (
	"context"
	"testing"
)

// What the sampler and NATS's handlers find runs on the session's
// goroutine while it streams, never beside it, and none of them waits on
// a session that no longer streams.
func TestStreamingRunsOthersWorkOnItsOwnGoroutine(t *testing.T) {
	st := newStreaming(&run{}, func(error) {})
	received := make(chan error, 1)
	owned := make(chan error, 1)
	inOwner := false
	go func() { owned <- st.own(received) }()
	if !st.ask(context.Background(), func() { inOwner = true }) || !inOwner {
		t.Fatal("ask did not run its work on the session's goroutine")
	}
	told := make(chan struct{})
	st.tell(func() { close(told) })
	<-told
	received <- context.Canceled
	if err := <-owned; err != context.Canceled {
		t.Fatalf("own returned %v, want the receiver's error", err)
	}
	if st.ask(context.Background(), func() { t.Error("work ran after the session stopped streaming") }) {
		t.Fatal("ask reported work done after the session stopped streaming")
	}
	for range 10 {
		st.tell(func() { t.Error("told work ran after the session stopped streaming") })
	}
}
