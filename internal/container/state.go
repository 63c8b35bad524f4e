package container

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/cgroups"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/sys"
)

// stateName is a sandbox's state file: what a restarted node needs to
// re-adopt it.
const stateName = "state.json"

// state is a sandbox's record on the node.
type state struct {
	Spec   sandbox.Spec `json:"spec"`
	Pid    int          `json:"pid"`
	Rootfs string       `json:"rootfs"`
	Netns  string       `json:"netns"`
	// CgroupBase is what the counters of its (maybe recycled) cgroups
	// held when it got them.
	CgroupBase cgroups.Counters `json:"cgroup_base"`
	// Warm: a sandbox of the warm pool, not yet claimed (a restarted node
	// destroys it).
	Warm bool `json:"warm,omitempty"`
	// Prestarted: it was a warm sandbox, claimed by its create.
	Prestarted bool `json:"prestarted,omitempty"`
	// Owner is the host uid that owns the sandbox's user namespace (0:
	// host root, a sandbox of a node from before owners; see owners.go).
	Owner int `json:"owner,omitempty"`
	// Phase is the sandbox's current phase (nil without phases).
	Phase   *api.Phase `json:"phase,omitempty"`
	Created time.Time  `json:"created"`
}

func (s *state) write(dir string) error {
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, stateName+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("writing sandbox state: %w", err)
	}
	return os.Rename(tmp, filepath.Join(dir, stateName))
}

func readState(dir string) (*state, error) {
	b, err := os.ReadFile(filepath.Join(dir, stateName))
	if err != nil {
		return nil, err
	}
	var s state
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("reading %s: %w", filepath.Join(dir, stateName), err)
	}
	if s.Spec.ID != filepath.Base(dir) {
		return nil, fmt.Errorf("reading %s: state of another sandbox", filepath.Join(dir, stateName))
	}
	return &s, nil
}

// mountStateFS puts the sandboxes' directories on a tmpfs: they are made
// and removed on every create and destroy, and live exactly as long as
// the tmpfs uppers and mounts they describe.
func mountStateFS(dir string) error {
	_, err := sys.EnsureTmpfs("dsec-container", dir, "mode=0711,size=64m")
	return err
}

func unmountStateFS(dir string) error { return sys.UnmountTmpfsIfEmpty(dir) }
