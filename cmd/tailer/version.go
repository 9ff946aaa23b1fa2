package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// commit is the source's commit, set at build time by make build
// (-ldflags "-X main.commit=..."); a build with VCS stamping gives it too.
var commit string

// versionLine says which tailer this is: the module version (a tag with
// go install ...@version, "(devel)" from a checkout), the commit, and Go's.
func versionLine() string {
	version, rev := "(unknown)", commit
	if info, ok := debug.ReadBuildInfo(); ok {
		version = info.Main.Version
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" && rev == "" {
				rev = s.Value
			}
		}
	}
	if rev == "" {
		rev = "commit unknown"
	}
	return fmt.Sprintf("tailer %s (%s, %s)", version, rev, runtime.Version())
}

func (x *cli) versionCmd() *cobra.Command {
	return x.leaf(&cobra.Command{Use: "version", Short: "print the version and commit (also --version)"}, func(*cobra.Command, []string) int {
		fmt.Fprintln(x.stdout, versionLine())
		return exitOK
	})
}
