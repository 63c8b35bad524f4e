package sys

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Bind is a path of the host kept in a small mount namespace (see
// EnterSmallMountNS), at the same path; Recursive takes its submounts too.
type Bind struct {
	Path      string
	Recursive bool
}

// EnterSmallMountNS moves the calling OS thread, which must be locked to
// its goroutine and stay locked for the rest of its life, into a mount
// namespace of its own whose root is a fresh tmpfs holding only binds of
// the given host paths. mountpoint is an existing host directory the
// tmpfs is built on (the host never sees it: every mount here is
// private). A process forked from the thread with CLONE_NEWNS copies this
// table of a few mounts instead of the host's, which grows with
// everything the node mounts.
func EnterSmallMountNS(mountpoint string, binds []Bind) error {
	// CLONE_FS: the thread stops sharing its root and working directory
	// with the process's other threads, which setns and pivot_root need.
	if err := unix.Unshare(unix.CLONE_FS | unix.CLONE_NEWNS); err != nil {
		if os.Geteuid() != 0 {
			return fmt.Errorf("unshare(CLONE_NEWNS): %w: %w", err, errdefs.ErrNotSupported)
		}
		return fmt.Errorf("unshare(CLONE_NEWNS): %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	if err := unix.Mount("dsec-forker", mountpoint, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=64k,mode=0755"); err != nil {
		return fmt.Errorf("mounting the small root: %w", err)
	}
	for _, b := range binds {
		fi, err := os.Stat(b.Path)
		if err != nil {
			return err
		}
		target := filepath.Join(mountpoint, b.Path)
		if fi.IsDir() {
			err = os.MkdirAll(target, 0o755)
		} else if err = os.MkdirAll(filepath.Dir(target), 0o755); err == nil {
			err = os.WriteFile(target, nil, 0o644)
		}
		if err != nil {
			return err
		}
		flags := uintptr(unix.MS_BIND)
		if b.Recursive {
			flags |= unix.MS_REC
		}
		if err := unix.Mount(b.Path, target, "", flags, ""); err != nil {
			return fmt.Errorf("binding %s: %w", b.Path, err)
		}
	}
	// pivot_root(".", ".") stacks the old root on the new one; detaching
	// it leaves only the new.
	if err := unix.Chdir(mountpoint); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detaching the host's root: %w", err)
	}
	return unix.Chdir("/")
}

// SetThreadNetns joins the calling OS thread (locked to its goroutine)
// to the network namespace ns.
func SetThreadNetns(ns *os.File) error {
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("setns(%s): %w", ns.Name(), err)
	}
	return nil
}

// SetLinkUp brings network interface name up in the calling thread's
// network namespace.
func SetLinkUp(name string) error { return setLinkFlags(name, unix.IFF_UP) }

// setLinkFlags adds flags to name's.
func setLinkFlags(name string, flags uint16) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("flags of %s: %w", name, err)
	}
	ifr.SetUint16(ifr.Uint16() | flags)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("setting the flags of %s: %w", name, err)
	}
	return nil
}
