//go:build !linux

package sys

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

func MountTmpfs(source, target, options string) error {
	return fmt.Errorf("mounting tmpfs on %s: %w", target, errdefs.ErrNotSupported)
}

func Unmount(string) error            { return nil }
func DetachMount(string) error        { return nil }
func IsTmpfsRoot(string) bool         { return false }
func UsedBytes(string) (int64, error) { return 0, errdefs.ErrNotSupported }

// FSUsage is what statfs says of a file system.
type FSUsage struct {
	Used, Size, Free int64
	FreeInodes       uint64
}

func (u FSUsage) Full() bool { return false }

func StatFS(string) (FSUsage, error) { return FSUsage{}, errdefs.ErrNotSupported }

func Reserve(uint64) ([]byte, error) { return nil, errdefs.ErrNotSupported }
func Unreserve([]byte)               {}
func DropPages([]byte) error         { return errdefs.ErrNotSupported }

func CloneMount(path string) (*os.File, error) {
	return nil, fmt.Errorf("cloning the mount at %s: %w", path, errdefs.ErrNotSupported)
}
func MoveMount(int, string) error { return errdefs.ErrNotSupported }

func MountErofs(meta, blob, target string) error {
	return fmt.Errorf("mounting erofs on %s: %w", target, errdefs.ErrNotSupported)
}

func MountOverlay(target string, lowers []string, upper, work string) error {
	return fmt.Errorf("mounting overlay on %s: %w", target, errdefs.ErrNotSupported)
}

func MountOverlayByFD(target string, lowers []string, upper, work string) error {
	return MountOverlay(target, lowers, upper, work)
}

func MountsUnder(string) ([]string, error) { return nil, nil }

func IDMappedClone(source, target string, usernsFd int) error {
	return fmt.Errorf("id-mapped mounts: %w", errdefs.ErrNotSupported)
}

func NewUserns(hostUID, hostGID, count int) (int, error) {
	return -1, fmt.Errorf("user namespaces: %w", errdefs.ErrNotSupported)
}

func CloseFd(fd int) error { return nil }

func EnsureTmpfs(source, dir, options string) (bool, error) { return false, nil }
func UnmountTmpfsIfEmpty(dir string) error                  { return nil }

func SetNofile(pid int, n uint64) error {
	return fmt.Errorf("rlimits: %w", errdefs.ErrNotSupported)
}

type Bind struct {
	Path      string
	Recursive bool
}

func EnterSmallMountNS(string, []Bind) error { return errdefs.ErrNotSupported }
func SetThreadNetns(*os.File) error          { return errdefs.ErrNotSupported }

func SetLinkUp(string) error { return errdefs.ErrNotSupported }

func SetHostnameIn(*os.File, string) error { return errdefs.ErrNotSupported }
func RenameNoReplace(string, string) error { return errdefs.ErrNotSupported }

func InMountNS(*os.File, func() error) error { return errdefs.ErrNotSupported }
func SetRootReadOnly(bool) error             { return errdefs.ErrNotSupported }
func BindWritable(string, int, int) error    { return errdefs.ErrNotSupported }
func UnmountPath(string) error               { return errdefs.ErrNotSupported }
func CheckBindable(string) error             { return errdefs.ErrNotSupported }

// UnbindableError is ReplaceWritable's error for a path it cannot bind.
type UnbindableError struct {
	Path string
	Err  error
}

func (e *UnbindableError) Error() string { return e.Path + ": " + e.Err.Error() }
func (e *UnbindableError) Unwrap() error { return e.Err }

func ReplaceWritable([]string, []string, int, int) error { return errdefs.ErrNotSupported }
func SetMountReadOnly(string, bool) error                { return errdefs.ErrNotSupported }

func CloneFile(dst, src string, perm os.FileMode) (bool, error) {
	return false, fmt.Errorf("cloning %s: %w", src, errdefs.ErrNotSupported)
}

func MountFUSE(dir, subtype string) (*os.File, error) {
	return nil, fmt.Errorf("mounting fuse at %s: %w", dir, errdefs.ErrNotSupported)
}

// RunContained needs Linux namespaces.
func RunContained(cmd *exec.Cmd) error {
	return fmt.Errorf("running %s contained: %w", cmd.Path, errdefs.ErrNotSupported)
}

// ExitWatch notices the end of one process (Linux only).
type ExitWatch struct{}

func WatchExit(int) (*ExitWatch, error)                     { return nil, errdefs.ErrNotSupported }
func (*ExitWatch) Wait() error                              { return errdefs.ErrNotSupported }
func (*ExitWatch) Status() (ws syscall.WaitStatus, ok bool) { return 0, false }
func (*ExitWatch) Pid() int                                 { return 0 }
func (*ExitWatch) Close() error                             { return nil }
func SignalName(s syscall.Signal) string                    { return "" }
