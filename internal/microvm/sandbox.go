package microvm

import (
	"context"
	"errors"
	"os"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/agentproto"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/vmm"
)

// shutdownGrace is how long Destroy lets the guest power off after an
// ACPI power button press before QEMU is told to quit (then killed). The
// guest keeps nothing worth a clean shutdown: its root is a tmpfs.
const shutdownGrace = 100 * time.Millisecond

// Sandbox is one microVM sandbox.
type Sandbox struct {
	id   string
	rt   *Runtime
	spec sandbox.Spec
	dir  string
	vm   *vmm.VM
	// netns is its network namespace's path (network.Endpoint.NetnsPath),
	// empty if it has no NIC.
	netns string
	// timing is its Create's (zero if recovered).
	timing Timing

	mu        sync.Mutex // guards following fields
	client    *agentproto.Client
	release   func() // the layers' references
	unjail    func() // the cgroup and uid of the Jail (nil without)
	destroyed bool
}

// ID implements sandbox.Sandbox.
func (s *Sandbox) ID() string { return s.id }

// Pid is QEMU's process id.
func (s *Sandbox) Pid() int { return s.vm.Pid }

// RunDir is the VM's run directory.
func (s *Sandbox) RunDir() string { return s.dir }

func (s *Sandbox) agent() (*agentproto.Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.destroyed || s.client == nil {
		return nil, sandbox.ErrGone(s.id)
	}
	return s.client, nil
}

// Exec implements sandbox.Sandbox.
func (s *Sandbox) Exec(ctx context.Context, req sandbox.ExecRequest) (api.ExecResult, error) {
	c, err := s.agent()
	if err != nil {
		return api.ExecResult{}, err
	}
	argv, err := sandbox.Argv(s.rt.Tier(), s.rt.Capabilities(), &req)
	if err != nil {
		return api.ExecResult{}, err
	}
	out := agentproto.OutputTo(req.Stdout, req.Stderr)
	return c.Exec(ctx, agentproto.ExecRequestFrom(argv, req), out)
}

// Stats implements sandbox.Sandbox with what the agent measures in the
// guest (this slice has no host-side measure of a VM).
func (s *Sandbox) Stats(ctx context.Context) (sandbox.Stats, error) {
	c, err := s.agent()
	if err != nil {
		return sandbox.Stats{}, err
	}
	st, err := c.Stats(ctx)
	if err != nil {
		return sandbox.Stats{}, err
	}
	return sandbox.Stats{
		MemoryBytes:      st.MemTotalBytes - st.MemAvailableBytes,
		MemoryLimitBytes: st.MemTotalBytes,
		Processes:        st.Processes,
	}, nil
}

// Destroy implements sandbox.Sandbox: it closes the agent's connection,
// stops QEMU (power button, quit, then SIGKILL: vmm.VM.Shutdown), and
// removes the network (tc redirects, namespace, nftables elements), the
// run directory and the layers' references.
func (s *Sandbox) Destroy(ctx context.Context) error {
	s.mu.Lock()
	if s.destroyed {
		s.mu.Unlock()
		return nil
	}
	s.destroyed = true
	c, release, unjail := s.client, s.release, s.unjail
	s.client, s.release, s.unjail = nil, nil, nil
	s.mu.Unlock()
	if c != nil {
		c.Close()
	}
	err := s.vm.Shutdown(ctx)
	if err == nil {
		// QEMU is gone, and its tap with it: the network goes.
		err = errors.Join(s.rt.releaseNetwork(ctx, s.id, s.netns), os.RemoveAll(s.dir))
	}
	if release != nil {
		release()
	}
	if unjail != nil {
		unjail() // kills whatever of QEMU is left in its cgroup
	}
	s.rt.mu.Lock()
	if s.rt.sandboxes[s.id] == s {
		delete(s.rt.sandboxes, s.id)
	}
	s.rt.mu.Unlock()
	return err
}

// detach forgets the sandbox without stopping its VM (Runtime.Close).
func (s *Sandbox) detach() {
	s.mu.Lock()
	c := s.client
	s.client, s.destroyed = nil, true
	s.mu.Unlock()
	if c != nil {
		c.Close()
	}
	s.vm.Release()
}
