package sys

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// holdEnv makes a re-executed copy of the running binary wait for its
// stdin to close and exit: the short-lived owner of a user namespace.
const holdEnv = "_DSEC_SYS_HOLD_USERNS"

func init() {
	// Runs in every binary that links this package (dsec, its tests). A Go
	// process cannot unshare a user namespace itself (it is
	// multi-threaded), so NewUserns starts a copy of the binary in one.
	if os.Getenv(holdEnv) == "1" {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}
}

// NewUserns returns an open user namespace mapping ids 0..count-1 to
// hostUID.. and hostGID.. on the host: what id-mapped mounts need. The
// caller closes it.
func NewUserns(hostUID, hostGID, count int) (int, error) {
	exe, err := os.Executable()
	if err != nil {
		return -1, fmt.Errorf("creating a user namespace: %w", err)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return -1, err
	}
	defer pr.Close()
	defer pw.Close()
	cmd := exec.Command(exe)
	cmd.Env = []string{holdEnv + "=1"}
	cmd.Stdin = pr
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: hostUID, Size: count}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: hostGID, Size: count}},
	}
	if err := cmd.Start(); err != nil {
		return -1, fmt.Errorf("creating a user namespace: %w", err)
	}
	fd, err := unix.Open("/proc/"+strconv.Itoa(cmd.Process.Pid)+"/ns/user", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	pw.Close()
	werr := cmd.Wait()
	if err != nil {
		return -1, fmt.Errorf("opening the user namespace: %w", err)
	}
	if werr != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("user namespace holder: %w", werr)
	}
	return fd, nil
}

// CloseFd closes a raw file descriptor.
func CloseFd(fd int) error { return unix.Close(fd) }
