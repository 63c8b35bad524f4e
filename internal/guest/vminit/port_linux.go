package vminit

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dsec-dev/dsec/internal/guest/agent"
)

// portPoll is how often a listener looks whether the host has connected
// to the port: a read of a port the host is not connected to returns EOF
// at once, and package syscall has no poll(2) to wait for POLLHUP to end.
const portPoll = 10 * time.Millisecond

// findPort waits up to timeout for the virtio-serial port named name
// (/sys/class/virtio-ports/*/name; the host announces ports after the
// driver probes the device) and its /dev node, and returns the node.
func findPort(name string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		names, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
		for _, n := range names {
			if b, err := os.ReadFile(n); err == nil && strings.TrimSpace(string(b)) == name {
				dev := "/dev/" + filepath.Base(filepath.Dir(n))
				if _, err := os.Stat(dev); err == nil {
					return dev, nil
				}
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no virtio-serial port %q after %v", name, timeout)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// portListener is a net.Listener over a virtio-serial port: a byte
// stream with one peer, the host. It yields one connection at a time:
// Accept waits until the previous connection is closed (the agent closes
// it when the host disconnects and reads see EOF), reopens the port and
// returns once the host has sent its first bytes.
type portListener struct {
	path   string
	free   chan struct{} // holds a token while no connection is open
	closed chan struct{}
	once   sync.Once

	mu sync.Mutex // guards f
	f  *os.File   // the port while Accept waits on it
}

func newPortListener(path string) *portListener {
	l := &portListener{path: path, free: make(chan struct{}, 1), closed: make(chan struct{})}
	l.free <- struct{}{}
	return l
}

// Accept implements net.Listener.
func (l *portListener) Accept() (net.Conn, error) {
	select {
	case <-l.free:
	case <-l.closed:
		return nil, net.ErrClosed
	}
	c, err := l.open()
	if err != nil {
		l.free <- struct{}{}
		return nil, err
	}
	return c, nil
}

func (l *portListener) open() (net.Conn, error) {
	f, err := os.OpenFile(l.path, os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.f = f
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.f = nil
		l.mu.Unlock()
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			return &portConn{f: f, pending: buf[:n], l: l}, nil
		}
		if err != nil && !errors.Is(err, io.EOF) {
			f.Close()
			select {
			case <-l.closed:
				return nil, net.ErrClosed
			default:
				return nil, err
			}
		}
		// EOF: the host is not connected (yet, or any more).
		select {
		case <-l.closed:
			f.Close()
			return nil, net.ErrClosed
		case <-time.After(portPoll):
		}
	}
}

// Close implements net.Listener; the open connection, if any, stays.
func (l *portListener) Close() error {
	l.once.Do(func() {
		close(l.closed)
		l.mu.Lock()
		if l.f != nil {
			l.f.Close()
		}
		l.mu.Unlock()
	})
	return nil
}

// Addr implements net.Listener.
func (l *portListener) Addr() net.Addr { return portAddr(l.path) }

type portAddr string

func (a portAddr) Network() string { return "virtio-serial" }
func (a portAddr) String() string  { return string(a) }

// portConn is one connection over the port. It implements
// agent.PeerConn: its peer is the host.
type portConn struct {
	f       *os.File
	pending []byte // read by Accept; only Read uses it
	l       *portListener
	once    sync.Once
}

var _ agent.PeerConn = (*portConn)(nil)

func (c *portConn) Read(p []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	return c.f.Read(p)
}

func (c *portConn) Write(p []byte) (int, error) { return c.f.Write(p) }

func (c *portConn) Close() error {
	var err error
	c.once.Do(func() {
		err = c.f.Close()
		c.l.free <- struct{}{}
	})
	return err
}

func (c *portConn) LocalAddr() net.Addr                { return c.l.Addr() }
func (c *portConn) RemoteAddr() net.Addr               { return portAddr("host") }
func (c *portConn) SetDeadline(t time.Time) error      { return c.f.SetDeadline(t) }
func (c *portConn) SetReadDeadline(t time.Time) error  { return c.f.SetReadDeadline(t) }
func (c *portConn) SetWriteDeadline(t time.Time) error { return c.f.SetWriteDeadline(t) }

// PeerCred implements agent.PeerConn: the port's one peer is the host,
// outside the guest (pid 0 as agent.RequireOutsidePIDNamespace wants).
func (c *portConn) PeerCred() (agent.Peer, error) { return agent.Peer{}, nil }
