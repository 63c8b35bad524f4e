package api

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestOpenAPIMatchesTypes checks that every JSON field of the wire types is
// described in the document under the schema of the same name, so the two
// cannot drift apart silently.
func TestOpenAPIMatchesTypes(t *testing.T) {
	raw, err := yaml.YAMLToJSON(OpenAPIYAML())
	if err != nil {
		t.Fatalf("the OpenAPI document: %v", err)
	}
	var doc struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]any `json:"properties"`
			} `json:"schemas"`
		} `json:"components"`
		Paths map[string]any `json:"paths"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	types := []any{CreateSandboxRequest{}, Sandbox{}, SandboxList{}, SandboxStats{}, NetworkPolicy{}, NetworkRule{}, Phase{}, SetPhaseRequest{}, AuditEvent{}, AuditEventList{}, PhaseChange{}, RuleCount{}, IntegrityReport{}, SetTimeoutRequest{}, ExecRequest{},
		ExecResult{}, ExecEvent{}, Process{}, ProcessList{}, StdinRequest{}, SignalRequest{}, FileInfo{},
		FileList{}, ExistsResponse{}, MkdirRequest{}, RenameRequest{}, Error{}, Health{}, VersionInfo{},
		TierInfo{}, Node{}, NodeList{}, Image{}, ImageList{}, AddDirImageRequest{}, ImageLayer{}, Layer{}, LayerList{},
		CreateImageRequest{}, TagRequest{}, BuildDirLayerRequest{}, GradeRequest{}, GradeResult{}, GradeSummary{}, TestCase{},
		Trajectory{}, TrajectoryList{}, TrajectorySteps{}, TrajectoryStep{}, StepCreate{}, StepExec{}, StepFile{}, StepResume{}, StepEnd{},
		Divergence{}, Snapshot{}, ResumeRequest{}, ResumeResult{}, ForkRequest{}, ForkResult{}}
	for _, v := range types {
		rt := reflect.TypeOf(v)
		schema, ok := doc.Components.Schemas[rt.Name()]
		if !ok {
			t.Errorf("schema %s missing", rt.Name())
			continue
		}
		for i := 0; i < rt.NumField(); i++ {
			name, _, _ := strings.Cut(rt.Field(i).Tag.Get("json"), ",")
			if _, ok := schema.Properties[name]; !ok {
				t.Errorf("schema %s lacks property %q", rt.Name(), name)
			}
		}
		for name := range schema.Properties {
			found := false
			for i := 0; i < rt.NumField(); i++ {
				n, _, _ := strings.Cut(rt.Field(i).Tag.Get("json"), ",")
				found = found || n == name
			}
			if !found {
				t.Errorf("schema %s has property %q the Go type lacks", rt.Name(), name)
			}
		}
	}
	if len(doc.Paths) < 20 {
		t.Errorf("only %d paths documented", len(doc.Paths))
	}
}
