package container

import (
	"context"
	"errors"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/guest"
)

// TestZygoteRetryOnlyUnsent: a fork whose request the zygote received
// but did not answer in time (a busy node) must not be asked of another
// zygote with the same descriptors, since the first may still fork it;
// one that never left may. Before, both were retried once, and under
// load two processes could share one sandbox's config pipe and
// connection.
func TestZygoteRetryOnlyUnsent(t *testing.T) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "zygote"), os.NewFile(uintptr(fds[1]), "zygote-peer")
	c, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		t.Fatal(err)
	}
	z := &zygote{conn: c.(*net.UnixConn), done: make(chan struct{})}
	close(z.done) // no process: close must not wait for or kill one
	defer z.close()
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	// The peer takes the request and never answers.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = z.start(ctx, guest.ZygoteRequest{}, []*os.File{f})
	if err == nil {
		t.Fatal("a request nobody answered succeeded")
	}
	if retryFork(err) {
		t.Errorf("a request the zygote received but did not answer (%v) would be retried with the same descriptors", err)
	}
	buf := make([]byte, 4096)
	oob := make([]byte, syscall.CmsgSpace(4))
	_ = syscall.SetNonblock(fds[1], true)
	if n, _, _, _, err := syscall.Recvmsg(fds[1], buf, oob, 0); err != nil || n == 0 {
		t.Fatalf("the peer did not get the request: %d bytes, %v", n, err)
	}

	// The peer is gone: the request cannot leave.
	theirs.Close()
	_, err = z.start(context.Background(), guest.ZygoteRequest{}, []*os.File{f})
	if err == nil || !retryFork(err) {
		t.Errorf("a request that could not be sent: %v, want one another zygote may be asked", err)
	}
}

// TestStartErrorClass: a start that failed because its deadline ran out
// (a node starting too much at once) is a retryable 503 with a retry
// hint; one that failed in time is an internal error, as before.
func TestStartErrorClass(t *testing.T) {
	cause := errors.New("the agent did not answer")
	expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	err := startError(expired, "sb-1", cause)
	if !errors.Is(err, errdefs.Unavailable) || errdefs.CodeOf(err) != CodeStartTimeout || errdefs.RetryAfterOf(err) <= 0 || !errors.Is(err, cause) {
		t.Errorf("start past its deadline: %v (%s, retry %v), want unavailable %s with a retry hint", err, errdefs.CodeOf(err), errdefs.RetryAfterOf(err), CodeStartTimeout)
	}
	err = startError(context.Background(), "sb-1", cause)
	if !errors.Is(err, errdefs.Internal) || errdefs.CodeOf(err) != "sandbox_start_failed" {
		t.Errorf("start failed in time: %v (%s), want internal sandbox_start_failed", err, errdefs.CodeOf(err))
	}
}
