//go:build !linux

package pause

import (
	"context"
	"time"
)

// For waits d, or returns ctx's error once it is done.
func For(ctx context.Context, d time.Duration) error { return onTimer(ctx, d) }
