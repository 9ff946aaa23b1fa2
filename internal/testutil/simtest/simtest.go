package simtest

import (
	"flag"
	"os"
	"testing"
)

// Main runs m with rapid's -rapid.checks and -rapid.seed set to checks
// and seed unless the command line gives them: the same schedules every
// run of go test (make sim draws others).
func Main(m *testing.M, checks, seed string) {
	flag.Parse()
	given := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if !given["rapid.checks"] {
		flag.Set("rapid.checks", checks)
	}
	if !given["rapid.seed"] && seed != "" {
		flag.Set("rapid.seed", seed)
	}
	os.Exit(m.Run())
}
