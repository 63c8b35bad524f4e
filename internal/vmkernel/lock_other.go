//go:build !linux

package vmkernel

import "context"

// lockFile does nothing off Linux, where guest kernels are not fetched.
func lockFile(ctx context.Context, path string) (unlock func(), err error) {
	return func() {}, nil
}
