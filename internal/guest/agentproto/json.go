package agentproto

import (
	"bytes"
	"encoding/json"
)

// encodeJSON marshals v without HTML escaping.
func encodeJSON(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// decodeJSON unmarshals one frame's payload (bounded by the frame limits).
func decodeJSON(b []byte, v any) error {
	return json.Unmarshal(b, v)
}
