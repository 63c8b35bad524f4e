package cli

import (
	"slices"
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

// mergeSecretEnv adds the --secret-env values to env and returns the
// secret keys, in the order given. A value is KEY=VALUE, or KEY alone:
// its value is then env's (from --env), else lookup's (the CLI's own
// environment, which keeps it out of the command line and the shell's
// history).
func mergeSecretEnv(env map[string]string, vals []string, lookup func(string) (string, bool)) (map[string]string, []string, error) {
	if len(vals) == 0 {
		return env, nil, nil
	}
	secrets, err := parseSecretEnv(vals, func(k string) (string, bool) {
		if v, ok := env[k]; ok {
			return v, true
		}
		return lookup(k)
	})
	if err != nil {
		return nil, nil, err
	}
	if env == nil {
		env = make(map[string]string, len(secrets))
	}
	keys := make([]string, 0, len(vals))
	for _, kv := range vals {
		k, _, _ := strings.Cut(kv, "=")
		if !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
		env[k] = secrets[k]
	}
	return env, keys, nil
}

// parseSecretEnv parses repeated --secret-env KEY=VALUE or KEY values;
// lookup finds the value of a KEY given alone.
func parseSecretEnv(vals []string, lookup func(string) (string, bool)) (map[string]string, error) {
	if len(vals) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(vals))
	for _, kv := range vals {
		k, v, ok := strings.Cut(kv, "=")
		if k == "" {
			return nil, usagef("--secret-env %q: want KEY=VALUE or KEY", kv)
		}
		if !ok {
			if v, ok = lookup(k); !ok {
				return nil, usagef("--secret-env %s: no value (give KEY=VALUE, --env %s=…, or set %s in the environment)", k, k, k)
			}
		}
		m[k] = v
	}
	return m, nil
}
