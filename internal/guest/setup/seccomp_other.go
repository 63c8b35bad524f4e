//go:build linux && !amd64

package setup

import "errors"

// installSeccomp: the container tier's filters are built for x86_64 only.
func installSeccomp(prog []byte) error {
	return errors.New("seccomp filters are only built for x86_64")
}
