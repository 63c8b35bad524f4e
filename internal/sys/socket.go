package sys

import "syscall"

// Ucred is a Unix socket peer's credentials (SO_PEERCRED), as seen from
// this process's namespaces: Pid is 0 when the peer's process has no pid
// in this process's pid namespace (it lives in an ancestor namespace), and
// Uid/Gid are the overflow ids (65534) when they do not map into this
// process's user namespace.
type Ucred struct {
	Pid int32
	Uid uint32
	Gid uint32
}

// Descriptor passing over Unix sockets (SCM_RIGHTS): building and
// reading the control messages that carry them.

// CmsgSpace is the room a control message of datalen bytes takes (a
// descriptor is 4).
func CmsgSpace(datalen int) int { return syscall.CmsgSpace(datalen) }

// UnixRights is the control message that passes fds.
func UnixRights(fds ...int) []byte { return syscall.UnixRights(fds...) }

// ParseSocketControlMessage splits b, received control data, into its
// messages.
func ParseSocketControlMessage(b []byte) ([]syscall.SocketControlMessage, error) {
	return syscall.ParseSocketControlMessage(b)
}

// ParseUnixRights returns the descriptors an SCM_RIGHTS message m
// carries (now open in this process); it fails for any other message.
func ParseUnixRights(m *syscall.SocketControlMessage) ([]int, error) {
	return syscall.ParseUnixRights(m)
}
