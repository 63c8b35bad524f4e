package trajectory

import (
	"maps"
	"slices"

	"github.com/dsec-dev/dsec/api"
)

// Redact returns the create request as it may be logged: the values of
// the Env keys SecretEnv names are dropped (a resume asks for them
// again), and the secret names, sorted, are returned. req is not changed.
func Redact(req api.CreateSandboxRequest) (api.CreateSandboxRequest, []string) {
	if len(req.SecretEnv) == 0 {
		return req, nil
	}
	names := slices.Clone(req.SecretEnv)
	slices.Sort(names)
	names = slices.Compact(names)
	req.Env = maps.Clone(req.Env)
	for _, k := range names {
		delete(req.Env, k)
	}
	req.SecretEnv = names
	return req, names
}

// RedactExec returns the exec request as it may be logged: Stdin is
// replaced by its digest (returned; "" without stdin). req is not
// changed.
func RedactExec(req api.ExecRequest) (api.ExecRequest, string) {
	if req.Stdin == "" {
		return req, ""
	}
	d := Digest([]byte(req.Stdin))
	req.Stdin = ""
	return req, d
}
