//go:build !linux

package builtin

import "context"

// lockFile does nothing off Linux, where built-in layers cannot be built.
func lockFile(ctx context.Context, path string) (unlock func(), err error) {
	return func() {}, nil
}
