package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Test names live in CONTRIBUTING.md ("Tested by") and nowhere else in
// the docs an operator reads, and each one named there exists.
func TestDocsNameRealTests(t *testing.T) {
	t.Parallel()
	name := regexp.MustCompile("`(Test[A-Z][A-Za-z0-9]*)`")
	defined := map[string]bool{}
	def := regexp.MustCompile(`(?m)^func (Test[A-Za-z0-9]*)\(`)
	err := filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return err
		}
		src, err := os.ReadFile(path)
		for _, m := range def.FindAllStringSubmatch(string(src), -1) {
			defined[m[1]] = true
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	contributing, err := os.ReadFile("../../CONTRIBUTING.md")
	if err != nil {
		t.Fatal(err)
	}
	named := name.FindAllStringSubmatch(string(contributing), -1)
	if len(named) < 30 {
		t.Errorf("CONTRIBUTING.md names %d tests: the Tested by table is gone", len(named))
	}
	for _, m := range named {
		if !defined[m[1]] {
			t.Errorf("CONTRIBUTING.md names %s, which no test file defines", m[1])
		}
	}
	for _, doc := range []string{"README.md", "docs/operations.md", "docs/faults.md", "docs/monitoring.md", "docs/subscribers.md", "docs/deploy.md", "docs/configuration.md", "docs/wire-format.md", "docs/tokens.md", "docs/consumers.md", "docs/ownership.md"} {
		text, err := os.ReadFile("../../" + doc)
		if err != nil {
			t.Fatal(err)
		}
		if m := name.FindString(string(text)); m != "" {
			t.Errorf("%s names the test %s: test names go in CONTRIBUTING.md, Tested by", doc, m)
		}
	}
}
