package setup

import (
	"fmt"

	"github.com/dsec-dev/dsec/internal/sys"
)

// Capabilities the agent keeps once the sandbox is set up: what running
// commands as any user (setuid, setgid), signalling them (kill) and the
// files API as the sandbox's root (DAC, owner, chown, setuid bits) need.
// The rest goes from every thread, CAP_SYS_ADMIN first: the mounts the
// host makes for a task's phase (read-only root, writable binds) could
// otherwise be undone by an agent the sandbox took over.
var agentCaps = []uint{
	0, // CAP_CHOWN
	1, // CAP_DAC_OVERRIDE
	2, // CAP_DAC_READ_SEARCH
	3, // CAP_FOWNER
	4, // CAP_FSETID
	5, // CAP_KILL
	6, // CAP_SETGID
	7, // CAP_SETUID
}

// dropAgentCaps limits every thread's effective and permitted sets to
// agentCaps and keep, the capabilities the sandbox's commands may be
// given (one stop-the-world: capset is per thread). A command gets its
// capabilities as ambient ones, which must be in the permitted set of
// the agent that starts it; no_new_privs keeps any exec from gaining
// more than that set.
func dropAgentCaps(keep []int) error {
	var mask uint64
	for _, c := range agentCaps {
		mask |= 1 << c
	}
	for _, c := range keep {
		if c >= 0 && c < 64 {
			mask |= 1 << uint(c)
		}
	}
	if err := sys.LimitCaps(mask); err != nil {
		return fmt.Errorf("dropping the agent's capabilities: %w", err)
	}
	return nil
}
