package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/dsec-dev/dsec/internal/noderpc"
	"github.com/dsec-dev/dsec/internal/sys"
)

// sandboxState is what the node service itself remembers of a sandbox across its
// own restarts: which image view it holds. Runtimes keep the rest.
type sandboxState struct {
	Tier  string           `json:"tier"`
	Image noderpc.ImageRef `json:"image"`
}

// stateDir is where sandbox states live. It is a tmpfs when we may mount:
// it is written on every create, and it lives exactly as long as the
// mounts it describes (until the host reboots).
type stateDir struct{ dir string }

// openState opens the state directory; a variable so that the package's
// tests keep their state in a plain directory, without a mount.
var openState = openStateDir

func openStateDir(dir string) (*stateDir, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating node state: %w", err)
	}
	if _, err := sys.EnsureTmpfs("dsec-node", dir, "mode=0700,size=64m"); err != nil {
		return nil, err
	}
	return &stateDir{dir: dir}, nil
}

func (s *stateDir) path(id string) string { return filepath.Join(s.dir, id+".json") }

// put records sandbox id's tier and image; image is the reference's
// encoding if the caller has it (it is then written as it is).
//
// Written in place, without a rename: the state is put before the
// runtime creates anything, so a crash that leaves it half-written (all
// drops it as unreadable) leaves nothing it should have described.
func (s *stateDir) put(id, tier string, ref noderpc.ImageRef, image json.RawMessage) error {
	var b []byte
	var err error
	if len(image) > 0 {
		b, err = json.Marshal(struct {
			Tier  string          `json:"tier"`
			Image json.RawMessage `json:"image"`
		}{tier, image})
	} else {
		b, err = json.Marshal(sandboxState{Tier: tier, Image: ref})
	}
	if err != nil {
		return err
	}
	if err := sys.WriteSmallFile(s.path(id), b, 0o600, false); err != nil {
		return fmt.Errorf("writing sandbox state: %w", err)
	}
	return nil
}

func (s *stateDir) remove(id string) {
	if err := os.Remove(s.path(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		// Harmless: a stale state only makes the next start re-acquire a
		// view that GC then drops.
		return
	}
}

// all returns every stored state by sandbox ID; unreadable ones are
// removed.
func (s *stateDir) all() map[string]sandboxState {
	out := map[string]sandboxState{}
	ents, _ := os.ReadDir(s.dir)
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok {
			os.Remove(filepath.Join(s.dir, e.Name()))
			continue
		}
		b, err := os.ReadFile(filepath.Join(s.dir, e.Name()))
		var st sandboxState
		if err != nil || json.Unmarshal(b, &st) != nil {
			os.Remove(filepath.Join(s.dir, e.Name()))
			continue
		}
		out[id] = st
	}
	return out
}

// close unmounts the state tmpfs if no sandbox state is left in it.
func (s *stateDir) close() error { return sys.UnmountTmpfsIfEmpty(s.dir) }
