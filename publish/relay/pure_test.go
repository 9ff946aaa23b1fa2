package relay

import (
	"testing"

	"github.com/mailroom/tailer/internal/testutil/puretest"
)

// The core does no IO and reads no clock: what the Relay knows comes in
// as events.
func TestPure(t *testing.T) { puretest.Check(t) }
