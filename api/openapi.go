package api

import _ "embed"

//go:embed openapi.yaml
var openAPIYAML []byte

// OpenAPIYAML returns the OpenAPI document as written (YAML). The server
// serves it as JSON; the conversion lives there, so that programs using
// only the wire types (the in-sandbox agent among them) do not link a
// YAML parser.
func OpenAPIYAML() []byte { return openAPIYAML }
