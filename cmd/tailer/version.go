package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
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

func printVersion(w io.Writer) int {
	fmt.Fprintln(w, versionLine())
	return exitOK
}
