package config

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// The settings table in docs/configuration.md is the user's reference: it
// names every setting of Vars, once, with its flag and its default, and
// nothing else.
func TestConfigurationDocMatchesVars(t *testing.T) {
	data, err := os.ReadFile("../../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	code := regexp.MustCompile("`([^`]*)`")
	type row struct{ flag, def string }
	documented := map[string]row{}
	for _, line := range strings.Split(string(data), "\n") {
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if !strings.HasPrefix(line, "| `MAILROOM_") || len(cells) < 4 {
			continue
		}
		var envs, flags []string
		for _, m := range code.FindAllStringSubmatch(cells[0], -1) {
			envs = append(envs, m[1])
		}
		for _, m := range code.FindAllStringSubmatch(cells[1], -1) {
			flags = append(flags, m[1])
		}
		if len(envs) != len(flags) {
			t.Errorf("row %q: %d variables, %d flags", cells[0], len(envs), len(flags))
			continue
		}
		def := strings.TrimSpace(cells[2])
		if m := code.FindStringSubmatch(def); m != nil {
			def = m[1]
		} else if def == "(required)" || def == "(unset)" {
			def = ""
		}
		for i, env := range envs {
			if _, dup := documented[env]; dup {
				t.Errorf("%s documented twice", env)
			}
			documented[env] = row{strings.TrimPrefix(flags[i], "--"), def}
		}
	}
	for _, v := range Vars {
		d, ok := documented[v.Env]
		if !ok {
			t.Errorf("%s (--%s) is not in docs/configuration.md", v.Env, v.Flag)
			continue
		}
		delete(documented, v.Env)
		if d.flag != v.Flag {
			t.Errorf("%s: documented flag --%s, it is --%s", v.Env, d.flag, v.Flag)
		}
		if d.def != v.Default {
			t.Errorf("%s: documented default %q, it is %q", v.Env, d.def, v.Default)
		}
	}
	for env := range documented {
		t.Errorf("docs/configuration.md documents %s, which is not a setting", env)
	}
}

// Every relative link between the docs (README.md, CONTRIBUTING.md,
// docs/*.md) names a file that exists and, after #, one of its headings.
func TestDocLinks(t *testing.T) {
	const root = "../../../"
	files, err := filepath.Glob(root + "docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, root+"README.md", root+"CONTRIBUTING.md")
	link := regexp.MustCompile(`\]\(([^)#\s]*)(#[^)\s]*)?\)`)
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		// Indented lines are code, whose brackets are not links.
		var prose []string
		for _, line := range strings.Split(string(data), "\n") {
			if !strings.HasPrefix(line, "    ") {
				prose = append(prose, line)
			}
		}
		for _, m := range link.FindAllStringSubmatch(strings.Join(prose, "\n"), -1) {
			target, anchor := m[1], strings.TrimPrefix(m[2], "#")
			if strings.Contains(target, "://") {
				continue
			}
			path := file
			if target != "" {
				path = filepath.Join(filepath.Dir(file), target)
			}
			body, err := os.ReadFile(path)
			if err != nil {
				t.Errorf("%s: link to %s: %v", file, m[0], err)
				continue
			}
			if anchor != "" && !slices.Contains(headingAnchors(string(body)), anchor) {
				t.Errorf("%s: link %s: %s has no heading #%s", file, m[0], target, anchor)
			}
		}
	}
}

// headingAnchors returns the anchors GitHub gives a Markdown file's
// headings: lower case, punctuation other than - and _ dropped, spaces to -.
func headingAnchors(md string) []string {
	var anchors []string
	for _, line := range strings.Split(md, "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(title) {
			switch {
			case r == ' ':
				b.WriteByte('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		anchors = append(anchors, b.String())
	}
	return anchors
}
