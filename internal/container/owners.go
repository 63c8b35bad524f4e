package container

import (
	"crypto/sha256"
	"encoding/hex"
	"path/filepath"
	"sync"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Each sandbox's user namespace is owned by a host uid of its own, and
// the kernel charges per-user counts — inotify instances and watches,
// POSIX message queue bytes, pending signals, locked memory, user
// namespaces — at every level of a namespace chain to the owner of the
// namespace below (see sys.WithThreadEUID). Owned by host root, as the
// namespaces of a root process's clones are, every sandbox and host root
// itself drew on one budget: a sandbox that opened 128 inotify instances
// (fs.inotify.max_user_instances) left its neighbours and the host
// without any until it let go. With an owner each, every sandbox has the
// host's per-user limits to itself, and host root keeps its own.
//
// The owners are the node's own ids, HostUID+1 to HostUID+IDCount-1, the
// same ids the sandboxes' users map to. That is safe: only a process in
// the namespace's parent (the host's) running as the owner holds
// capabilities over a namespace by ownership, and no host process runs
// as one of these ids; a sandbox's process running as the same id is in
// its own namespace, from which a sibling namespace is out of reach.

// owners hands out the owner uids of sandboxes' user namespaces, one per
// live sandbox, in turn (a namespace's counts go when the kernel frees
// it, a little after its last process: a uid just released is the last
// one handed out again). It is safe for concurrent use.
type owners struct {
	base, count int // owners are base+1 … base+count-1

	mu   sync.Mutex // guards the following fields
	used map[int]bool
	next int // the slot to try first
}

func newOwners(base, count int) *owners {
	return &owners{base: base, count: count, used: map[int]bool{}, next: 1}
}

// take returns a free owner uid.
func (o *owners) take() (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for range o.count - 1 {
		slot := o.next
		if o.next++; o.next >= o.count {
			o.next = 1
		}
		if !o.used[slot] {
			o.used[slot] = true
			return o.base + slot, nil
		}
	}
	return 0, errdefs.New(errdefs.Unavailable, api.CodeNoNamespaceOwner,
		"all %d owner ids of the node's user namespaces are in use", o.count-1)
}

// hold marks uid taken (an adopted sandbox's; 0, a sandbox made before
// owners, is ignored).
func (o *owners) hold(uid int) {
	if slot := uid - o.base; uid != 0 && slot > 0 && slot < o.count {
		o.mu.Lock()
		o.used[slot] = true
		o.mu.Unlock()
	}
}

// release gives uid back.
func (o *owners) release(uid int) {
	if slot := uid - o.base; uid != 0 && slot > 0 && slot < o.count {
		o.mu.Lock()
		delete(o.used, slot)
		o.mu.Unlock()
	}
}

// nodeMark names the node whose state is in stateDir, in the environment
// of every sandbox's first process (guest.NodeEnv): a restarted node
// finds the processes it forked by it, and the marks of two nodes on one
// host differ. It is a digest: the state directory's path is the host's
// business, not a sandbox's.
func nodeMark(stateDir string) string {
	if abs, err := filepath.Abs(stateDir); err == nil {
		stateDir = abs
	}
	sum := sha256.Sum256([]byte(filepath.Clean(stateDir)))
	return hex.EncodeToString(sum[:8])
}
