// Package layout holds tests of the tree's shape: what a reader can hold
// at once, and names that mean one thing.
package layout

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// maxFuncLines is the longest a function may be, outside tests.
const maxFuncLines = 80

// goFiles parses every non-test Go file of the module, by path.
func goFiles(t *testing.T) (*token.FileSet, map[string]*ast.File) {
	t.Helper()
	fset := token.NewFileSet()
	files := map[string]*ast.File{}
	root := filepath.Join("..", "..")
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		files[rel] = f
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return fset, files
}

// Every function outside tests fits on a screen.
func TestFunctionsFitOnAScreen(t *testing.T) {
	fset, files := goFiles(t)
	for path, f := range files {
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			if n := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1; n > maxFuncLines {
				t.Errorf("%s: %s is %d lines, more than %d", path, fn.Name.Name, n, maxFuncLines)
			}
		}
	}
}

// dataPath are the packages a token goes through, WAL to reader.
var dataPath = []string{"replication", "decoder", "decoder/action", "decoder/traceparent", "decoder/wal", "batch", "migrations",
	"publish", "publish/join", "publish/token", "publish/wire", "publish/jsio", "publish/relay", "publish/resync",
	"publish/subscriber", "publish/subscriber/protocol", "publish/subscriber/inbox"}

// No exported type name means two things on the data path.
func TestTypeNamesMeanOneThing(t *testing.T) {
	_, files := goFiles(t)
	where := map[string]string{}
	for path, f := range files {
		dir := filepath.ToSlash(filepath.Dir(path))
		if !slices.Contains(dataPath, dir) {
			continue
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.TYPE {
				continue
			}
			for _, s := range g.Specs {
				name := s.(*ast.TypeSpec).Name.Name
				if !ast.IsExported(name) {
					continue
				}
				if other, ok := where[name]; ok && other != dir {
					t.Errorf("type %s is declared in %s and in %s", name, other, dir)
				}
				where[name] = dir
			}
		}
	}
	if len(where) == 0 {
		t.Fatal("no type found on the data path")
	}
}

// maxFileLines is the most lines a file of non-test code may have: one
// a reader holds in one sitting.
const maxFileLines = 500

// Every file outside tests is one a reader can hold.
func TestFilesFitInOneRead(t *testing.T) {
	fset, files := goFiles(t)
	for path, f := range files {
		if n := fset.File(f.Pos()).LineCount(); n > maxFileLines {
			t.Errorf("%s is %d lines, more than %d: split it along its seams", path, n, maxFileLines)
		}
	}
}

// whereItSits are the words a package's doc uses to say where the package
// sits: on the data path, beside it, wiring it, or supporting tests.
var whereItSits = []string{"Where it sits", "Data path", "data path", "Wiring", "Test support", "test support"}

// Every package of non-test code has a doc.go that says where it sits.
func TestEveryPackageSaysWhereItSits(t *testing.T) {
	_, files := goFiles(t)
	dirs := map[string]bool{}
	for path := range files {
		dirs[filepath.Dir(path)] = true
	}
	for dir := range dirs {
		doc := files[filepath.Join(dir, "doc.go")]
		if doc == nil || doc.Doc == nil {
			t.Errorf("%s has no doc.go with a package comment", dir)
			continue
		}
		if text := doc.Doc.Text(); !slices.ContainsFunc(whereItSits, func(w string) bool { return strings.Contains(text, w) }) {
			t.Errorf("%s/doc.go does not say where the package sits (one of %q)", dir, whereItSits)
		}
	}
}

// floor is how high a package stands in the house: a package imports only
// packages on lower floors, or of its own tree (a room's core, simulation
// and sinks beside its driver). The top level keeps the data's order
// (decoder, batch, replication, publish), with test support and the
// standard-library leaves on the ground and cmd, which wires, on top;
// inside publish the formats lie beneath the two rooms, the relay's and
// the subscriber's, which import nothing of each other.
var floors = []struct {
	prefix string
	floor  int
}{
	{"internal/", 0}, {"decoder/action", 0}, {"decoder/traceparent", 0}, {"decoder/wal", 0},
	{"decoder", 1}, {"migrations", 1},
	{"batch", 2},
	{"replication", 3},
	{"publish/token", 4}, {"publish/wire", 4}, {"publish/jsio", 4},
	{"publish/join", 5}, {"publish/relay", 5}, {"publish/subscriber", 5},
	{"publish/audit", 7}, {"publish/resync", 7},
	{"publish", 6},
	{"cmd", 8},
}

// floorOf is the floor of the package in dir, and the tree it belongs to.
func floorOf(dir string) (floor int, tree string) {
	for _, f := range floors {
		if dir == f.prefix || strings.HasPrefix(dir, strings.TrimSuffix(f.prefix, "/")+"/") {
			return f.floor, f.prefix
		}
	}
	return -1, ""
}

// No arrow climbs back: no package imports one on a higher floor, or one
// of another tree on its own floor.
func TestNoArrowClimbsBack(t *testing.T) {
	const module = "github.com/mailroom/tailer/"
	_, files := goFiles(t)
	for path, f := range files {
		dir := filepath.ToSlash(filepath.Dir(path))
		from, fromTree := floorOf(dir)
		if from < 0 {
			continue
		}
		for _, imp := range f.Imports {
			p := strings.Trim(imp.Path.Value, `"`)
			if !strings.HasPrefix(p, module) {
				continue
			}
			to, toTree := floorOf(strings.TrimPrefix(p, module))
			if to > from || to == from && toTree != fromTree {
				t.Errorf("%s (floor %d) imports %s (floor %d): an arrow that climbs back", path, from, p, to)
			}
		}
	}
}
