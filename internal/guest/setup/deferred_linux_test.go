package setup

import (
	"encoding/binary"
	"net"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/dsec-dev/dsec/internal/sys"
)

// rootPair is a connected pair of unix stream sockets: the node's end
// and a deferred setup's.
func rootPair(t *testing.T) (node, guest *net.UnixConn) {
	t.Helper()
	fds, err := sys.Socketpair(syscall.SOCK_STREAM)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "pair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// TestReceiveRoot: a deferred setup says it waits, then takes the root
// message's fields and its one descriptor; a message without a
// descriptor, one naming no root, and one longer than the bound are
// refused.
func TestReceiveRoot(t *testing.T) {
	node, guest := rootPair(t)
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	devNull := int(f.Fd()) // once: Fd changes the file's state
	msg, err := RootMessage(SandboxConfig{Rootfs: "/s/x/root", SockDir: "/s/x/sock", Hostname: "x", Hosts: "h\n", ResolvConf: "r\n", Env: []string{"A=b"}, ShmBytes: 5})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	cfg := SandboxConfig{Deferred: true, Rootfs: "/warm/root", KeepCaps: []int{3}}
	var fd int
	go func() {
		var err error
		fd, err = receiveRoot(guest, &cfg)
		got <- err
	}()
	var b [1]byte
	if _, err := node.Read(b[:]); err != nil || b[0] != Waiting {
		t.Fatalf("the setup said %q, %v", b[0], err)
	}
	if _, _, err := node.WriteMsgUnix(msg, sys.UnixRights(devNull), nil); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil { // bounded: the message is written above
		t.Fatal(err)
	}
	defer sys.CloseFd(fd)
	var st, want syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Fstat(devNull, &want); err != nil {
		t.Fatal(err)
	}
	if st.Ino != want.Ino || st.Rdev != want.Rdev {
		t.Error("the descriptor received is not the one sent")
	}
	if cfg.Rootfs != "/s/x/root" || cfg.SockDir != "/s/x/sock" || cfg.Hostname != "x" || cfg.Hosts != "h\n" ||
		cfg.ResolvConf != "r\n" || !slices.Equal(cfg.Env, []string{"A=b"}) || cfg.ShmBytes != 5 || !slices.Equal(cfg.KeepCaps, []int{3}) {
		t.Errorf("config after the root message: %+v", cfg)
	}

	bad := map[string]func(node *net.UnixConn) error{
		"no descriptor": func(node *net.UnixConn) error { _, err := node.Write(msg); return err },
		"no root": func(node *net.UnixConn) error {
			m, _ := RootMessage(SandboxConfig{SockDir: "/s"})
			_, _, err := node.WriteMsgUnix(m, sys.UnixRights(devNull), nil)
			return err
		},
		"too long": func(node *net.UnixConn) error {
			m := binary.BigEndian.AppendUint32(nil, maxRootMessage+1)
			_, _, err := node.WriteMsgUnix(m, sys.UnixRights(devNull), nil)
			return err
		},
	}
	for name, send := range bad {
		node, guest := rootPair(t)
		go func() {
			var b [1]byte
			_, _ = node.Read(b[:])
			_ = send(node)
		}()
		var c SandboxConfig
		fd, err := receiveRoot(guest, &c)
		if err == nil {
			sys.CloseFd(fd)
			t.Errorf("%s: received", name)
		} else if strings.Contains(err.Error(), "EOF") {
			t.Errorf("%s: %v (the message was not read)", name, err)
		}
	}
}
