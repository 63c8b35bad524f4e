//go:build !linux

package sys

import "github.com/dsec-dev/dsec/internal/errdefs"

func IsTmpfsRoot(string) bool { return false }

func StatFS(string) (FSUsage, error) { return FSUsage{}, errdefs.ErrNotSupported }

func UsedBytes(string) (int64, error) { return 0, errdefs.ErrNotSupported }

func IsNoSpace(error) bool { return false }
