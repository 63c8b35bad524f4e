//go:build !wasip1

package main

import (
	"errors"
	"os"
)

// openRaw is only meaningful under WASI; the program is built for the host
// only so that go vet and editors can check it.
func openRaw(int, string) (*os.File, error) {
	return nil, errors.New("openat is only available under WASI")
}
