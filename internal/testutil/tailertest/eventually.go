package tailertest

import (
	"testing"
	"time"
)

// Eventually polls cond until it returns nil, and fails t with cond's last
// error when that has not happened within timeout: the error says where
// things stood ("3 of 50 tokens on the stream"), not only that time ran
// out. It polls every 10 ms at first and backs off to every 100 ms, so a
// short wait ends soon and a long one leaves the CPU to the tests running
// beside it. Waits on a condition, not fixed sleeps, keep tests fast where
// the machine is fast and correct where it is slow.
func Eventually(t testing.TB, timeout time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for pause := 10 * time.Millisecond; ; pause = min(2*pause, 100*time.Millisecond) {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %v", timeout, err)
		}
		time.Sleep(pause)
	}
}

// EventuallyProgressing is Eventually for a wait whose length is the
// machine's speed times a known amount of work (a thousand messages acked
// one at a time, say): cond returns how far the work has got besides its
// error, and t fails only when that has not grown for stall. A fixed
// deadline would fail a slow but healthy run, on a machine whose CPU the
// tests running beside it take; a stall is what a lost message looks like.
func EventuallyProgressing(t testing.TB, stall time.Duration, cond func() (progress int, err error)) {
	t.Helper()
	best, since := -1, time.Now()
	for pause := 10 * time.Millisecond; ; pause = min(2*pause, 100*time.Millisecond) {
		progress, err := cond()
		if err == nil {
			return
		}
		if progress > best {
			best, since = progress, time.Now()
		} else if time.Since(since) > stall {
			t.Fatalf("no progress for %v: %v", stall, err)
		}
		time.Sleep(pause)
	}
}
