package setup

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"

	"github.com/dsec-dev/dsec/internal/sys"
)

// receiveRoot is a deferred setup's wait: it tells the node it waits
// (Waiting on conn, the node's first connection), then reads the root
// message (see RootMessage) and takes its fields into cfg. It returns the
// root's descriptor.
func receiveRoot(conn *net.UnixConn, cfg *SandboxConfig) (int, error) {
	if conn == nil {
		return 0, errors.New("no connection to the node")
	}
	if _, err := conn.Write([]byte{Waiting}); err != nil {
		return 0, err
	}
	var head [4]byte
	oob := make([]byte, sys.CmsgSpace(4))
	n, oobn, _, _, err := conn.ReadMsgUnix(head[:], oob)
	if err != nil {
		return 0, err
	}
	fd, err := oneRight(oob[:oobn])
	if err != nil {
		return 0, err
	}
	if _, err := io.ReadFull(conn, head[n:]); err != nil {
		_ = sys.CloseFd(fd)
		return 0, err
	}
	size := binary.BigEndian.Uint32(head[:])
	if size > maxRootMessage {
		_ = sys.CloseFd(fd)
		return 0, fmt.Errorf("a root message of %d bytes", size)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(conn, b); err != nil {
		_ = sys.CloseFd(fd)
		return 0, err
	}
	if err := cfg.takeRoot(b); err != nil {
		_ = sys.CloseFd(fd)
		return 0, err
	}
	sys.CloseOnExec(fd)
	return fd, nil
}

// oneRight returns the one descriptor control data b carries.
func oneRight(b []byte) (int, error) {
	msgs, err := sys.ParseSocketControlMessage(b)
	if err != nil {
		return 0, err
	}
	var fds []int
	for i := range msgs {
		if msgs[i].Header.Type != syscall.SCM_RIGHTS {
			continue
		}
		got, err := sys.ParseUnixRights(&msgs[i])
		if err != nil {
			return 0, err
		}
		fds = append(fds, got...)
	}
	if len(fds) != 1 {
		for _, fd := range fds {
			_ = sys.CloseFd(fd)
		}
		return 0, fmt.Errorf("the root message carried %d descriptors, not 1", len(fds))
	}
	return fds[0], nil
}
