package layout

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

var (
	// figure is a number as the docs write a measured one: with a decimal
	// point or thousands separators, or a range of two.
	figure = regexp.MustCompile(`(?:^|[^\w.,/:#-])(\d[\d,]*(?:\.\d+)?(?:\s?-\s?\d[\d,]*(?:\.\d+)?)?)`)
	number = regexp.MustCompile(`\d[\d,]*(?:\.\d+)?`)
	// notFigures are what reads like a figure and is none: a code span, a
	// link's target, a date, a version.
	notFigures = []*regexp.Regexp{
		regexp.MustCompile("`[^`]*`"),
		regexp.MustCompile(`\]\([^)]*\)`),
		regexp.MustCompile(`\b\d{4}-\d\d(-\d\d)?\b`),
		regexp.MustCompile(`\b\d+\.\d+\.\d+\b`),
	}
)

// TestDocsFiguresComeFromRuns holds every measured figure of the README
// and docs/ to a dated run in docs/bench: each number with a decimal
// point or thousands separators, or each end of a range, is written in a
// bench record, or is a value of a bench JSON (rounded as the docs round
// it). A figure typed from memory, or rounded into one no run gave, fails.
func TestDocsFiguresComeFromRuns(t *testing.T) {
	root := filepath.Join("..", "..")
	recorded, records := benchNumbers(t, filepath.Join(root, "docs", "bench"))
	docs, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	docs = append(docs, filepath.Join(root, "README.md"))
	checked := 0
	for _, p := range docs {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, p)
		for _, f := range figures(string(data)) {
			checked++
			if strings.Contains(records, f) {
				continue
			}
			for _, end := range strings.Split(f, "-") {
				if end = strings.TrimSpace(end); !recorded[strings.ReplaceAll(end, ",", "")] {
					t.Errorf("%s: %s is in no bench record (docs/bench): cite the run it comes from, as it gave it", rel, f)
					break
				}
			}
		}
	}
	if checked < 100 {
		t.Errorf("found %d figures in the docs: the figure pattern no longer matches them", checked)
	}
}

// figures are the measured figures of a markdown text, outside code.
func figures(text string) []string {
	text = normalize(prose(text))
	for _, re := range notFigures {
		text = re.ReplaceAllString(text, " ")
	}
	var out []string
	for _, m := range figure.FindAllStringSubmatch(text, -1) {
		f := strings.TrimRight(m[1], ",")
		if strings.ContainsAny(f, ".,-") {
			out = append(out, f)
		}
	}
	return out
}

// benchNumbers reads the bench records: every number they write (without
// thousands separators), every value of their JSON files as it is and
// rounded to one to three decimals, and the records' text.
func benchNumbers(t *testing.T, dir string) (map[string]bool, string) {
	t.Helper()
	nums := map[string]bool{}
	var text strings.Builder
	paths, _ := filepath.Glob(filepath.Join(dir, "*"))
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		s := normalize(string(data))
		if strings.HasSuffix(p, ".md") {
			text.WriteString(s + "\n")
		}
		for _, n := range number.FindAllString(s, -1) {
			n = strings.ReplaceAll(n, ",", "")
			nums[n] = true
			if !strings.HasSuffix(p, ".json") || !strings.Contains(n, ".") {
				continue
			}
			if v, err := strconv.ParseFloat(n, 64); err == nil {
				for d := 0; d <= 3; d++ {
					nums[strconv.FormatFloat(v, 'f', d, 64)] = true
				}
			}
		}
	}
	return nums, text.String()
}

// normalize writes ranges and spaces one way.
func normalize(s string) string {
	return strings.NewReplacer("\u2009", " ", "\u202f", " ", "–", "-", "\n", " ").Replace(s)
}
