package setup

import (
	"fmt"
	"runtime"

	"github.com/dsec-dev/dsec/internal/sys"
)

// installSeccomp sets no_new_privs and installs the filter on every
// thread of this process; children inherit both. Without a filter it
// sets no_new_privs on the calling thread only (the one that forks every
// command).
func installSeccomp(prog []byte) error {
	if len(prog) > 0 {
		return sys.InstallSeccompFilter(prog)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := sys.SetNoNewPrivs(); err != nil {
		return fmt.Errorf("setting no_new_privs: %w", err)
	}
	return nil
}
