package sandbox

import (
	"context"
	"time"
)

// Snapshotter is implemented by sandboxes whose tier can copy out their
// writable state, for a snapshot (a state layer: see
// docs/design/trajectories.md). The node builds the layer from what
// CaptureState copies.
type Snapshotter interface {
	// CaptureState holds the sandbox still (its processes frozen, or its
	// calls held off) while it copies into dst, an empty directory on the
	// node, the entries of its writable state that differ from since
	// (every entry when since is nil), laid out as the layer's tree, with
	// whiteouts for entries removed since. It returns the index of the
	// state as copied, for the next snapshot.
	CaptureState(ctx context.Context, dst string, since *StateIndex) (*StateIndex, CaptureStats, error)
}

// StateIndex is what a snapshot stored: each entry's identity and
// metadata, by path, to find what changed since. It lives in the node's
// memory only.
type StateIndex struct {
	entries map[string]stateKey
}

// Len is the number of entries indexed.
func (x *StateIndex) Len() int { return len(x.entries) }

// stateKey identifies an entry's version: any change to it (content
// included: it moves mtime and ctime) changes the key.
type stateKey struct {
	mode         uint32
	uid, gid     uint32
	size         int64
	mtime, ctime int64
	ino, rdev    uint64
	opaque       bool
}

// CaptureStats says what CaptureState copied.
type CaptureStats struct {
	Entries   int   // entries of the state
	Copied    int   // entries copied (files, dirs, symlinks, whiteouts)
	Whiteouts int   // of which whiteouts
	Bytes     int64 // file content copied
	// Frozen is how long the sandbox was held still.
	Frozen time.Duration
}

// CaptureOptions tell CaptureState where the state is and how it maps
// into the layer.
type CaptureOptions struct {
	// Src is the state's top directory: a path the node reaches, which
	// nothing may change during the capture (the sandbox is held still).
	Src string
	// Dst is the empty directory the layer's tree is made in.
	Dst string
	// Prefix is where the state goes in the layer ("" for a root file
	// system's upper; "workspace" for the function tier's).
	Prefix string
	// Since is the previous snapshot's index (nil: a full one).
	Since *StateIndex
	// Overlay: Src is an overlay upper, whose whiteouts and opaque
	// directories are kept as such.
	Overlay bool
	// IDBase and IDCount shift owners down into the layer's ids (a
	// container's upper holds host ids, layers hold the sandbox's); an
	// owner outside the range is refused. IDCount 0: no shift.
	IDBase, IDCount uint32
}

// CaptureState copies the state at o.Src into o.Dst (see Snapshotter);
// the caller holds the sandbox still.
func CaptureState(ctx context.Context, o CaptureOptions) (*StateIndex, CaptureStats, error) {
	return captureState(ctx, o)
}
