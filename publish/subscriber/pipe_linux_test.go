package subscriber_test

import (
	"context"
	"errors"
	"io"
	"os"
	"testing"
	"time"

	"github.com/mailroom/tailer/publish/subscriber"
)

func testPipe(t *testing.T, data string) (*os.File, *subscriber.Pipe) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	p, ok := subscriber.OpenPipe(w)
	if !ok {
		t.Fatal("OpenPipe: an os.Pipe is not a pipe")
	}
	if _, err := w.WriteString(data); err != nil {
		t.Fatal(err)
	}
	return r, p
}

// A reader that takes a line and exits at once (a sender failing on it)
// ends the hand-over's context through the subscriber's watch on the pipe,
// often while Taken waits between two looks: the line was taken all the
// same, which the pipe, not the context, says (TestPoisonBatch wrote a
// batch twice when it was not so).
func TestPipeTakenThenReaderGone(t *testing.T) {
	r, p := testPipe(t, "line\n")
	ctx, cancel := context.WithCancelCause(context.Background())
	taken := make(chan error, 1)
	go func() { taken <- p.Taken(ctx) }()
	// Taken's waits grow to 20 ms: most likely it waits in one when the
	// reader takes the line, goes, and the watch ends ctx.
	time.Sleep(150 * time.Millisecond)
	if _, err := io.ReadFull(r, make([]byte, 5)); err != nil {
		t.Fatal(err)
	}
	r.Close()
	cancel(subscriber.ErrReaderGone)
	if err := <-taken; err != nil {
		t.Fatalf("Taken = %v, want nil: the reader took the line before it went", err)
	}
}

// Ended with the line still in the pipe, Taken says it was not taken:
// ctx's error while the reader is there, ErrReaderGone once it went.
func TestPipeNotTaken(t *testing.T) {
	_, p := testPipe(t, "line\n")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := p.Taken(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Taken with the line unread and ctx done = %v, want context.Canceled", err)
	}
	r, p := testPipe(t, "line\n")
	r.Close()
	if err := p.Taken(context.Background()); !errors.Is(err, subscriber.ErrReaderGone) {
		t.Fatalf("Taken with the line unread and the reader gone = %v, want ErrReaderGone", err)
	}
}
