package grading

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"strings"

	"github.com/dsec-dev/dsec/api"
)

// MaxReportBytes bounds a report: a grader that writes more is broken
// or subverted.
const MaxReportBytes = 16 << 20

// maxCases bounds the test cases kept from a report.
const maxCases = 100000

// junitNode is any element of a JUnit document: testsuites, testsuite
// (nested, as some tools write them) and testcase with its children.
type junitNode struct {
	XMLName   xml.Name
	Name      string      `xml:"name,attr"`
	ClassName string      `xml:"classname,attr"`
	Time      string      `xml:"time,attr"`
	Message   string      `xml:"message,attr"`
	Text      string      `xml:",chardata"`
	Children  []junitNode `xml:",any"`
}

// ParseJUnit reads a JUnit XML report into its test cases. Counts come
// from the testcase elements, not from the suites' summary attributes,
// which a report can state without backing them.
func ParseJUnit(r io.Reader) ([]api.TestCase, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxReportBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxReportBytes {
		return nil, fmt.Errorf("the report is larger than %d bytes", MaxReportBytes)
	}
	dec := xml.NewDecoder(bytes.NewReader(b))
	dec.Strict = true
	var root junitNode
	if err := dec.Decode(&root); err != nil {
		return nil, fmt.Errorf("not JUnit XML: %w", err)
	}
	if n := root.XMLName.Local; n != "testsuites" && n != "testsuite" {
		return nil, fmt.Errorf("not JUnit XML: the root element is <%s>", n)
	}
	var cases []api.TestCase
	var walk func(n *junitNode, depth int) error
	walk = func(n *junitNode, depth int) error {
		if depth > 32 {
			return fmt.Errorf("test suites nest deeper than 32")
		}
		for i := range n.Children {
			c := &n.Children[i]
			switch c.XMLName.Local {
			case "testsuite":
				if err := walk(c, depth+1); err != nil {
					return err
				}
			case "testcase":
				if len(cases) == maxCases {
					return fmt.Errorf("more than %d test cases", maxCases)
				}
				cases = append(cases, testCase(c))
			}
		}
		return nil
	}
	if root.XMLName.Local == "testsuite" {
		root = junitNode{Children: []junitNode{root}}
	}
	if err := walk(&root, 0); err != nil {
		return nil, err
	}
	return cases, nil
}

// testCase reads one testcase element: its status is the worst of its
// children (error, failure, skipped); none is a pass.
func testCase(n *junitNode) api.TestCase {
	tc := api.TestCase{Name: n.Name, ClassName: n.ClassName, Status: "passed"}
	fmt.Sscanf(n.Time, "%g", &tc.TimeS)
	rank := map[string]int{"passed": 0, "skipped": 1, "failed": 2, "error": 3}
	for i := range n.Children {
		c := &n.Children[i]
		var st string
		switch c.XMLName.Local {
		case "failure":
			st = "failed"
		case "error":
			st = "error"
		case "skipped":
			st = "skipped"
		default:
			continue
		}
		if rank[st] > rank[tc.Status] {
			tc.Status = st
			tc.Message = truncate(strings.TrimSpace(c.Message+"\n"+c.Text), 1024)
		}
	}
	return tc
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
