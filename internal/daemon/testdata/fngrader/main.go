// Command fngrader is the function-tier grader of TestSealedGrading: a
// WASI module that compares /workspace/answer.txt with the expected
// answer of its tests layer and writes a JUnit report to argv[1].
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

func main() {
	want, err := os.ReadFile("/tests/expected.txt")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	got, _ := os.ReadFile("/workspace/answer.txt")
	tc := `<testcase classname="tests" name="test_answer"/>`
	if strings.TrimSpace(string(got)) != strings.TrimSpace(string(want)) {
		tc = `<testcase classname="tests" name="test_answer"><failure message="wrong answer"/></testcase>`
	}
	os.MkdirAll(filepath.Dir(os.Args[1]), 0o755)
	if err := os.WriteFile(os.Args[1], []byte("<testsuite>"+tc+"</testsuite>"), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
}
