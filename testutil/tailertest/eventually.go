package tailertest

import (
	"testing"
	"time"
)

// Eventually polls cond every 10 ms until it holds, and fails t, naming
// what was awaited, when it has not within timeout. Waits on a condition,
// not a fixed sleep, keep tests fast where the machine is fast and
// correct where it is slow.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
