package subscriber

import (
	"context"
	"os"
	"testing"
	"time"
)

// A pipe's reader that ends on its own saying it finished what it took
// (ReaderTook) has done the batches it read whole, and not the one left
// in its pipe, which comes again.
func TestLinesSettleTookWhatItRead(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	pipe, ok := OpenPipe(w)
	if !ok {
		t.Fatal("an os.Pipe is not taken for a pipe")
	}
	l := &Lines{Out: w, Pipe: pipe}
	unit := func(seq uint64, email string) *Unit {
		return &Unit{Seq: seq, Tokens: []SignedToken{{Action: "activation", Email: email, Login: "l", Token: "t", Key: email}}}
	}
	first, second := unit(1, "a@x"), unit(2, "b@x")
	var done []uint64
	ctx, cancel := context.WithCancel(context.Background())
	handed := make(chan error, 1)
	go func() {
		handed <- l.Hand(ctx, []*Unit{first, second}, func(us ...*Unit) {
			for _, u := range us {
				done = append(done, u.Seq)
			}
		})
	}()
	// The reader takes the first line, a byte at a time, and no more.
	b := make([]byte, 1)
	for b[0] != '\n' {
		if _, err := r.Read(b); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); pipe.Unread() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the second line never reached the pipe")
		}
	}
	cancel()
	if err := <-handed; err == nil {
		t.Fatal("Hand returned no error though stopped with a line untaken")
	}
	failedOn, held := l.settle(ReaderTook)
	if failedOn != nil || !held || len(done) != 1 || done[0] != 1 {
		t.Fatalf("settled: failed on %v, held %v, done %v; want none, held, the first done", failedOn, held, done)
	}
}
