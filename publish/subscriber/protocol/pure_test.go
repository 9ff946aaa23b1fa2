package protocol

import (
	"testing"

	"github.com/mailroom/tailer/internal/testutil/puretest"
)

// The subscriber's decisions do no IO and read no clock: durations and
// what the servers said come in as arguments.
func TestPure(t *testing.T) { puretest.Check(t) }
