package cli

import (
	"strings"

	"github.com/dsec-dev/dsec/api"
)

// parseKV parses repeated K=V flag values into a map; flag names the flag
// in errors. A value may contain '='; the key may not be empty.
func parseKV(flag string, vals []string) (map[string]string, error) {
	if len(vals) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(vals))
	for _, kv := range vals {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, usagef("--%s %q: want KEY=VALUE", flag, kv)
		}
		m[k] = v
	}
	return m, nil
}

// parseLayers parses repeated --layer ROLE=REF values into image layers,
// in the order given (bottom first).
func parseLayers(vals []string) ([]api.ImageLayer, error) {
	if len(vals) == 0 {
		return nil, nil
	}
	out := make([]api.ImageLayer, 0, len(vals))
	for _, kv := range vals {
		role, ref, ok := strings.Cut(kv, "=")
		if !ok || role == "" || ref == "" {
			return nil, usagef("--layer %q: want ROLE=REF (e.g. base=base/busybox:1.36)", kv)
		}
		out = append(out, api.ImageLayer{Role: role, ID: ref})
	}
	return out, nil
}
