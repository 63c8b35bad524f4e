package api

import (
	_ "embed"
	"sync"

	"sigs.k8s.io/yaml"
)

//go:embed openapi.yaml
var openAPIYAML []byte

var openAPIJSON = sync.OnceValues(func() ([]byte, error) { return yaml.YAMLToJSON(openAPIYAML) })

// OpenAPIJSON returns the OpenAPI document as JSON.
func OpenAPIJSON() ([]byte, error) { return openAPIJSON() }
