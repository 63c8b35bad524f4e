package vmtier

import (
	"context"
	"errors"
	"os"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/agentsandbox"
	"github.com/dsec-dev/dsec/internal/guest/agentproto"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/vm/vmm"
)

// shutdownGrace is how long Destroy lets the guest power off after an
// ACPI power button press before QEMU is told to quit (then killed). The
// guest keeps nothing worth a clean shutdown: its root is a tmpfs.
const shutdownGrace = 100 * time.Millisecond

var (
	_ sandbox.Sandbox       = (*Sandbox)(nil)
	_ sandbox.ProcessRunner = (*Sandbox)(nil)
	_ sandbox.Phaser        = (*Sandbox)(nil)
)

// Sandbox is one microVM sandbox. It is safe for concurrent use.
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
	// upperDisk: its upper is a disk of its own (UpperDisk), which
	// snapshots can freeze; else a tmpfs in the guest.
	upperDisk bool

	// phaseMu guards phase. SetPhase holds it throughout; a command
	// holds it for reading until the agent has started it (holdPhase).
	phaseMu sync.RWMutex
	phase   *api.Phase // the current phase (nil without phases)

	// gone is closed when the sandbox is destroyed or detached: its
	// watch (liveness.go) ends.
	gone     chan struct{}
	goneOnce sync.Once

	agent *agentsandbox.Agent

	mu        sync.Mutex // guards following fields
	release   func()     // the layers' references
	unjail    func()     // the cgroup and uid of the Jail (nil without)
	destroyed bool
}

// ID implements sandbox.Sandbox.
func (s *Sandbox) ID() string { return s.id }

// Pid is QEMU's process id.
func (s *Sandbox) Pid() int { return s.vm.Pid }

// RunDir is the VM's run directory.
func (s *Sandbox) RunDir() string { return s.dir }

// Exec implements sandbox.Sandbox.
func (s *Sandbox) Exec(ctx context.Context, req sandbox.ExecRequest) (api.ExecResult, error) {
	if _, err := s.agent.Client(); err != nil {
		return api.ExecResult{}, err
	}
	p, release := s.holdPhase()
	defer release()
	cmd, err := s.agent.Command(&req, s.spec, p)
	if err != nil {
		return api.ExecResult{}, err
	}
	res, err := s.agent.Exec(ctx, cmd, req.Stdout, req.Stderr, release)
	res.Phase = phaseName(p)
	return res, err
}

// holdPhase returns the current phase and holds it (phaseMu, for
// reading) until release, which the caller calls once the agent has
// started the command: a phase change cannot fall between the command's
// user and its start, so a command never runs with an earlier phase's
// user or capabilities, and the next change kills it. release may be
// called more than once.
func (s *Sandbox) holdPhase() (p *api.Phase, release func()) {
	s.phaseMu.RLock()
	return s.phase, sync.OnceFunc(s.phaseMu.RUnlock)
}

func phaseName(p *api.Phase) string {
	if p == nil {
		return ""
	}
	return p.Name
}

// StartProcess implements sandbox.ProcessRunner: the guest's agent runs
// the process, as the container's does.
func (s *Sandbox) StartProcess(ctx context.Context, req sandbox.ExecRequest) (sandbox.Process, error) {
	return s.start(ctx, req, nil)
}

func (s *Sandbox) start(ctx context.Context, req sandbox.ExecRequest, pty *agentproto.PTYSize) (sandbox.Process, error) {
	if _, err := s.agent.Client(); err != nil {
		return nil, err
	}
	p, release := s.holdPhase()
	defer release()
	cmd, err := s.agent.Command(&req, s.spec, p)
	if err != nil {
		return nil, err
	}
	cmd.PTY = pty
	return s.agent.Start(ctx, cmd)
}

// StartPTY starts req in the background on a new pseudo-terminal of
// rows×cols in the guest (stdout and stderr merged). The process is an
// agentsandbox.Process, whose Resize resizes the terminal.
func (s *Sandbox) StartPTY(ctx context.Context, req sandbox.ExecRequest, rows, cols uint16) (sandbox.Process, error) {
	return s.start(ctx, req, &agentproto.PTYSize{Rows: rows, Cols: cols})
}

// Processes implements sandbox.ProcessRunner.
func (s *Sandbox) Processes() []api.Process { return s.agent.Processes() }

// Process implements sandbox.ProcessRunner.
func (s *Sandbox) Process(pid int) (sandbox.Process, error) { return s.agent.Process(pid) }

// Stats implements sandbox.Sandbox. The host measures QEMU's process:
// HostMemoryBytes is its resident memory (the guest's touched pages and
// QEMU's own), CPUSeconds its CPU time (every vCPU's). The guest's agent
// reports the guest's view: MemoryBytes and MemoryLimitBytes are the
// guest's used and total memory, Processes its process count, DiskBytes,
// DiskLimitBytes and DiskFull its root's statfs (the upper's); it is
// informative only (the guest may lie about itself, never about the
// host's figures).
func (s *Sandbox) Stats(ctx context.Context) (sandbox.Stats, error) {
	c, err := s.agent.Client()
	if err != nil {
		return sandbox.Stats{}, err
	}
	u, err := s.vm.Usage()
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
		CPUSeconds:       u.CPUSeconds,
		Processes:        st.Processes,
		HostMemoryBytes:  u.RSSBytes,
		// The guest's statfs of its root: the upper disk's or tmpfs's.
		DiskBytes: st.RootUsedBytes, DiskLimitBytes: st.RootSizeBytes, DiskFull: st.RootFull,
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
	release, unjail := s.release, s.unjail
	s.release, s.unjail = nil, nil
	s.mu.Unlock()
	s.goneOnce.Do(func() { close(s.gone) })
	s.agent.Close()
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
	s.destroyed = true
	s.mu.Unlock()
	s.goneOnce.Do(func() { close(s.gone) })
	s.agent.Close()
	s.vm.Release()
}
