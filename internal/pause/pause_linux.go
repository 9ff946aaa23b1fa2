package pause

import (
	"context"
	"time"

	"golang.org/x/sys/unix"
)

// For waits d, or returns ctx's error once it is done. The runtime's
// timers wake an idle process no sooner than a millisecond later (its
// poller waits in whole milliseconds: BenchmarkFor measured 1.13-1.19 ms
// for 100 µs, docs/bench/2026-11-27-short-waits.md), so a wait under a
// millisecond sleeps in the kernel, on the caller's thread (0.16-0.22 ms),
// and gives the CPU to whoever the caller waits for. Such a wait sees ctx
// only before it starts.
func For(ctx context.Context, d time.Duration) error {
	if d >= time.Millisecond {
		return onTimer(ctx, d)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	ts := unix.NsecToTimespec(d.Nanoseconds())
	for unix.Nanosleep(&ts, &ts) == unix.EINTR {
	}
	return ctx.Err()
}
