package puretest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Check fails t unless the package in the working directory (a test's
// own) is pure: no package it depends on talks to a network, a database,
// NATS or another process, and none of its non-test files asks the time,
// waits or starts a goroutine. What such a core knows comes in as
// arguments or events.
func Check(t *testing.T) {
	t.Helper()

	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	forbidden := regexp.MustCompile(`^(net|net/.*|os/exec|database/sql|database/sql/.*|github\.com/jackc/.*|github\.com/nats-io/.*)$`)
	for _, dep := range strings.Fields(string(out)) {
		if forbidden.MatchString(dep) {
			t.Errorf("the package depends on %s", dep)
		}
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	clock := map[string]bool{"Now": true, "Sleep": true, "After": true, "AfterFunc": true, "NewTimer": true, "NewTicker": true, "Tick": true, "Since": true, "Until": true}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.SelectorExpr:
				if x, ok := n.X.(*ast.Ident); ok && x.Name == "time" && clock[n.Sel.Name] {
					t.Errorf("%s: time.%s", fset.Position(n.Pos()), n.Sel.Name)
				}
			case *ast.GoStmt:
				t.Errorf("%s: a goroutine", fset.Position(n.Pos()))
			}
			return true
		})
	}
}
