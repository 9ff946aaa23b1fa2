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
		f, err := parser.ParseFile(fset, p, nil, 0)
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
