package grading

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/dsec-dev/dsec/api"
)

// DeclaredTestsPath is where a tests layer declares its tests: a JSON
// file {"tests": [{"classname": "tests.test_calc", "name": "test_add"},
// …]} naming each test case as the grader's JUnit report will (a
// parametrised test once per parameter set). A declared test without a
// classname matches a case of that name in any class. Where the tests
// layer has the file, the report must name exactly these tests: one it
// does not declare makes the verdict an error (a report padded or made
// up), one it lacks a failure (a test that never ran cannot pass).
// Without it, the report's names are not checked.
const DeclaredTestsPath = "/.dsec/tests.json"

// MaxDeclaredBytes bounds the declaration file.
const MaxDeclaredBytes = 16 << 20

// TestID names a test case as a JUnit report does.
type TestID struct {
	ClassName string `json:"classname,omitempty"`
	Name      string `json:"name"`
}

func (id TestID) String() string {
	if id.ClassName == "" {
		return id.Name
	}
	return id.ClassName + "::" + id.Name
}

// ParseDeclared reads a tests layer's declaration (DeclaredTestsPath).
func ParseDeclared(b []byte) ([]TestID, error) {
	var doc struct {
		Tests []TestID `json:"tests"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("%s: %w", DeclaredTestsPath, err)
	}
	if len(doc.Tests) == 0 || len(doc.Tests) > maxCases {
		return nil, fmt.Errorf("%s: declares %d tests, want 1 to %d", DeclaredTestsPath, len(doc.Tests), maxCases)
	}
	seen := map[TestID]bool{}
	for _, t := range doc.Tests {
		if t.Name == "" {
			return nil, fmt.Errorf("%s: a test without a name", DeclaredTestsPath)
		}
		if seen[t] {
			return nil, fmt.Errorf("%s: %s declared twice", DeclaredTestsPath, t)
		}
		seen[t] = true
	}
	return doc.Tests, nil
}

// CheckNames compares a report's cases with the declared tests (none:
// nothing to check): the cases no declared test matches, the declared
// tests no case matches, and the cases named more than once.
func CheckNames(cases []api.TestCase, declared []TestID) (unknown, missing, twice []string) {
	if len(declared) == 0 {
		return nil, nil, nil
	}
	exact := map[TestID]int{}  // declared with a classname
	byName := map[string]int{} // declared without one
	for i, d := range declared {
		if d.ClassName == "" {
			byName[d.Name] = i
		} else {
			exact[d] = i
		}
	}
	matched := make([]bool, len(declared))
	seen := map[TestID]bool{}
	for _, c := range cases {
		id := TestID{ClassName: c.ClassName, Name: c.Name}
		if seen[id] {
			twice = append(twice, id.String())
			continue
		}
		seen[id] = true
		i, ok := exact[id]
		if !ok {
			i, ok = byName[c.Name]
		}
		if !ok {
			unknown = append(unknown, id.String())
			continue
		}
		if matched[i] { // a declared test without a classname, in two classes
			twice = append(twice, id.String())
			continue
		}
		matched[i] = true
	}
	for i, d := range declared {
		if !matched[i] {
			missing = append(missing, d.String())
		}
	}
	return unknown, missing, twice
}
