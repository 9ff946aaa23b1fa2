package protocol_test

import (
	"flag"
	"os"
	"testing"

	"pgregory.net/rapid"

	"github.com/mailroom/tailer/publish/protocol/sim"
)

// defaultSchedules is how many schedules go test runs without
// -rapid.checks (rapid's own default is 100): enough that each of the
// losses that reached main before is found (CONTRIBUTING), in a few
// seconds with the race detector.
const defaultSchedules = "3000"

func TestMain(m *testing.M) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "rapid.checks" })
	if !given {
		flag.Set("rapid.checks", defaultSchedules)
	}
	os.Exit(m.Run())
}

// TestSimulation drives the real Relay through schedules rapid chooses
// (sim.Schedule). make sim SEEDS=N runs N of them; a failing one prints
// its steps and the command that runs it again.
func TestSimulation(t *testing.T) {
	rapid.Check(t, sim.Schedule)
}
