package vmtier

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/agentsandbox"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/guest/agentproto"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/vm/vmm"
)

// stateFile, in a VM's run directory, is what a later run of the node
// agent needs to adopt the VM.
const stateFile = "state.json"

// recoverDial bounds the reconnection to an adopted VM's agent, and
// helloAttempt each try.
const (
	recoverDial  = 10 * time.Second
	helloAttempt = time.Second
)

type state struct {
	Spec sandbox.Spec `json:"spec"`
	Pid  int          `json:"pid"`
	VM   vmm.Config   `json:"vm"`
	// Netns is the network namespace of the VM's tap, if it has one.
	Netns string `json:"netns,omitempty"`
	// Phase is the current phase (nil without phases).
	Phase *api.Phase `json:"phase,omitempty"`
}

// writeState writes dir's state file, whole (through a rename).
func writeState(dir string, st state) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, stateFile+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, stateFile))
}

func readState(dir string) (state, error) {
	var st state
	b, err := os.ReadFile(filepath.Join(dir, stateFile))
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("%s: %w", stateFile, err)
	}
	if st.Pid <= 0 || st.VM.RunDir != dir && st.VM.RunDir != filepath.Join(dir, qemuDir) || st.Spec.ID != filepath.Base(dir) {
		return st, fmt.Errorf("%s does not describe the VM of %s", stateFile, dir)
	}
	return st, nil
}

// Recover implements sandbox.Runtime: it re-adopts the VMs a previous run
// left running (vmm.Adopt checks each pid is its run directory's QEMU),
// reconnects to their agents and holds their layers, uids and cgroups
// again. A run directory without a whole state file, whose QEMU is gone,
// or whose agent does not answer is torn down; then every QEMU, run
// directory and cgroup of this runtime that no recovered sandbox owns is
// removed (sweepLeftovers). Errors are joined; the sandboxes recovered are
// returned whatever failed.
func (r *Runtime) Recover(ctx context.Context) ([]sandbox.Sandbox, error) {
	entries, err := os.ReadDir(r.opt.StateDir)
	if err != nil {
		return nil, err
	}
	var out []sandbox.Sandbox
	var errs []error
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(r.opt.StateDir, e.Name())
		sb, err := r.adopt(ctx, dir)
		if err != nil {
			r.log.Warn("tearing down a VM that could not be recovered", "dir", dir, "err", err)
			if err := r.sweep(ctx, dir); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		sb.watchVM()
		out = append(out, sb)
	}
	live := map[string]bool{}
	for _, sb := range out {
		live[sb.ID()] = true
	}
	if err := r.sweepLeftovers(ctx, live); err != nil {
		errs = append(errs, err)
	}
	if r.opt.Network != nil {
		// What no adopted VM owns goes: namespaces, veths, nftables
		// elements (for every runtime sharing the manager: see
		// network.Shared). A failed sweep leaves strays, logged, and
		// does not fail the recovery. VMs without network access have
		// no network there and are not named.
		var ids []string
		for _, sb := range out {
			if s := sb.(*Sandbox); s.netns != "" {
				ids = append(ids, s.id)
			}
		}
		if err := r.opt.Network.Recover(ctx, ids); err != nil {
			r.log.Error("sweeping networks no sandbox owns", "err", err)
		}
	}
	return out, errors.Join(errs...)
}

// adopt re-attaches to the VM of run directory dir.
func (r *Runtime) adopt(ctx context.Context, dir string) (*Sandbox, error) {
	st, err := readState(dir)
	if err != nil {
		return nil, err
	}
	if st.Netns != "" {
		// The network manager adopted the networks it had recorded.
		if r.opt.Network == nil {
			return nil, errors.New("it has a network and this node no network manager")
		}
		if _, ok := r.opt.Network.Endpoint(st.Spec.ID); !ok {
			return nil, errors.New("its network is gone")
		}
	}
	_, release, err := r.opt.Layers.Files(ctx, st.Spec.Image.Layers)
	if err != nil {
		return nil, err
	}
	// (The VM has its disks open already: only the hold matters.)
	vm, err := vmm.Adopt(ctx, st.VM, st.Pid)
	if err != nil {
		release()
		return nil, err
	}
	client, err := redialAgent(ctx, vm.AgentSocket(), r)
	if err != nil {
		vm.Kill(ctx)
		release()
		return nil, errdefs.Wrap(errdefs.Unavailable, api.CodeAgentUnreachable, err, "reconnecting to the agent of %s", st.Spec.ID)
	}
	sb := &Sandbox{id: st.Spec.ID, rt: r, spec: st.Spec, dir: dir, vm: vm, netns: st.Netns, agent: agentsandbox.NewAgent(r.Tier(), st.Spec.ID, client), release: release, unjail: r.rejail(st), phase: st.Phase, upperDisk: st.VM.Writable != nil,
		gone: make(chan struct{})}
	r.mu.Lock()
	r.sandboxes[sb.id] = sb
	if u := st.VM.User; u != nil && r.opt.Jail != nil {
		r.uids[u.UID] = sb.id
	}
	r.mu.Unlock()
	return sb, nil
}

// sweep stops the QEMU of run directory dir, if it runs (found by the
// state file's pid and checked by vmm.Adopt to be that directory's),
// releases its network and removes dir.
func (r *Runtime) sweep(ctx context.Context, dir string) error {
	if st, err := readState(dir); err == nil {
		if vm, err := vmm.Adopt(ctx, st.VM, st.Pid); err == nil {
			if err := vm.Kill(ctx); err != nil {
				return err
			}
		} else if !errors.Is(err, errdefs.NotFound) {
			r.log.Warn("leftover VM not adopted", "dir", dir, "pid", st.Pid, "err", err)
		}
		if err := r.releaseNetwork(ctx, st.Spec.ID, st.Netns); err != nil {
			r.log.Warn("releasing the network of a VM not recovered", "dir", dir, "err", err)
		}
	}
	return os.RemoveAll(dir)
}

// redialAgent reconnects to an adopted VM's agent, retrying: the guest
// discards what it has buffered when it closes its end of the port after
// the previous connection, so a hello sent just then can be lost. Each try
// waits helloAttempt for the answer.
func redialAgent(ctx context.Context, sock string, r *Runtime) (*agentproto.Client, error) {
	ctx, cancel := context.WithTimeout(ctx, recoverDial)
	defer cancel()
	for {
		actx, acancel := context.WithTimeout(ctx, helloAttempt)
		c, err := dialAgent(actx, sock, r, &Timing{}, time.Now())
		acancel()
		if err == nil || ctx.Err() != nil {
			return c, err
		}
		select { // a refused connection fails at once: don't spin
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
}
