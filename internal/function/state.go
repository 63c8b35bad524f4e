package function

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/sys"
)

// stateFile is <StateDir>/sandboxes/<id>/sandbox.json. It is written last
// when a sandbox is created, so a directory without one is a partial
// sandbox.
type stateFile struct {
	Version int          `json:"version"`
	Spec    sandbox.Spec `json:"spec"`
	// Tmpfs says the workspace is a tmpfs mount; if it is no longer
	// mounted (the host rebooted), the sandbox is lost.
	Tmpfs bool `json:"tmpfs"`
	// Phase is the current phase's name ("" without phases, or still the
	// first).
	Phase string `json:"phase,omitempty"`
}

// writeState records the sandbox's current phase.
func (s *Sandbox) writeState() error {
	return writeState(s.dir, stateFile{Version: 1, Spec: s.spec, Tmpfs: s.tmpfs, Phase: s.Phase()})
}

const stateName = "sandbox.json"

func writeState(dir string, st stateFile) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, stateName+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("writing sandbox state: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, stateName)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing sandbox state: %w", err)
	}
	return nil
}

// createState writes a new sandbox's first state in place, without
// writeState's rename: a crash that leaves it half-written leaves a
// sandbox no one was told of, which recovery drops as partial.
func createState(dir string, st stateFile) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	if err := sys.WriteSmallFile(filepath.Join(dir, stateName), b, 0o600, true); err != nil {
		return fmt.Errorf("writing sandbox state: %w", err)
	}
	return nil
}

func readState(dir string) (stateFile, error) {
	var st stateFile
	b, err := os.ReadFile(filepath.Join(dir, stateName))
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("reading %s: %w", filepath.Join(dir, stateName), err)
	}
	if st.Version != 1 || st.Spec.ID != filepath.Base(dir) {
		return st, fmt.Errorf("reading %s: unknown version or wrong ID", filepath.Join(dir, stateName))
	}
	return st, nil
}

// Recover implements sandbox.Runtime. It adopts every sandbox with a valid
// sandbox.json whose workspace is intact, and removes the rest: partial
// sandboxes (no sandbox.json) and lost ones (their tmpfs is gone, e.g.
// after a reboot, or their image is).
func (r *Runtime) Recover(ctx context.Context) ([]sandbox.Sandbox, error) {
	base := filepath.Join(r.opts.StateDir, "sandboxes")
	entries, err := os.ReadDir(base)
	if err != nil {
		return nil, fmt.Errorf("recovering sandboxes: %w", err)
	}
	var out []sandbox.Sandbox
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(base, e.Name())
		sb, why, drop := r.recoverOne(dir)
		if sb == nil && !drop {
			r.log.Info("function sandbox: not recovered", "dir", dir, "reason", why)
			continue
		}
		if sb == nil {
			r.log.Info("function sandbox: removing", "dir", dir, "reason", why)
			if err := removeSandboxDir(dir); err != nil {
				r.log.Warn("function sandbox: removing", "dir", dir, "err", err)
			}
			continue
		}
		out = append(out, sb)
	}
	return out, nil
}

// recoverOne adopts the sandbox in dir, or says why it cannot and whether
// its leftovers should go.
func (r *Runtime) recoverOne(dir string) (sb *Sandbox, why string, drop bool) {
	st, err := readState(dir)
	if err != nil {
		return nil, "partial: " + err.Error(), true
	}
	work := filepath.Join(dir, "workspace")
	if st.Tmpfs && !isTmpfsMount(work) {
		return nil, "lost: its workspace is no longer mounted", true
	}
	if fi, err := os.Stat(work); err != nil || !fi.IsDir() {
		return nil, "lost: its workspace is missing", true
	}
	img, err := r.image(st.Spec.Image.Root)
	if err != nil {
		return nil, "lost: " + err.Error(), true
	}
	sb, err = r.adopt(st.Spec, dir, st.Tmpfs, img)
	if err == nil && st.Phase != "" {
		for _, p := range st.Spec.Phases {
			if p.Name == st.Phase {
				sb.phase.cur = &p
			}
		}
	}
	if err != nil {
		return nil, "lost: " + err.Error(), true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		sb.release()
		return nil, "the runtime is closed", false
	}
	if _, dup := r.sandboxes[st.Spec.ID]; dup {
		sb.release()
		return nil, "already adopted", false
	}
	r.sandboxes[st.Spec.ID] = sb
	return sb, "", false
}
