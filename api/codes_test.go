package api

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

var classes = []string{ClassInvalid, ClassUnauthenticated, ClassPermissionDenied, ClassNotFound, ClassConflict,
	ClassTooLarge, ClassUnsupported, ClassRateLimited, ClassUnavailable, ClassDeadlineExceeded, ClassInternal}

// docCode is an entry of openapi.yaml's components.x-error-codes.
type docCode struct {
	Class       string `json:"class"`
	Description string `json:"description"`
}

func openAPICodes(t *testing.T) map[string]docCode {
	t.Helper()
	raw, err := yaml.YAMLToJSON(OpenAPIYAML())
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Components struct {
			Codes map[string]docCode `json:"x-error-codes"`
		} `json:"components"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	return doc.Components.Codes
}

var codePattern = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)

// codeProblems compares the registry reg with the document's list of
// codes doc: each code once, well formed, of a known class, and listed
// in both with the same class and description.
func codeProblems(reg []ErrorCode, doc map[string]docCode) []string {
	var out []string
	seen := map[string]bool{}
	for _, c := range reg {
		switch {
		case seen[c.Code]:
			out = append(out, fmt.Sprintf("%s: registered twice", c.Code))
		case !codePattern.MatchString(c.Code):
			out = append(out, fmt.Sprintf("%q: not a lower_snake_case code", c.Code))
		case !slices.Contains(classes, c.Class):
			out = append(out, fmt.Sprintf("%s: unknown class %q", c.Code, c.Class))
		case c.Doc == "":
			out = append(out, fmt.Sprintf("%s: no Doc", c.Code))
		}
		seen[c.Code] = true
		d, ok := doc[c.Code]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("%s: missing from openapi.yaml's components.x-error-codes; add\n    %s: {class: %s, description: %q}", c.Code, c.Code, c.Class, c.Doc))
		case d.Class != c.Class:
			out = append(out, fmt.Sprintf("%s: class %s in openapi.yaml, %s in ErrorCodes", c.Code, d.Class, c.Class))
		case d.Description != c.Doc:
			out = append(out, fmt.Sprintf("%s: openapi.yaml describes it as %q, ErrorCodes as %q", c.Code, d.Description, c.Doc))
		}
	}
	for code := range doc {
		if !seen[code] {
			out = append(out, fmt.Sprintf("%s: in openapi.yaml's components.x-error-codes, not in ErrorCodes", code))
		}
	}
	sort.Strings(out)
	return out
}

// TestErrorCodesInOpenAPI: the OpenAPI document lists exactly the
// registry's codes, each with its class and meaning.
func TestErrorCodesInOpenAPI(t *testing.T) {
	for _, p := range codeProblems(ErrorCodes, openAPICodes(t)) {
		t.Error(p)
	}
}

func TestCodeProblemsFails(t *testing.T) {
	reg := []ErrorCode{
		{"a_code", ClassNotFound, "a"},
		{"b_code", ClassConflict, "b"},
		{"c_code", ClassInternal, "c"},
		{"c_code", ClassInternal, "c"},
		{"Bad-Code", ClassInternal, "d"},
		{"e_code", "no_such_class", "e"},
	}
	doc := map[string]docCode{
		"a_code":   {ClassNotFound, "a"},
		"b_code":   {ClassInvalid, "b"},
		"c_code":   {ClassInternal, "other"},
		"Bad-Code": {ClassInternal, "d"},
		"e_code":   {"no_such_class", "e"},
		"z_code":   {ClassInternal, "z"},
	}
	got := strings.Join(codeProblems(reg, doc), "\n")
	for _, want := range []string{"b_code: class invalid_argument in openapi.yaml", "c_code: registered twice",
		"c_code: openapi.yaml describes", `"Bad-Code": not a lower_snake_case`, `e_code: unknown class`,
		"z_code: in openapi.yaml's components.x-error-codes, not in ErrorCodes"} {
		if !strings.Contains(got, want) {
			t.Errorf("problems lack %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "a_code") {
		t.Errorf("a_code is fine, but:\n%s", got)
	}
	delete(doc, "a_code")
	if got := strings.Join(codeProblems(reg, doc), "\n"); !strings.Contains(got, "a_code: missing from openapi.yaml") {
		t.Errorf("a missing code not reported:\n%s", got)
	}
}

// The Python SDK, read as text: the dicts that choose an exception by
// class and by code, the classes' bases, the codes it compares, and the
// codes it raises itself (keyword code="…").
var (
	pyDict     = regexp.MustCompile(`(?ms)^(_BY_CLASS|_BY_CODE)[^=]*= \{\n(.*?)^\}`)
	pyEntry    = regexp.MustCompile(`"([^"]+)":\s*(\w+)`)
	pyClass    = regexp.MustCompile(`(?m)^class (\w+)\(([^)]*)\):`)
	pyCompare  = regexp.MustCompile(`\bcode\s*(?:==|!=)\s*"([^"]+)"`)
	pyIn       = regexp.MustCompile(`\bcode\s+(?:not\s+)?in\s+\(([^)]*)\)`)
	pyOwn      = regexp.MustCompile(`\bcode="([^"]+)"`)
	pyQuoted   = regexp.MustCompile(`"([^"]+)"`)
	sdkSources = "../sdk/python/libdsec"
)

// sdkProblems checks the Python SDK's sources src (file name to text)
// against the registry reg: it maps every class, maps a code only to a
// subclass of its class's exception, and compares only codes that exist
// (registered, or raised by the SDK itself).
func sdkProblems(reg []ErrorCode, src map[string]string) []string {
	classOf := map[string]string{}
	for _, c := range reg {
		classOf[c.Code] = c.Class
	}
	dicts := map[string]map[string]string{}
	bases := map[string][]string{}
	own := map[string]bool{}
	for _, text := range src {
		for _, m := range pyDict.FindAllStringSubmatch(text, -1) {
			d := map[string]string{}
			for _, e := range pyEntry.FindAllStringSubmatch(m[2], -1) {
				d[e[1]] = e[2]
			}
			dicts[m[1]] = d
		}
		for _, m := range pyClass.FindAllStringSubmatch(text, -1) {
			for _, b := range strings.Split(m[2], ",") {
				bases[m[1]] = append(bases[m[1]], strings.TrimSpace(b))
			}
		}
		for _, m := range pyOwn.FindAllStringSubmatch(text, -1) {
			own[m[1]] = true
		}
	}
	var isSub func(sub, super string) bool
	isSub = func(sub, super string) bool {
		if sub == super {
			return true
		}
		for _, b := range bases[sub] {
			if isSub(b, super) {
				return true
			}
		}
		return false
	}
	var out []string
	byClass, byCode := dicts["_BY_CLASS"], dicts["_BY_CODE"]
	if byClass == nil || byCode == nil {
		return []string{"errors.py: _BY_CLASS or _BY_CODE not found"}
	}
	for _, c := range classes {
		if byClass[c] == "" {
			out = append(out, fmt.Sprintf("_BY_CLASS lacks class %s", c))
		}
	}
	for c := range byClass {
		if !slices.Contains(classes, c) {
			out = append(out, fmt.Sprintf("_BY_CLASS maps %s, which is no class", c))
		}
	}
	for code, exc := range byCode {
		class, ok := classOf[code]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("_BY_CODE maps %s, which is not in api.ErrorCodes", code))
		case !isSub(exc, byClass[class]):
			out = append(out, fmt.Sprintf("_BY_CODE maps %s (class %s) to %s, which is not a %s", code, class, exc, byClass[class]))
		}
	}
	for name, text := range src {
		var compared []string
		for _, m := range pyCompare.FindAllStringSubmatch(text, -1) {
			compared = append(compared, m[1])
		}
		for _, m := range pyIn.FindAllStringSubmatch(text, -1) {
			for _, q := range pyQuoted.FindAllStringSubmatch(m[1], -1) {
				compared = append(compared, q[1])
			}
		}
		for _, code := range compared {
			if _, ok := classOf[code]; !ok && !own[code] {
				out = append(out, fmt.Sprintf("%s compares code %s, which is neither in api.ErrorCodes nor raised by the SDK", name, code))
			}
		}
	}
	sort.Strings(out)
	return out
}

// TestSDKKnowsCodes: the Python SDK's exceptions agree with the registry.
func TestSDKKnowsCodes(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(sdkSources, "*.py"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no SDK sources in %s: %v", sdkSources, err)
	}
	src := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		src[filepath.Base(f)] = string(b)
	}
	for _, p := range sdkProblems(ErrorCodes, src) {
		t.Error(p)
	}
}

func TestSDKProblemsFails(t *testing.T) {
	reg := []ErrorCode{{"read_only", ClassPermissionDenied, "r"}, {"gone", ClassNotFound, "g"}}
	errorsPy := `
class SandboxError(Exception):
    pass
class PermissionDeniedError(SandboxError):
    pass
class NotFoundError(SandboxError):
    pass
class ReadOnlyError(PermissionDeniedError):
    pass

_BY_CLASS: dict[str, type[SandboxError]] = {
    "permission_denied": PermissionDeniedError,
    "not_found": NotFoundError,
    "no_such_class": SandboxError,
}

_BY_CODE: dict[str, type[SandboxError]] = {
    "read_only": ReadOnlyError,
    "gone": ReadOnlyError,
    "vanished": NotFoundError,
}

def f():
    raise SandboxError("x", code="sdk_own")
`
	opsPy := `
def g(e):
    return e.code == "gone" or e.code != "sdk_own" or e.code in ("read_only", "missing")
`
	got := strings.Join(sdkProblems(reg, map[string]string{"errors.py": errorsPy, "_ops.py": opsPy}), "\n")
	for _, want := range []string{"_BY_CLASS lacks class conflict", "_BY_CLASS maps no_such_class",
		"_BY_CODE maps gone (class not_found) to ReadOnlyError, which is not a NotFoundError",
		"_BY_CODE maps vanished, which is not in api.ErrorCodes", "_ops.py compares code missing"} {
		if !strings.Contains(got, want) {
			t.Errorf("problems lack %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "read_only,") || strings.Contains(got, "code read_only") || strings.Contains(got, "sdk_own") {
		t.Errorf("fine uses reported:\n%s", got)
	}
}
