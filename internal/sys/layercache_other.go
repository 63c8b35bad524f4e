//go:build !linux

package sys

import "github.com/dsec-dev/dsec/internal/errdefs"

// MountEntry is one line of /proc/self/mountinfo.
type MountEntry struct {
	Target, FSType, Source, Options string
}

func MountInfoUnder(string) ([]MountEntry, error) { return nil, nil }
func ResidentBytes(string) (int64, error)         { return 0, errdefs.ErrNotSupported }
func IsNoSpace(error) bool                        { return false }
