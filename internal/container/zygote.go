package container

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/dsec-dev/dsec/internal/guest/setup"
	"github.com/dsec-dev/dsec/internal/sys"
)

// zygote is the node's end of `dsec-guest zygote` (see setup.Zygote):
// the small process that forks sandboxes, so that a create does not copy
// the node's page tables, which grow with every sandbox it tracks. It is
// started from a forker thread, so it lives in the forker's small mount
// namespace, and exits when its connection closes.
//
// Locking: mu serialises requests (one in flight: a fork is ~1 ms) and
// guards conn.
type zygote struct {
	mu   sync.Mutex
	conn *net.UnixConn
	pid  int
	done chan struct{} // closed when the process has exited
}

// startZygote starts a zygote from bin (a dsec-guest binary, open) on a
// forker thread joined to the node's network namespace.
func startZygote(f *forker, bin *os.File) (*zygote, error) {
	fds, err := sys.Socketpair(syscall.SOCK_SEQPACKET)
	if err != nil {
		return nil, fmt.Errorf("making the zygote's connection: %w", err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "zygote"), os.NewFile(uintptr(fds[1]), "zygote")
	defer theirs.Close()
	c, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		return nil, err
	}
	host, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		c.Close()
		return nil, err
	}
	defer host.Close()
	cmd := exec.Command("/proc/self/fd/4", "zygote")
	cmd.Args[0] = "dsec-guest"
	cmd.Env = []string{"GOMAXPROCS=1"}
	cmd.Dir = "/"
	cmd.Stderr = os.Stderr
	cmd.ExtraFiles = []*os.File{theirs, bin}
	if err := f.fork(host, 0, cmd.Start); err != nil {
		c.Close()
		return nil, fmt.Errorf("starting the zygote: %w", err)
	}
	z := &zygote{conn: c.(*net.UnixConn), pid: cmd.Process.Pid, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(z.done)
	}()
	return z, nil
}

// errRefused is the zygote's own answer that it could not start a
// process: the connection is still in step.
var errRefused = errors.New("refused")

// start asks the zygote for a sandbox's first process; files are in
// setup.ZygoteFD* order. It returns the process's pid, its pidfd (nil
// from a zygote too old to send one) and the owner uid the zygote gave
// its user namespace. An error that is not the zygote's answer (wrapping
// errRefused) leaves requests and answers out of step: the caller must
// drop the zygote, and never hand the same descriptors to another
// process (see Runtime.fork). A process the zygote forked for a request
// whose answer did not arrive exits by itself: its config pipe closes
// unread; the zygote kills one whose answer it could not send.
func (z *zygote) start(ctx context.Context, req setup.ZygoteRequest, files []*os.File) (int, *sys.Pidfd, int, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return 0, nil, 0, err
	}
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(30 * time.Second)
	}
	_ = z.conn.SetDeadline(deadline)
	// A datagram of a SOCK_SEQPACKET socket is sent whole or not at all.
	if _, _, err := z.conn.WriteMsgUnix(b, sys.UnixRights(fds...), nil); err != nil {
		return 0, nil, 0, fmt.Errorf("asking the zygote: %w", err)
	}
	buf := make([]byte, 4096)
	oob := make([]byte, sys.CmsgSpace(4))
	n, oobn, _, _, err := z.conn.ReadMsgUnix(buf, oob)
	child, ferr := answerPidfd(oob[:oobn])
	if err == nil && n == 0 {
		err = errors.New("it closed its connection")
	}
	if err == nil {
		err = ferr
	}
	var r setup.ZygoteReply
	if err == nil {
		err = json.Unmarshal(buf[:n], &r)
	}
	if err != nil {
		if child != nil {
			child.Close()
		}
		return 0, nil, 0, fmt.Errorf("the zygote's answer: %w", err)
	}
	if r.Err != "" {
		if child != nil {
			child.Close()
		}
		return 0, nil, 0, fmt.Errorf("%w: %s", errRefused, r.Err)
	}
	return r.Pid, child, r.Owner, nil
}

// answerPidfd returns the pidfd an answer carries (nil if none).
func answerPidfd(oob []byte) (*sys.Pidfd, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := sys.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, m := range msgs {
		got, err := sys.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		fds = append(fds, got...)
	}
	if len(fds) != 1 {
		for _, fd := range fds {
			_ = sys.CloseFd(fd)
		}
		if len(fds) == 0 {
			return nil, nil
		}
		return nil, fmt.Errorf("%d descriptors with one answer", len(fds))
	}
	return sys.PidfdFromFD(fds[0]), nil
}

// close ends the zygote (it exits when its connection closes) and waits
// for it, killing it after a second.
func (z *zygote) close() {
	z.mu.Lock()
	z.conn.Close()
	z.mu.Unlock()
	select {
	case <-z.done:
	case <-time.After(time.Second):
		_ = sys.Kill(z.pid, syscall.SIGKILL)
		<-z.done
	}
}

// zygoteFor returns the runtime's zygote, starting one from bin (the
// agent binary of the sandbox being created) if there is none; nil if
// the zygote is off or cannot start (an older agent without one): the
// node then forks itself.
func (r *Runtime) zygoteFor(bin *os.File) *zygote {
	r.zmu.Lock()
	defer r.zmu.Unlock()
	if r.opt.NoZygote || r.zygoteFailed {
		return nil
	}
	if r.zygote == nil {
		z, err := startZygote(r.forker, bin)
		if err != nil {
			r.log.Warn("no zygote: the node forks sandboxes itself", "err", err)
			r.zygoteFailed = true
			return nil
		}
		r.zygote = z
	}
	return r.zygote
}

// dropZygote forgets z (dead) so that the next create starts another.
func (r *Runtime) dropZygote(z *zygote) {
	r.zmu.Lock()
	if r.zygote == z {
		r.zygote = nil
	}
	r.zmu.Unlock()
	z.close()
}
