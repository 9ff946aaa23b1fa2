package pause

import (
	"context"
	"time"
)

// onTimer waits d on the runtime's timer, or until ctx is done.
func onTimer(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
