//go:build !linux

package sys

import "github.com/dsec-dev/dsec/internal/errdefs"

func ThreadCPUs() ([]int, error) { return nil, errdefs.ErrNotSupported }

func SetThreadCPUs([]int) error { return errdefs.ErrNotSupported }

func UnpinThreads() error { return errdefs.ErrNotSupported }
