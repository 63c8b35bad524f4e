package sys

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// SetNofile sets process pid's RLIMIT_NOFILE, soft and hard, to n. The
// node sets it on a sandbox's first process: raising a hard limit needs
// CAP_SYS_RESOURCE in the initial user namespace, which the sandbox never
// has.
func SetNofile(pid int, n uint64) error {
	lim := unix.Rlimit{Cur: n, Max: n}
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &lim, nil); err != nil {
		return fmt.Errorf("setting the open files limit of %d: %w", pid, err)
	}
	return nil
}
