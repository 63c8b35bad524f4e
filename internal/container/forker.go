package container

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"

	"github.com/dsec-dev/dsec/internal/sys"
)

// forker forks sandboxes' first processes from threads that live in a
// small mount namespace of their own (see sys.EnterSmallMountNS). A new
// mount namespace starts as a copy of its parent's whole mount table:
// forked from the host's, each sandbox paid for every mount on the node
// (~3 µs each here; with 1,000 sandboxes' roots in the table, 9.5 ms a
// create, a quarter of it with only their network namespaces left). The
// small namespace holds what the first process needs before it pivots
// into its root, at the host's paths: /proc, /dev, /sys (each without its
// submounts) and the state
// directory (its socket directory and root mount point). The agent
// binary is executed through a descriptor; the root arrives as one.
//
// Each thread is locked for life: it does not share the process's root
// and working directory any more, so no other goroutine may run on it.
type forker struct {
	mountpoint string
	binds      []sys.Bind

	reqs chan forkReq
	stop chan struct{}
	wg   sync.WaitGroup

	mu      sync.Mutex // guards the following fields
	tids    []int      // the forking threads' ids (for tests)
	closing bool       // close has begun: no thread may start
}

type forkReq struct {
	netns *os.File     // the namespace the process starts in
	owner int          // the thread's effective uid for start (0: its own)
	start func() error // forks it (exec.Cmd.Start)
	done  chan error
}

// newForker starts n forking threads; stateDir holds the mount point of
// their namespace's root and the sandboxes' directories.
func newForker(n int, stateDir string) (*forker, error) {
	f := &forker{
		mountpoint: filepath.Join(stateDir, "forker"),
		// /sys without its submounts (cgroup hierarchies, debugfs, …):
		// sandboxes mask those paths anyway, and each submount was one
		// more mount every sandbox copied and tore down.
		binds: []sys.Bind{{Path: "/proc"}, {Path: "/dev"}, {Path: "/sys"},
			{Path: filepath.Join(stateDir, "sandboxes")}},
		reqs: make(chan forkReq),
		stop: make(chan struct{}),
	}
	if err := os.MkdirAll(f.mountpoint, 0o700); err != nil {
		return nil, err
	}
	for range n {
		if err := f.spawn(); err != nil {
			f.close()
			return nil, err
		}
	}
	return f, nil
}

// spawn starts one forking thread and waits until it is ready.
func (f *forker) spawn() error {
	ready := make(chan error, 1)
	// Add before Wait, never during it: a replacement thread may start
	// while close runs.
	f.mu.Lock()
	if f.closing {
		f.mu.Unlock()
		return errClosed()
	}
	f.wg.Add(1)
	f.mu.Unlock()
	go func() {
		defer f.wg.Done()
		runtime.LockOSThread() // never unlocked: the thread dies with us
		if sys.Gettid() == os.Getpid() {
			// The main thread: /proc/self shows its mount namespace to
			// the whole process. Holding it, start again elsewhere.
			ready <- f.spawn()
			runtime.UnlockOSThread()
			return
		}
		host, err := os.Open("/proc/thread-self/ns/net")
		if err == nil {
			defer host.Close()
			err = sys.EnterSmallMountNS(f.mountpoint, f.binds)
		}
		if err == nil {
			f.mu.Lock()
			f.tids = append(f.tids, sys.Gettid())
			f.mu.Unlock()
		}
		ready <- err
		if err != nil {
			return
		}
		f.serve(host)
	}()
	return <-ready
}

func (f *forker) serve(host *os.File) {
	for {
		select {
		case <-f.stop:
			return
		case r := <-f.reqs:
			err := sys.SetThreadNetns(r.netns)
			if err == nil {
				stuck := false
				if r.owner != 0 {
					stuck, err = sys.WithThreadEUID(r.owner, r.start)
				} else {
					err = r.start()
				}
				rerr := errors.New("its effective uid is not its own")
				if !stuck {
					rerr = sys.SetThreadNetns(host)
				}
				if rerr != nil {
					// This thread is in a sandbox's network, or runs as
					// another uid: replace it.
					r.done <- errors.Join(err, fmt.Errorf("forker: back to the host's network and uid: %w", rerr))
					go func() { _ = f.spawn() }() // refused once closing
					return
				}
			}
			r.done <- err
		}
	}
}

// fork runs start on a forking thread joined to netns, with owner (if
// not 0) as its effective uid (see sys.WithThreadEUID).
func (f *forker) fork(netns *os.File, owner int, start func() error) error {
	r := forkReq{netns: netns, owner: owner, start: start, done: make(chan error, 1)}
	select {
	case f.reqs <- r:
	case <-f.stop:
		return errClosed()
	}
	return <-r.done
}

func (f *forker) close() {
	f.mu.Lock()
	first := !f.closing
	f.closing = true
	f.mu.Unlock()
	if first {
		close(f.stop)
	}
	f.wg.Wait()
}
