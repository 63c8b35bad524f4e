package testenv

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/dsec-dev/dsec/internal/sys"
)

// hostNet is this process's hold on the host-network lock.
var hostNet struct {
	mu     sync.Mutex // guards following fields
	n      int
	unlock func()
}

// LockHostNet keeps other test processes from changing the host's network
// the way t is about to until t ends: the packages' tests that put
// documentation addresses (198.51.100.0/24, 192.0.2.0/24) or
// 169.254.169.254 on host veths or routes run concurrently under `go
// test ./...`, and would answer for each other. The lock is an flock
// shared by every process; within one process it is counted (a test may
// take it more than once).
func LockHostNet(t testing.TB) {
	t.Helper()
	hostNet.mu.Lock()
	defer hostNet.mu.Unlock()
	if hostNet.n == 0 {
		unlock, err := sys.LockFile(context.Background(), filepath.Join(os.TempDir(), "dsec-test-hostnet.lock"))
		if err != nil {
			t.Fatalf("locking the host network for the test: %v", err)
		}
		hostNet.unlock = unlock
	}
	hostNet.n++
	t.Cleanup(func() {
		hostNet.mu.Lock()
		defer hostNet.mu.Unlock()
		if hostNet.n--; hostNet.n == 0 {
			hostNet.unlock()
		}
	})
}
