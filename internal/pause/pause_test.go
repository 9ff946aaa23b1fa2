package pause

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestFor(t *testing.T) {
	for _, d := range []time.Duration{100 * time.Microsecond, 2 * time.Millisecond} {
		start := time.Now()
		if err := For(context.Background(), d); err != nil {
			t.Fatalf("For(%v) = %v", d, err)
		}
		if took := time.Since(start); took < d {
			t.Errorf("For(%v) returned after %v", d, took)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := For(ctx, d); !errors.Is(err, context.Canceled) {
			t.Errorf("For(%v) on a cancelled context = %v, want context.Canceled", d, err)
		}
	}
}

// BenchmarkFor: how long a wait of 100 µs really takes, in the kernel
// (For) and on the runtime's timer. Run with -cpu 1, as tailer run sets
// GOMAXPROCS.
func BenchmarkFor(b *testing.B) {
	for _, bc := range []struct {
		name string
		f    func(context.Context, time.Duration) error
	}{{"kernel", For}, {"timer", onTimer}} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			for b.Loop() {
				if err := bc.f(ctx, 100*time.Microsecond); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
