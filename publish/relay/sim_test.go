package relay_test

import (
	"testing"

	"pgregory.net/rapid"

	"github.com/mailroom/tailer/internal/testutil/simtest"
	"github.com/mailroom/tailer/publish/relay/sim"
)

// Without -rapid.checks and -rapid.seed, go test runs defaultSchedules
// schedules of each profile (rapid's own default is 100), drawn from
// defaultSeed: the same schedules every run, enough that each of the
// losses that reached main before is found (CONTRIBUTING), in seconds.
// make sim draws others.
const (
	defaultSchedules = "4000"
	defaultSeed      = "1"
)

func TestMain(m *testing.M) { simtest.Main(m, defaultSchedules, defaultSeed) }

// TestSimulation drives the real Relay through schedules rapid chooses,
// of each of sim.Profiles. make sim SEEDS=N runs N of each; a failing one
// prints its steps and the command that runs it again.
func TestSimulation(t *testing.T) {
	for _, p := range sim.Profiles {
		t.Run(p.Name, func(t *testing.T) { rapid.Check(t, p.Schedule) })
	}
}
