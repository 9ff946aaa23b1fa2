package layout

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// mdLink is a markdown link to a relative path, with its anchor if any.
var mdLink = regexp.MustCompile(`\]\(([^)\s:#]*)(#[^)\s]*)?\)`)

// TestDocsLinksResolve holds every relative link of the markdown files to
// a file that exists and, with an anchor, to a heading of it: a page split
// or a heading renamed breaks a runbook's link where nobody looks until
// 3 a.m.
func TestDocsLinksResolve(t *testing.T) {
	root := filepath.Join("..", "..")
	anchors := map[string]map[string]bool{}
	headingsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		a := map[string]bool{}
		text, err := os.ReadFile(path)
		if err == nil {
			for _, line := range strings.Split(string(text), "\n") {
				if h, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " "); ok && strings.HasPrefix(line, "#") {
					a[slug(h)] = true
				}
			}
		}
		anchors[path] = a
		return a
	}
	links := 0
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".md") {
			return nil
		}
		text, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		for _, m := range mdLink.FindAllStringSubmatch(prose(string(text)), -1) {
			target, anchor := m[1], strings.TrimPrefix(m[2], "#")
			if strings.HasPrefix(target, "http") || strings.HasPrefix(target, "mailto") {
				continue
			}
			links++
			path := filepath.Join(filepath.Dir(p), target)
			if target == "" {
				path, target = p, filepath.Base(p)
			}
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s links to %s, which does not exist", rel, target)
				continue
			}
			if anchor != "" && strings.HasSuffix(target, ".md") && !headingsOf(path)[anchor] {
				t.Errorf("%s links to %s#%s: no such heading there", rel, target, anchor)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if links < 50 {
		t.Errorf("found %d relative links in the docs: the link pattern no longer matches them", links)
	}
}

// prose is text without its fenced code blocks, where ](x) is code.
func prose(text string) string {
	var b strings.Builder
	code := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			code = !code
			continue
		}
		if !code && !strings.HasPrefix(line, "    ") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

// slug is the anchor GitHub gives a heading: lower case, spaces as
// hyphens, punctuation but hyphens and underscores dropped.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestDocsShort holds every user doc to 5,000 words: a page past that is
// two pages (a reader at 3 a.m. reads one).
func TestDocsShort(t *testing.T) {
	pages, err := filepath.Glob(filepath.Join("..", "..", "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range append(pages, filepath.Join("..", "..", "README.md")) {
		text, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if n := len(strings.Fields(string(text))); n > 5000 {
			t.Errorf("%s is %d words: split it (at most 5,000)", p, n)
		}
	}
}
