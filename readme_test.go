package hmc

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// readmeExamples are the example files whose marked parts README.md shows as Go snippets.
var readmeExamples = []string{"example_test.go", "coord/group/example_test.go"}

// TestReadmeSnippetsCompile: every Go snippet in README.md is a part of a compiled, run
// Example (between a "// README: name" and a "// README: end" line), dedented; so the README's
// code compiles and works as pasted into a function.
func TestReadmeSnippetsCompile(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	var parts []string
	for _, f := range readmeExamples {
		parts = append(parts, readmeParts(t, f)...)
	}
	blocks := regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(string(readme), -1)
	if len(blocks) == 0 {
		t.Fatal("README.md has no Go snippet")
	}
	for _, b := range blocks {
		found := false
		for _, p := range parts {
			found = found || b[1] == p
		}
		if !found {
			t.Errorf("README.md snippet is not a marked part of %v:\n%s", readmeExamples, b[1])
		}
	}
}

// readmeParts returns the marked parts of an example file, dedented by one tab.
func readmeParts(t *testing.T, file string) []string {
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var parts []string
	var cur []string
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case trimmed == "// README: end":
			parts = append(parts, strings.Join(cur, "\n")+"\n")
			cur, in = nil, false
		case strings.HasPrefix(trimmed, "// README: "):
			in = true
		case in:
			cur = append(cur, strings.TrimPrefix(line, "\t"))
		}
	}
	return parts
}
