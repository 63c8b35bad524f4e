package testenv

import (
	"encoding/binary"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/sys"
)

// StuckFUSE is a FUSE file system that answers only the kernel's INIT
// and reads every later request without answering it, so a process that
// touches a path below Dir waits in uninterruptible sleep (state D) that
// neither a freezer nor SIGKILL ends, until Release. Tests use it to hold
// a task where a loaded host or a hung network file system would.
type StuckFUSE struct {
	Dir  string
	conn *os.File
	// Requests receives each request's opcode as it is read.
	Requests chan uint32
	once     sync.Once
	done     chan struct{}
}

// NewStuckFUSE mounts a StuckFUSE in a temporary directory; the test's
// cleanup releases it. It fails the test if FUSE is missing.
func NewStuckFUSE(t testing.TB) *StuckFUSE {
	t.Helper()
	dir := t.TempDir()
	conn, err := sys.MountFUSE(dir, "dsectest")
	if err != nil {
		t.Fatalf("FUSE (the kernel and /dev/fuse are needed): %v", err)
	}
	f := &StuckFUSE{Dir: dir, conn: conn, Requests: make(chan uint32, 64), done: make(chan struct{})}
	t.Cleanup(f.Release)
	if err := f.init(); err != nil {
		t.Fatalf("FUSE init: %v", err)
	}
	go f.serve()
	return f
}

// fuse_in_header is 40 bytes (len, opcode, unique, nodeid, uid, gid,
// pid, padding); INIT's body starts with the kernel's major and minor.
const fuseInHeader = 40

func (f *StuckFUSE) init() error {
	buf := make([]byte, 1<<17)
	_ = f.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := f.conn.Read(buf)
	_ = f.conn.SetReadDeadline(time.Time{})
	if err != nil {
		return err
	}
	if n < fuseInHeader+8 || binary.LittleEndian.Uint32(buf[4:]) != 26 { // FUSE_INIT
		return errors.New("the first request is not INIT")
	}
	// fuse_out_header (len, error, unique) and fuse_init_out: protocol
	// 7.31, one background request, 64 KiB writes.
	out := make([]byte, 16+64)
	binary.LittleEndian.PutUint32(out[0:], uint32(len(out)))
	copy(out[8:16], buf[8:16])
	binary.LittleEndian.PutUint32(out[16:], 7)
	binary.LittleEndian.PutUint32(out[20:], 31)
	binary.LittleEndian.PutUint16(out[32:], 1)
	binary.LittleEndian.PutUint16(out[34:], 1)
	binary.LittleEndian.PutUint32(out[36:], 1<<16)
	_, err = f.conn.Write(out)
	return err
}

// serve reads requests (which marks them sent, so a waiting task can no
// longer be interrupted) and never answers.
func (f *StuckFUSE) serve() {
	defer close(f.done)
	buf := make([]byte, 1<<17)
	for {
		n, err := f.conn.Read(buf)
		if err != nil {
			return
		}
		if n >= 8 {
			select {
			case f.Requests <- binary.LittleEndian.Uint32(buf[4:]):
			default:
			}
		}
	}
}

// Release aborts the file system (closing its connection fails every
// waiting request, so stuck tasks go on) and unmounts it.
func (f *StuckFUSE) Release() {
	f.once.Do(func() {
		_ = f.conn.Close()
		select {
		case <-f.done:
		case <-time.After(10 * time.Second):
		}
		_ = sys.DetachMount(f.Dir)
	})
}

// WaitRequest waits up to d for a request to reach the server; it
// reports whether one did.
func (f *StuckFUSE) WaitRequest(d time.Duration) bool {
	select {
	case <-f.Requests:
		return true
	case <-time.After(d):
		return false
	}
}
