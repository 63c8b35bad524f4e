package sys

import (
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// PeerCred returns the credentials of the process at the other end of a
// connected Unix socket (SO_PEERCRED, recorded by the kernel at connect
// time and translated into this process's namespaces when asked).
func PeerCred(c syscall.Conn) (Ucred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return Ucred{}, fmt.Errorf("peer credentials: %w", err)
	}
	var (
		uc   *unix.Ucred
		uerr error
	)
	if err := rc.Control(func(fd uintptr) {
		uc, uerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return Ucred{}, fmt.Errorf("peer credentials: %w", err)
	}
	if uerr != nil {
		return Ucred{}, fmt.Errorf("peer credentials: %w", uerr)
	}
	return Ucred{Pid: uc.Pid, Uid: uc.Uid, Gid: uc.Gid}, nil
}

// NetlinkRoute is the rtnetlink protocol number (NETLINK_ROUTE), for
// netlink handles opened outside this package.
const NetlinkRoute = unix.NETLINK_ROUTE

// ForceSocketBuffers sets a socket's send and receive buffers to n bytes
// even above net.core.{w,r}mem_max (SO_SNDBUFFORCE, SO_RCVBUFFORCE; needs
// CAP_NET_ADMIN): a netlink batch must fit the send buffer in one piece.
func ForceSocketBuffers(rc syscall.RawConn, n int) error {
	var serr error
	err := rc.Control(func(fd uintptr) {
		if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, n); serr == nil {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, n)
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("setting socket buffers to %d bytes: %w", n, err)
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

// Socketpair returns a connected pair of Unix sockets of type typ
// (syscall.SOCK_STREAM, syscall.SOCK_SEQPACKET…), both close-on-exec.
func Socketpair(typ int) ([2]int, error) {
	return unix.Socketpair(unix.AF_UNIX, typ|unix.SOCK_CLOEXEC, 0)
}
