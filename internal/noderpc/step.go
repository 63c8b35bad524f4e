package noderpc

import "context"

type stepKey struct{}

// WithStep returns ctx carrying trajectory step step: the client's calls
// that change a sandbox (Exec, StartProcess, WriteFile, Mkdir, Remove,
// Rename) tell the node so, and the node tags the audit events of their
// time with it. It keeps the existing signatures as they are.
func WithStep(ctx context.Context, step int) context.Context {
	return context.WithValue(ctx, stepKey{}, step)
}

// StepOf is the step ctx carries (0: none).
func StepOf(ctx context.Context) int {
	n, _ := ctx.Value(stepKey{}).(int)
	return n
}
