//go:build !linux

package testenv

import "time"

// SweepStale does nothing where DSec's tests mount nothing.
func SweepStale(maxAge time.Duration) {}

// UnmountAll does nothing where DSec's tests mount nothing.
func UnmountAll(dir string) {}

// SweepDeadTests does nothing where DSec's tests make no cgroups.
func SweepDeadTests() {}
